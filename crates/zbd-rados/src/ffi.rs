//! The librados C API, loaded at run time: `librados.so.2` is opened (dlopen) the first time a
//! cluster is connected, not linked into the binary. Linked, it and libceph-common were mapped
//! and their static initialisers run at every start, file volumes included (14 MiB more RSS at
//! idle, the margin issue 9's 128 MiB bound at 1 TiB did not have); a build also needed
//! librados-dev.
//!
//! The declarations are transcribed from `rados/librados.h` (Ceph 16 and later, whose ABI
//! `librados.so.2` keeps); client.rs is the only caller.
#![allow(unsafe_code)]
// C's names, so they can be checked against librados.h at a glance.
#![allow(non_camel_case_types)]

use crate::error::RadosError;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

/// The library opened (Debian/Ubuntu package librados2).
pub const LIBRARY: &str = "librados.so.2";

pub type rados_t = *mut c_void;
pub type rados_ioctx_t = *mut c_void;
pub type rados_completion_t = *mut c_void;
pub type rados_write_op_t = *mut c_void;
pub type rados_callback_t = Option<unsafe extern "C" fn(cb: rados_completion_t, arg: *mut c_void)>;
/// `rados_watchcb2_t`: (arg, notify_id, watch handle, notifier id, data, data_len).
pub type rados_watchcb2_t =
    Option<unsafe extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize)>;
/// `rados_watcherrcb_t`: (arg, watch handle, error).
pub type rados_watcherrcb_t = Option<unsafe extern "C" fn(*mut c_void, u64, c_int)>;

/// Declares the function table [`Api`] and its loader: one field per C function, resolved by
/// its own name (or, where Ceph renamed it, the old name when the new one is missing).
macro_rules! librados {
    ($( $name:ident $(| $old:ident)? : fn($($arg:ty),* $(,)?) $(-> $ret:ty)?; )*) => {
        /// Pointers to the librados functions zbd calls.
        pub struct Api {
            $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
            // Last, so it is dropped after the pointers into it (only an `Api` whose load
            // failed half-way is ever dropped: the loaded one lives in a static).
            _library: Library,
        }

        impl Api {
            fn load(file: &str) -> Result<Api, String> {
                // SAFETY: opening librados runs its (and libceph-common's) static
                // initialisers, which only set up process-wide state and need no argument;
                // RTLD_NOW resolves every symbol now, so a broken install fails here rather
                // than in the middle of I/O.
                let library = unsafe { Library::open(Some(file), RTLD_NOW | RTLD_LOCAL) }
                    .map_err(|e| e.to_string())?;
                Ok(Api {
                    // SAFETY: each field's type is the signature librados.h declares for that
                    // name (the macro call below transcribes them), and the pointer is only
                    // called while `_library`, stored next to it, keeps the code mapped.
                    $( $name: unsafe {
                        symbol(&library, &[stringify!($name) $(, stringify!($old))?])?
                    }, )*
                    _library: library,
                })
            }
        }
    };
}

