//! An ordered set of extents kept as runs of consecutive ones, for the extents waiting for a
//! checkpoint to become free ([`super::Extents`]): usually a few scattered ones (a B-tree entry
//! each, 15-20 bytes), but a trim of a whole volume empties every closed extent at once, and
//! then they are one run per stretch between free extents instead of one entry per extent.

use std::collections::BTreeMap;

/// A set of extent numbers, iterated in ascending order.
#[derive(Clone, Debug, Default)]
pub struct RunSet {
    /// First extent of each run -> extents in it. Runs neither overlap nor touch.
    runs: BTreeMap<u32, u32>,
    len: usize,
}

impl RunSet {
    /// Extents in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The run holding `e`, if any.
    fn run_of(&self, e: u32) -> Option<(u32, u32)> {
        let (&first, &n) = self.runs.range(..=e).next_back()?;
        (u64::from(e) < u64::from(first) + u64::from(n)).then_some((first, n))
    }

    /// Whether `e` is in the set.
    pub fn contains(&self, e: u32) -> bool {
        self.run_of(e).is_some()
    }

    /// Adds `e`; false if it was there already.
    pub fn insert(&mut self, e: u32) -> bool {
        if self.contains(e) {
            return false;
        }
        let before = self
            .runs
            .range(..e)
            .next_back()
            .filter(|(&first, &n)| u64::from(first) + u64::from(n) == u64::from(e))
            .map(|(&first, &n)| (first, n));
        let after = e
            .checked_add(1)
            .and_then(|next| self.runs.get(&next).map(|&n| (next, n)));
        match (before, after) {
            (Some((first, n)), Some((next, m))) => {
                self.runs.remove(&next);
                self.runs.insert(first, n + 1 + m);
            }
            (Some((first, n)), None) => {
                self.runs.insert(first, n + 1);
            }
            (None, Some((next, m))) => {
                self.runs.remove(&next);
                self.runs.insert(e, m + 1);
            }
            (None, None) => {
                self.runs.insert(e, 1);
            }
        }
        self.len += 1;
        true
    }

    /// Takes `e` out; false if it was not there.
    pub fn remove(&mut self, e: u32) -> bool {
        let Some((first, n)) = self.run_of(e) else {
            return false;
        };
        let left = e - first;
        let right = n - left - 1;
        if left == 0 {
            self.runs.remove(&first);
        } else {
            self.runs.insert(first, left);
        }
        if right > 0 {
            self.runs.insert(e + 1, right);
        }
        self.len -= 1;
        true
    }

    /// The extents, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs
            .iter()
            .flat_map(|(&first, &n)| (0..n).map(move |i| first + i))
    }

    /// Runs in the set.
    #[cfg(test)]
    pub fn runs(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::RunSet;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Any sequence of inserts and removes leaves the same set, in the same order, as a
        /// `BTreeSet`, with runs that neither overlap nor touch.
        #[test]
        fn behaves_like_an_ordered_set(
            ops in proptest::collection::vec((any::<bool>(), 0u32..200), 0..400),
            edge in any::<bool>(),
        ) {
            let mut s = RunSet::default();
            let mut model = BTreeSet::new();
            // Near the top of the range too: runs ending at u32::MAX.
            let base = if edge { u32::MAX - 199 } else { 0 };
            for (add, e) in ops {
                let e = base + e;
                if add {
                    prop_assert_eq!(s.insert(e), model.insert(e));
                } else {
                    prop_assert_eq!(s.remove(e), model.remove(&e));
                }
                prop_assert_eq!(s.len(), model.len());
                prop_assert_eq!(s.contains(e), model.contains(&e));
            }
            prop_assert!(s.iter().eq(model.iter().copied()));
            let runs: Vec<(u32, u32)> = s.runs.iter().map(|(&f, &n)| (f, n)).collect();
            for w in runs.windows(2) {
                prop_assert!(u64::from(w[0].0) + u64::from(w[0].1) < u64::from(w[1].0));
            }
            prop_assert!(runs.iter().all(|&(_, n)| n > 0));
        }
    }

    #[test]
    fn consecutive_extents_are_one_run() {
        let mut s = RunSet::default();
        for e in (0..100_000).rev().step_by(2).chain((0..100_000).step_by(2)) {
            s.insert(e);
        }
        assert_eq!((s.len(), s.runs()), (100_000, 1));
        assert!(s.remove(500));
        assert_eq!((s.len(), s.runs()), (99_999, 2));
        assert!(!s.contains(500) && s.contains(499) && s.contains(501));
    }
}
