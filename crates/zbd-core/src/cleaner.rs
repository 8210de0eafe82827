//! The cleaner (paper II-A, Sprite LFS): compacts the live blocks of partly dead extents into new
//! extents so whole extents become free again.
//!
//! - Victims: closed extents with dead space, best cost-benefit first: `(1 - u) * age / (1 + u)`
//!   with `u` = live bytes / extent size and `age` = write sequences since the extent was written
//!   (old, mostly dead extents first; hot extents get time to die on their own). An incremental
//!   pass stops adding victims once it would gain `PASS_GAIN_TARGET` extents; `compact` takes the
//!   least-live extents first and as many as one pass may.
//! - Placement: the live blocks of a pass are packed first-fit decreasing (largest first, each into
//!   the first output extent with room) without recompressing; a pass handles a batch of victims
//!   together, so blocks of neighbouring victims share output extents, in LBA order among equal
//!   sizes. The exact packing is computed before anything is written: a pass that would not free
//!   more extents than it fills is not run. With fewer free extents than the packing needs
//!   (small data areas), the pass streams instead (`stream`): outputs reuse drained victims.
//! - Safety: outputs come from the allocation queue like host writes, carry ordinary data records
//!   (replayed after a crash in write-sequence order), and the map is switched to them only after
//!   they are sealed (they reach the storage through the outbox, before any sync); victims become
//!   free only at a checkpoint that no longer references them (after the outputs are synced).
//! - Locking: background passes read their victims with the state lock released and switch the
//!   map, under it, only for blocks whose entry did not change meanwhile (`pass_unlocked`);
//!   other passes run whole under the lock. Reads never see a half-moved block either way.

use crate::error::Result;
use crate::format::{
    seal_segment, segment_padded_len, MapEntry, Record, RecordKind, SegmentHeader, RECORD_BYTES,
    SECTOR_BYTES, SEGMENT_HEADER_BYTES,
};
use crate::state::{Ctx, ExtentInfo, ExtentState, State};
use parking_lot::MutexGuard;
use std::collections::HashMap;

/// How a pass chooses its victims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Background / foreground cleaning: cost-benefit, stop at the gain target.
    Incremental,
    /// Offline compaction: least live first, as many as one pass allows.
    Compact,
}

/// Net extents an incremental pass aims to free.
const PASS_GAIN_TARGET: usize = 8;
/// Victims per pass at most.
const PASS_VICTIMS_MAX: usize = 128;
/// Output extents per pass at most.
const PASS_OUTPUTS_MAX: usize = 64;
/// Incremental passes one foreground `make_space` call may run.
const FOREGROUND_PASSES_MAX: usize = 64;

/// What one pass did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassResult {
    /// Victims cleaned.
    pub victims: usize,
    /// Victims left without live data (free after the next checkpoint).
    pub reclaimed: usize,
    /// Output extents written.
    pub outputs: usize,
    /// Live bytes moved.
    pub bytes_moved: u64,
}

impl PassResult {
    /// Whether the pass freed more extents than it used.
    pub fn progressed(&self) -> bool {
        self.reclaimed > self.outputs
    }
}

fn cost_benefit(x: &ExtentInfo, extent_bytes: f64, now: u64) -> f64 {
    let u = f64::from(x.live_bytes) / extent_bytes;
    let age = (now.saturating_sub(x.stamp) + 1) as f64;
    (1.0 - u) * age / (1.0 + u)
}

/// Bytes an extent's live blocks take in an output extent (payload and records).
fn footprint(x: &ExtentInfo) -> usize {
    // v2 segments carry their record table twice (v1 once: the estimate errs on the safe side).
    x.live_bytes as usize + x.live_blocks as usize * 2 * RECORD_BYTES
}

/// Chooses the victims of a pass, best first.
fn choose_victims(st: &State, extent_bytes: usize, mode: Mode, outputs_max: usize) -> Vec<u32> {
    let usable = extent_bytes - 2 * SEGMENT_HEADER_BYTES - SECTOR_BYTES;
    let now = st.next_seq;
    let mut cands: Vec<(f64, u32)> = st
        .extents
        .iter()
        .enumerate()
        .filter(|(i, x)| {
            x.state == ExtentState::Closed
                && footprint(x) < usable
                && !st.cleaning.contains(&(*i as u32))
        })
        .map(|(i, x)| {
            let key = match mode {
                Mode::Incremental => -cost_benefit(x, extent_bytes as f64, now),
                Mode::Compact => f64::from(x.live_bytes),
            };
            (key, i as u32)
        })
        .collect();
    cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut victims = Vec::new();
    let mut need = 0usize;
    for &(_, v) in &cands {
        let add = footprint(&st.extents[v as usize]);
        if (need + add).div_ceil(usable) > outputs_max {
            continue;
        }
        victims.push(v);
        need += add;
        let gain = victims.len().saturating_sub(need.div_ceil(usable));
        if (mode == Mode::Incremental && gain >= PASS_GAIN_TARGET)
            || victims.len() >= PASS_VICTIMS_MAX
        {
            break;
        }
    }
    victims
}

