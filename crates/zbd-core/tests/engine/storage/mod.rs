//! The storage backends under a volume: real files (buffered and O_DIRECT), a loop block
//! device (512-byte and 4 KiB sectors) and RAM. Guards against backend-specific loss: misaligned direct I/O, discards that
//! write, stripes of RAM read or written wrongly.

mod aligned;
mod block_device;
mod direct;
mod file;
mod ram;
mod review14;

/// A process these tests start (`losetup`) holds a copy of every file open in the test binary
/// for the instant between its fork and its exec, and with it the `flock` of a volume: a test
/// that closes a volume and reopens it in that instant finds it "in use". Tests hold this while
/// they start a process, and from closing a volume to reopening it.
static FORK_GUARD: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn fork_guard() -> std::sync::MutexGuard<'static, ()> {
    FORK_GUARD.lock().unwrap_or_else(|e| e.into_inner())
}
