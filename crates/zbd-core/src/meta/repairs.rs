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
//! current slot installs the good copy's frame clean and queues the page's address, and each
//! phase 1 takes as many entries as its new interval has room for and dirties them there, so no
//! step counts or reserves anything for repairs. A queue attempt on a full list goes to a bounded
//! re-read set of addresses (R9-C4, R15-C3), which `zbd-cleaner` works through a batch after each
//! commit (R10-C1); past that bound only a sticky "scrub needed" flag remains. A free forgets its
//! id on the list and in the set (R15-E1).
//!
//! Pure data structures: no I/O and no lock of their own; the caller holds the state lock for
//! every call.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::error::{Error, Result};
use crate::format::PageAddress;

/// Commits whose written sets the ring keeps ("Prefetch, re-check", R6-B1): a read noted longer
/// ago can no longer be checked by the id map, so its frame is dropped (~880 KiB of sets and ~3
/// MiB of map at 16 TiB: "RAM at 16 TiB").
pub const HINT_COMMITS_MAX: u64 = 64;
/// Entries on the repair list ("Counted pages", R9-E3): their frames stay resident while listed,
/// so the list is the `64` of the page pool's floor (`8,192 + 64 + F + 2S + 2R`).
pub const REPAIR_LIST_MAX: usize = 64;
/// Addresses the re-read set holds when the list is full (R9-C4): 1 MiB at 16 bytes each
/// (R15-C3; "RAM at 16 TiB" counts 256 KiB of bare ids); a page past it is forgotten and sets
/// "scrub needed".
pub const REREAD_SET_MAX: usize = 65_536;
/// Addresses of the re-read set handed out after each commit (R10-C1): bounded work for
/// `zbd-cleaner`, which re-reads their copies without the lock; 1,024 commits go once through a
/// full set.
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
///
/// No pair state (R15-D1): no rule reads one, since phase 1 decides from RAM facts alone (R9-D1);
/// a debug check that a taken page equals its durable copy finds that copy's slot from the id's
/// pair state at phase 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repair {
    /// The page: its id, and the kind, level and position that seed its CRC, as the walk or list
    /// that reached it knew them. An entry moved to the re-read set keeps it, so the re-read can
    /// check the copies it reads ([`format::open_page`](crate::format::open_page), R15-C3).
    pub address: PageAddress,
    /// The commit counter taken under the lock before the read was issued (for a locked fault,
    /// the counter at the fault).
    pub noted: u64,
}

impl Repair {
    /// The page id: entries are one per id.
    pub fn id(&self) -> u32 {
        self.address.id
    }
}

/// Where a queue attempt put the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// A new entry at the end of the list: the caller holds the frame in the pool
    /// ([`PagePool::hold`](super::pool::PagePool::hold)) while it is listed.
    Listed,
    /// The id was listed already: its entry keeps its place, and takes this read's address and
    /// counter if that counter is at least as new.
    AlreadyListed,
    /// The list was full: the address is in the re-read set (it may have been there already:
    /// this one replaces it).
    Reread,
    /// The list and the re-read set were full: the page is forgotten and "scrub needed" is set.
    Overflow,
}

