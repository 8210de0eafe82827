//! The cleaner (paper II-A, Sprite LFS): compacts the live blocks of partly dead extents into new
//! extents so whole extents become free again.
//!
//! - Victims: closed extents with dead space, best cost-benefit first: `(1 - u) * age / (1 + u)`
//!   with `u` = live bytes / extent size and `age` = write sequences since the extent was written
//!   (old, mostly dead extents first; hot extents get time to die on their own). An incremental
//!   pass stops adding victims once it would gain `PASS_GAIN_TARGET` extents; `compact` takes the
//!   least-live extents first and as many as one pass may.
//! - Placement: the live blocks of a pass are packed first-fit decreasing (largest first, each into
//!   the first output extent with room) without recompressing (except the live blocks of mostly
//!   dead compression units, see `items`); a pass handles a batch of victims
//!   together, so blocks of neighbouring victims share output extents, in LBA order among equal
//!   sizes. The exact packing is computed before anything is written: a pass that would not free
//!   more extents than it fills is not run. With fewer free extents than the packing needs
//!   (small data areas), the pass streams instead (`stream`): outputs reuse drained victims.
//! - Safety: outputs come from the allocation queue like host writes, carry ordinary data records
//!   (replayed after a crash in write-sequence order), and the map is switched to them only after
//!   they are sealed (they reach the storage through the outbox, before any sync); victims become
//!   free only at a checkpoint that no longer references them (after the outputs are synced).
//! - Locking: background passes read their victims with the state lock released and switch the
//!   map, under it, only for blocks still live in a victim (`pass_unlocked`);
//!   other passes run whole under the lock. Reads never see a half-moved block either way.
//!   Victims are chosen under the lock by their accounting; once they are read, their live
//!   blocks are found from their record tables (no walk of the paged map), mostly dead units
//!   are recompressed and everything is packed, under the lock: victims that do not pack into
//!   fewer extents are dropped.

mod policy;

pub use policy::Mode;

use crate::error::Result;
use crate::extents::ExtentState;
use crate::format::{
    seal_segment, MapEntry, Record, RecordKind, SbtKey, SbtValue, SegmentForm, SegmentHeader,
    Superblock, BLOCK_BYTES, SECTOR_BYTES, SEGMENT_HEADER_BYTES,
};
use crate::state::{Ctx, State};
use parking_lot::MutexGuard;
use std::collections::{BTreeMap, HashMap};

/// Output extents per pass at most.
const PASS_OUTPUTS_MAX: usize = 64;
/// Victims of one migration batch (`migrate`): half the outputs a pass may use, so a batch
/// whose blocks grow a little when recompressed still fits.
pub const MIGRATE_BATCH: usize = PASS_OUTPUTS_MAX / 2;
/// Incremental passes one foreground `make_space` call may run.
pub(crate) const FOREGROUND_PASSES_MAX: usize = 64;

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
    /// `zbd compact` only: bytes of map page slots no page needs, given back to the storage.
    pub metadata_bytes_discarded: u64,
}

impl PassResult {
    /// Whether the pass freed more extents than it used.
    pub fn progressed(&self) -> bool {
        self.reclaimed > self.outputs
    }
}

/// One stored item a pass moves: a single block, or a compression unit with its live blocks
/// (copied whole, one record per live block), or a block of a mostly dead unit recompressed on
/// its own, or a block or unit recompressed with the current dictionary (it named an older one).
#[derive(Clone, Debug)]
struct Item {
    /// Live blocks it carries, (lba, entry in the victim), in LBA order; a shared item's are
    /// every block of it, at its birth LBA + index.
    blocks: Vec<(u64, MapEntry)>,
    /// Recompressed form; `None`: the victim's stored bytes, verbatim.
    fresh: Option<Fresh>,
    /// A shared item (bit 12): moved whole and verbatim, its SBT entry pointed at the copy,
    /// one move record per block (design.md, build order 2a).
    shared: Option<SbtKey>,
}

/// Stored bytes a pass compressed again.
#[derive(Clone, Debug)]
struct Fresh {
    codec: u8,
    bytes: Vec<u8>,
    crc: u32,
    /// Whether `crc` is seeded (v3).
    seeded: bool,
    dict: u8,
    /// The whole unit again (its blocks keep their index); else one block on its own.
    unit: bool,
}

