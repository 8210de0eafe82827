//! `zbd bench extents`: what the engine's work over the extent table costs under the state lock
//! on a large data area: one checkpoint's phase 1 (`State::begin_checkpoint`) and one choice of
//! cleaner victims (`cleaner::select`, both modes). A real volume in a sparse RAM storage, whose
//! extent accounting is made up (seeded) instead of written: no host write fills 161 M extents.
//! The volume is thrown away afterwards (its accounting does not match its map), and the timed
//! calls are the engine's own, so the same command measures any version of them.

use super::{Inner, OpenOptions};
use crate::backend::{IoOptions, Storage};
use crate::cleaner::{self, Mode};
use crate::error::{Error, Result};
use crate::extents::{ExtentInfo, ExtentState, Extents};
use crate::layout::CreateOptions;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::time::Instant;

/// What to measure.
#[derive(Clone, Debug)]
pub struct ExtentScanOptions {
    /// Extents in the data area.
    pub extents: u32,
    /// Extent size (the made-up live bytes scale with it).
    pub extent_bytes: u32,
    /// Timed repetitions of each measurement.
    pub rounds: usize,
    /// Extents that turn "pending free" before each checkpoint (what a checkpoint releases).
    pub pending: usize,
    /// Seed of the made-up accounting.
    pub seed: u64,
}

/// Seconds per round of each measurement, and what the table held.
#[derive(Clone, Debug, Default)]
pub struct ExtentScanTimes {
    /// Extents in the data area.
    pub extents: u64,
    /// Closed extents (cleaner candidates or full) when the first round started.
    pub closed: u64,
    /// Seconds to make up the accounting (not timed below).
    pub setup_s: f64,
    /// `begin_checkpoint`, per round.
    pub phase1_s: Vec<f64>,
    /// Extents the first round's checkpoint released.
    pub released: u64,
    /// `cleaner::select(Mode::Incremental)`, per round.
    pub incremental_s: Vec<f64>,
    /// `cleaner::select(Mode::Compact)`, per round.
    pub compact_s: Vec<f64>,
    /// Victims each mode chose in the last round (incremental, compact).
    pub victims: (usize, usize),
}

/// Runs the measurement (see the module doc).
pub fn extent_scans(o: &ExtentScanOptions) -> Result<ExtentScanTimes> {
    let eb = u64::from(o.extent_bytes);
    let create = CreateOptions {
        extent_bytes: o.extent_bytes,
        capacity_bytes: Some(u64::from(o.extents) * eb),
        ..CreateOptions::new(64 << 20)
    };
    let sb = crate::layout::plan(&create)?;
    let storage = SparseRam::new(sb.total_bytes());
    let open = OpenOptions {
        background_cleaner: false,
        io: IoOptions::synchronous(),
        ..OpenOptions::default()
    };
    let inner = Inner::create_with(Box::new(storage), &create, open)?;
    inner.extent_scans(o)
}

impl Inner {
    fn extent_scans(&self, o: &ExtentScanOptions) -> Result<ExtentScanTimes> {
        let cx = self.ctx();
        let mut st = self.state.lock();
        let mut rng = SmallRng::seed_from_u64(o.seed);
        let started = Instant::now();
        // A volume near the low watermark (10 % free) after a long life: the rest closed, live
        // bytes spread from nearly empty to full, written over the last 16 M write sequences.
        let queued: std::collections::HashSet<u32> = st.queue.iter().map(|q| q.extent).collect();
        let now = st.next_seq as u32;
        let eb = o.extent_bytes;
        let mut infos = Vec::with_capacity(o.extents as usize);
        for e in 0..o.extents {
            let free = ExtentInfo::FREE;
            if queued.contains(&e) || rng.random_ratio(1, 10) {
                infos.push(free);
                continue;
            }
            let live_bytes = rng.random_range(eb / 64..eb);
            infos.push(ExtentInfo::new(
                ExtentState::Closed,
                live_bytes,
                // About 2:1 compression of 4 KiB blocks.
                (live_bytes / 2048).max(1),
                now.wrapping_sub(rng.random_range(0..1 << 24)),
            ));
        }
        let closed = infos
            .iter()
            .filter(|x| x.state() == ExtentState::Closed)
            .count();
        self.install_extents(&mut st, infos, &queued);
        let mut t = ExtentScanTimes {
            extents: u64::from(o.extents),
            closed: closed as u64,
            setup_s: started.elapsed().as_secs_f64(),
            ..ExtentScanTimes::default()
        };
        for round in 0..o.rounds {
            // Extents emptied since the last checkpoint (overwrites, cleaner victims).
            let mut made = 0;
            while made < o.pending.min(closed / 2) {
                let e = rng.random_range(0..o.extents);
                if self.bench_make_pending(&mut st, e) {
                    made += 1;
                }
            }
            let at = Instant::now();
            let io = st.begin_checkpoint(&cx)?;
            t.phase1_s.push(at.elapsed().as_secs_f64());
            let r = io.run(&cx);
            st.finish_checkpoint(&cx, io.seq, r)?;
            if round == 0 {
                t.released = made as u64;
            }
            let at = Instant::now();
            let v = cleaner::select(&st, &cx, Mode::Incremental);
            t.incremental_s.push(at.elapsed().as_secs_f64());
            t.victims.0 = std::hint::black_box(v).len();
            let at = Instant::now();
            let v = cleaner::select(&st, &cx, Mode::Compact);
            t.compact_s.push(at.elapsed().as_secs_f64());
            t.victims.1 = std::hint::black_box(v).len();
        }
        Ok(t)
    }

