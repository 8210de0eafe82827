//! Hints and repairs: what lets a frame read without the state lock be trusted, and a page found
//! with one bad copy be rewritten later by a counted checkpoint (docs/design.md, "Shared blocks":
//! "Counted pages", "Prefetch, re-check"; "RAM at 16 TiB"; "Build order" 1b.1).
//!
//! [`WrittenSets`] keeps the ids each of the last 64 commits wrote and, beside them, the last
//! commit that wrote each id, so the hint rule is one lookup (R6-B1, R7-C2). A page's current slot,
//! and that slot's content, change only at a commit that writes its id; so a frame read after the
//! reader noted commit `c` is the page's current content if no commit after `c` wrote the id (a
//! double flip A -> B -> A included, which comparing pair states alone would miss).
//!
//! [`RepairList`] holds the pages to rewrite (R8-E2): a read that finds one bad copy of a page's
//! current slot installs the good copy's frame clean and queues the id, and each phase 1 takes as
//! many entries as its interval has room for and dirties them, so no step counts or reserves
//! anything for repairs. A queue attempt on a full list goes to a bounded re-read set (R9-C4),
//! which `zbd-cleaner` works through a batch after each commit (R10-C1); past that bound only a
//! sticky "scrub needed" flag remains.
//!
//! Pure data structures: no I/O and no lock of their own; the caller holds the state lock for
//! every call.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::error::{Error, Result};
use crate::format::PairState;

/// Commits whose written sets the ring keeps ("Prefetch, re-check", R6-B1): a read noted longer
/// ago can no longer be checked by the id map, so its frame is dropped (~880 KiB of sets and ~3
/// MiB of map at 16 TiB: "RAM at 16 TiB").
pub const HINT_COMMITS_MAX: u64 = 64;
/// Entries on the repair list ("Counted pages", R9-E3): their frames stay resident while listed,
/// so the list is the `64` of the page pool's floor (`8,192 + 64 + F + 2S + 2R`).
pub const REPAIR_LIST_MAX: usize = 64;
/// Ids the re-read set holds when the list is full (R9-C4): 256 KiB at 4 bytes each ("RAM at 16
/// TiB"); an id past it is forgotten and sets "scrub needed".
pub const REREAD_SET_MAX: usize = 65_536;
/// Ids of the re-read set handed out after each commit (R10-C1): bounded work for `zbd-cleaner`,
/// which re-reads their copies without the lock; 1,024 commits go once through a full set.
pub const REREAD_BATCH: usize = 64;

/// Why a frame read without the lock is not installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintDrop {
    /// The id is resident: the cache's frame is at least as new (caller's condition).
    Resident,
    /// The id's pair state (page bits and list entry) changed since the read was issued: it was
    /// freed, allocated or flipped in the open interval (caller's condition).
    PairStateChanged,
    /// The read was issued more than [`HINT_COMMITS_MAX`] commits ago (or before the ring began):
    /// some commit since then may have written the id and left the ring.
    TooOld,
    /// A commit after the noted one wrote the id: the slot read may no longer be current.
    Stale {
        /// The last commit that wrote it.
        written_by: u64,
    },
}

/// What the caller finds under the lock when a frame read without it comes back: the two
/// conditions of the hint rule that are not about commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recheck {
    /// The id is still absent from the cache.
    pub absent: bool,
    /// The id's pair state equals the one taken, under the lock, before the read was issued.
    pub same_pair_state: bool,
}

/// The written sets of the last [`HINT_COMMITS_MAX`] commits and the map from id to the last of
/// them that wrote it.
#[derive(Debug)]
pub struct WrittenSets {
    /// (commit, the sorted ids it wrote), oldest first.
    ring: VecDeque<(u64, Vec<u32>)>,
    /// Id -> last commit in the ring that wrote it; holds exactly the ids of the ring's sets.
    /// A std map takes ~20-40 bytes an entry against "RAM at 16 TiB"'s ~14 (3 MiB for 224,896):
    /// at most ~9 MiB, to be packed if the pool's budget needs it.
    last: HashMap<u32, u64>,
    /// Every commit after this one is in the ring: the counter at open, then the newest commit
    /// whose set left the ring.
    floor: u64,
    /// The newest commit published (the counter at open before any).
    latest: u64,
}

impl WrittenSets {
    /// An empty ring on a volume whose commit counter (the sequence of the last committed
    /// checkpoint) is `commit`: writes of commits up to it are not known, so a read noted before
    /// it is [`TooOld`](HintDrop::TooOld).
    pub fn new(commit: u64) -> WrittenSets {
        WrittenSets {
            ring: VecDeque::new(),
            last: HashMap::new(),
            floor: commit,
            latest: commit,
        }
    }

