//! A small safe layer over the librados C API (loaded at run time, ffi.rs): connect with
//! timeouts, pool I/O contexts, object reads and writes (synchronous and asynchronous), and the
//! `cls_lock` advisory locks.
//!
//! Every `unsafe` block here calls librados with pointers that outlive the call: `CString`s and
//! slices owned by the caller, or buffers owned by a [`Completion`] until librados is done with
//! them. librados is thread-safe: one cluster handle and its I/O contexts may be used from many
//! threads at once (librados.h, "thread safety"), which is what makes the `Send`/`Sync` impls
//! below sound.
#![allow(unsafe_code)]

use crate::error::{errno_text, RadosError};
use crate::ffi::{self, Api};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

/// How to reach a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Ceph config file; `None`: `CEPH_CONF`, then Ceph's default search path.
    pub conf: Option<PathBuf>,
    /// Ceph user without the `client.` prefix; `None`: librados' default (`admin`).
    pub id: Option<String>,
    /// Give up connecting (and monitor requests) after this long.
    pub connect_timeout: Duration,
    /// An OSD request that is not answered within this long fails with ETIMEDOUT (reported as
    /// an I/O error); zero waits forever, like RBD by default.
    pub op_timeout: Duration,
    /// The lock's lease (lock.rs): the watch on the header expires this long after the
    /// holder's last sign of life, and then another server may take the volume over.
    pub lock_lease: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            conf: None,
            id: None,
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(60),
            lock_lease: Duration::from_secs(30),
        }
    }
}

fn cstring(what: &str, text: &str) -> Result<CString, RadosError> {
    CString::new(text).map_err(|_| RadosError::Invalid(format!("{what} {text:?} contains a NUL")))
}

/// A connected cluster handle.
pub struct Cluster {
    api: &'static Api,
    handle: ffi::rados_t,
    user: String,
}

// SAFETY: a `rados_t` may be used from any thread, concurrently (librados is thread-safe); the
// handle is only shut down in `Drop`, when no other reference exists.
unsafe impl Send for Cluster {}
unsafe impl Sync for Cluster {}

impl Cluster {
    /// Loads librados (the first time), reads the config, applies the timeouts and connects.
    pub fn connect(options: &ClusterOptions) -> Result<Arc<Cluster>, RadosError> {
        let api = ffi::api()?;
        let id = options
            .id
            .as_deref()
            .map(|id| cstring("--ceph-id", id))
            .transpose()?;
        let user = format!("client.{}", options.id.as_deref().unwrap_or("admin"));
        let mut handle: ffi::rados_t = ptr::null_mut();
        // SAFETY: `handle` is a valid out pointer; `id` is NUL-terminated or null (default id).
        let rc = unsafe {
            (api.rados_create)(&mut handle, id.as_ref().map_or(ptr::null(), |i| i.as_ptr()))
        };
        if rc < 0 {
            return Err(RadosError::Connect(errno_text(rc)));
        }
        // From here on `Drop` shuts the handle down on every error path.
        let cluster = Cluster { api, handle, user };
        cluster.read_config(options)?;
        let seconds = |d: Duration| d.as_secs().max(u64::from(d.subsec_nanos() > 0)).to_string();
        let connect = seconds(options.connect_timeout);
        cluster.set("client_mount_timeout", &connect)?;
        cluster.set("rados_mon_op_timeout", &connect)?;
        cluster.set("rados_osd_op_timeout", &seconds(options.op_timeout))?;
        // SAFETY: the handle is created and configured, not yet connected.
        let rc = unsafe { (cluster.api.rados_connect)(cluster.handle) };
        if rc < 0 {
            let conf = options
                .conf
                .as_ref()
                .map(|c| format!(" of {}", c.display()))
                .unwrap_or_default();
            return Err(match -rc {
                libc::ETIMEDOUT | libc::ENOTCONN | libc::ECONNREFUSED => RadosError::Unreachable {
                    conf,
                    seconds: options.connect_timeout.as_secs(),
                },
                libc::EACCES | libc::EPERM => RadosError::Permission {
                    user: cluster.user.clone(),
                    what: "connecting".into(),
                },
                // librados found no keyring holding the user's key (the cluster wants cephx).
                libc::ENOENT => RadosError::NoKey(cluster.user.clone()),
                _ => RadosError::Connect(errno_text(rc)),
            });
        }
        Ok(Arc::new(cluster))
    }

