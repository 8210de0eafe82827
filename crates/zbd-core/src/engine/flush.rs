//! Flush and checkpoint: seal pending segments and sync; checkpoints written outside the state
//! lock (three phases, engine/state/checkpoint.rs), asked for by writes and run in the
//! background thread or by the writer.

use super::*;
use crate::backend::Storage;
use crate::error::Result;
use crate::state::State;
use std::sync::atomic::Ordering;

impl Inner {
    /// A write saw the allocation queue ask for its refill (`State::ckpt_wanted`): the
    /// background thread writes the checkpoint when there is one, while this write returns
    /// and later ones go on with the queue's last eighth (`buffer::refill_at`); a write that
    /// finds the queue that low waits for it (`wait_for_queue_refill`). On this machine's disk
    /// a sequential writer spent about half its time in these syncs (issue 13). A checkpoint
    /// is not what makes writes durable (a flush is), so the write need not wait for it; a
    /// failed sync there trips the fence and fails every later write and flush.
    pub(super) fn checkpoint_asked(&self) -> Result<()> {
        if self.ckpt_in_background.load(Ordering::Relaxed) {
            self.ckpt_requested.store(true, Ordering::Release);
            return Ok(());
        }
        self.checkpoint_unlocked(true)
    }

    /// Whether writes leave their checkpoints to a background thread (volume.rs), which then
    /// takes them with [`Inner::take_checkpoint_request`].
    pub(crate) fn checkpoint_in_background(&self, on: bool) {
        self.ckpt_in_background.store(on, Ordering::Relaxed);
    }

    /// A checkpoint a write asked for since the last call (cleared by the call).
    pub(crate) fn take_checkpoint_request(&self) -> bool {
        self.ckpt_requested.swap(false, Ordering::AcqRel)
    }

    /// Makes everything written so far durable.
    pub fn flush(&self) -> Result<()> {
        self.check_writable()?;
        let covered = {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            st.write_pending(&cx)?;
            st.counters.flushes += 1;
            st.next_seq - 1
        };
        // Nothing recorded since a sync that succeeded (a FLUSH right after a FUA write or a
        // checkpoint, an idle file system's periodic flush): every record up to `covered` was
        // sealed, issued and synced by it, so a second device flush would buy nothing. Records
        // are sealed before their sequence counts as durable (write_pending above, and the
        // checkpoint's phase 1), and a trim that extends a record extends one still pending,
        // whose sequence is above `durable_seq`.
        if covered <= self.durable_seq.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Sync outside the lock: reads and writes go on meanwhile. Segments written after this
        // point belong to later flushes; the ones above are covered by this sync. Only once it
        // succeeded do they count as durable (a failed sync stops the volume: backend/fence.rs).
        self.issue_sealed()?;
        self.storage.sync()?;
        self.durable_seq.fetch_max(covered, Ordering::SeqCst);
        Ok(())
    }

    /// Writes a checkpoint now (bounded recovery; normally automatic).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        self.checkpoint_unlocked(false)
    }

    /// Writes a checkpoint in three phases (state/checkpoint.rs, `begin_checkpoint`): the snapshot under
    /// the state lock, its writes and syncs with the lock released (reads and writes go on),
    /// the commit under the lock again. A second caller waits for the first (`ckpt_lock`); a
    /// thread that must checkpoint with the state lock held waits for and commits the one in
    /// flight instead (`State::join_checkpoint`). `if_wanted`: only if one is still wanted
    /// (`State::ckpt_wanted`: several writers may have seen the wish; the first one does it).
    pub(crate) fn checkpoint_unlocked(&self, if_wanted: bool) -> Result<()> {
        let _one = self.ckpt_lock.lock();
        let cx = self.ctx();
        let io = {
            let mut st = self.lock_for_write();
            if if_wanted && !st.ckpt_wanted {
                return Ok(());
            }
            self.sync_read_counters(&mut st);
            st.begin_checkpoint(&cx)?
        };
        let r = io.run(&cx);
        let mut st = self.state.lock();
        st.finish_checkpoint(&cx, io.seq, r)
    }

    pub(super) fn sync_read_counters(&self, st: &mut State) {
        st.counters.host_bytes_read = self.host_bytes_read.load(Ordering::Relaxed);
        st.counters.storage_bytes_read = self.storage_bytes_read.load(Ordering::Relaxed);
        st.counters.corrupt_reads = self.corrupt_reads.load(Ordering::Relaxed);
    }
}
