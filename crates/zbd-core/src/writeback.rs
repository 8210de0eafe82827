//! Segment write-back outside the state lock.
//!
//! Sealing a segment (records, checksums) needs the state; handing its bytes to the storage does
//! not, and that hand-off is what used to stall everyone: a queued write woke an I/O thread
//! (now one per 256 KiB queued, backend/queued.rs), the scheduler ran it at once, and the thread that held
//! the state lock waited for a core (`docs/benchmarks-history.md`, "Write path"); a full queue also makes
//! the writer wait. So a sealed segment is pushed here under the state lock
//! (cheap: a move) and issued to the storage after the lock is released, by the thread that
//! sealed it or by whoever needs it on the storage first.
//!
//! Rules that keep this invisible to everyone else:
//! - **Order.** Segments are pushed under the state lock and issued in push order, one issuer at
//!   a time (`issue` lock), so the storage sees them in the order the state sealed them.
//! - **Reads.** A segment stays here until the storage has taken it (queued or written), so a
//!   reader that finds its block in no open extent looks here before it reads the storage
//!   (`find`, called under the state lock: the segment cannot be pushed concurrently).
//! - **Syncs.** Anything that syncs the storage to make segments durable (flush, checkpoint,
//!   the cleaner before it reads victims) calls `issue_all` first.
//! - **Errors.** A segment the storage refused stays at the front, visible to readers, and is
//!   tried again by the next `issue_all`: a flush cannot succeed past it.
//!
//! Lock order: state lock, then `issue`, then `pending`.

use crate::backend::Storage;
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// One sealed segment waiting to be issued.
struct Segment {
    /// Extent it belongs to.
    extent: u32,
    /// Byte offset within the extent.
    start: u32,
    /// Byte offset on the storage.
    offset: u64,
    bytes: Arc<[u8]>,
}

/// Sealed segments not yet handed to the storage.
#[derive(Default)]
pub struct Outbox {
    pending: Mutex<VecDeque<Segment>>,
    issue: Mutex<()>,
}

impl Outbox {
    /// Queues the sealed bytes of `extent` from byte `start` (storage offset `offset`).
    pub fn push(&self, extent: u32, start: usize, offset: u64, bytes: &[u8]) {
        self.pending.lock().push_back(Segment {
            extent,
            start: start as u32,
            offset,
            bytes: Arc::from(bytes),
        });
    }

    /// Whether nothing waits to be issued.
    pub fn is_empty(&self) -> bool {
        self.pending.lock().is_empty()
    }

    /// The stored bytes at `offset..offset + len` of `extent`, if a waiting segment holds them
    /// (the newest such segment; call under the state lock).
    pub fn find(&self, extent: u32, offset: u32, len: usize) -> Option<Vec<u8>> {
        let pending = self.pending.lock();
        pending.iter().rev().find_map(|s| {
            let from = offset.checked_sub(s.start)? as usize;
            (s.extent == extent && from + len <= s.bytes.len())
                .then(|| s.bytes[from..from + len].to_vec())
        })
    }

    /// Issues every waiting segment to `storage`, in push order. Returns once everything pushed
    /// before the call has been taken by the storage (or the first refusal).
    pub fn issue_all(&self, storage: &dyn Storage) -> Result<()> {
        let _issuer = self.issue.lock();
        loop {
            let next = {
                let pending = self.pending.lock();
                pending.front().map(|s| (s.offset, Arc::clone(&s.bytes)))
            };
            let Some((offset, bytes)) = next else {
                return Ok(());
            };
            // Still in `pending` while the storage takes it: readers keep finding it here.
            storage.write_shared(offset, &bytes)?;
            self.pending.lock().pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimStorage;

    #[test]
    fn segments_are_found_until_issued_and_refused_ones_stay() {
        let out = Outbox::default();
        out.push(3, 512, 10_000, &[1, 2, 3, 4]);
        out.push(3, 516, 10_004, &[5, 6]);
        assert_eq!(out.find(3, 513, 2), Some(vec![2, 3]));
        assert_eq!(out.find(3, 516, 2), Some(vec![5, 6]));
        assert_eq!(out.find(4, 513, 2), None);
        assert_eq!(
            out.find(3, 515, 2),
            None,
            "spans two segments: not one block"
        );
        let sim = SimStorage::new(20_000);
        out.issue_all(&sim).expect("issue");
        assert!(out.is_empty());
        assert_eq!(out.find(3, 513, 2), None);
        let mut b = [0u8; 6];
        sim.read_at(10_000, &mut b).expect("read back");
        assert_eq!(b, [1, 2, 3, 4, 5, 6]);
        // A write past the end of the storage is refused: the segment stays, readable.
        out.push(1, 0, 19_999, &[9, 9]);
        assert!(out.issue_all(&sim).is_err());
        assert_eq!(out.find(1, 0, 2), Some(vec![9, 9]));
    }
}
