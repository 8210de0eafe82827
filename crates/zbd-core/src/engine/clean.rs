//! Running the cleaner: ahead of writers that would run short of extents, in the background
//! between the watermarks, and offline (`compact`). The choice of victims and the copying are
//! `cleaner/`.

use super::*;
use crate::error::{Error, Result};
use crate::extents::ExtentState;
use crate::state::{Consumer, State};
use std::sync::atomic::Ordering;

impl Inner {
    /// Says in the log, at most once a minute, that writers clean in the foreground: the
    /// background cleaner is not keeping up (or the volume is nearly full of live data).
    fn log_falling_behind(&self) {
        const EVERY_S: u64 = 60;
        let now = self.opened_at.elapsed().as_secs() + 1;
        let last = self.behind_logged_at.load(Ordering::Relaxed);
        if (last == 0 || now >= last + EVERY_S)
            && self
                .behind_logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let free = self.state.lock().free_now();
            tracing::warn!(
                "cleaner falling behind: writes are cleaning in the foreground ({free} of {} \
                 extents free)",
                self.sb.extent_count
            );
        }
    }

    /// Foreground cleaning with the state lock released between its steps (issue 9). A write
    /// that may open extents down to the point where opening one cleans under the state lock
    /// (`State::space_short_for`, `cleaner::make_space`) cleans first, the way the background
    /// cleaner does: victims read and outputs issued without the lock, the checkpoint that
    /// frees them in three phases, until make_space's goal. Reads wait for neither; make_space
    /// stays for writers that outrun this. At most once per extent opened (`extents_opened`),
    /// like make_space: on a volume at its guaranteed overwrite fraction space is short all the
    /// time, and cleaning before every write would run passes that gain nothing. Writers that
    /// find one cleaning wait for it, without the state lock.
    pub(super) fn clean_ahead(&self, bytes: usize) -> Result<()> {
        let need = bytes.div_ceil(self.sb.extent_bytes as usize) + 1;
        let due = |st: &State| {
            st.space_short_for(need)
                && st.extents_opened != self.clean_ahead_opened.load(Ordering::Relaxed)
        };
        if !due(&self.state.lock()) {
            return Ok(());
        }
        let _one = self.clean_ahead_lock.lock();
        if !due(&self.state.lock()) {
            // Another writer cleaned meanwhile.
            return Ok(());
        }
        self.log_falling_behind();
        self.foreground_passes()?;
        let opened = self.state.lock().extents_opened;
        self.clean_ahead_opened.store(opened, Ordering::Relaxed);
        Ok(())
    }

    /// A writer whose placement found space short (bit 10: no cleaning under the lock, docs/
    /// design.md "Room first, sequence last") waits for the round in flight and, if space is
    /// still short, runs its own, whatever `clean_ahead`'s pacing says; then it places again.
    /// True when the round freed nothing and the writer's next placement may take extents
    /// down to the cleaner's floor, as v2's does after `make_space` (`State::below_host_floor`).
    /// `NoSpace` when not even those are left and no extent waits for a checkpoint to be freed:
    /// a full volume fails writes rather than making them wait for nothing.
    pub(super) fn space_short_round(&self) -> Result<bool> {
        let _one = self.clean_ahead_lock.lock();
        let short = |st: &State| st.free_now() <= st.floor(Consumer::HostWrite);
        {
            let mut st = self.state.lock();
            st.space_short_rounds += 1;
            if !short(&st) {
                // The round in flight (or trims, or a checkpoint) made room meanwhile.
                return Ok(false);
            }
        }
        self.log_falling_behind();
        // Extents without live data only wait for a checkpoint: the cheapest space there is,
        // and room for the passes' outputs.
        if self.state.lock().extents.count(ExtentState::PendingFree) > 0 {
            self.checkpoint_unlocked(false)?;
            if !short(&self.state.lock()) {
                return Ok(false);
            }
        }
        if self.foreground_passes()? > 0 {
            return Ok(false);
        }
        let st = self.state.lock();
        if !short(&st) {
            Ok(false)
        } else if st.free_now() > st.floor(Consumer::AfterCleaning) {
            Ok(true)
        } else {
            Err(Error::NoSpace)
        }
    }

    /// Foreground passes with the state lock released between steps, until `make_space`'s
    /// goal or a pass that gains nothing; the victims they empty are freed by a checkpoint
    /// before it returns. Returns the victims emptied (cleaning gain).
    fn foreground_passes(&self) -> Result<usize> {
        let cx = self.ctx();
        let mut gained = 0usize;
        let mut reclaimed = 0usize;
        for _ in 0..crate::cleaner::FOREGROUND_PASSES_MAX {
            let (short, refill) = {
                let st = self.state.lock();
                // A pass takes its outputs from the allocation queue and, finding it empty,
                // refills it with a checkpoint under the lock: refill it first, outside (from
                // the free list and the extents emptied since the last checkpoint).
                let low = st.queue.len() <= crate::buffer::refill_at(&self.sb);
                let refill = low
                    && (st.free.len() > 0
                        || reclaimed > 0
                        || st.extents.count(ExtentState::PendingFree) > 0);
                (st.space_short_after(reclaimed), refill)
            };
            if !short {
                break;
            }
            if refill {
                self.checkpoint_unlocked(false)?;
                reclaimed = 0;
            }
            let r = crate::cleaner::pass_unlocked(&|| self.lock_for_write(), &cx)?;
            self.issue_sealed()?;
            reclaimed += r.reclaimed;
            if !r.progressed() {
                break;
            }
            gained += r.reclaimed - r.outputs;
        }
        // Victims emptied by the passes are free once a checkpoint no longer references them.
        if reclaimed > 0 {
            self.checkpoint_unlocked(false)?;
        }
        Ok(gained)
    }

    /// Extents free now (queued or on the free list).
    pub(crate) fn free_extents(&self) -> usize {
        self.state.lock().free_now()
    }

    /// Whether free extents are below the low watermark (cheap; called after writes).
    pub(crate) fn below_low_watermark(&self) -> bool {
        let st = self.state.lock();
        self.below_low(&st)
    }

    /// The low watermark, raised to the foreground goal when a large space reserve sits above
    /// it: the background cleaner starts before host writes would clean themselves.
    fn below_low(&self, st: &State) -> bool {
        st.free_now() * 100 < self.clean_low_pct as usize * st.extents.data_len()
            || (st.reserve_held() > 0 && st.free_now() <= st.clean_goal())
    }

    /// One background cleaning round: passes until free extents reach the high watermark or no
    /// pass makes progress. Each pass takes the state lock anew, so host I/O interleaves.
    pub(crate) fn background_round(&self) -> Result<()> {
        if self.read_only || self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        {
            let st = self.state.lock();
            let idle = self.clean_idle_seq.load(Ordering::Relaxed) == st.next_seq;
            if idle || !self.below_low(&st) {
                return Ok(());
            }
        }
        // Victims turn into free extents at a checkpoint (three syncs): batch a few passes.
        const CHECKPOINT_AFTER_RECLAIMED: usize = 32;
        let mut pending = 0usize;
        loop {
            let cx = self.ctx();
            // Victims are read without the state lock; it is taken to choose and to commit.
            let r = {
                // On bit 10 a writer at "space short" waits for this pass (its round could
                // find every victim taken). v2 writers clean beside it, and take its victims
                // back under the lock when they must (`make_space`).
                let cleans_unlocked = self.state.lock().cleans_unlocked();
                let _one = cleans_unlocked.then(|| self.clean_ahead_lock.lock());
                crate::cleaner::pass_unlocked(&|| self.lock_for_write(), &cx)?
            };
            let (done, checkpoint, wanted) = {
                let st = self.lock_for_write();
                pending += r.reclaimed;
                let total = st.extents.data_len();
                let done = !r.progressed()
                    || (st.free_now() + pending) * 100 >= self.clean_high_pct as usize * total;
                let checkpoint = pending > 0
                    && (done
                        || pending >= CHECKPOINT_AFTER_RECLAIMED
                        || st.free_now() <= st.floor(Consumer::HostWrite));
                if !r.progressed() {
                    self.clean_idle_seq.store(st.next_seq, Ordering::Relaxed);
                }
                (done, checkpoint, st.ckpt_wanted)
            };
            // The outputs went to the outbox under the lock: issue them now.
            self.issue_sealed()?;
            // Outside the state lock: host I/O goes on during its syncs. Also when the passes'
            // outputs brought the allocation queue low (`State::alloc`).
            if checkpoint {
                self.checkpoint_unlocked(false)?;
                pending = 0;
            } else if wanted {
                self.checkpoint_unlocked(true)?;
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Offline compaction: cleans every extent with dead space, least live first, until no pass
    /// frees anything. `progress(done, total)` counts candidate extents.
    pub(crate) fn compact(
        &self,
        progress: &dyn Fn(u64, u64),
    ) -> Result<crate::cleaner::PassResult> {
        self.check_writable()?;
        let mut total = crate::cleaner::PassResult::default();
        let mut st = self.state.lock();
        let cx = self.ctx();
        let n = st.buffer.len();
        for i in (0..n).rev() {
            st.close_open(&cx, i)?;
        }
        st.checkpoint(&cx)?;
        let candidates = |st: &State| st.extents.count(ExtentState::Closed) as u64;
        let first = candidates(&st);
        loop {
            let r = crate::cleaner::pass(&mut st, &cx, crate::cleaner::Mode::Compact)?;
            if r.reclaimed > 0 {
                st.checkpoint(&cx)?;
            }
            total.victims += r.victims;
            total.reclaimed += r.reclaimed;
            total.outputs += r.outputs;
            total.bytes_moved += r.bytes_moved;
            progress(first.saturating_sub(candidates(&st)).min(first), first);
            if !r.progressed() {
                break;
            }
        }
        // Then the blocks of older dictionaries move to the current one, batch by batch (each
        // batch's victims are freed by the checkpoint after it), so those can be retired. One
        // map walk finds them; a batch that does not fit the free extents is skipped.
        let todo = crate::cleaner::migrate_candidates(&mut st, &cx)?;
        for batch in todo.chunks(crate::cleaner::MIGRATE_BATCH) {
            let r = crate::cleaner::migrate(&mut st, &cx, batch.to_vec())?;
            if r.victims == 0 {
                continue;
            }
            st.checkpoint(&cx)?;
            total.victims += r.victims;
            total.reclaimed += r.reclaimed;
            total.outputs += r.outputs;
            total.bytes_moved += r.bytes_moved;
        }
        progress(first, first);
        // Then the slot of each page pair that does not hold the page goes back to the backing
        // file, after one more checkpoint: if it moved no page, the one before it (an open's
        // fallback) names the same slots (`MetaStore::discard_stale_slots`).
        st.checkpoint(&cx)?;
        st.checkpoint(&cx)?;
        if let crate::map::VolumeMap::Tree(t) = &mut st.map {
            total.metadata_bytes_discarded =
                t.discard_stale_slots(|offset, len| cx.storage.discard(offset, len))?;
        }
        drop(st);
        self.issue_sealed()?;
        Ok(total)
    }
}