    /// The newest commit published: the volume's commit counter.
    pub fn latest(&self) -> u64 {
        self.latest
    }

    /// A commit's written set, published under the lock as it commits: the ids whose pages it
    /// wrote, in any order. The set 64 commits older leaves the ring, and with it the map
    /// entries that still name that commit (a later write of the same id keeps its own entry).
    /// Commits must increase: anything else is a caller's error, refused.
    pub fn publish(&mut self, commit: u64, mut ids: Vec<u32>) -> Result<()> {
        if commit <= self.latest {
            return Err(Error::Invalid(format!(
                "written set of commit {commit} published after commit {}: commits must increase",
                self.latest
            )));
        }
        ids.sort_unstable();
        ids.dedup();
        for &id in &ids {
            self.last.insert(id, commit);
        }
        self.ring.push_back((commit, ids));
        self.latest = commit;
        while self.ring.len() as u64 > HINT_COMMITS_MAX {
            let Some((old, ids)) = self.ring.pop_front() else {
                break;
            };
            for id in ids {
                if self.last.get(&id) == Some(&old) {
                    self.last.remove(&id);
                }
            }
            self.floor = old;
        }
        Ok(())
    }

    /// The last commit in the ring that wrote `id`, if any did.
    pub fn last_write(&self, id: u32) -> Option<u64> {
        self.last.get(&id).copied()
    }

    /// Whether the ring holds every commit after `noted`, so [`last_write`](Self::last_write)
    /// answers for all of them. Counting commits, not counter values: a volume whose counter
    /// skipped values would still be covered for 64 commits.
    pub fn covers(&self, noted: u64) -> bool {
        self.floor <= noted && noted <= self.latest
    }

    /// Ids the map holds (at most 64 x 3,514 = 224,896 at 16 TiB), for `zbd stat`.
    pub fn tracked_ids(&self) -> usize {
        self.last.len()
    }

    /// The hint rule: may a frame of `id`, read without the lock after the commit counter was
    /// `noted` (taken under the lock before the read was issued), be installed now? Only if the
    /// id is still absent and its pair state unchanged (`recheck`, the caller's part), the ring
    /// covers every commit since `noted`, and none of them wrote the id. Reasons are checked in
    /// [`HintDrop`]'s order. The caller faults a dropped page under the lock when it needs it,
    /// and does not read a page dropped twice a third time without the lock.
    pub fn hint(&self, id: u32, noted: u64, recheck: Recheck) -> std::result::Result<(), HintDrop> {
        debug_assert!(
            noted <= self.latest,
            "noted commit {noted} is after the latest, {}",
            self.latest
        );
        if !recheck.absent {
            return Err(HintDrop::Resident);
        }
        if !recheck.same_pair_state {
            return Err(HintDrop::PairStateChanged);
        }
        // A noted commit from the future is a caller's bug; dropping is the safe answer.
        if !self.covers(noted) {
            return Err(HintDrop::TooOld);
        }
        match self.last_write(id) {
            Some(written_by) if written_by > noted => Err(HintDrop::Stale { written_by }),
            _ => Ok(()),
        }
    }
}

/// A page to rewrite: one copy of its current slot was found bad by a read whose good copy was
/// installed clean or was resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repair {
    /// The page id.
    pub id: u32,
    /// The commit counter taken under the lock before the read was issued (for a locked fault,
    /// the counter at the fault).
    pub noted: u64,
    /// The pair state the read noted: carried to the caller of [`RepairList::phase1`] for its
    /// debug check that a page phase 1 dirties equals its durable copy (R8-E2). No rule here
    /// reads it: phase 1 decides from RAM facts alone, never a pair state (R9-D1).
    pub state: PairState,
}

/// Where a queue attempt put the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// A new entry at the end of the list.
    Listed,
    /// The id was listed already: its entry keeps its place, and takes this read's counter and
    /// pair state if that counter is at least as new.
    AlreadyListed,
    /// The list was full: the id is in the re-read set (it may have been there already).
    Reread,
    /// The list and the re-read set were full: the id is forgotten and "scrub needed" is set.
    Overflow,
}