/// First-fit decreasing over stored sizes; returns bins of block indices.
fn pack(blocks: &[(u64, MapEntry)], extent_bytes: usize, version: u32) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by(|&a, &b| {
        blocks[b]
            .1
            .len
            .cmp(&blocks[a].1.len)
            .then(blocks[a].0.cmp(&blocks[b].0))
    });
    let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in order {
        let len = blocks[i].1.len as usize;
        let fits = |payload: usize, n: usize| {
            segment_padded_len(version, payload + len, n + 1) as usize <= extent_bytes
        };
        match bins.iter_mut().find(|(p, b)| fits(*p, b.len())) {
            Some((p, b)) => {
                *p += len;
                b.push(i);
            }
            None => bins.push((len, vec![i])),
        }
    }
    bins.into_iter().map(|(_, b)| b).collect()
}

/// Next-fit packing in victim order, emptiest victim first, for a pass whose outputs outnumber
/// the free extents: each output drains victims in turn, and a drained victim is free again after
/// the checkpoint `alloc` writes when the queue runs dry, so it can take a later output (4 partly
/// dead extents into 3 with 1 free). Reorders `blocks` to match the returned bins; `None` when
/// some output would find no free extent or the pass would not gain.
fn stream(
    st: &State,
    blocks: &mut [(u64, MapEntry)],
    victims: &[u32],
    extent_bytes: usize,
    version: u32,
    free: usize,
) -> Option<Vec<Vec<usize>>> {
    let mut order = victims.to_vec();
    order.sort_by_key(|&v| (st.extents[v as usize].live_bytes, v));
    let rank: HashMap<u32, usize> = order.iter().enumerate().map(|(r, &v)| (v, r)).collect();
    blocks.sort_by_key(|(lba, m)| (rank[&m.extent], *lba));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    let mut payload = 0usize;
    // Per victim (by rank): the bin holding its last block.
    let mut last_bin = vec![0usize; order.len()];
    for (i, (_, m)) in blocks.iter().enumerate() {
        let len = m.len as usize;
        let fits = bins.last().is_some_and(|b| {
            segment_padded_len(version, payload + len, b.len() + 1) as usize <= extent_bytes
        });
        if !fits {
            bins.push(Vec::new());
            payload = 0;
        }
        payload += len;
        bins.last_mut()?.push(i);
        last_bin[rank[&m.extent]] = bins.len() - 1;
    }
    if bins.len() >= victims.len() || bins.len() > PASS_OUTPUTS_MAX {
        return None;
    }
    // Output k needs a free extent: `free` minus the k taken, plus the victims drained before.
    for k in 0..bins.len() {
        let drained = last_bin.iter().filter(|&&b| b < k).count();
        if free + drained <= k {
            return None;
        }
    }
    Some(bins)
}

/// The blocks a pass moves and how they are packed, chosen under the state lock.
struct Selection {
    victims: Vec<u32>,
    /// (logical block, its map entry when chosen).
    blocks: Vec<(u64, MapEntry)>,
    /// Output extents: indices into `blocks`.
    bins: Vec<Vec<usize>>,
    /// Packed victim by victim (`stream`): needs drained victims freed during the pass.
    streamed: bool,
}