    fn read_config(&self, options: &ClusterOptions) -> Result<(), RadosError> {
        let path = match &options.conf {
            Some(path) => {
                // librados only says ENOENT or EINVAL: name the file and the reason ourselves.
                std::fs::File::open(path).map_err(|e| RadosError::Config {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                Some(cstring("--ceph-conf", &path.to_string_lossy())?)
            }
            None => None,
        };
        // SAFETY: the handle is valid; `path` is NUL-terminated or null (= CEPH_CONF, then the
        // default search path).
        let rc = unsafe {
            (self.api.rados_conf_read_file)(
                self.handle,
                path.as_ref().map_or(ptr::null(), |p| p.as_ptr()),
            )
        };
        if rc < 0 {
            return Err(match &options.conf {
                Some(path) => RadosError::Config {
                    path: path.display().to_string(),
                    reason: format!("not a valid Ceph config ({})", errno_text(rc)),
                },
                None => RadosError::NoConfig,
            });
        }
        // SAFETY: null selects the CEPH_ARGS environment variable.
        let rc = unsafe { (self.api.rados_conf_parse_env)(self.handle, ptr::null()) };
        if rc < 0 {
            return Err(RadosError::Connect(format!(
                "CEPH_ARGS: {}",
                errno_text(rc)
            )));
        }
        Ok(())
    }

    fn set(&self, option: &str, value: &str) -> Result<(), RadosError> {
        let (o, v) = (cstring("option", option)?, cstring("value", value)?);
        // SAFETY: valid handle and NUL-terminated strings.
        let rc = unsafe { (self.api.rados_conf_set)(self.handle, o.as_ptr(), v.as_ptr()) };
        if rc < 0 {
            return Err(RadosError::Connect(format!(
                "setting {option}={value}: {}",
                errno_text(rc)
            )));
        }
        Ok(())
    }

    /// The Ceph user this handle authenticated as (`client.NAME`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Opens an I/O context on `pool`.
    pub fn pool(self: &Arc<Self>, pool: &str) -> Result<IoCtx, RadosError> {
        let name = cstring("pool", pool)?;
        let mut io: ffi::rados_ioctx_t = ptr::null_mut();
        // SAFETY: connected handle, NUL-terminated name, valid out pointer.
        let rc = unsafe { (self.api.rados_ioctx_create)(self.handle, name.as_ptr(), &mut io) };
        if rc < 0 {
            return Err(match -rc {
                libc::ENOENT => RadosError::NoPool(pool.to_string()),
                libc::EACCES | libc::EPERM => RadosError::Permission {
                    user: self.user.clone(),
                    what: format!("pool {pool}"),
                },
                _ => RadosError::Op {
                    what: format!("opening pool {pool}"),
                    reason: errno_text(rc),
                },
            });
        }
        Ok(IoCtx {
            api: self.api,
            io,
            cluster: Arc::clone(self),
        })
    }

    /// Adds a client address (`IP:PORT/NONCE`) to the OSD blocklist for `expire` seconds (0: the
    /// cluster's default, one hour): its in-flight and future requests are refused.
    pub fn blocklist(&self, address: &str, expire: u32) -> Result<(), RadosError> {
        let address = cstring("address", address)?;
        // SAFETY: valid handle; librados takes a mutable pointer but only reads the string.
        let rc = unsafe {
            (self.api.rados_blocklist_add)(self.handle, address.as_ptr() as *mut c_char, expire)
        };
        check(rc, "adding to the blocklist")?;
        // Our next requests then carry the map that lists it: an OSD must catch up with that
        // map before serving them, so from then on it refuses the old holder (as librbd does
        // before it breaks a lock).
        // SAFETY: valid, connected handle.
        let rc = unsafe { (self.api.rados_wait_for_latest_osdmap)(self.handle) };
        check(rc, "waiting for the OSD map with the blocklist entry")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create; every IoCtx holds an Arc to us, so none is
        // left, and this is the only shutdown.
        unsafe { (self.api.rados_shutdown)(self.handle) }
    }
}

fn check(rc: i32, what: &str) -> Result<(), RadosError> {
    if rc < 0 {
        return Err(RadosError::Op {
            what: what.to_string(),
            reason: errno_text(rc),
        });
    }
    Ok(())
}

/// One holder of a `cls_lock` lock.
#[derive(Clone, Debug)]
pub struct Locker {
    /// `client.<instance id>`.
    pub client: String,
    /// The cookie the holder chose (zbd puts its host and PID in it).
    pub cookie: String,
    /// The holder's address, `IP:PORT/NONCE` (what `ceph osd blocklist add` takes).
    pub address: String,
}

/// An I/O context on one pool. Negative errno values are returned raw (`Err(-errno)`) so the
/// storage layer can decide what each one means.
pub struct IoCtx {
    api: &'static Api,
    io: ffi::rados_ioctx_t,
    cluster: Arc<Cluster>,
}

// SAFETY: as for `Cluster`: librados I/O contexts may be shared between threads.
unsafe impl Send for IoCtx {}
unsafe impl Sync for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; every Completion borrows the IoCtx's owner
        // (RadosStorage waits for all of them before dropping it).
        unsafe { (self.api.rados_ioctx_destroy)(self.io) }
    }
}

