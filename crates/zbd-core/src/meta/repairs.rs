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
//! Pure data structures: no I/O and no lock of their own; the caller holds the state lock for
//! every call.

use std::collections::{HashMap, VecDeque};

use crate::error::{Error, Result};

/// Commits whose written sets the ring keeps ("Prefetch, re-check", R6-B1): a read noted longer
/// ago can no longer be checked by the id map, so its frame is dropped (~880 KiB of sets and ~3
/// MiB of map at 16 TiB: "RAM at 16 TiB").
pub const HINT_COMMITS_MAX: u64 = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