/// Chooses victims and packs their live blocks (state lock held); `None` if no pass is worth it.
fn select(st: &mut State, cx: &Ctx, mode: Mode) -> Result<Option<Selection>> {
    let e = cx.sb.extent_bytes as usize;
    let free = st.free_now();
    if free == 0 {
        return Ok(None);
    }
    // Victims may need more outputs than are free: `stream` then reuses drained victims.
    let mut victims = choose_victims(st, e, mode, PASS_OUTPUTS_MAX);
    if victims.is_empty() {
        return Ok(None);
    }
    let mut is_victim = vec![false; st.extents.len()];
    victims.iter().for_each(|&v| is_victim[v as usize] = true);
    let mut candidates: Vec<(u64, MapEntry)> = Vec::new();
    st.map.for_each_data(|l, m| {
        if is_victim[m.extent as usize] {
            candidates.push((l, *m));
        }
    })?;
    loop {
        let mut blocks: Vec<(u64, MapEntry)> = candidates
            .iter()
            .filter(|(_, m)| is_victim[m.extent as usize])
            .copied()
            .collect();
        let bins = pack(&blocks, e, cx.sb.version);
        if bins.len() <= free.min(PASS_OUTPUTS_MAX) && bins.len() < victims.len() {
            return Ok(Some(Selection {
                victims,
                blocks,
                bins,
                streamed: false,
            }));
        }
        // Too few free extents for the whole packing (small data areas): fill the outputs
        // victim by victim instead, so drained victims are free again for the later outputs.
        if let Some(bins) = stream(st, &mut blocks, &victims, e, cx.sb.version, free) {
            return Ok(Some(Selection {
                victims,
                blocks,
                bins,
                streamed: true,
            }));
        }
        // Drop the least beneficial victim and try again rather than giving up: when free
        // extents are scarce, giving up here meant NoSpace with most of the data area dead.
        let Some(v) = victims.pop() else {
            return Ok(None);
        };
        is_victim[v as usize] = false;
    }
}

/// Reads the victims whole (paper: extents are read in full), their last segments issued
/// first (they may still wait in the outbox). Needs no state lock: victims stay allocated
/// while they are read (lock held, or listed in `State::cleaning`).
fn read_victims(cx: &Ctx, victims: &[u32]) -> Result<HashMap<u32, Vec<u8>>> {
    cx.outbox.issue_all(cx.storage)?;
    let mut images = HashMap::with_capacity(victims.len());
    for &v in victims {
        let mut buf = vec![0u8; cx.sb.extent_bytes as usize];
        cx.storage.read_at(cx.sb.extent_offset(v), &mut buf)?;
        images.insert(v, buf);
    }
    Ok(images)
}

/// Writes the outputs of a pass and switches the map to them (state lock held). Only blocks
/// whose map entry is still the one chosen move: a block the host rewrote, trimmed or zeroed
/// meanwhile keeps its new entry, and its old bytes are not copied. Outputs are sealed here and
/// issued through the outbox, after the lock is released.
fn commit(
    st: &mut State,
    cx: &Ctx,
    sel: &Selection,
    images: &HashMap<u32, Vec<u8>>,
) -> Result<PassResult> {
    let e = cx.sb.extent_bytes as usize;
    let stamp = sel
        .victims
        .iter()
        .map(|&v| st.extents[v as usize].stamp)
        .max()
        .unwrap_or(0);
    let mut result = PassResult {
        victims: sel.victims.len(),
        ..PassResult::default()
    };
    let mut outputs = Vec::with_capacity(sel.bins.len());
    for bin in &sel.bins {
        let mut unchanged = Vec::with_capacity(bin.len());
        for &i in bin {
            let (lba, chosen) = sel.blocks[i];
            if st.map.get(lba)? == chosen {
                unchanged.push(i);
            }
        }
        if unchanged.is_empty() {
            continue;
        }
        // When the queue runs dry, `alloc` checkpoints (syncing the outputs written so far),
        // which releases the victims they drained: crash safety as for separate passes.
        let q = st.alloc(cx)?;
        outputs.push(q.extent);
        let mut buf = vec![0u8; e];
        let mut records = Vec::with_capacity(unchanged.len());
        let mut moved = Vec::with_capacity(unchanged.len());
        let mut at = SEGMENT_HEADER_BYTES;
        for i in unchanged {
            let (lba, old) = sel.blocks[i];
            let len = old.len as usize;
            let src = &images[&old.extent][old.offset as usize..old.offset as usize + len];
            buf[at..at + len].copy_from_slice(src);
            let seq = st.take_seq();
            records.push(Record {
                codec: old.codec,
                len: len as u32,
                offset: at as u32,
                crc: old.crc,
                ..Record::new(RecordKind::Data, lba, 1, seq)
            });
            moved.push((
                lba,
                MapEntry {
                    extent: q.extent,
                    offset: at as u32,
                    ..old
                },
            ));
            at += len;
        }
        let h = SegmentHeader {
            version: cx.sb.version,
            alloc_seq: q.alloc_seq,
            extent: q.extent,
            seg_offset: 0,
            payload_len: (at - SEGMENT_HEADER_BYTES) as u32,
            record_count: records.len() as u32,
            durable_seq: cx.durable_seq.load(std::sync::atomic::Ordering::SeqCst),
        };
        let n = seal_segment(&mut buf, &cx.sb.uuid, &h, &records);
        cx.outbox
            .push(q.extent, 0, cx.sb.extent_offset(q.extent), &buf[..n]);
        st.counters.cleaner_bytes_written += n as u64;
        let x = &mut st.extents[q.extent as usize];
        x.state = ExtentState::Closed;
        x.stamp = stamp;
        for (lba, entry) in moved {
            result.bytes_moved += u64::from(entry.len);
            st.set_entry(lba, entry)?;
        }
        result.outputs += 1;
    }
    result.reclaimed = sel
        .victims
        .iter()
        .filter(|&&v| st.extents[v as usize].live_blocks == 0 || outputs.contains(&v))
        .count();
    st.counters.cleaner_runs += 1;
    st.counters.cleaner_bytes_moved += result.bytes_moved;
    st.counters.extents_reclaimed += result.reclaimed as u64;
    Ok(result)
}

