//! The failed state (docs/design.md, "Failed syncs"): the first failed write, sync or metadata
//! write stops the volume from writing anything more until it is reopened.
//!
//! On Linux a failed fsync drops the dirty pages it was meant to persist, reports the error
//! once, and the next fsync succeeds ("fsyncgate"). Trusting that next sync would count lost
//! bytes as durable, so after any failure nothing is written or synced again: writes, flushes
//! and trims fail with EIO, reads are still served, and reopening recovers from what is really
//! on disk (roll-forward checks every segment). Every write path goes through this wrapper, so
//! the rule holds for flush, FUA, checkpoints, the cleaner, discards and segment write-back alike.

use crate::backend::Storage;
use crate::error::{Error, Result};
use parking_lot::Mutex;

/// A [`Storage`] that trips into the failed state on the first write or sync error.
pub(crate) struct Fenced {
    inner: Box<dyn Storage>,
    /// Why the volume failed; `None` while healthy.
    failed: Mutex<Option<String>>,
    /// Syncs run one at a time: a sync that started after another one failed must not report
    /// success for writes the failed one dropped.
    sync_lock: Mutex<()>,
}

impl Fenced {
    pub(crate) fn new(inner: Box<dyn Storage>) -> Fenced {
        Fenced {
            inner,
            failed: Mutex::new(None),
            sync_lock: Mutex::new(()),
        }
    }

    /// Why the volume stopped writing, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// `Err(Failed)` once the volume has failed.
    pub(crate) fn check(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(why) => Err(Error::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn trip<T>(&self, what: &str, r: Result<T>) -> Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let mut failed = self.failed.lock();
        if failed.is_none() {
            let why = format!("{what} failed: {e}");
            tracing::error!(
                "zbd volume stopped writing: {why}; reads go on, reopen the volume to recover \
                 from what is on disk"
            );
            *failed = Some(why);
        }
        Err(e)
    }
}

impl Storage for Fenced {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }

    fn write_align(&self) -> usize {
        self.inner.write_align()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check()?;
        self.trip("a write", self.inner.write_at(offset, data))
    }

    fn write_shared(&self, offset: u64, data: &std::sync::Arc<[u8]>) -> Result<()> {
        self.check()?;
        self.trip("a write", self.inner.write_shared(offset, data))
    }

    fn sync(&self) -> Result<()> {
        let _one = self.sync_lock.lock();
        self.check()?;
        self.trip("a sync", self.inner.sync())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        // Best effort (a device may refuse): its error never fails the volume, but a failed
        // volume releases nothing either.
        self.check()?;
        self.inner.discard(offset, len)
    }

    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        self.inner.read_many(reads)
    }
}