/// The repair list, its re-read set and the "scrub needed" flag.
#[derive(Debug)]
pub struct RepairList {
    /// Entries in queue order, one per id.
    entries: Vec<Repair>,
    /// Addresses waiting to be re-read, keyed by id (R15-C3). Ordered by id, so a batch reads
    /// neighbouring pairs together and a sweep (`reread_next`) reaches every id before any comes
    /// round again. A B-tree takes ~32-41 bytes an entry with its nodes (2-2.6 MiB full), against
    /// 16 bytes an address (1 MiB, R15-C3) and "RAM at 16 TiB"'s 4 bytes an id (0.25 MiB); a
    /// sorted array would take 16 but move up to 1 MiB under the lock per insert.
    reread: BTreeMap<u32, PageAddress>,
    /// Where the next batch starts: one past the last id handed out.
    reread_next: u32,
    /// Sticky: a page was forgotten because the re-read set was full.
    scrub_needed: bool,
    /// [`phase1_drop`](Self::phase1_drop) ran and [`phase1_take`](Self::phase1_take) has not:
    /// the debug check of phase 1's order.
    dropped: bool,
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
            reread: BTreeMap::new(),
            reread_next: 0,
            scrub_needed: false,
            dropped: false,
            list_max,
            reread_max,
            batch,
        }
    }

    /// Queues a repair, once per id. The caller queues only a page whose good copy's frame it
    /// installed or found resident (so the listed frame is the page's content), and holds that
    /// frame while [`listed`](Self::listed). An id listed leaves the re-read set. On a full list
    /// the address goes to the re-read set; scrub and the online check instead wait outside the
    /// lock while [`is_full`](Self::is_full).
    pub fn queue(&mut self, repair: Repair) -> Queued {
        let id = repair.id();
        if let Some(e) = self.entries.iter_mut().find(|e| e.id() == id) {
            // The newer read's finding stands: an entry kept at an older counter would be
            // dropped at phase 1 if the page flipped in between, though this read found the
            // new current slot bad.
            if repair.noted >= e.noted {
                *e = repair;
            }
            return Queued::AlreadyListed;
        }
        if self.entries.len() < self.list_max {
            self.reread.remove(&id);
            self.entries.push(repair);
            return Queued::Listed;
        }
        self.send_to_reread(repair.address)
    }

    /// Puts `address` in the re-read set, or sets "scrub needed" if it is full.
    fn send_to_reread(&mut self, address: PageAddress) -> Queued {
        if self.reread.contains_key(&address.id) || self.reread.len() < self.reread_max {
            self.reread.insert(address.id, address);
            Queued::Reread
        } else {
            self.scrub_needed = true;
            Queued::Overflow
        }
    }

    /// A free of `id` (a whole-page trim, a released page), under the lock and together with the
    /// pool's [`remove`](super::pool::PagePool::remove), which drops the id's frame with the
    /// list's hold on it (R15-E1): the id's list entry and its re-read entry go. For a region-0
    /// leaf that is the trim or zero that drops its frame, though its free is recorded only at
    /// the next phase 1 (R15-A1). So no freed id
    /// is ever on the list or in the set: a page created again under the id never meets the old
    /// page's entry, and no later batch hands out the old address (one already handed out is
    /// [`reread_batch`](Self::reread_batch)'s case). An id on neither is left as it is.
    pub fn forget(&mut self, id: u32) {
        self.entries.retain(|e| e.id() != id);
        self.reread.remove(&id);
    }

    /// Whether `id` is on the list: the pool keeps its frame resident.
    pub fn listed(&self, id: u32) -> bool {
        self.entries.iter().any(|e| e.id() == id)
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

    /// Addresses in the re-read set (at most [`REREAD_SET_MAX`]), for `zbd stat`.
    pub fn reread_len(&self) -> usize {
        self.reread.len()
    }

    /// A page was forgotten because the re-read set was full; `zbd stat` says "scrub needed".
    /// Sticky, RAM only: a completed scrub clears it, and nothing else does (no scrub is built
    /// yet, so nothing here clears it). Emptying the list and the set does not: the forgotten
    /// page may still have a bad copy.
    pub fn scrub_needed(&self) -> bool {
        self.scrub_needed
    }

    /// Phase 1, first call: the drop rule, from RAM alone (R9-D1, R9-E3): no pair-state read, no
    /// fault, no I/O. Returns the ids whose entries left the list, in queue order; the caller
    /// releases each one's hold in the pool.
    ///
    /// Phase 1 runs under the lock in this order (R15-D3), which is why it is two calls:
    /// 1. `phase1_drop`, against the closing interval's state: `current` is the commit counter
    ///    and `last_write` the [`WrittenSets`] id map (commits up to `current`); `dirty` is the
    ///    pool's dirty bit ([`PagePool::is_dirty`](super::pool::PagePool::is_dirty)) before the
    ///    snapshot, which turns it into "written by the checkpoint in flight".
    /// 2. The caller takes the closing checkpoint's snapshot
    ///    ([`PagePool::snapshot`](super::pool::PagePool::snapshot)).
    /// 3. [`phase1_take`](Self::phase1_take), with the room the NEW interval has: the caller
    ///    dirties the taken pages there, so they are not in the closing checkpoint's written set.
    ///    Dirtied before the snapshot they would add up to 64 pages to that set and its encoded
    ///    copy (past its 2,048 + `F` + `S`) while counting in the next interval.
    ///
    /// In queue order, an entry is
    /// - dropped if `last_write` names a commit after its noted one (the page flipped: the bad
    ///   copy is no longer current), or if `dirty` (the closing checkpoint writes the page
    ///   anyway);
    /// - else moved, with its address, to the re-read set if more than [`HINT_COMMITS_MAX`]
    ///   commits old (the map no longer covers every commit since), by counter difference: the
    ///   counter moves by one per commit, and a counter that skipped values would only move
    ///   entries sooner;
    /// - else kept for [`phase1_take`](Self::phase1_take).
    ///
    /// No "freed" clause (R15-E1): a free [`forget`](Self::forget)s its id's entry as the pool
    /// drops its frame, so no freed id is ever on the list, and small lists need no RAM set of
    /// the ids freed since the last commit for repairs.
    pub fn phase1_drop(
        &mut self,
        current: u64,
        last_write: impl Fn(u32) -> Option<u64>,
        dirty: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        let mut left = Vec::new();
        let mut old = Vec::new();
        self.entries.retain(|e| {
            let flipped = last_write(e.id()).is_some_and(|c| c > e.noted);
            if flipped || dirty(e.id()) {
                left.push(e.id());
                return false;
            }
            if current.saturating_sub(e.noted) > HINT_COMMITS_MAX {
                left.push(e.id());
                old.push(e.address);
                return false;
            }
            true
        });
        for address in old {
            self.send_to_reread(address);
        }
        self.dropped = true;
        left
    }

    /// Phase 1, last call, after [`phase1_drop`](Self::phase1_drop) and the checkpoint's
    /// snapshot (see there for the order): takes the first `room` entries in queue order, where
    /// `room` is how many counted pages the new interval has left for repairs after the
    /// allowances outstanding; the rest wait for a later phase 1. The taken entries leave the
    /// list; the caller dirties each in the new interval
    /// ([`PagePool::change`](super::pool::PagePool::change), then
    /// [`release`](super::pool::PagePool::release) of its hold) and counts it there.
    pub fn phase1_take(&mut self, room: usize) -> Vec<Repair> {
        debug_assert!(
            self.dropped,
            "phase 1 takes repairs only after its drop rule ran"
        );
        self.dropped = false;
        let n = room.min(self.entries.len());
        self.entries.drain(..n).collect()
    }

    /// The next at most [`REREAD_BATCH`] addresses of the re-read set, taken out of it, for
    /// `zbd-cleaner` to re-read after a commit without the lock.
    ///
    /// Order: by id, from one past the last id handed out, wrapping round, so batches sweep the
    /// set and every id in it is handed out before any comes round again (1,024 commits for a
    /// full set); an id queued back waits for the rest. An id moved onto the list left the set
    /// ([`queue`](Self::queue)), and so did a freed one ([`forget`](Self::forget)).
    ///
    /// The caller reads both copies of each page and checks them against the address
    /// ([`format::open_page`](crate::format::open_page)):
    /// - both fail: the id was freed, and maybe reused for another page, after the batch was
    ///   handed out, or the page is gone. The entry is dropped: not damage to report from here
    ///   (a live page with both copies bad fails its next fault under the lock).
    /// - one fails: the caller installs the good copy's frame by the hint rule
    ///   ([`WrittenSets::hint`], with the counter and pair state it noted under the lock before
    ///   the read, so a free meanwhile drops it) and queues the page again
    ///   ([`queue`](Self::queue), under the lock, with that counter); so does, the safe
    ///   reading, a re-read that could not be done.
    /// - both check: nothing; the copies are fine again.
    ///
    /// A batch is handed out whether or not the list has room: a re-read also clears pages whose
    /// copies are fine again, and one found bad on a full list goes back to the set, to be listed
    /// when room appears.
    pub fn reread_batch(&mut self) -> Vec<PageAddress> {
        let out: Vec<PageAddress> = self
            .reread
            .range(self.reread_next..)
            .chain(self.reread.range(..self.reread_next))
            .take(self.batch)
            .map(|(_, a)| *a)
            .collect();
        for a in &out {
            self.reread.remove(&a.id);
        }
        if let Some(last) = out.last() {
            self.reread_next = last.id.wrapping_add(1);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::format::PageKind;
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

    /// A page's address: a position and level of its own, so a test comparing addresses tells a
    /// stored one from one made up from the id.
    fn addr(id: u32) -> PageAddress {
        PageAddress {
            id,
            kind: PageKind::MapInterior,
            level: 1,
            position: 3 * u64::from(id) + 7,
        }
    }

    fn repair(id: u32, noted: u64) -> Repair {
        Repair {
            address: addr(id),
            noted,
        }
    }

    /// Phase 1 with nothing flipped or dirty: the drop rule (only the age rule can act), then the
    /// take; the ids taken.
    fn take(l: &mut RepairList, current: u64, room: usize) -> Vec<u32> {
        l.phase1_drop(current, |_| None, |_| false);
        l.phase1_take(room).iter().map(Repair::id).collect()
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
        assert!(l.reread_batch().is_empty());
        assert!(!l.scrub_needed());
    }

    #[test]
    fn the_65537th_reread_page_sets_scrub_needed_for_good() {
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
        // Draining the set, emptying the list and forgetting ids do not clear it: the forgotten
        // page may still have a bad copy, and only a completed scrub clears it.
        while !l.reread_batch().is_empty() {}
        assert_eq!(take(&mut l, 1, 64).len(), 64);
        l.forget(64 + 65_536);
        assert_eq!((l.len(), l.reread_len()), (0, 0));
        assert!(l.scrub_needed());
    }

    #[test]
    fn an_entry_65_commits_old_moves_to_the_reread_set_at_phase_1() {
        let mut l = RepairList::new();
        l.queue(repair(1, 100));
        l.queue(repair(2, 101));
        l.queue(repair(3, 101));
        // At 165, entry 1 is 65 commits old; 2 and 3 are 64 old and may still be taken.
        assert_eq!(l.phase1_drop(165, |_| None, |_| false), vec![1]);
        assert_eq!(l.phase1_take(1), vec![repair(2, 101)]);
        assert!(!l.listed(1));
        assert_eq!(l.reread_len(), 1);
        assert_eq!(l.reread_batch(), vec![addr(1)], "with its address");
        assert!(l.listed(3), "no room for it: it waits");
        assert_eq!(take(&mut l, 166, 8), Vec::<u32>::new());
        assert_eq!((l.len(), l.reread_len()), (0, 1));
    }

    #[test]
    fn phase_1_drops_flipped_and_dirty_entries_and_says_which_left() {
        let mut l = RepairList::new();
        for id in 1..=5 {
            l.queue(repair(id, 20));
        }
        l.queue(repair(6, 10));
        // 1 was written by commit 20 (the noted one: its read saw that write), 2 by commit 21;
        // 4 is dirty in the closing interval; 6 is 70 commits old.
        let last_write = |id| match id {
            1 => Some(20),
            2 => Some(21),
            _ => None,
        };
        let left = l.phase1_drop(80, last_write, |id| id == 4);
        assert_eq!(
            left,
            vec![2, 4, 6],
            "in queue order: the caller releases their holds"
        );
        assert_eq!(l.len(), 3);
        assert_eq!(
            l.reread_len(),
            1,
            "dropped entries need no re-read; the old one does"
        );
        let taken = l.phase1_take(64);
        assert_eq!(taken, vec![repair(1, 20), repair(3, 20), repair(5, 20)]);
        assert!(l.is_empty());
        assert_eq!(l.reread_batch(), vec![addr(6)]);
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
    #[cfg(debug_assertions)]
    #[should_panic(expected = "only after its drop rule")]
    fn phase_1_takes_only_after_its_drop_rule() {
        let mut l = RepairList::new();
        l.queue(repair(1, 1));
        l.phase1_drop(1, |_| None, |_| false);
        l.phase1_take(1);
        l.phase1_take(1);
    }

    #[test]
    fn an_id_is_listed_once_and_a_newer_read_refreshes_its_entry() {
        let mut l = RepairList::new();
        assert_eq!(l.queue(repair(4, 10)), Queued::Listed);
        assert_eq!(l.queue(repair(8, 10)), Queued::Listed);
        let newer = repair(4, 12);
        assert_eq!(l.queue(newer), Queued::AlreadyListed);
        // An older read does not undo the newer one's finding.
        assert_eq!(l.queue(repair(4, 11)), Queued::AlreadyListed);
        assert_eq!(l.len(), 2);
        // Commit 11 flipped page 4; the read at 12 found its new slot bad: it is still repaired,
        // and keeps its place ahead of 8.
        let left = l.phase1_drop(12, |id| (id == 4).then_some(11), |_| false);
        assert_eq!(left, Vec::<u32>::new());
        assert_eq!(l.phase1_take(1), vec![newer]);
        assert_eq!(take(&mut l, 12, 5), vec![8]);
    }

    #[test]
    fn a_free_forgets_the_id_on_the_list_and_in_the_reread_set() {
        let mut l = RepairList::with_bounds(3, 4, 64);
        for id in 1..=6 {
            l.queue(repair(id, 5));
        }
        assert_eq!((l.len(), l.reread_len()), (3, 3));
        l.forget(2);
        l.forget(5);
        l.forget(99);
        assert!(!l.listed(2));
        assert_eq!((l.len(), l.reread_len()), (2, 2));
        // The id is reused for another page before phase 1: its new entry is the new page's,
        // and goes to the end of the list.
        let reused = Repair {
            address: PageAddress {
                id: 2,
                kind: PageKind::MapLeaf,
                level: 0,
                position: 1_000_000,
            },
            noted: 6,
        };
        assert_eq!(l.queue(reused), Queued::Listed);
        // No freed entry is taken, and none is re-read: both hold only live pages.
        assert_eq!(l.phase1_drop(7, |_| None, |_| false), Vec::<u32>::new());
        assert_eq!(l.phase1_take(8), vec![repair(1, 5), repair(3, 5), reused]);
        assert_eq!(l.reread_batch(), vec![addr(4), addr(6)]);
        // A freed id in the full set makes room for another page.
        let mut l = RepairList::with_bounds(0, 1, 64);
        assert_eq!(l.queue(repair(1, 5)), Queued::Reread);
        assert_eq!(l.queue(repair(2, 5)), Queued::Overflow);
        l.forget(1);
        assert_eq!(l.queue(repair(2, 5)), Queued::Reread);
        assert_eq!(l.reread_batch(), vec![addr(2)]);
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
            assert!(b.windows(2).all(|w| w[0].id < w[1].id), "in id order");
            for a in b {
                assert_eq!(a, addr(a.id), "the address queued");
                assert!(seen.insert(a.id), "id {} handed out twice", a.id);
            }
            batches += 1;
        }
        assert_eq!(batches, 1_024);
        assert_eq!(seen.len(), REREAD_SET_MAX);
        // The sweep goes on from where it stopped: ids below it wait for the wrap.
        for id in [10_000, 70_000, 80_000] {
            l.queue(repair(id, 2));
        }
        assert_eq!(
            l.reread_batch(),
            vec![addr(70_000), addr(80_000), addr(10_000)]
        );
        // The last batch stopped after 10,000: 500 is behind the sweep, the others ahead.
        for id in [80_001, 500, 80_000] {
            l.queue(repair(id, 3));
        }
        assert_eq!(
            l.reread_batch(),
            vec![addr(80_000), addr(80_001), addr(500)]
        );
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
        Queue { id: u32, back: u64 },
        /// Phase 1: the drop rule with `dirty` the closing interval's dirty ids, then the take.
        Phase1 { room: usize, dirty: Vec<u32> },
        Hint {
            id: u32,
            back: u64,
            absent: bool,
            same: bool,
        },
        /// A batch is re-read; the ids at set bits of `bad` still have a bad copy.
        Reread { bad: u8 },
        /// `id` is freed; its next life is another page (another address).
        Forget { id: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let ids = || prop::collection::vec(0..IDS, 0..6);
        prop_oneof![
            4 => (1u64..=3, ids()).prop_map(|(gap, ids)| Op::Publish { gap, ids }),
            4 => (0..IDS, 0u64..90).prop_map(|(id, back)| Op::Queue { id, back }),
            2 => (0usize..6, ids()).prop_map(|(room, dirty)| Op::Phase1 { room, dirty }),
            3 => (0..IDS, 0u64..140, prop::bool::weighted(0.9), prop::bool::weighted(0.9))
                .prop_map(|(id, back, absent, same)| Op::Hint { id, back, absent, same }),
            1 => any::<u8>().prop_map(|bad| Op::Reread { bad }),
            1 => (0..IDS).prop_map(|id| Op::Forget { id }),
        ]
    }

    /// The naive model: every written set kept forever, answers found by scanning.
    struct Model {
        start: u64,
        history: Vec<(u64, BTreeSet<u32>)>,
        entries: Vec<Repair>,
        reread: BTreeMap<u32, PageAddress>,
        next: u32,
        scrub: bool,
        /// Frees of each id so far: its current page's address follows from it.
        lives: [u32; IDS as usize],
    }

    impl Model {
        fn latest(&self) -> u64 {
            self.history.last().map_or(self.start, |(c, _)| *c)
        }

        /// The address of the page `id` names now: each free makes it another page, at another
        /// level and position.
        fn address(&self, id: u32) -> PageAddress {
            let life = self.lives[id as usize];
            PageAddress {
                id,
                kind: PageKind::MapLeaf,
                level: (life % 3) as u8,
                position: u64::from(id) + 1_000 * u64::from(life + 1),
            }
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

        fn send_to_set(&mut self, a: PageAddress) -> Queued {
            if self.reread.contains_key(&a.id) || self.reread.len() < REREAD {
                self.reread.insert(a.id, a);
                Queued::Reread
            } else {
                self.scrub = true;
                Queued::Overflow
            }
        }

        fn queue(&mut self, r: Repair) -> Queued {
            if let Some(e) = self.entries.iter_mut().find(|e| e.id() == r.id()) {
                if r.noted >= e.noted {
                    *e = r;
                }
                Queued::AlreadyListed
            } else if self.entries.len() < LIST {
                self.reread.remove(&r.id());
                self.entries.push(r);
                Queued::Listed
            } else {
                self.send_to_set(r.address)
            }
        }

        fn forget(&mut self, id: u32) {
            self.entries.retain(|e| e.id() != id);
            self.reread.remove(&id);
            self.lives[id as usize] += 1;
        }

        fn phase1_drop(&mut self, dirty: &[u32]) -> Vec<u32> {
            let current = self.latest();
            let mut left = Vec::new();
            for e in std::mem::take(&mut self.entries) {
                let flipped = self.ring_last_write(e.id()).is_some_and(|c| c > e.noted);
                if flipped || dirty.contains(&e.id()) {
                    left.push(e.id());
                } else if current - e.noted > HINT_COMMITS_MAX {
                    left.push(e.id());
                    self.send_to_set(e.address);
                } else {
                    self.entries.push(e);
                }
            }
            left
        }

        fn phase1_take(&mut self, room: usize) -> Vec<Repair> {
            let n = room.min(self.entries.len());
            self.entries.drain(..n).collect()
        }

        fn reread_batch(&mut self) -> Vec<PageAddress> {
            let mut out: Vec<PageAddress> = self.reread.values().copied().collect();
            out.sort_by_key(|a| (a.id < self.next, a.id));
            out.truncate(BATCH);
            for a in &out {
                self.reread.remove(&a.id);
            }
            if let Some(last) = out.last() {
                self.next = last.id + 1;
            }
            out
        }
    }

    proptest! {
        /// Against the naive model: the id map, hint verdicts, queue results, phase 1's drops and
        /// takes and re-read batches (addresses included) agree; phase 1 never takes more than
        /// its room, nor an entry whose page a commit after its read wrote (by all history, not
        /// just the ring), nor one dirty in the closing interval; no entry on the list or in the
        /// set, and no address a batch hands out, is of a page freed since it was queued; a hint
        /// passes only if no commit since its read wrote the id; bounds hold throughout.
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
                reread: BTreeMap::new(),
                next: 0,
                scrub: false,
                lives: [0; IDS as usize],
            };
            let noted = |m: &Model, back: u64| m.latest().saturating_sub(back).max(start);
            for op in ops {
                match op {
                    Op::Publish { gap, ids } => {
                        let c = m.latest() + gap;
                        sets.publish(c, ids.clone()).expect("increasing");
                        m.history.push((c, ids.into_iter().collect()));
                    }
                    Op::Queue { id, back } => {
                        let r = Repair { address: m.address(id), noted: noted(&m, back) };
                        prop_assert_eq!(list.queue(r), m.queue(r));
                    }
                    Op::Phase1 { room, dirty } => {
                        let left = list.phase1_drop(
                            sets.latest(),
                            |id| sets.last_write(id),
                            |id| dirty.contains(&id),
                        );
                        prop_assert_eq!(&left, &m.phase1_drop(&dirty));
                        // The snapshot goes here; the take fills the new interval.
                        let taken = list.phase1_take(room);
                        prop_assert_eq!(&taken, &m.phase1_take(room));
                        prop_assert!(taken.len() <= room);
                        for r in &taken {
                            prop_assert_eq!(m.written_after(r.id(), r.noted), None);
                            prop_assert!(!dirty.contains(&r.id()));
                            prop_assert!(!left.contains(&r.id()));
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
                        for (i, &a) in batch.iter().enumerate() {
                            prop_assert_eq!(a, m.address(a.id), "a freed page's address");
                            if bad & (1 << i) != 0 {
                                let r = Repair { address: a, noted: now };
                                prop_assert_eq!(list.queue(r), m.queue(r));
                            }
                        }
                    }
                    Op::Forget { id } => {
                        list.forget(id);
                        m.forget(id);
                        prop_assert!(!list.listed(id));
                    }
                }
                prop_assert_eq!(sets.latest(), m.latest());
                let ring = &m.history[m.history.len().saturating_sub(HINT_COMMITS_MAX as usize)..];
                let union: BTreeSet<u32> = ring.iter().flat_map(|(_, s)| s.iter().copied()).collect();
                prop_assert_eq!(sets.tracked_ids(), union.len());
                for id in 0..IDS {
                    prop_assert_eq!(sets.last_write(id), m.ring_last_write(id), "id {}", id);
                    let listed = m.entries.iter().any(|e| e.id() == id);
                    prop_assert_eq!(list.listed(id), listed, "id {}", id);
                    prop_assert!(!(listed && m.reread.contains_key(&id)), "id {} in both", id);
                }
                prop_assert_eq!(&list.entries, &m.entries);
                for e in &list.entries {
                    prop_assert_eq!(e.address, m.address(e.id()), "a freed page listed");
                }
                prop_assert_eq!(&list.reread, &m.reread);
                for (&id, a) in &list.reread {
                    prop_assert_eq!(a.id, id);
                    prop_assert_eq!(*a, m.address(id), "a freed page to re-read");
                }
                prop_assert!(list.len() <= LIST);
                prop_assert!(list.reread_len() <= REREAD);
                prop_assert_eq!(list.scrub_needed(), m.scrub);
            }
        }
    }
}