/// One cleaning pass, all of it under the state lock (foreground cleaning, compaction).
pub fn pass(st: &mut State, cx: &Ctx, mode: Mode) -> Result<PassResult> {
    let Some(sel) = select(st, cx, mode)? else {
        return Ok(PassResult::default());
    };
    let images = read_victims(cx, &sel.victims)?;
    commit(st, cx, &sel, &images)
}

/// One incremental pass that holds the state lock (`lock`) only to choose its victims and to
/// commit: the victims are read with the lock released, so host I/O goes on meanwhile (the
/// background cleaner). A victim stays allocated while it is read because `State::cleaning`
/// keeps checkpoints from releasing it; blocks that changed meanwhile are not moved (`commit`).
/// A pass that must stream (small data areas) runs whole under the lock, as `pass`.
pub fn pass_unlocked<'a>(lock: &dyn Fn() -> MutexGuard<'a, State>, cx: &Ctx) -> Result<PassResult> {
    let (sel, gen) = {
        let mut st = lock();
        let Some(sel) = select(&mut st, cx, Mode::Incremental)? else {
            return Ok(PassResult::default());
        };
        if sel.streamed {
            let images = read_victims(cx, &sel.victims)?;
            return commit(&mut st, cx, &sel, &images);
        }
        // Two rounds may overlap (`Volume::clean` beside the cleaner thread): their victims are
        // disjoint (`choose_victims` skips listed ones), each lists and unlists its own.
        st.cleaning.extend_from_slice(&sel.victims);
        (sel, st.clean_gen)
    };
    let images = read_victims(cx, &sel.victims);
    let mut st = lock();
    st.cleaning.retain(|v| !sel.victims.contains(v));
    let images = images?;
    // Host writes may have taken free extents meanwhile, or foreground cleaning took the victims
    // back: then the pass is dropped (nothing moved yet; the next one chooses again).
    if st.clean_gen != gen || st.free_now() < sel.bins.len() {
        return Ok(PassResult::default());
    }
    commit(&mut st, cx, &sel, &images)
}

/// Foreground: free extents for host writes when the free pool is down to the cleaner reserve.
/// Cleans until twice the reserve is free (hysteresis), batching passes between checkpoints
/// (a checkpoint costs three syncs and is what turns victims into free extents).
pub fn make_space(st: &mut State, cx: &Ctx) -> Result<()> {
    // A host write waits for space: victims a background pass is reading are taken back (that
    // pass drops its work at commit), or they could neither be cleaned nor released now and a
    // nearly full volume would report NoSpace with dead space left.
    if !st.cleaning.is_empty() {
        st.cleaning.clear();
        st.clean_gen += 1;
    }
    // Extents without live data only wait for a checkpoint: the cheapest space there is.
    if st
        .extents
        .iter()
        .any(|x| x.state == ExtentState::PendingFree)
    {
        st.checkpoint(cx)?;
    }
    let goal = st.buffer.reserve * 2;
    let pending = |st: &State| {
        st.extents
            .iter()
            .filter(|x| x.state == ExtentState::PendingFree)
            .count()
    };
    for _ in 0..FOREGROUND_PASSES_MAX {
        if st.free_now() + pending(st) > goal {
            break;
        }
        let r = pass(st, cx, Mode::Incremental)?;
        if !r.progressed() {
            break;
        }
        if st.free_now() <= 2 {
            st.checkpoint(cx)?;
        }
    }
    if pending(st) > 0 {
        st.checkpoint(cx)?;
    }
    Ok(())
}
