//! Fault-injecting storages: a simulated disk that fails chosen calls with EIO while the
//! process goes on (unlike a power cut, which `SimStorage` models itself). Each storage says
//! which calls it fails in its [`Hooks`]; `hooked_storage!` forwards everything else to the
//! disk, so the delegation is written once.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use zbd_core::error::errno;
use zbd_core::{Error, Result, SimStorage};

/// What a fault-injecting storage does before each call reaches its disk: an error fails the
/// call without doing it.
pub trait Hooks {
    fn disk(&self) -> &SimStorage;
    fn before_read(&self, _offset: u64, _buf: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn before_write(&self, _offset: u64, _len: usize) -> Result<()> {
        Ok(())
    }
    fn before_sync(&self) -> Result<()> {
        Ok(())
    }
    fn before_discard(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    /// What it reports as `Storage::write_align`.
    fn align(&self) -> usize {
        512
    }
}

/// `Storage` for types implementing [`Hooks`] (a blanket impl of the foreign trait is not
/// allowed, hence the macro).
macro_rules! hooked_storage {
    ($($t:ty),* $(,)?) => {$(
        impl zbd_core::Storage for $t {
            fn len_bytes(&self) -> Result<u64> {
                self.disk().len_bytes()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
                self.before_read(offset, buf)?;
                self.disk().read_at(offset, buf)
            }
            fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
                self.before_write(offset, data.len())?;
                self.disk().write_at(offset, data)
            }
            fn sync(&self) -> Result<()> {
                self.before_sync()?;
                self.disk().sync()
            }
            fn discard(&self, offset: u64, len: u64) -> Result<()> {
                self.before_discard(offset, len)?;
                self.disk().discard(offset, len)
            }
            fn write_align(&self) -> usize {
                self.align()
            }
        }
    )*};
}

hooked_storage!(
    NoDiscard,
    OneFault,
    FailOneWrite,
    FailWriteIn,
    Faulty,
    BadSpot,
    FourKn
);

/// The error every storage here injects.
pub fn eio() -> Error {
    Error::Io(std::io::Error::other("injected EIO"))
}

/// A disk whose discard (hole punch / block discard) always fails with EIO, e.g. a device that
/// rejects the request: discard only gives space back, so the volume must carry on. Extents
/// reused on it always still hold their previous life's segments.
pub struct NoDiscard(pub Arc<SimStorage>);

impl Hooks for NoDiscard {
    fn disk(&self) -> &SimStorage {
        &self.0
    }
    fn before_discard(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(Error::Io(std::io::Error::other("discard rejected")))
    }
}

/// A disk on which exactly one storage operation (read, write, sync or discard, counted from
/// when the fault is armed) fails with EIO; the process goes on, unlike a power cut.
pub struct OneFault {
    pub disk: Arc<SimStorage>,
    pub countdown: AtomicI64,
}

impl OneFault {
    fn hit(&self) -> Result<()> {
        if self.countdown.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(eio());
        }
        Ok(())
    }
}

impl Hooks for OneFault {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_read(&self, _offset: u64, _buf: &mut [u8]) -> Result<()> {
        self.hit()
    }
    fn before_write(&self, _offset: u64, _len: usize) -> Result<()> {
        self.hit()
    }
    fn before_sync(&self) -> Result<()> {
        self.hit()
    }
    fn before_discard(&self, _offset: u64, _len: u64) -> Result<()> {
        self.hit()
    }
}

/// Fails the first write it is given after `armed` is set, once; everything else passes through.
pub struct FailOneWrite {
    pub disk: Arc<SimStorage>,
    pub armed: AtomicBool,
}

impl Hooks for FailOneWrite {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_write(&self, _offset: u64, _len: usize) -> Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(errno::EIO)));
        }
        Ok(())
    }
}

/// Fails, once armed, the first write that starts in `range` (a transient EIO); the rest pass.
pub struct FailWriteIn {
    pub disk: Arc<SimStorage>,
    pub range: Mutex<Option<Range<u64>>>,
}

impl Hooks for FailWriteIn {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_write(&self, offset: u64, _len: usize) -> Result<()> {
        let mut r = self.range.lock().expect("lock");
        if r.as_ref().is_some_and(|r| r.contains(&offset)) {
            *r = None;
            return Err(Error::Io(std::io::Error::other("transient EIO")));
        }
        Ok(())
    }
}

/// Which storage call a [`Faulty`] disk fails.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// The n-th write from arming (1 = the next).
    Write(u64),
    /// The n-th read of a whole extent from arming: a cleaning pass reading a victim (host
    /// reads here are of 1..4 blocks).
    VictimRead(u64),
}

/// A simulated disk failing one chosen call with EIO (failed syncs come from the simulator).
pub struct Faulty {
    pub disk: Arc<SimStorage>,
    pub extent_bytes: usize,
    pub fault: Mutex<Option<(Fault, u64)>>,
    /// Faults injected.
    pub hit: AtomicU64,
}

impl Faulty {
    pub fn arm(&self, f: Fault) {
        *self.fault.lock().expect("lock") = Some((f, 0));
    }

    fn fails(&self, write: bool, len: usize) -> bool {
        let mut g = self.fault.lock().expect("lock");
        let hit = match &mut *g {
            Some((Fault::Write(n), seen)) if write => {
                *seen += 1;
                *seen == *n
            }
            Some((Fault::VictimRead(n), seen)) if !write && len == self.extent_bytes => {
                *seen += 1;
                *seen == *n
            }
            _ => false,
        };
        if hit {
            *g = None;
            self.hit.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }
}

impl Hooks for Faulty {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_read(&self, _offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.fails(false, buf.len()) {
            // Garbage where the read failed: an error lost on the way must show as bad data.
            buf.fill(0x5a);
            return Err(eio());
        }
        Ok(())
    }
    fn before_write(&self, _offset: u64, len: usize) -> Result<()> {
        if self.fails(true, len) {
            return Err(eio());
        }
        Ok(())
    }
}

/// Reads of one byte range fail (EIO) once armed: a bad spot on the medium.
pub struct BadSpot {
    pub disk: Arc<SimStorage>,
    pub range: Range<u64>,
    pub armed: AtomicBool,
    pub failed: AtomicU64,
}

impl Hooks for BadSpot {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset + buf.len() as u64;
        if self.armed.load(Ordering::SeqCst) && offset < self.range.end && end > self.range.start {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(eio());
        }
        Ok(())
    }
}

/// A simulated disk with 4 KiB logical blocks: it refuses (and counts) any write or discard that
/// does not cover whole blocks, as O_DIRECT on a 4Kn device does.
pub struct FourKn {
    pub disk: Arc<SimStorage>,
    pub unaligned: AtomicU64,
    pub writes: AtomicU64,
}

impl FourKn {
    pub const BLOCK: u64 = 4096;

    pub fn new(disk: &Arc<SimStorage>) -> Arc<FourKn> {
        Arc::new(FourKn {
            disk: Arc::clone(disk),
            unaligned: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if !offset.is_multiple_of(Self::BLOCK) || !len.is_multiple_of(Self::BLOCK) {
            self.unaligned.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Io(std::io::Error::other(format!(
                "unaligned write of {len} bytes at {offset}"
            ))));
        }
        Ok(())
    }
}

impl Hooks for FourKn {
    fn disk(&self) -> &SimStorage {
        &self.disk
    }
    fn before_write(&self, offset: u64, len: usize) -> Result<()> {
        self.check(offset, len as u64)
    }
    fn before_discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)
    }
    fn align(&self) -> usize {
        Self::BLOCK as usize
    }
}