librados! {
    rados_create: fn(*mut rados_t, *const c_char) -> c_int;
    rados_conf_read_file: fn(rados_t, *const c_char) -> c_int;
    rados_conf_parse_env: fn(rados_t, *const c_char) -> c_int;
    rados_conf_set: fn(rados_t, *const c_char, *const c_char) -> c_int;
    rados_connect: fn(rados_t) -> c_int;
    rados_shutdown: fn(rados_t);
    rados_ioctx_create: fn(rados_t, *const c_char, *mut rados_ioctx_t) -> c_int;
    rados_ioctx_destroy: fn(rados_ioctx_t);
    // `blacklist` before Ceph 16; both take (cluster, char *client_address, uint32_t expire).
    rados_blocklist_add | rados_blacklist_add: fn(rados_t, *mut c_char, u32) -> c_int;
    rados_wait_for_latest_osdmap: fn(rados_t) -> c_int;
    rados_read: fn(rados_ioctx_t, *const c_char, *mut c_char, usize, u64) -> c_int;
    rados_write_full: fn(rados_ioctx_t, *const c_char, *const c_char, usize) -> c_int;
    rados_aio_create_completion: fn(
        *mut c_void,
        rados_callback_t,
        rados_callback_t,
        *mut rados_completion_t,
    ) -> c_int;
    rados_aio_wait_for_complete: fn(rados_completion_t) -> c_int;
    rados_aio_get_return_value: fn(rados_completion_t) -> c_int;
    rados_aio_release: fn(rados_completion_t);
    rados_aio_read: fn(
        rados_ioctx_t,
        *const c_char,
        rados_completion_t,
        *mut c_char,
        usize,
        u64,
    ) -> c_int;
    rados_aio_write: fn(
        rados_ioctx_t,
        *const c_char,
        rados_completion_t,
        *const c_char,
        usize,
        u64,
    ) -> c_int;
    rados_aio_remove: fn(rados_ioctx_t, *const c_char, rados_completion_t) -> c_int;
    rados_create_write_op: fn() -> rados_write_op_t;
    rados_release_write_op: fn(rados_write_op_t);
    rados_write_op_assert_exists: fn(rados_write_op_t);
    rados_write_op_truncate: fn(rados_write_op_t, u64);
    rados_write_op_zero: fn(rados_write_op_t, u64, u64);
    rados_write_op_exec: fn(
        rados_write_op_t,
        *const c_char,
        *const c_char,
        *const c_char,
        usize,
        *mut c_int,
    );
    rados_aio_write_op_operate: fn(
        rados_write_op_t,
        rados_ioctx_t,
        rados_completion_t,
        *const c_char,
        *mut libc::time_t,
        c_int,
    ) -> c_int;
    rados_watch3: fn(
        rados_ioctx_t,
        *const c_char,
        *mut u64,
        rados_watchcb2_t,
        rados_watcherrcb_t,
        u32,
        *mut c_void,
    ) -> c_int;
    rados_unwatch2: fn(rados_ioctx_t, u64) -> c_int;
    rados_watch_check: fn(rados_ioctx_t, u64) -> c_int;
    rados_watch_flush: fn(rados_t) -> c_int;
    rados_notify2: fn(
        rados_ioctx_t,
        *const c_char,
        *const c_char,
        c_int,
        u64,
        *mut *mut c_char,
        *mut usize,
    ) -> c_int;
    rados_notify_ack: fn(rados_ioctx_t, *const c_char, u64, u64, *const c_char, c_int) -> c_int;
    rados_buffer_free: fn(*mut c_char);
    rados_lock_exclusive: fn(
        rados_ioctx_t,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        *mut libc::timeval,
        u8,
    ) -> c_int;
    rados_unlock: fn(rados_ioctx_t, *const c_char, *const c_char, *const c_char) -> c_int;
    rados_break_lock: fn(
        rados_ioctx_t,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
    ) -> c_int;
    rados_list_lockers: fn(
        rados_ioctx_t,
        *const c_char,
        *const c_char,
        *mut c_int,
        *mut c_char,
        *mut usize,
        *mut c_char,
        *mut usize,
        *mut c_char,
        *mut usize,
        *mut c_char,
        *mut usize,
    ) -> isize;
}

/// The first of `names` the library has, as a `T`.
///
/// # Safety
/// `T` must be the function pointer type of that C function, and the value must not be called
/// after `library` is closed.
unsafe fn symbol<T: Copy>(library: &Library, names: &[&str]) -> Result<T, String> {
    let mut error = String::new();
    for name in names {
        // SAFETY: the caller guarantees the type; `*` copies the pointer out of the borrow,
        // which the caller keeps from outliving the library.
        match unsafe { library.get::<T>(name.as_bytes()) } {
            Ok(found) => return Ok(*found),
            Err(e) => error = e.to_string(),
        }
    }
    Err(error)
}

/// librados, loaded on first use and kept for the life of the process (unloading a library
/// with running threads and static destructors is not safe; nothing needs it).
pub fn api() -> Result<&'static Api, RadosError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    match API.get_or_init(|| Api::load(LIBRARY)) {
        Ok(api) => Ok(api),
        Err(reason) => Err(no_library(LIBRARY, reason)),
    }
}

fn no_library(library: &str, reason: &str) -> RadosError {
    RadosError::NoLibrary {
        library: library.to_string(),
        // dlerror() text is one line already; keep the error one line whatever it says.
        reason: reason.replace('\n', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_error(file: &str) -> String {
        match Api::load(file) {
            Ok(_) => panic!("{file} loaded as librados"),
            Err(reason) => no_library(file, &reason).to_string(),
        }
    }

    #[test]
    fn a_missing_library_is_a_one_line_error_saying_what_to_install() {
        let message = load_error("libzbd-no-such-library.so.2");
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains("libzbd-no-such-library.so.2"), "{message}");
        assert!(message.contains("librados2"), "{message}");
    }

    #[test]
    fn a_library_without_the_functions_is_refused() {
        // libc is always there and has none of them: the first lookup must fail and say which.
        let message = load_error("libc.so.6");
        assert!(message.contains("rados_create"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
}