fn oid(name: &str) -> CString {
    // Object names are built by this crate from validated volume names (no NUL).
    CString::new(name).unwrap_or_default()
}

impl IoCtx {
    /// The cluster this context belongs to.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Reads up to `buf.len()` bytes at `offset` of `object`; returns how many it read (0 for a
    /// missing object).
    pub fn read(&self, object: &str, offset: u64, buf: &mut [u8]) -> Result<usize, i32> {
        let o = oid(object);
        // SAFETY: `buf` is valid for writes of buf.len() bytes for the whole (synchronous) call.
        let rc = unsafe {
            (self.api.rados_read)(
                self.io,
                o.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
                offset,
            )
        };
        match rc {
            n if n >= 0 => Ok(n as usize),
            n if n == -libc::ENOENT => Ok(0),
            n => Err(n),
        }
    }

    /// Starts reading up to `len` bytes at `offset` of `object` into a buffer the completion
    /// owns; [`Completion::read_result`] gives the bytes read.
    pub fn aio_read(&self, object: &str, offset: u64, len: usize) -> Result<Completion, i32> {
        let mut c = Completion::new(self.api, object)?;
        c.data = vec![0u8; len];
        // SAFETY: the buffer is the completion's heap allocation (moving `c` does not move it),
        // valid for writes of `len` bytes and neither read nor freed until the operation is
        // complete (read_result and Drop wait first).
        let rc = unsafe {
            (self.api.rados_aio_read)(
                self.io,
                c.oid.as_ptr(),
                c.handle,
                c.data.as_mut_ptr() as *mut c_char,
                len,
                offset,
            )
        };
        if rc < 0 {
            c.started = false;
            return Err(rc);
        }
        Ok(c)
    }