    /// Replaces the accounting with `infos` and the free list with its free extents not in
    /// the allocation queue.
    fn install_extents(
        &self,
        st: &mut crate::state::State,
        infos: Vec<ExtentInfo>,
        queued: &std::collections::HashSet<u32>,
    ) {
        st.free = (0..infos.len() as u32)
            .filter(|e| infos[*e as usize].state() == ExtentState::Free && !queued.contains(e))
            .collect();
        st.extents = Extents::new(infos);
    }

    /// Empties closed extent `e` (no live block left); false if it is not closed.
    fn bench_make_pending(&self, st: &mut crate::state::State, e: u32) -> bool {
        let x = st.extents.get(e);
        if x.state() != ExtentState::Closed {
            return false;
        }
        let (mut bytes, blocks) = (x.live_bytes(), x.live_blocks());
        for left in (1..=blocks).rev() {
            let share = if left == 1 { bytes } else { bytes / left };
            st.extents.remove_block(e, share);
            bytes -= share;
        }
        true
    }
}

/// Storage in RAM that holds only what was written (64 KiB chunks): a data area of terabytes
/// costs nothing until written.
struct SparseRam {
    len: u64,
    chunks: Mutex<HashMap<u64, Box<[u8]>>>,
}

const CHUNK: u64 = 64 << 10;

impl SparseRam {
    fn new(len: u64) -> SparseRam {
        SparseRam {
            len,
            chunks: Mutex::new(HashMap::new()),
        }
    }

    /// Calls `f(chunk, offset in chunk, offset in the caller's buffer, bytes)` per chunk of
    /// `offset..offset + len`.
    fn each(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, usize, usize),
    ) -> Result<()> {
        if offset + len as u64 > self.len {
            return Err(Error::Invalid("beyond the end of the storage".into()));
        }
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let (c, o) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - o).min(len - done);
            f(c, o, done, n);
            done += n;
        }
        Ok(())
    }
}

impl Storage for SparseRam {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let chunks = self.chunks.lock();
        self.each(offset, buf.len(), |c, o, b, n| match chunks.get(&c) {
            Some(chunk) => buf[b..b + n].copy_from_slice(&chunk[o..o + n]),
            None => buf[b..b + n].fill(0),
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut chunks = self.chunks.lock();
        self.each(offset, data.len(), |c, o, b, n| {
            let chunk = chunks
                .entry(c)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            chunk[o..o + n].copy_from_slice(&data[b..b + n]);
        })
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let mut chunks = self.chunks.lock();
        let len = usize::try_from(len).map_err(|_| Error::Invalid("discard too long".into()))?;
        self.each(offset, len, |c, o, _, n| {
            if n == CHUNK as usize {
                chunks.remove(&c);
            } else if let Some(chunk) = chunks.get_mut(&c) {
                chunk[o..o + n].fill(0);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_small_table() {
        let t = extent_scans(&ExtentScanOptions {
            extents: 4096,
            extent_bytes: 128 << 10,
            rounds: 2,
            pending: 16,
            seed: 1,
        })
        .expect("a small table is measured");
        assert_eq!((t.phase1_s.len(), t.compact_s.len()), (2, 2));
        assert_eq!(t.released, 16);
        assert!(t.closed > 3000, "{t:?}");
        assert!(t.victims.0 > 0 && t.victims.1 > 0, "{t:?}");
    }

    #[test]
    fn sparse_ram_reads_back_what_was_written() {
        let s = SparseRam::new(1 << 30);
        s.write_at(CHUNK - 3, &[1, 2, 3, 4, 5]).expect("write");
        let mut b = [9u8; 7];
        s.read_at(CHUNK - 4, &mut b).expect("read");
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 0]);
        s.discard(CHUNK - 2, 2 * CHUNK).expect("discard");
        s.read_at(CHUNK - 4, &mut b).expect("read");
        assert_eq!(b, [0, 1, 0, 0, 0, 0, 0]);
        assert!(s.read_at((1 << 30) - 2, &mut b).is_err());
    }
}
