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

    /// Takes the first extent.
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
