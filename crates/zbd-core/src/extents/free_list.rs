//! Free extents not in the allocation queue, in the order they became free, kept as runs of
//! consecutive extents: a fresh or mostly empty volume is a few runs (one for a new 1 TiB
//! volume) instead of 4 bytes per free extent (5 MiB per TiB of 1 MiB extents; issue 9), and
//! extents released together by a checkpoint (ascending) merge into runs too. At worst (every
//! other extent free) 8 bytes per free extent.

use std::collections::VecDeque;

/// Free extents, first free first out.
#[derive(Clone, Debug, Default)]
pub struct FreeList {
    /// (first extent, extents) per run, in list order.
    runs: VecDeque<(u32, u32)>,
    len: usize,
}

impl FreeList {
    /// Extents in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends extent `e`.
    pub fn push_back(&mut self, e: u32) {
        self.len += 1;
        if let Some((first, n)) = self.runs.back_mut() {
            if first.checked_add(*n) == Some(e) {
                *n += 1;
                return;
            }
        }
        self.runs.push_back((e, 1));
    }

    /// Takes the first extent (the model tests' counterpart of `remove`).
    #[cfg(test)]
    pub fn pop_front(&mut self) -> Option<u32> {
        let (first, n) = self.runs.front_mut()?;
        let e = *first;
        *first += 1;
        *n -= 1;
        if *n == 0 {
            self.runs.pop_front();
        }
        self.len -= 1;
        Some(e)
    }

    /// The extents, in list order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(|&(first, n)| first..first + n)
    }

    /// Takes extent `e` out of the list; false when it is not there.
    pub fn remove(&mut self, e: u32) -> bool {
        let Some(i) = self.runs.iter().position(|&(f, n)| e >= f && e - f < n) else {
            return false;
        };
        let (first, n) = self.runs[i];
        let (before, after) = (e - first, n - (e - first) - 1);
        match (before, after) {
            (0, 0) => {
                self.runs.remove(i);
            }
            (0, _) => self.runs[i] = (e + 1, after),
            (_, 0) => self.runs[i] = (first, before),
            _ => {
                self.runs[i] = (first, before);
                self.runs.insert(i + 1, (e + 1, after));
            }
        }
        self.len -= 1;
        true
    }

    /// The first `runs` runs of the list, sorted, for [`in_runs`] (a bounded look: the list
    /// of a fragmented volume can hold a million runs).
    pub fn front_runs(&self, runs: usize) -> Vec<(u32, u32)> {
        let mut front: Vec<(u32, u32)> = self.runs.iter().take(runs).copied().collect();
        front.sort_unstable();
        front
    }

    /// Up to `n` extents `e < h` in the list whose partners `e + h` are in the list too,
    /// highest first, among the first `limit` extents below `h` looked at: pairs the metadata
    /// carver may take (design, "Space for metadata"). One sort of the runs, whatever `n`.
    pub fn pairs_below(&self, h: u32, n: usize, limit: usize) -> Vec<u32> {
        let sorted = self.front_runs(self.runs.len());
        let listed = |x: u32| in_runs(&sorted, x);
        sorted
            .iter()
            .rev()
            .flat_map(|&(f, len)| (f..(f + len).min(h)).rev())
            .take(limit)
            .filter(|&e| e.checked_add(h).is_some_and(listed))
            .take(n)
            .collect()
    }
}

/// Whether extent `e` is in sorted, disjoint runs (`FreeList::front_runs`).
pub fn in_runs(sorted: &[(u32, u32)], e: u32) -> bool {
    let i = sorted.partition_point(|&(f, _)| f <= e);
    i > 0 && e - sorted[i - 1].0 < sorted[i - 1].1
}

impl Extend<u32> for FreeList {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for e in iter {
            self.push_back(e);
        }
    }
}

impl FromIterator<u32> for FreeList {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut l = FreeList::default();
        l.extend(iter);
        l
    }
}

#[cfg(test)]
mod tests {
    use super::FreeList;
    use std::collections::VecDeque;

    /// Removal anywhere keeps the order of the rest, and the carver's pairs are exactly the
    /// listed `e < h` with `e + h` listed, highest first (brute force on a model).
    #[test]
    fn removes_anywhere_and_finds_the_carvers_pairs() {
        let mut model: VecDeque<u32> = VecDeque::new();
        let mut l = FreeList::default();
        let mut x: u64 = 11;
        for step in 0..4000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let e = (x >> 33) as u32 % 200;
            match x >> 62 {
                0 => assert_eq!(l.pop_front(), model.pop_front(), "step {step}"),
                1 => {
                    let at = model.iter().position(|&m| m == e);
                    assert_eq!(l.remove(e), at.is_some(), "step {step}: remove {e}");
                    if let Some(i) = at {
                        model.remove(i);
                    }
                }
                _ if !model.contains(&e) => {
                    l.push_back(e);
                    model.push_back(e);
                }
                _ => {}
            }
            assert!(l.iter().eq(model.iter().copied()), "step {step}");
            assert_eq!(l.len(), model.len());
            let h = 100;
            let mut want: Vec<u32> = model
                .iter()
                .copied()
                .filter(|&e| e < h && model.contains(&(e + h)))
                .collect();
            want.sort_unstable_by(|a, b| b.cmp(a));
            want.truncate(3);
            assert_eq!(l.pairs_below(h, 3, usize::MAX), want, "step {step}");
        }
    }

    #[test]
    fn behaves_like_a_queue_of_extents() {
        let mut model: VecDeque<u32> = VecDeque::new();
        let mut l = FreeList::default();
        let mut x: u64 = 7;
        for step in 0..5000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match x >> 62 {
                0 => assert_eq!(l.pop_front(), model.pop_front(), "step {step}"),
                1 => {
                    // A run of consecutive extents, as a checkpoint releases them.
                    let first = (x >> 20) as u32 % 1000;
                    for e in first..first + (x >> 50) as u32 % 5 {
                        l.push_back(e);
                        model.push_back(e);
                    }
                }
                _ => {
                    let e = (x >> 33) as u32 % 1000;
                    l.push_back(e);
                    model.push_back(e);
                }
            }
            assert_eq!(l.len(), model.len());
        }
        assert!(l.iter().eq(model.iter().copied()));
        let whole: FreeList = (0..1_000_000).collect();
        assert_eq!((whole.len(), whole.runs.len()), (1_000_000, 1));
    }
}