impl Item {
    fn len(&self) -> usize {
        match &self.fresh {
            Some(f) => f.bytes.len(),
            None => usize::from(self.blocks[0].1.len),
        }
    }
    fn lba(&self) -> u64 {
        self.blocks[0].0
    }
    fn victim(&self) -> u32 {
        self.blocks[0].1.extent
    }
}

/// Compresses `data` (one block, or a unit when `unit`) with the dictionary in use, if any;
/// `None` when it does not save a sector (a block is then stored raw, a unit is not redone).
fn recompress(
    sb: &Superblock,
    codec: crate::codec::Codec,
    dicts: &crate::dicts::Dicts,
    data: &[u8],
    unit: bool,
) -> Option<Fresh> {
    let active = dicts.active();
    let z = match &active {
        Some(d) => d.compress(codec, data),
        None => codec.compress(data),
    };
    let (codec, bytes, dict) = match z {
        Some(z) if z.len() + SECTOR_BYTES <= data.len() => (codec.id(), z, active),
        _ if unit => return None,
        _ => (crate::codec::id::RAW, data.to_vec(), None),
    };
    let blocks = (data.len() / BLOCK_BYTES) as u8;
    let id = dict.as_ref().map(|d| d.identity());
    let (crc, seeded) = sb.new_item_checksum(codec, blocks, id.as_ref(), &bytes);
    Some(Fresh {
        codec,
        bytes,
        crc,
        seeded,
        dict: dict.map_or(0, |d| d.id() as u8),
        unit,
    })
}

/// Groups the live blocks of the victims into items: a unit's blocks travel together. A unit
/// with fewer than half its blocks live is decoded (after its CRC checks) and its live blocks
/// are recompressed one by one, so its dead share is given back; a damaged one is copied
/// verbatim, damage and all. Blocks and units that name a dictionary other than the current
/// one are decoded and recompressed with the current one (or none when dictionaries are off),
/// so old dictionaries lose their last blocks and can be retired (dicts.rs).
fn items(
    sb: &Superblock,
    candidates: &[(u64, MapEntry)],
    images: &HashMap<u32, Vec<u8>>,
    codec: crate::codec::Codec,
    dicts: &crate::dicts::Dicts,
) -> Vec<Item> {
    let current = dicts.current_id();
    let stale = |m: &MapEntry| m.dict != 0 && Some(u16::from(m.dict)) != current;
    // The stored bytes of `m` decoded into `plain` after their CRC check; false when damaged
    // or when its dictionary is not loaded (then it is copied verbatim).
    let decode = |m: &MapEntry, plain: &mut [u8]| -> bool {
        let stored = images
            .get(&m.extent)
            .and_then(|img| img.get(m.offset as usize..m.offset as usize + usize::from(m.len)));
        let dict = (m.dict != 0).then(|| dicts.get(m.dict));
        stored.is_some_and(|s| {
            m.checksum_matches(
                &sb.uuid,
                dict.clone().flatten().map(|d| d.identity()).as_ref(),
                s,
            ) && match &dict {
                None => crate::codec::decompress(m.codec, s, plain).is_some(),
                Some(Some(d)) => d.decompress(m.codec, s, plain).is_some(),
                Some(None) => false,
            }
        })
    };
    let mut units: HashMap<(u32, u32), Vec<(u64, MapEntry)>> = HashMap::new();
    let mut out = Vec::new();
    for &(lba, m) in candidates {
        if m.unit_blocks > 1 {
            units
                .entry((m.extent, m.offset))
                .or_default()
                .push((lba, m));
        } else {
            let mut plain = vec![0u8; BLOCK_BYTES];
            let fresh = (stale(&m) && decode(&m, &mut plain))
                .then(|| recompress(sb, codec, dicts, &plain, false))
                .flatten();
            out.push(Item {
                blocks: vec![(lba, m)],
                fresh,
                shared: None,
            });
        }
    }
    for (_, blocks) in units {
        let m = blocks[0].1;
        let mostly_live = blocks.len() * 2 >= usize::from(m.unit_blocks);
        if mostly_live && !stale(&m) {
            out.push(Item {
                blocks,
                fresh: None,
                shared: None,
            });
            continue;
        }
        let mut plain = vec![0u8; usize::from(m.unit_blocks) * BLOCK_BYTES];
        if !decode(&m, &mut plain) {
            out.push(Item {
                blocks,
                fresh: None,
                shared: None,
            });
            continue;
        }
        // A mostly live unit on an old dictionary: the whole unit again, if that still pays.
        if let Some(fresh) = mostly_live
            .then(|| recompress(sb, codec, dicts, &plain, true))
            .flatten()
        {
            out.push(Item {
                blocks,
                fresh: Some(fresh),
                shared: None,
            });
            continue;
        }
        for (lba, e) in blocks {
            let i = usize::from(e.unit_index) * BLOCK_BYTES;
            let fresh = recompress(sb, codec, dicts, &plain[i..i + BLOCK_BYTES], false);
            out.push(Item {
                blocks: vec![(lba, e)],
                fresh,
                shared: None,
            });
        }
    }
    out.sort_by_key(|it| it.lba());
    out
}