/// The repair list, its re-read set and the "scrub needed" flag.
#[derive(Debug)]
pub struct RepairList {
    /// Entries in queue order, one per id.
    entries: Vec<Repair>,
    /// Ids waiting to be re-read. Ordered by id, so a batch reads neighbouring pairs together
    /// and a sweep (`reread_next`) reaches every id before any comes round again. A B-tree takes
    /// about twice the design's 4 bytes an id (~0.5 MiB full, not 0.25); a sorted array would
    /// take 4 but move up to 256 KiB under the lock per insert.
    reread: BTreeSet<u32>,
    /// Where the next batch starts: one past the last id handed out.
    reread_next: u32,
    /// Sticky: an id was forgotten because the re-read set was full.
    scrub_needed: bool,
    /// [`REPAIR_LIST_MAX`], [`REREAD_SET_MAX`], [`REREAD_BATCH`] (smaller in tests).
    list_max: usize,
    reread_max: usize,
    batch: usize,
}

impl Default for RepairList {
    fn default() -> RepairList {
        RepairList::with_bounds(REPAIR_LIST_MAX, REREAD_SET_MAX, REREAD_BATCH)
    }
}

impl RepairList {
    /// An empty list with the design's bounds.
    pub fn new() -> RepairList {
        RepairList::default()
    }

    fn with_bounds(list_max: usize, reread_max: usize, batch: usize) -> RepairList {
        RepairList {
            entries: Vec::new(),
            reread: BTreeSet::new(),
            reread_next: 0,
            scrub_needed: false,
            list_max,
            reread_max,
            batch,
        }
    }

    /// Queues a repair, once per id. The caller queues only an id whose good copy's frame it
    /// installed or found resident (so the listed frame is the page's content), and keeps that
    /// frame resident while [`listed`](Self::listed). On a full list the id goes to the re-read
    /// set; scrub and the online check instead wait outside the lock while
    /// [`is_full`](Self::is_full).
    pub fn queue(&mut self, repair: Repair) -> Queued {
        if let Some(e) = self.entries.iter_mut().find(|e| e.id == repair.id) {
            // The newer read's finding stands: an entry kept at an older counter would be
            // dropped at phase 1 if the page flipped in between, though this read found the
            // new current slot bad.
            if repair.noted >= e.noted {
                *e = repair;
            }
            return Queued::AlreadyListed;
        }
        if self.entries.len() < self.list_max {
            self.reread.remove(&repair.id);
            self.entries.push(repair);
            return Queued::Listed;
        }
        self.send_to_reread(repair.id)
    }

    /// Puts `id` in the re-read set, or sets "scrub needed" if it is full.
    fn send_to_reread(&mut self, id: u32) -> Queued {
        if self.reread.contains(&id) || self.reread.len() < self.reread_max {
            self.reread.insert(id);
            Queued::Reread
        } else {
            self.scrub_needed = true;
            Queued::Overflow
        }
    }