    /// Replaces `object`'s content with `data` (synchronously).
    pub fn write_full(&self, object: &str, data: &[u8]) -> Result<(), i32> {
        let o = oid(object);
        // SAFETY: `data` is valid for reads for the whole call.
        let rc = unsafe {
            (self.api.rados_write_full)(
                self.io,
                o.as_ptr(),
                data.as_ptr() as *const c_char,
                data.len(),
            )
        };
        if rc < 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// Starts writing `data` at `offset` of `object`.
    pub fn aio_write(&self, object: &str, offset: u64, data: Vec<u8>) -> Result<Completion, i32> {
        let mut c = Completion::new(self.api, object)?;
        // SAFETY: the completion, the object name and the data buffer are owned by `c`, which
        // waits for the operation before freeing any of them (Completion::drop).
        let rc = unsafe {
            (self.api.rados_aio_write)(
                self.io,
                c.oid.as_ptr(),
                c.handle,
                data.as_ptr() as *const c_char,
                data.len(),
                offset,
            )
        };
        c.data = data;
        if rc < 0 {
            c.started = false;
            return Err(rc);
        }
        Ok(c)
    }

    /// Starts removing `object` (ENOENT when it did not exist).
    pub fn aio_remove(&self, object: &str) -> Result<Completion, i32> {
        let mut c = Completion::new(self.api, object)?;
        // SAFETY: as in aio_write; no data buffer.
        let rc = unsafe { (self.api.rados_aio_remove)(self.io, c.oid.as_ptr(), c.handle) };
        if rc < 0 {
            c.started = false;
            return Err(rc);
        }
        Ok(c)
    }

    /// Starts zeroing `len` bytes at `offset` of `object` (the OSD frees the space). With
    /// `to_end`, the range runs to the end of the object: it is cut off instead (truncate), so
    /// the object's size, which is what the pool accounts, shrinks too. Missing object: ENOENT
    /// (a truncate would create it).
    pub fn aio_zero(
        &self,
        object: &str,
        offset: u64,
        len: u64,
        to_end: bool,
    ) -> Result<Completion, i32> {
        let mut c = Completion::new(self.api, object)?;
        // SAFETY: rados_create_write_op returns a fresh op (null on allocation failure, checked);
        // the op is owned by `c`, released after the operation completed.
        unsafe {
            c.write_op = (self.api.rados_create_write_op)();
            if c.write_op.is_null() {
                c.started = false;
                return Err(-libc::ENOMEM);
            }
            (self.api.rados_write_op_assert_exists)(c.write_op);
            if to_end {
                (self.api.rados_write_op_truncate)(c.write_op, offset);
            } else {
                (self.api.rados_write_op_zero)(c.write_op, offset, len);
            }
        }
        self.operate(c)
    }

    /// Starts asserting that this client holds the exclusive lock `name` on `object` with
    /// `cookie` (the `lock` object class's `assert_locked`): 0 when it does, EBUSY when
    /// someone else holds it, ENOENT when nobody does, ESHUTDOWN when this client is
    /// blocklisted.
    pub fn aio_assert_locked(
        &self,
        object: &str,
        name: &str,
        cookie: &str,
    ) -> Result<Completion, i32> {
        let mut c = Completion::new(self.api, object)?;
        c.data = assert_locked_input(name, cookie);
        let (class, method) = (oid("lock"), oid("assert_locked"));
        // SAFETY: as in aio_zero; the input bytes are owned by `c` (librados copies them
        // anyway), `prval` is null (the operation's result is enough).
        unsafe {
            c.write_op = (self.api.rados_create_write_op)();
            if c.write_op.is_null() {
                c.started = false;
                return Err(-libc::ENOMEM);
            }
            (self.api.rados_write_op_exec)(
                c.write_op,
                class.as_ptr(),
                method.as_ptr(),
                c.data.as_ptr() as *const c_char,
                c.data.len(),
                ptr::null_mut(),
            );
        }
        self.operate(c)
    }

    /// Starts the write operation `c` holds on its object.
    fn operate(&self, mut c: Completion) -> Result<Completion, i32> {
        // SAFETY: op, completion and object name live in `c` until it has waited.
        let rc = unsafe {
            (self.api.rados_aio_write_op_operate)(
                c.write_op,
                self.io,
                c.handle,
                c.oid.as_ptr(),
                ptr::null_mut(),
                0,
            )
        };
        if rc < 0 {
            c.started = false;
            return Err(rc);
        }
        Ok(c)
    }

    /// Watches `object`: the OSD keeps the watch while this client pings it (librados does,
    /// every few seconds) and drops it `timeout_seconds` after the last ping. Every notify
    /// sent to the object is acknowledged at once, which is how another client tells that
    /// we are alive.
    pub fn watch(self: &Arc<Self>, object: &str, timeout_seconds: u32) -> Result<Watch, i32> {
        let context = Box::new(WatchContext {
            api: self.api,
            io: self.io,
            oid: oid(object),
        });
        let mut handle = 0u64;
        let arg = &*context as *const WatchContext as *mut std::ffi::c_void;
        // SAFETY: `handle` is a valid out pointer; `arg` points to the boxed context, which
        // the returned Watch keeps (at a fixed heap address) until it has unwatched and
        // flushed every callback (Watch::drop); the callback only reads it.
        let rc = unsafe {
            (self.api.rados_watch3)(
                self.io,
                context.oid.as_ptr(),
                &mut handle,
                Some(acknowledge_notify),
                None,
                timeout_seconds,
                arg,
            )
        };
        if rc < 0 {
            return Err(rc);
        }
        Ok(Watch {
            context,
            handle,
            io: Arc::clone(self),
        })
    }

    /// Whether `watch` is still registered: Ok(ms since the OSD last confirmed it), or the
    /// error that broke it (ENOTCONN: it timed out; ESHUTDOWN: blocklisted).
    pub fn watch_check(&self, watch: &Watch) -> Result<u32, i32> {
        // SAFETY: valid context; an unknown handle is reported as an error, not undefined.
        let rc = unsafe { (self.api.rados_watch_check)(self.io, watch.handle) };
        if rc < 0 {
            return Err(rc);
        }
        Ok(rc as u32)
    }

    /// Notifies the watchers of `object` and waits up to `timeout`: the (client id, watch
    /// handle) pairs that acknowledged, and those whose watch is registered but did not
    /// answer in time. A client with no watch on the object is in neither list.
    pub fn notify(&self, object: &str, timeout: Duration) -> Result<Notified, i32> {
        let o = oid(object);
        let mut reply: *mut c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        // SAFETY: NUL-terminated name; an empty payload; valid out pointers. librados
        // allocates the reply, which is freed below with rados_buffer_free.
        let rc = unsafe {
            (self.api.rados_notify2)(
                self.io,
                o.as_ptr(),
                ptr::null(),
                0,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        let bytes = if reply.is_null() {
            Vec::new()
        } else {
            // SAFETY: librados returned `reply_len` bytes at `reply`; copied, then freed once.
            unsafe {
                let copy = std::slice::from_raw_parts(reply as *const u8, reply_len).to_vec();
                (self.api.rados_buffer_free)(reply);
                copy
            }
        };
        // A timed-out notify still says who answered; without that list it says nothing.
        if rc < 0 && (rc != -libc::ETIMEDOUT || bytes.is_empty()) {
            return Err(rc);
        }
        decode_notify_reply(&bytes).ok_or(-libc::EBADMSG)
    }

    /// Takes the exclusive lock `name` on `object` (creating the object if needed), with no
    /// expiry. EBUSY: someone else holds it.
    pub fn lock_exclusive(&self, object: &str, name: &str, cookie: &str) -> Result<(), i32> {
        let (o, n, c) = (oid(object), oid(name), oid(cookie));
        let description = oid("zbd volume");
        // SAFETY: NUL-terminated strings; a null duration means no expiry.
        let rc = unsafe {
            (self.api.rados_lock_exclusive)(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                c.as_ptr(),
                description.as_ptr(),
                ptr::null_mut(),
                0,
            )
        };
        if rc < 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// Releases our own lock.
    pub fn unlock(&self, object: &str, name: &str, cookie: &str) -> Result<(), i32> {
        let (o, n, c) = (oid(object), oid(name), oid(cookie));
        // SAFETY: NUL-terminated strings.
        let rc = unsafe { (self.api.rados_unlock)(self.io, o.as_ptr(), n.as_ptr(), c.as_ptr()) };
        if rc < 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// Breaks another client's lock.
    pub fn break_lock(&self, object: &str, name: &str, locker: &Locker) -> Result<(), i32> {
        let (o, n) = (oid(object), oid(name));
        let (client, cookie) = (oid(&locker.client), oid(&locker.cookie));
        // SAFETY: NUL-terminated strings.
        let rc = unsafe {
            (self.api.rados_break_lock)(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                client.as_ptr(),
                cookie.as_ptr(),
            )
        };
        if rc < 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// Who holds lock `name` on `object`.
    pub fn lockers(&self, object: &str, name: &str) -> Result<Vec<Locker>, i32> {
        let (o, n) = (oid(object), oid(name));
        let mut sizes = [256usize; 4];
        loop {
            let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
            let mut lens = sizes;
            let mut exclusive = 0i32;
            let [tag, clients, cookies, addrs] = &mut bufs[..] else {
                unreachable!("four buffers")
            };
            // SAFETY: each buffer is valid for writes of the length passed with it; librados
            // writes at most that many bytes, or returns -ERANGE with the sizes it needs.
            let rc = unsafe {
                (self.api.rados_list_lockers)(
                    self.io,
                    o.as_ptr(),
                    n.as_ptr(),
                    &mut exclusive,
                    tag.as_mut_ptr() as *mut c_char,
                    &mut lens[0],
                    clients.as_mut_ptr() as *mut c_char,
                    &mut lens[1],
                    cookies.as_mut_ptr() as *mut c_char,
                    &mut lens[2],
                    addrs.as_mut_ptr() as *mut c_char,
                    &mut lens[3],
                )
            };
            if rc == -libc::ERANGE as isize {
                for (size, len) in sizes.iter_mut().zip(lens) {
                    *size = (*size).max(len) * 2;
                }
                continue;
            }
            if rc == -libc::ENOENT as isize {
                return Ok(Vec::new());
            }
            if rc < 0 {
                return Err(rc as i32);
            }
            let split = |buf: &[u8], len: usize| -> Vec<String> {
                buf[..len.min(buf.len())]
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            };
            let clients = split(clients, lens[1]);
            let cookies = split(cookies, lens[2]);
            let addrs = split(addrs, lens[3]);
            return Ok(clients
                .into_iter()
                .zip(cookies)
                .zip(addrs)
                .map(|((client, cookie), address)| Locker {
                    client,
                    cookie,
                    address,
                })
                .collect());
        }
    }
}

/// The input of `cls_lock`'s `assert_locked` (`cls_lock_assert_op` in Ceph's
/// cls/lock/cls_lock_ops.h, version 1): name, type (1: exclusive), cookie, tag (ours is
/// empty), in Ceph's encoding (little-endian, strings as u32 length + bytes), after the
/// version header (struct version, compat version, u32 length of what follows).
fn assert_locked_input(name: &str, cookie: &str) -> Vec<u8> {
    const LOCK_EXCLUSIVE: u8 = 1;
    let mut body = Vec::new();
    let string = |body: &mut Vec<u8>, text: &str| {
        body.extend_from_slice(&(text.len() as u32).to_le_bytes());
        body.extend_from_slice(text.as_bytes());
    };
    string(&mut body, name);
    body.push(LOCK_EXCLUSIVE);
    string(&mut body, cookie);
    string(&mut body, "");
    let mut out = vec![1u8, 1u8];
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Who answered a notify: (client id, watch handle) pairs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Notified {
    /// Acknowledged in time.
    pub acked: Vec<(u64, u64)>,
    /// Registered, but did not acknowledge in time.
    pub missed: Vec<(u64, u64)>,
}

/// Decodes the OSD's notify reply (Watch.cc, `Notify::maybe_complete_notify`): a map from
/// (client id, watch handle) to reply payload, then a list of the (client id, watch handle)
/// pairs that did not answer. `None` if it is malformed.
fn decode_notify_reply(bytes: &[u8]) -> Option<Notified> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let part = bytes.get(at..at.checked_add(n)?)?;
        at += n;
        Some(part)
    };
    let mut notified = Notified::default();
    if bytes.is_empty() {
        return Some(notified);
    }
    let read_u32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
    let read_u64 = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let acks = read_u32(take(4)?);
    for _ in 0..acks {
        let gid = read_u64(take(8)?);
        let handle = read_u64(take(8)?);
        let len = read_u32(take(4)?) as usize;
        take(len)?;
        notified.acked.push((gid, handle));
    }
    let missed = read_u32(take(4)?);
    for _ in 0..missed {
        let gid = read_u64(take(8)?);
        let handle = read_u64(take(8)?);
        notified.missed.push((gid, handle));
    }
    Some(notified)
}

/// What a watch's callback needs to acknowledge a notify.
struct WatchContext {
    api: &'static Api,
    io: ffi::rados_ioctx_t,
    oid: CString,
}

/// Called by librados (on its own thread) for every notify on a watched object: acknowledge
/// it at once, empty payload.
unsafe extern "C" fn acknowledge_notify(
    arg: *mut std::ffi::c_void,
    notify_id: u64,
    handle: u64,
    _notifier: u64,
    _data: *mut std::ffi::c_void,
    _data_len: usize,
) {
    // SAFETY: `arg` is the WatchContext the Watch owns; librados calls back only between
    // rados_watch3 and the rados_watch_flush of Watch::drop, while it is alive. notify_ack
    // only queues a message (it does not wait), so it may be called from the callback.
    unsafe {
        let context = &*(arg as *const WatchContext);
        (context.api.rados_notify_ack)(
            context.io,
            context.oid.as_ptr(),
            notify_id,
            handle,
            ptr::null(),
            0,
        );
    }
}

/// A watch on an object ([`IoCtx::watch`]); dropping it unwatches. It keeps its I/O context
/// alive (the callback uses it).
pub struct Watch {
    context: Box<WatchContext>,
    handle: u64,
    io: Arc<IoCtx>,
}

// SAFETY: the context is only read (by callbacks and Drop); librados watch calls are
// thread-safe.
unsafe impl Send for Watch {}
unsafe impl Sync for Watch {}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_watch3 on `self.io`, which this Watch keeps
        // alive; after rados_watch_flush no callback runs any more, so the context may be
        // freed.
        unsafe {
            (self.context.api.rados_unwatch2)(self.io.io, self.handle);
            (self.context.api.rados_watch_flush)(self.io.cluster.handle);
        }
    }
}

/// An asynchronous operation in flight; owns everything librados may still read.
pub struct Completion {
    api: &'static Api,
    handle: ffi::rados_completion_t,
    oid: CString,
    data: Vec<u8>,
    write_op: ffi::rados_write_op_t,
    /// False when librados refused to start the operation: nothing to wait for.
    started: bool,
}

// SAFETY: a librados completion is internally synchronised: it may be waited on from several
// threads at once and released from any thread once complete.
unsafe impl Send for Completion {}
unsafe impl Sync for Completion {}

impl Completion {
    fn new(api: &'static Api, object: &str) -> Result<Completion, i32> {
        let mut handle: ffi::rados_completion_t = ptr::null_mut();
        // SAFETY: no callbacks (we wait instead); valid out pointer.
        let rc =
            unsafe { (api.rados_aio_create_completion)(ptr::null_mut(), None, None, &mut handle) };
        if rc < 0 {
            return Err(rc);
        }
        Ok(Completion {
            api,
            handle,
            oid: oid(object),
            data: Vec::new(),
            write_op: ptr::null_mut(),
            started: true,
        })
    }

    /// Waits until the OSDs acknowledged the operation (a write is then durable on every
    /// replica) and returns its result: 0 or a negative errno.
    pub fn wait(&self) -> i32 {
        if !self.started {
            return -libc::ECANCELED;
        }
        // SAFETY: the handle is valid until Drop; waiting concurrently is allowed.
        unsafe {
            (self.api.rados_aio_wait_for_complete)(self.handle);
            (self.api.rados_aio_get_return_value)(self.handle)
        }
    }

    /// Waits for a read started by [`IoCtx::aio_read`]: the bytes it read (fewer than asked
    /// past the object's end, none for a missing object) or a negative errno.
    pub fn read_result(&self) -> Result<&[u8], i32> {
        match self.wait() {
            n if n >= 0 => Ok(&self.data[..(n as usize).min(self.data.len())]),
            n if n == -libc::ENOENT => Ok(&[]),
            n => Err(n),
        }
    }

    /// The object this operation is on.
    pub fn object(&self) -> &CStr {
        &self.oid
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // Never free what librados may still use: wait first (immediate when already done).
        self.wait();
        // SAFETY: the operation is complete; handle and op are released exactly once.
        unsafe {
            if !self.write_op.is_null() {
                (self.api.rados_release_write_op)(self.write_op);
            }
            (self.api.rados_aio_release)(self.handle);
        }
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assert_locked_input_is_cls_lock_assert_op_v1() {
        let got = assert_locked_input("zbd", "c1");
        let mut want = vec![1, 1, 18, 0, 0, 0];
        want.extend_from_slice(&[3, 0, 0, 0, b'z', b'b', b'd', 1]);
        want.extend_from_slice(&[2, 0, 0, 0, b'c', b'1', 0, 0, 0, 0]);
        assert_eq!(got, want);
    }

    #[test]
    fn notify_reply_names_who_answered_and_who_did_not() {
        let mut reply = Vec::new();
        reply.extend_from_slice(&1u32.to_le_bytes());
        reply.extend_from_slice(&4151u64.to_le_bytes());
        reply.extend_from_slice(&7u64.to_le_bytes());
        reply.extend_from_slice(&2u32.to_le_bytes());
        reply.extend_from_slice(b"ok");
        reply.extend_from_slice(&1u32.to_le_bytes());
        reply.extend_from_slice(&4200u64.to_le_bytes());
        reply.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(
            decode_notify_reply(&reply),
            Some(Notified {
                acked: vec![(4151, 7)],
                missed: vec![(4200, 9)],
            })
        );
        assert_eq!(decode_notify_reply(&reply[..reply.len() - 1]), None);
        assert_eq!(decode_notify_reply(&[]), Some(Notified::default()));
    }
}