/// First-fit decreasing over stored sizes; returns bins of item indices.
fn pack(items: &[Item], extent_bytes: usize, form: SegmentForm) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        items[b]
            .len()
            .cmp(&items[a].len())
            .then(items[a].lba().cmp(&items[b].lba()))
    });
    let mut bins: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for i in order {
        let (len, recs) = (items[i].len(), items[i].blocks.len());
        let fits = |payload: usize, n: usize| {
            form.padded_len(payload + len, n + recs) as usize <= extent_bytes
        };
        match bins.iter_mut().find(|(p, n, _)| fits(*p, *n)) {
            Some((p, n, b)) => {
                *p += len;
                *n += recs;
                b.push(i);
            }
            None => bins.push((len, recs, vec![i])),
        }
    }
    bins.into_iter().map(|(_, _, b)| b).collect()
}

/// Next-fit packing in victim order, emptiest victim first, for a pass whose outputs outnumber
/// the free extents: each output drains victims in turn, and a drained victim is free again after
/// the checkpoint `alloc` writes when the queue runs dry, so it can take a later output (4 partly
/// dead extents into 3 with 1 free). Reorders `blocks` to match the returned bins; `None` when
/// some output would find no free extent or the pass would not gain.
fn stream(
    st: &State,
    items: &mut [Item],
    victims: &[u32],
    extent_bytes: usize,
    form: SegmentForm,
    free: usize,
) -> Option<Vec<Vec<usize>>> {
    let mut order = victims.to_vec();
    order.sort_by_key(|&v| (st.extents.get(v).live_bytes(), v));
    let rank: HashMap<u32, usize> = order.iter().enumerate().map(|(r, &v)| (v, r)).collect();
    items.sort_by_key(|it| (rank[&it.victim()], it.lba()));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    let (mut payload, mut recs) = (0usize, 0usize);
    // Per victim (by rank): the bin holding its last block.
    let mut last_bin = vec![0usize; order.len()];
    for (i, it) in items.iter().enumerate() {
        let (len, n) = (it.len(), it.blocks.len());
        let fits =
            !bins.is_empty() && form.padded_len(payload + len, recs + n) as usize <= extent_bytes;
        if !fits {
            bins.push(Vec::new());
            payload = 0;
            recs = 0;
        }
        payload += len;
        recs += n;
        bins.last_mut()?.push(i);
        last_bin[rank[&it.victim()]] = bins.len() - 1;
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

/// Chooses the victims of a pass (state lock held); empty when none is worth cleaning.
pub(crate) fn select(st: &State, cx: &Ctx, mode: Mode) -> Vec<u32> {
    if st.free_now() == 0 {
        return Vec::new();
    }
    // Victims may need more outputs than are free: `stream` then reuses drained victims.
    let busy: Vec<u32> = st.cleaning.iter().chain(&st.unreadable).copied().collect();
    policy::choose_victims(
        st.extents.as_slice(),
        &busy,
        st.next_seq,
        cx.sb.extent_bytes as usize,
        mode,
        PASS_OUTPUTS_MAX,
    )
}

/// Packs the items of `victims` into output extents, dropping the least beneficial victim and
/// trying again until the packing fits the free extents and frees more than it fills (rather
/// than giving up: when free extents are scarce, giving up meant NoSpace with most of the data
/// area dead). Returns the items, their bins and whether they were streamed; `None` when no
/// victim is left.
/// `migrate`: the pass moves blocks off old dictionaries, so it need not gain extents (it
/// only has to fit the free ones).
fn fit(
    st: &State,
    all: &[Item],
    victims: &mut Vec<u32>,
    extent_bytes: usize,
    form: SegmentForm,
    free: usize,
    migrate: bool,
) -> Option<(Vec<Item>, Vec<Vec<usize>>, bool)> {
    while !victims.is_empty() {
        let mut chosen: Vec<Item> = all
            .iter()
            .filter(|it| victims.contains(&it.victim()))
            .cloned()
            .collect();
        let bins = pack(&chosen, extent_bytes, form);
        if migrate {
            if bins.len() <= free.min(PASS_OUTPUTS_MAX) {
                return Some((chosen, bins, false));
            }
            victims.pop();
            continue;
        }
        if bins.len() <= free.min(PASS_OUTPUTS_MAX) && bins.len() < victims.len() {
            return Some((chosen, bins, false));
        }
        // Too few free extents for the whole packing (small data areas): fill the outputs
        // victim by victim instead, so drained victims are free again for the later outputs.
        if let Some(bins) = stream(st, &mut chosen, victims, extent_bytes, form, free) {
            return Some((chosen, bins, true));
        }
        victims.pop();
    }
    None
}

/// Reads the victims whole (paper: extents are read in full), their last segments issued
/// first (they may still wait in the outbox). Needs no state lock: victims stay allocated while
/// they are read (lock held, or listed in `State::cleaning`).
/// The victims read, and those whose bytes the storage would not give (`unreadable`).
struct Images {
    images: HashMap<u32, Vec<u8>>,
    unreadable: Vec<u32>,
}

impl Images {
    /// Leaves out of `victims` those that could not be read and lists them in the state: the
    /// cleaner no longer chooses them (their blocks read as I/O errors until overwritten, and
    /// the extent is freed like any other once none is live). Failing the pass instead would
    /// fail every later one on the same victim and end, once free extents ran out, in NoSpace.
    fn keep_readable(&self, st: &mut State, victims: &mut Vec<u32>) {
        for &v in &self.unreadable {
            if !st.unreadable.contains(&v) {
                tracing::warn!(
                    "cleaner: extent {v} cannot be read; its blocks are left where they are"
                );
                st.unreadable.push(v);
            }
        }
        victims.retain(|v| self.images.contains_key(v));
    }
}

fn read_victims(cx: &Ctx, victims: &[u32]) -> Result<Images> {
    cx.outbox.issue_all(cx.storage)?;
    let mut images = HashMap::with_capacity(victims.len());
    let mut unreadable = Vec::new();
    for &v in victims {
        let mut buf = vec![0u8; cx.sb.extent_bytes as usize];
        let at = cx.sb.extent_offset(v);
        // A second try: a read error that passes is not worth giving up an extent for.
        if cx.storage.read_at(at, &mut buf).is_err() && cx.storage.read_at(at, &mut buf).is_err() {
            unreadable.push(v);
            continue;
        }
        images.insert(v, buf);
    }
    Ok(Images { images, unreadable })
}

/// Finds the live blocks of the victims (read: `images`), packs them and writes the outputs,
/// switching the map to them (state lock held, so the blocks found are the current ones).
/// Victims whose blocks do not pack into fewer extents are dropped. Outputs are sealed here
/// and issued through the outbox, after the lock is released.
fn commit(
    st: &mut State,
    cx: &Ctx,
    mut victims: Vec<u32>,
    images: &HashMap<u32, Vec<u8>>,
    migrate: bool,
) -> Result<PassResult> {
    let e = cx.sb.extent_bytes as usize;
    // The victims' record tables name their live blocks, so the (paged) map is not walked,
    // unless a victim's records do not account for all its live blocks.
    let mut candidates: Vec<(u64, MapEntry)> = Vec::new();
    // Content does not change when a block moves (recompressed or not): its copy's record
    // carries the fingerprint the victim's record carried, so the dedup index's manifests
    // (an extent's record table) survive cleaning.
    let mut fingerprints: HashMap<u64, u32> = HashMap::new();
    // Shared items lying in the victims, by key (bit 12), and their blocks' fingerprints (by
    // key and index: a direct block may live at a shared item's birth LBA + index).
    let mut shared: BTreeMap<SbtKey, SbtValue> = BTreeMap::new();
    let mut shared_prints: HashMap<(SbtKey, u8), u32> = HashMap::new();
    let mut complete = true;
    for &v in &victims {
        let live = st.extents.get(v).live_blocks();
        match crate::recovery::live_blocks_in(&mut st.map, cx.sb, v, &images[&v], live)? {
            Some(found) => {
                for b in found.blocks {
                    candidates.push((b.lba, b.entry));
                    if b.fingerprint != 0 {
                        fingerprints.insert(b.lba, b.fingerprint);
                    }
                }
                for (key, item) in found.shared {
                    for (i, f) in item.fingerprints {
                        shared_prints.insert((key, i), f);
                    }
                    shared.insert(key, item.value);
                }
            }
            None => complete = false,
        }
    }
    if !complete {
        let mut is_victim = vec![false; st.extents.len()];
        victims.iter().for_each(|&v| is_victim[v as usize] = true);
        let in_victim = |e: u32| is_victim.get(e as usize).copied().unwrap_or(false);
        candidates.clear();
        shared.clear();
        st.map.for_each_data(|l, m| {
            if in_victim(m.extent) {
                candidates.push((l, *m));
            }
        })?;
        st.map.for_each_shared(&mut |k, v| {
            if in_victim(v.extent) {
                shared.insert(k, v);
            }
            true
        })?;
    }
    let mut all = items(cx.sb, &candidates, images, cx.codec, cx.dicts);
    all.extend(shared.iter().map(|(&key, v)| {
        Item {
            blocks: (0..v.unit_blocks())
                .map(|i| (key.birth + u64::from(i), v.block(i)))
                .collect(),
            fresh: None,
            shared: Some(key),
        }
    }));
    let free = st.free_now();
    let Some((items, bins, _)) = fit(st, &all, &mut victims, e, cx.form, free, migrate) else {
        return Ok(PassResult::default());
    };
    let stamp = victims
        .iter()
        .map(|&v| st.extents.get(v).stamp())
        .max()
        .unwrap_or(0);
    let mut result = PassResult {
        victims: victims.len(),
        ..PassResult::default()
    };
    let mut outputs = Vec::with_capacity(bins.len());
    for bin in &bins {
        // When the queue runs dry, `alloc` checkpoints (syncing the outputs written so far),
        // which releases the victims they drained: crash safety as for separate passes.
        let q = st.alloc(cx)?;
        outputs.push(q.extent);
        let mut buf = vec![0u8; e];
        let mut records = Vec::with_capacity(bin.len());
        let mut moved = Vec::with_capacity(bin.len());
        let mut moved_shared = Vec::new();
        let mut at = SEGMENT_HEADER_BYTES;
        for &i in bin {
            let it = &items[i];
            let len = it.len();
            let old = it.blocks[0].1;
            // Copied stored bytes keep their dictionary id; recompressed ones name theirs.
            let (codec, crc, seeded, dict) = match &it.fresh {
                Some(f) => {
                    buf[at..at + len].copy_from_slice(&f.bytes);
                    (f.codec, f.crc, f.seeded, f.dict)
                }
                None => {
                    // Verbatim, checksum and all: a plain (v2) item stays plain, so replay
                    // can still fall back on the victim's copy by checksum (open.rs), and
                    // damage is never given a valid checksum.
                    let src = &images[&old.extent][old.offset as usize..old.offset as usize + len];
                    buf[at..at + len].copy_from_slice(src);
                    (old.codec, old.crc, old.seeded, old.dict)
                }
            };
            if let Some(key) = it.shared {
                for &(lba, b) in &it.blocks {
                    let seq = st.take_seq();
                    records.push(Record {
                        codec,
                        len: len as u32,
                        offset: at as u32,
                        crc,
                        unit_index: b.unit_index,
                        unit_blocks: u16::from(b.unit_blocks),
                        dict: u16::from(b.dict),
                        seeded: b.seeded,
                        fingerprint: shared_prints
                            .get(&(key, b.unit_index))
                            .copied()
                            .unwrap_or(0),
                        source_extent: old.extent,
                        source_offset: old.offset,
                        ..Record::new(RecordKind::Move, lba, 1, seq)
                    });
                }
                moved_shared.push((key, at as u32));
                result.bytes_moved += len as u64;
                at += len;
                continue;
            }
            for &(lba, old) in &it.blocks {
                let entry = match &it.fresh {
                    Some(f) if f.unit => MapEntry {
                        codec,
                        len: len as u16,
                        crc,
                        seeded,
                        dict,
                        ..old
                    },
                    Some(_) => MapEntry {
                        codec,
                        len: len as u16,
                        crc,
                        seeded,
                        unit_index: 0,
                        unit_blocks: 1,
                        dict,
                        ..old
                    },
                    None => old,
                };
                let seq = st.take_seq();
                records.push(Record {
                    codec,
                    len: len as u32,
                    offset: at as u32,
                    crc,
                    unit_index: entry.unit_index,
                    unit_blocks: u16::from(entry.unit_blocks),
                    dict: u16::from(entry.dict),
                    seeded: entry.seeded,
                    fingerprint: fingerprints.get(&lba).copied().unwrap_or(0),
                    ..Record::new(RecordKind::Data, lba, 1, seq)
                });
                moved.push((
                    lba,
                    MapEntry {
                        extent: q.extent,
                        offset: at as u32,
                        ..entry
                    },
                ));
            }
            result.bytes_moved += len as u64;
            at += len;
        }
        let h = SegmentHeader {
            version: cx.form.version,
            flags: cx.form.flags,
            alloc_seq: q.alloc_seq,
            extent: q.extent,
            seg_offset: 0,
            payload_len: (at - SEGMENT_HEADER_BYTES) as u32,
            record_count: records.len() as u32,
            durable_seq: cx.durable_seq.load(std::sync::atomic::Ordering::SeqCst),
        };
        let n = seal_segment(&mut buf, &cx.sb.uuid, &h, &records);
        // Padded to the write alignment: the buffer past the segment is zeros.
        let n = crate::format::align_up(n as u64, cx.write_align as u64) as usize;
        cx.outbox
            .push(q.extent, 0, cx.sb.extent_offset(q.extent), &buf[..n]);
        st.counters.cleaner_bytes_written += n as u64;
        st.extents.close_output(q.extent, stamp);
        for (key, offset) in moved_shared {
            st.move_shared_item(key, q.extent, offset)?;
            if st.map.window_full() {
                st.checkpoint(cx)?;
            }
        }
        for (lba, entry) in moved {
            // A move changes no block's content: every device that shares the leaf follows.
            st.set_entry_in_place(lba, entry)?;
            // One pass may touch a leaf per block it moves: a page tree's window is bounded
            // (VolumeMap::window_full). Each block maps to a good copy at any point, so a
            // checkpoint between two moves records a consistent map.
            if st.map.window_full() {
                st.checkpoint(cx)?;
            }
        }
        result.outputs += 1;
    }
    result.reclaimed = victims
        .iter()
        .filter(|&&v| st.extents.get(v).live_blocks() == 0 || outputs.contains(&v))
        .count();
    st.counters.cleaner_runs += 1;
    st.counters.cleaner_bytes_moved += result.bytes_moved;
    st.counters.extents_reclaimed += result.reclaimed as u64;
    Ok(result)
}

/// One cleaning pass, all of it under the state lock (foreground cleaning, compaction).
pub fn pass(st: &mut State, cx: &Ctx, mode: Mode) -> Result<PassResult> {
    let victims = select(st, cx, mode);
    if victims.is_empty() {
        return Ok(PassResult::default());
    }
    let read = read_victims(cx, &victims)?;
    let mut victims = victims;
    read.keep_readable(st, &mut victims);
    commit(st, cx, victims, &read.images, false)
}

/// Live blocks that name a dictionary other than the current one (0 when the counts are not
/// known).
pub fn stale_blocks(st: &State, cx: &Ctx) -> u64 {
    let current = cx.dicts.current_id();
    let counts = st.map.counters();
    if !counts.savings_known {
        return 0;
    }
    (1..crate::map::DICT_IDS)
        .filter(|&id| Some(id as u16) != current)
        .map(|id| counts.by_dict[id])
        .sum()
}

/// Extents holding live blocks that name a dictionary other than the current one, found by
/// one walk of the map (offline migration, `compact`; empty when there are none).
pub fn migrate_candidates(st: &mut State, cx: &Ctx) -> Result<Vec<u32>> {
    if stale_blocks(st, cx) == 0 {
        return Ok(Vec::new());
    }
    let current = cx.dicts.current_id();
    let mut has = vec![false; st.extents.len()];
    st.map.for_each_data(|_, m| {
        if m.dict != 0 && Some(u16::from(m.dict)) != current {
            if let Some(h) = has.get_mut(m.extent as usize) {
                *h = true;
            }
        }
    })?;
    Ok((0..st.extents.len() as u32)
        .filter(|&e| has[e as usize])
        .collect())
}

/// Offline migration (after compaction): moves the live blocks of `victims` (a batch of
/// [`migrate_candidates`]), recompressing those that name a dictionary other than the current
/// one with the current one (`items`), so old dictionaries lose their last blocks and the next
/// checkpoints retire them (dicts.rs). Only `compact` runs it (the map walk that finds the
/// candidates); the background cleaner migrates the blocks it moves for its own reasons. The
/// pass need not gain extents; victims that do not fit the free extents are left as they are.
pub fn migrate(st: &mut State, cx: &Ctx, mut victims: Vec<u32>) -> Result<PassResult> {
    // Only closed extents are cleaned (open ones are closed by `compact` first), and none a
    // background pass is reading.
    victims.retain(|&v| {
        st.extents.get(v).state() == ExtentState::Closed
            && !st.cleaning.contains(&v)
            && !st.unreadable.contains(&v)
    });
    if victims.is_empty() || st.free_now() == 0 {
        return Ok(PassResult::default());
    }
    let read = read_victims(cx, &victims)?;
    read.keep_readable(st, &mut victims);
    commit(st, cx, victims, &read.images, true)
}

/// One incremental pass that holds the state lock (`lock`) only to choose its victims and to
/// commit: the victims are read with the lock released, so host I/O goes on meanwhile (the
/// background cleaner). A victim stays allocated while it is read because `State::cleaning`
/// keeps checkpoints from releasing it; `commit` finds the blocks still live in it under the
/// lock, so blocks the host rewrote meanwhile are not moved.
pub fn pass_unlocked<'a>(lock: &dyn Fn() -> MutexGuard<'a, State>, cx: &Ctx) -> Result<PassResult> {
    let (victims, gen) = {
        let mut st = lock();
        let victims = select(&st, cx, Mode::Incremental);
        if victims.is_empty() {
            return Ok(PassResult::default());
        }
        // Two rounds may overlap (`Volume::clean` beside the cleaner thread): their victims are
        // disjoint (`choose_victims` skips listed ones), each lists and unlists its own (unless
        // make_space took them back meanwhile, see below).
        st.cleaning.extend_from_slice(&victims);
        (victims, st.clean_gen)
    };
    let images = read_victims(cx, &victims);
    let mut st = lock();
    // Foreground cleaning took the victims back meanwhile (`make_space` cleared the list):
    // what is listed now was listed by passes that started since, which may have chosen some
    // of ours again and be reading them. Unlisting those would let a checkpoint release and a
    // writer reuse an extent such a pass is reading, and it would then move blocks with bytes
    // it never read.
    if st.clean_gen == gen {
        st.cleaning.retain(|v| !victims.contains(v));
    }
    let read = images?;
    // Taken back: drop the pass (nothing moved yet; the next one chooses again). Host writes
    // may have taken free extents meanwhile: `commit` packs for what is free now, dropping
    // victims (or the pass).
    if st.clean_gen != gen {
        return Ok(PassResult::default());
    }
    let mut victims = victims;
    read.keep_readable(&mut st, &mut victims);
    commit(&mut st, cx, victims, &read.images, false)
}

/// Foreground: free extents for host writes when the free pool is down to the cleaner reserve.
/// Cleans until twice the reserve is free (hysteresis), batching passes between checkpoints
/// (a checkpoint costs two syncs and is what turns victims into free extents).
pub fn make_space(st: &mut State, cx: &Ctx) -> Result<()> {
    // A host write waits for space: victims a background pass is reading are taken back (that
    // pass drops its work at commit), or they could neither be cleaned nor released now and a
    // nearly full volume would report NoSpace with dead space left.
    if !st.cleaning.is_empty() {
        st.cleaning.clear();
        st.clean_gen += 1;
    }
    // Extents without live data only wait for a checkpoint: the cheapest space there is.
    let pending = |st: &State| st.extents.count(ExtentState::PendingFree);
    if pending(st) > 0 {
        st.checkpoint(cx)?;
    }
    let goal = st.clean_goal();
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