    /// Whether `id` is on the list: the pool keeps its frame resident.
    pub fn listed(&self, id: u32) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    /// Entries on the list (at most [`REPAIR_LIST_MAX`]), for `zbd stat`.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entry is listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The list has no room: a new id would go to the re-read set.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.list_max
    }

    /// Ids in the re-read set (at most [`REREAD_SET_MAX`]), for `zbd stat`.
    pub fn reread_len(&self) -> usize {
        self.reread.len()
    }

    /// An id was forgotten because the re-read set was full; `zbd stat` says "scrub needed".
    /// Sticky: RAM only, and nothing here clears it.
    pub fn scrub_needed(&self) -> bool {
        self.scrub_needed
    }

    /// Phase 1's drop rule, from RAM alone (R9-D1, R9-E3): no pair-state read, no fault, no I/O.
    /// `current` is the commit counter, `room` how many counted pages the new interval has left
    /// for repairs after the allowances outstanding. In queue order, an entry is
    /// - dropped if `last_write` (the [`WrittenSets`] id map) names a commit after its noted one
    ///   (the page flipped: the bad copy is no longer current), if `freed` (the list holds a free
    ///   entry for the id, or on small lists the set of ids freed since the last commit has it),
    ///   or if `dirty` (the checkpoint writes the page anyway);
    /// - else moved to the re-read set if more than [`HINT_COMMITS_MAX`] commits old (the map no
    ///   longer covers every commit since), by counter difference: the counter moves by one per
    ///   commit, and a counter that skipped values would only move entries sooner;
    /// - else taken while fewer than `room` are taken, or left for a later phase 1.
    ///
    /// The taken entries leave the list; the caller dirties each and counts it toward the
    /// interval.
    pub fn phase1(
        &mut self,
        current: u64,
        room: usize,
        last_write: impl Fn(u32) -> Option<u64>,
        freed: impl Fn(u32) -> bool,
        dirty: impl Fn(u32) -> bool,
    ) -> Vec<Repair> {
        let mut taken = Vec::new();
        let mut old = Vec::new();
        self.entries.retain(|e| {
            let flipped = last_write(e.id).is_some_and(|c| c > e.noted);
            if flipped || freed(e.id) || dirty(e.id) {
                return false;
            }
            if current.saturating_sub(e.noted) > HINT_COMMITS_MAX {
                old.push(e.id);
                return false;
            }
            if taken.len() < room {
                taken.push(*e);
                return false;
            }
            true
        });
        for id in old {
            self.send_to_reread(id);
        }
        taken
    }

    /// The next at most [`REREAD_BATCH`] ids of the re-read set, taken out of it, for
    /// `zbd-cleaner` to re-read after a commit without the lock. The caller queues again (by
    /// [`queue`](Self::queue), under the lock, with the counter it noted before the read) each
    /// id whose current slot still has a bad copy, and, the safe reading, each whose re-read
    /// failed. Batches sweep the set in id order from where the last one stopped, so an id
    /// queued back waits for the rest. A batch is handed out whether or not the list has room:
    /// a re-read also clears ids whose copies are fine again, and one found bad on a full list
    /// goes back to the set, to be listed when room appears.
    pub fn reread_batch(&mut self) -> Vec<u32> {
        let out: Vec<u32> = self
            .reread
            .range(self.reread_next..)
            .chain(self.reread.range(..self.reread_next))
            .take(self.batch)
            .copied()
            .collect();
        for id in &out {
            self.reread.remove(id);
        }
        if let Some(&last) = out.last() {
            self.reread_next = last.wrapping_add(1);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FRESH: Recheck = Recheck {
        absent: true,
        same_pair_state: true,
    };

    #[test]
    fn a_double_flip_within_the_ring_still_drops_a_hint_noted_before_it() {
        let mut w = WrittenSets::new(10);
        // Read of id 7 issued at commit 10; commit 11 flips it A -> B, commit 12 back B -> A, so
        // its pair state is the one noted: only the written sets can tell.
        w.publish(11, vec![7, 3]).expect("publish");
        w.publish(12, vec![7]).expect("publish");
        assert_eq!(
            w.hint(7, 10, FRESH),
            Err(HintDrop::Stale { written_by: 12 })
        );
        assert_eq!(
            w.hint(7, 11, FRESH),
            Err(HintDrop::Stale { written_by: 12 })
        );
        // Noted at or after the last write: the read saw the current slot.
        assert_eq!(w.hint(7, 12, FRESH), Ok(()));
        // Other ids written by those commits do not drop it (revision 6's counter would).
        assert_eq!(w.hint(8, 10, FRESH), Ok(()));
        assert_eq!(w.hint(3, 11, FRESH), Ok(()));
        assert_eq!(
            w.hint(3, 10, FRESH),
            Err(HintDrop::Stale { written_by: 11 })
        );
        // Still dropped while commit 12's set is in the ring, 63 commits later.
        for c in 13..=75 {
            w.publish(c, vec![100 + c as u32]).expect("publish");
        }
        assert_eq!(w.latest() - 12, 63);
        assert_eq!(w.hint(7, 12, FRESH), Ok(()));
        assert_eq!(
            w.hint(7, 11, FRESH),
            Err(HintDrop::Stale { written_by: 12 })
        );
    }

    #[test]
    fn a_hint_is_dropped_past_64_commits_and_before_the_ring_began() {
        let mut w = WrittenSets::new(100);
        assert_eq!(w.hint(1, 99, FRESH), Err(HintDrop::TooOld), "before open");
        assert_eq!(w.hint(1, 100, FRESH), Ok(()));
        for c in 101..=164 {
            w.publish(c, vec![]).expect("publish");
        }
        // 64 commits since 100, all in the ring.
        assert_eq!(w.hint(1, 100, FRESH), Ok(()));
        w.publish(165, vec![]).expect("publish");
        // Commit 101 left the ring: a read noted at 100 is 65 commits old.
        assert_eq!(w.hint(1, 100, FRESH), Err(HintDrop::TooOld));
        assert_eq!(w.hint(1, 101, FRESH), Ok(()));
    }

    #[test]
    fn the_callers_conditions_drop_a_hint_first() {
        let mut w = WrittenSets::new(0);
        w.publish(1, vec![5]).expect("publish");
        let resident = Recheck {
            absent: false,
            ..FRESH
        };
        let moved = Recheck {
            same_pair_state: false,
            ..FRESH
        };
        assert_eq!(w.hint(6, 1, resident), Err(HintDrop::Resident));
        assert_eq!(w.hint(6, 1, moved), Err(HintDrop::PairStateChanged));
        assert_eq!(w.hint(5, 0, moved), Err(HintDrop::PairStateChanged));
        assert_eq!(w.hint(6, 1, FRESH), Ok(()));
    }

    #[test]
    fn a_set_leaving_the_ring_removes_only_entries_naming_its_commit() {
        let mut w = WrittenSets::new(0);
        w.publish(1, vec![2, 1, 2]).expect("publish");
        for c in 2..=64 {
            w.publish(c, if c == 10 { vec![2] } else { vec![] })
                .expect("publish");
        }
        assert_eq!((w.last_write(1), w.last_write(2)), (Some(1), Some(10)));
        assert_eq!(w.tracked_ids(), 2);
        w.publish(65, vec![]).expect("publish");
        assert_eq!(w.last_write(1), None, "commit 1 left the ring");
        assert_eq!(w.last_write(2), Some(10), "commit 10's entry stays");
        assert_eq!(w.tracked_ids(), 1);
        for c in 66..=74 {
            w.publish(c, vec![]).expect("publish");
        }
        assert_eq!(w.last_write(2), None);
        assert_eq!(w.tracked_ids(), 0);
    }

    #[test]
    fn publish_refuses_commits_that_do_not_increase() {
        let mut w = WrittenSets::new(5);
        assert!(w.publish(5, vec![1]).is_err());
        w.publish(7, vec![1]).expect("gaps are allowed");
        assert!(w.publish(6, vec![2]).is_err());
        assert!(w.publish(7, vec![2]).is_err());
        assert_eq!(
            (w.latest(), w.last_write(1), w.last_write(2)),
            (7, Some(7), None)
        );
    }

    fn repair(id: u32, noted: u64) -> Repair {
        Repair {
            id,
            noted,
            state: PairState::SlotA,
        }
    }

    /// Phase 1 with nothing flipped, freed or dirty.
    fn take(l: &mut RepairList, current: u64, room: usize) -> Vec<u32> {
        l.phase1(current, room, |_| None, |_| false, |_| false)
            .iter()
            .map(|r| r.id)
            .collect()
    }

    #[test]
    fn the_65th_entry_goes_to_the_reread_set() {
        let mut l = RepairList::new();
        for id in 0..64 {
            assert_eq!(l.queue(repair(id, 1)), Queued::Listed);
        }
        assert!(l.is_full());
        assert_eq!(l.queue(repair(64, 1)), Queued::Reread);
        assert_eq!((l.len(), l.reread_len()), (64, 1));
        assert!(!l.listed(64));
        assert!(l.listed(63));
        // A listed id on a full list stays listed, and is not also put in the re-read set.
        assert_eq!(l.queue(repair(5, 2)), Queued::AlreadyListed);
        assert_eq!(l.queue(repair(64, 2)), Queued::Reread, "once in the set");
        assert_eq!((l.len(), l.reread_len()), (64, 1));
        // With room, a re-read id is listed and leaves the set.
        assert_eq!(take(&mut l, 2, 1), vec![0]);
        assert_eq!(l.queue(repair(64, 2)), Queued::Listed);
        assert_eq!((l.len(), l.reread_len()), (64, 0));
        assert!(!l.scrub_needed());
    }

    #[test]
    fn the_65537th_reread_id_sets_scrub_needed_for_good() {
        let mut l = RepairList::new();
        for id in 0..64 {
            l.queue(repair(id, 1));
        }
        for id in 64..64 + 65_536 {
            assert_eq!(l.queue(repair(id, 1)), Queued::Reread);
        }
        assert_eq!(l.reread_len(), REREAD_SET_MAX);
        assert!(!l.scrub_needed());
        // An id already in the full set is no overflow.
        assert_eq!(l.queue(repair(64, 1)), Queued::Reread);
        assert!(!l.scrub_needed());
        assert_eq!(l.queue(repair(64 + 65_536, 1)), Queued::Overflow);
        assert!(l.scrub_needed());
        assert_eq!(l.reread_len(), REREAD_SET_MAX);
        // Draining the set does not clear it: the forgotten id may still have a bad copy.
        while !l.reread_batch().is_empty() {}
        assert_eq!(l.reread_len(), 0);
        assert!(l.scrub_needed());
    }

    #[test]
    fn an_entry_65_commits_old_moves_to_the_reread_set_at_phase_1() {
        let mut l = RepairList::new();
        l.queue(repair(1, 100));
        l.queue(repair(2, 101));
        l.queue(repair(3, 101));
        // At 165, entry 1 is 65 commits old; 2 and 3 are 64 old and may still be taken.
        assert_eq!(take(&mut l, 165, 1), vec![2]);
        assert!(!l.listed(1));
        assert_eq!(l.reread_len(), 1);
        assert_eq!(l.reread_batch(), vec![1]);
        assert!(l.listed(3), "no room for it: it waits");
        assert_eq!(take(&mut l, 166, 8), Vec::<u32>::new());
        assert_eq!((l.len(), l.reread_len()), (0, 1));
    }

    #[test]
    fn phase_1_drops_flipped_freed_and_dirty_entries() {
        let mut l = RepairList::new();
        for id in 1..=5 {
            l.queue(repair(id, 10));
        }
        // 1 was written by commit 10 (the noted one: its read saw that write), 2 by commit 11.
        let last_write = |id| match id {
            1 => Some(10),
            2 => Some(11),
            _ => None,
        };
        let taken = l.phase1(12, 64, last_write, |id| id == 3, |id| id == 4);
        assert_eq!(taken, vec![repair(1, 10), repair(5, 10)]);
        assert!(l.is_empty());
        assert_eq!(l.reread_len(), 0, "dropped entries need no re-read");
    }

    #[test]
    fn phase_1_never_takes_more_than_room_and_takes_in_queue_order() {
        let mut l = RepairList::new();
        for id in [9, 3, 7, 1, 5] {
            l.queue(repair(id, 1));
        }
        assert_eq!(take(&mut l, 2, 0), Vec::<u32>::new());
        assert_eq!(l.len(), 5);
        assert_eq!(take(&mut l, 2, 2), vec![9, 3]);
        assert_eq!(take(&mut l, 3, 2), vec![7, 1]);
        assert!(l.listed(5) && !l.listed(9));
        assert_eq!(take(&mut l, 4, 2), vec![5]);
        assert!(l.is_empty());
    }

    #[test]
    fn an_id_is_listed_once_and_a_newer_read_refreshes_its_entry() {
        let mut l = RepairList::new();
        assert_eq!(l.queue(repair(4, 10)), Queued::Listed);
        assert_eq!(l.queue(repair(8, 10)), Queued::Listed);
        let newer = Repair {
            state: PairState::SlotB,
            ..repair(4, 12)
        };
        assert_eq!(l.queue(newer), Queued::AlreadyListed);
        // An older read does not undo the newer one's finding.
        assert_eq!(l.queue(repair(4, 11)), Queued::AlreadyListed);
        assert_eq!(l.len(), 2);
        // Commit 11 flipped page 4; the read at 12 found its new slot bad: it is still repaired,
        // and keeps its place ahead of 8.
        let taken = l.phase1(12, 1, |id| (id == 4).then_some(11), |_| false, |_| false);
        assert_eq!(taken, vec![newer]);
        assert_eq!(take(&mut l, 12, 5), vec![8]);
    }

    #[test]
    fn reread_batches_take_at_most_64_and_sweep_the_whole_set() {
        let mut l = RepairList::new();
        for id in 0..64 {
            l.queue(repair(id, 1));
        }
        for id in (1_000..1_000 + 65_536).rev() {
            l.queue(repair(id, 1));
        }
        let mut seen = BTreeSet::new();
        let mut batches = 0;
        loop {
            let b = l.reread_batch();
            if b.is_empty() {
                break;
            }
            assert!(b.len() <= REREAD_BATCH);
            assert!(b.windows(2).all(|w| w[0] < w[1]), "in id order");
            for id in b {
                assert!(seen.insert(id), "id {id} handed out twice");
            }
            batches += 1;
        }
        assert_eq!(batches, 1_024);
        assert_eq!(seen.len(), REREAD_SET_MAX);
        // The sweep goes on from where it stopped: ids below it wait for the wrap.
        for id in [10_000, 70_000, 80_000] {
            l.queue(repair(id, 2));
        }
        assert_eq!(l.reread_batch(), vec![70_000, 80_000, 10_000]);
        // The last batch stopped after 10,000: 500 is behind the sweep, the others ahead.
        for id in [80_001, 500, 80_000] {
            l.queue(repair(id, 3));
        }
        assert_eq!(l.reread_batch(), vec![80_000, 80_001, 500]);
    }

    /// Ids the proptest draws from: few, so ids collide in sets, on the list and in the re-read
    /// set.
    const IDS: u32 = 40;
    /// The proptest's bounds: small, so the list, the re-read set and batches all fill up.
    const LIST: usize = 8;
    const REREAD: usize = 6;
    const BATCH: usize = 5;

    #[derive(Clone, Debug)]
    enum Op {
        /// The next commit, `gap` past the latest (counters may skip), wrote `ids`.
        Publish { gap: u64, ids: Vec<u32> },
        /// A read noted `back` commits before the latest found one bad copy of `id`.
        Queue { id: u32, back: u64, slot_b: bool },
        Phase1 {
            room: usize,
            freed: Vec<u32>,
            dirty: Vec<u32>,
        },
        Hint {
            id: u32,
            back: u64,
            absent: bool,
            same: bool,
        },
        /// A batch is re-read; the ids at set bits of `bad` still have a bad copy.
        Reread { bad: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let ids = || prop::collection::vec(0..IDS, 0..6);
        prop_oneof![
            4 => (1u64..=3, ids()).prop_map(|(gap, ids)| Op::Publish { gap, ids }),
            4 => (0..IDS, 0u64..90, any::<bool>())
                .prop_map(|(id, back, slot_b)| Op::Queue { id, back, slot_b }),
            2 => (0usize..6, ids(), ids())
                .prop_map(|(room, freed, dirty)| Op::Phase1 { room, freed, dirty }),
            3 => (0..IDS, 0u64..140, prop::bool::weighted(0.9), prop::bool::weighted(0.9))
                .prop_map(|(id, back, absent, same)| Op::Hint { id, back, absent, same }),
            1 => any::<u8>().prop_map(|bad| Op::Reread { bad }),
        ]
    }

    /// The naive model: every written set kept forever, answers found by scanning.
    struct Model {
        start: u64,
        history: Vec<(u64, BTreeSet<u32>)>,
        entries: Vec<Repair>,
        reread: BTreeSet<u32>,
        next: u32,
        scrub: bool,
    }

    impl Model {
        fn latest(&self) -> u64 {
            self.history.last().map_or(self.start, |(c, _)| *c)
        }

        /// What the id map should say: the last of the newest 64 sets that holds `id`.
        fn ring_last_write(&self, id: u32) -> Option<u64> {
            let n = HINT_COMMITS_MAX as usize;
            let ring = &self.history[self.history.len().saturating_sub(n)..];
            ring.iter()
                .filter(|(_, s)| s.contains(&id))
                .map(|(c, _)| *c)
                .max()
        }

        /// The truth, from all history: the last commit after `noted` that wrote `id`.
        fn written_after(&self, id: u32, noted: u64) -> Option<u64> {
            self.history
                .iter()
                .filter(|(c, s)| *c > noted && s.contains(&id))
                .map(|(c, _)| *c)
                .max()
        }

        fn hint(&self, id: u32, noted: u64, r: Recheck) -> std::result::Result<(), HintDrop> {
            let since = self.history.iter().filter(|(c, _)| *c > noted).count();
            if !r.absent {
                Err(HintDrop::Resident)
            } else if !r.same_pair_state {
                Err(HintDrop::PairStateChanged)
            } else if noted < self.start || since as u64 > HINT_COMMITS_MAX {
                Err(HintDrop::TooOld)
            } else if let Some(written_by) = self.written_after(id, noted) {
                Err(HintDrop::Stale { written_by })
            } else {
                Ok(())
            }
        }

        fn send_to_set(&mut self, id: u32) -> Queued {
            if self.reread.contains(&id) || self.reread.len() < REREAD {
                self.reread.insert(id);
                Queued::Reread
            } else {
                self.scrub = true;
                Queued::Overflow
            }
        }

        fn queue(&mut self, r: Repair) -> Queued {
            if let Some(e) = self.entries.iter_mut().find(|e| e.id == r.id) {
                if r.noted >= e.noted {
                    *e = r;
                }
                Queued::AlreadyListed
            } else if self.entries.len() < LIST {
                self.reread.remove(&r.id);
                self.entries.push(r);
                Queued::Listed
            } else {
                self.send_to_set(r.id)
            }
        }

        fn phase1(&mut self, room: usize, freed: &[u32], dirty: &[u32]) -> Vec<Repair> {
            let current = self.latest();
            let mut taken = Vec::new();
            for e in std::mem::take(&mut self.entries) {
                let flipped = self.ring_last_write(e.id).is_some_and(|c| c > e.noted);
                if flipped || freed.contains(&e.id) || dirty.contains(&e.id) {
                    continue;
                }
                if current - e.noted > HINT_COMMITS_MAX {
                    self.send_to_set(e.id);
                } else if taken.len() < room {
                    taken.push(e);
                } else {
                    self.entries.push(e);
                }
            }
            taken
        }

        fn reread_batch(&mut self) -> Vec<u32> {
            let mut ids: Vec<u32> = self.reread.iter().copied().collect();
            ids.sort_by_key(|&id| (id < self.next, id));
            ids.truncate(BATCH);
            for id in &ids {
                self.reread.remove(id);
            }
            if let Some(&last) = ids.last() {
                self.next = last + 1;
            }
            ids
        }
    }

    proptest! {
        /// Against the naive model: the id map, hint verdicts, queue results, phase 1's takes
        /// and re-read batches agree; phase 1 never takes more than its room, nor an entry whose
        /// page a commit after its read wrote (by all history, not just the ring); a hint passes
        /// only if no commit since its read wrote the id; bounds hold throughout.
        #[test]
        fn hints_and_repairs_agree_with_a_model_that_keeps_every_set(
            ops in prop::collection::vec(op(), 1..400)
        ) {
            let start = 1_000;
            let mut sets = WrittenSets::new(start);
            let mut list = RepairList::with_bounds(LIST, REREAD, BATCH);
            let mut m = Model {
                start,
                history: Vec::new(),
                entries: Vec::new(),
                reread: BTreeSet::new(),
                next: 0,
                scrub: false,
            };
            let noted = |m: &Model, back: u64| m.latest().saturating_sub(back).max(start);
            for op in ops {
                match op {
                    Op::Publish { gap, ids } => {
                        let c = m.latest() + gap;
                        sets.publish(c, ids.clone()).expect("increasing");
                        m.history.push((c, ids.into_iter().collect()));
                    }
                    Op::Queue { id, back, slot_b } => {
                        let state = if slot_b { PairState::SlotB } else { PairState::SlotA };
                        let r = Repair { id, noted: noted(&m, back), state };
                        prop_assert_eq!(list.queue(r), m.queue(r));
                    }
                    Op::Phase1 { room, freed, dirty } => {
                        let taken = list.phase1(
                            sets.latest(),
                            room,
                            |id| sets.last_write(id),
                            |id| freed.contains(&id),
                            |id| dirty.contains(&id),
                        );
                        prop_assert_eq!(&taken, &m.phase1(room, &freed, &dirty));
                        prop_assert!(taken.len() <= room);
                        for r in &taken {
                            prop_assert_eq!(m.written_after(r.id, r.noted), None);
                            prop_assert!(!freed.contains(&r.id) && !dirty.contains(&r.id));
                        }
                    }
                    Op::Hint { id, back, absent, same } => {
                        let n = noted(&m, back);
                        let r = Recheck { absent, same_pair_state: same };
                        let got = sets.hint(id, n, r);
                        prop_assert_eq!(got, m.hint(id, n, r), "id {} noted {}", id, n);
                        if got.is_ok() {
                            prop_assert_eq!(m.written_after(id, n), None);
                        }
                    }
                    Op::Reread { bad } => {
                        let batch = list.reread_batch();
                        prop_assert_eq!(&batch, &m.reread_batch());
                        let now = m.latest();
                        for (i, &id) in batch.iter().enumerate() {
                            if bad & (1 << i) != 0 {
                                let r = Repair { id, noted: now, state: PairState::SlotA };
                                prop_assert_eq!(list.queue(r), m.queue(r));
                            }
                        }
                    }
                }
                prop_assert_eq!(sets.latest(), m.latest());
                let ring = &m.history[m.history.len().saturating_sub(HINT_COMMITS_MAX as usize)..];
                let union: BTreeSet<u32> = ring.iter().flat_map(|(_, s)| s.iter().copied()).collect();
                prop_assert_eq!(sets.tracked_ids(), union.len());
                for id in 0..IDS {
                    prop_assert_eq!(sets.last_write(id), m.ring_last_write(id), "id {}", id);
                    let listed = m.entries.iter().any(|e| e.id == id);
                    prop_assert_eq!(list.listed(id), listed, "id {}", id);
                    prop_assert!(!(listed && m.reread.contains(&id)), "id {} in both", id);
                }
                prop_assert_eq!(list.len(), m.entries.len());
                prop_assert!(list.len() <= LIST);
                prop_assert_eq!(list.reread_len(), m.reread.len());
                prop_assert!(list.reread_len() <= REREAD);
                prop_assert_eq!(list.scrub_needed(), m.scrub);
            }
        }
    }
}
