//! What a volume can say about itself: allocation (NBD block status), statistics, and the
//! verification of `check` (offline) and `scrub` (online, rate-bounded).

use super::*;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::extents::ExtentState;
use crate::format::{
    decode_map_page, BlockState, MapEntry, BLOCK_BYTES, MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES,
    PAGE_NONE,
};
use crate::recovery;
use crate::stats::Stats;
use std::time::Duration;

impl Inner {
    /// Allocation state of a byte range, as runs of (length, state).
    pub fn allocation(&self, device: u32, offset: u64, len: u64) -> Result<Vec<(u64, AllocState)>> {
        let base = self.check_range(device, offset, len, false)?;
        let mut runs: Vec<(u64, AllocState)> = Vec::new();
        if len == 0 {
            return Ok(runs);
        }
        let bs = BLOCK_BYTES as u64;
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let mut pos = offset;
        let mut st = self.state.lock();
        st.map
            .runs(base + first, last - first + 1, |state, blocks| {
                let s = match state {
                    BlockState::Unmapped => AllocState::Hole,
                    BlockState::Zero => AllocState::Zero,
                    BlockState::Data | BlockState::Corrupt | BlockState::Shared => AllocState::Data,
                };
                let run_end = ((pos / bs + blocks) * bs).min(end);
                let n = run_end - pos;
                match runs.last_mut() {
                    Some((l, last)) if *last == s => *l += n,
                    _ => runs.push((n, s)),
                }
                pos = run_end;
            })?;
        Ok(runs)
    }

    /// Sets the space reserve (`OpenOptions::space_reserve_bytes`) of an open volume; like an
    /// open, lends it at once if the volume is at it. True when lent.
    pub fn set_space_reserve(&self, bytes: u64) -> bool {
        let mut st = self.state.lock();
        let data_extents = st.extents.data_len() as u32;
        st.space_reserve = super::space_reserve_extents(bytes, &self.sb, data_extents);
        st.reserve_lent = false;
        !self.read_only && st.lend_reserve_if_full()
    }

    /// How full the data area is: counters only, no walk of the extent table.
    pub fn space(&self) -> crate::stats::Space {
        let st = self.state.lock();
        let eb = u64::from(self.sb.extent_bytes);
        crate::stats::Space {
            live_bytes: st.map.counters().live_bytes,
            data_area_bytes: u64::from(self.sb.extent_count) * eb,
            metadata_extent_bytes: st.extents.count(ExtentState::Metadata) as u64 * eb,
            extents_free: st.free_now() as u64,
            reserve_bytes: st.space_reserve as u64 * eb,
            reserve_lent: st.reserve_lent,
            writable_bytes: st.writable_extents() as u64 * eb,
        }
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let mut st = self.state.lock();
        self.sync_read_counters(&mut st);
        // Counters kept exact on every map change: no scan.
        let m = st.map.counters();
        let (data, zero, raw, damaged, live) = (
            m.data_blocks,
            m.zero_blocks,
            m.raw_blocks,
            m.damaged_blocks,
            m.live_bytes,
        );
        // Every device's blocks (the counters are the volume's).
        let logical_blocks: u64 = st.map.device_ranges().iter().map(|&(_, n)| n).sum();
        let unmapped = logical_blocks.saturating_sub(data + zero + damaged);
        // Blocks stored once for every block that names them (bit 12): the direct ones, and
        // every block of each shared item. Counted from the SBT the first time.
        let shared = st.map.shared_totals().unwrap_or_default();
        let stored_blocks = (data + shared.item_blocks).saturating_sub(shared.references);
        let ratio = |blocks: u64, bytes: u64| {
            if bytes == 0 {
                0.0
            } else {
                (blocks * BLOCK_BYTES as u64) as f64 / bytes as f64
            }
        };
        let (in_units, unit_live) = (m.unit_blocks, m.unit_bytes);
        let eb = u64::from(self.sb.extent_bytes);
        let count = |s: ExtentState| st.extents.count(s) as u64;
        let (free, open, closed, pending) = (
            count(ExtentState::Free),
            count(ExtentState::Open),
            count(ExtentState::Closed),
            count(ExtentState::PendingFree),
        );
        let in_use = open + closed;
        let logical_in_use = (data + zero) * BLOCK_BYTES as u64;
        let c = st.counters;
        let written = c.data_bytes_written + c.metadata_bytes_written + c.cleaner_bytes_written;
        let carved = count(ExtentState::Metadata) * eb;
        Stats {
            logical_bytes: self.size_bytes(),
            codec: self.codec.to_string(),
            extent_bytes: self.sb.extent_bytes,
            data_area_bytes: u64::from(self.sb.extent_count) * eb,
            // Carved metadata extents (bit 10) are metadata too, never data or dead space.
            metadata_bytes: self.sb.metadata_bytes() + carved,
            metadata_extent_bytes: carved,
            metadata_extent_free_bytes: match &st.map {
                crate::map::VolumeMap::Tree(t) => {
                    let (free, all) = t.carved_pairs_free();
                    (u128::from(carved) * u128::from(free))
                        .checked_div(u128::from(all))
                        .map_or(0, |b| b as u64)
                }
                crate::map::VolumeMap::Pages(_) => 0,
            },
            data_blocks: data,
            zero_blocks: zero,
            unmapped_blocks: unmapped,
            raw_blocks: raw,
            unit_bytes: u32::from(self.unit_blocks) * BLOCK_BYTES as u32,
            unit_blocks: in_units,
            unit_ratio: if unit_live == 0 {
                0.0
            } else {
                (in_units * BLOCK_BYTES as u64) as f64 / unit_live as f64
            },
            single_ratio: if live == unit_live {
                0.0
            } else {
                (data.saturating_sub(in_units) * BLOCK_BYTES as u64) as f64
                    / (live - unit_live) as f64
            },
            damaged_blocks: damaged,
            logical_bytes_in_use: logical_in_use,
            physical_bytes_live: live,
            physical_bytes_allocated: (in_use + pending) * eb,
            savings_pct: if logical_in_use == 0 {
                0.0
            } else {
                100.0 * (1.0 - live as f64 / logical_in_use as f64)
            },
            compression_ratio: if live == 0 {
                0.0
            } else {
                logical_in_use as f64 / live as f64
            },
            dedup_ratio: if stored_blocks == 0 {
                1.0
            } else {
                data as f64 / stored_blocks as f64
            },
            shared,
            extents_total: u64::from(self.sb.extent_count),
            extents_free: free,
            extents_in_use: in_use,
            extents_pending_free: pending,
            extents_open: open,
            reserve_bytes: st.space_reserve as u64 * eb,
            reserve_lent: st.reserve_lent,
            writable_bytes: st.writable_extents() as u64 * eb,
            dead_bytes: (in_use + pending) * eb - live,
            locked_cleanings: st.locked_cleanings,
            space_short_rounds: st.space_short_rounds,
            write_amplification: if c.host_bytes_written == 0 {
                0.0
            } else {
                written as f64 / c.host_bytes_written as f64
            },
            metadata_ram_bytes: st.map.ram_bytes()
                + (st.extents.len() * std::mem::size_of::<crate::extents::ExtentInfo>()) as u64,
            map_cache: st.map.cache_stats(),
            read_cache: self.cache.stats(),
            clean_low_pct: self.clean_low_pct,
            clean_high_pct: self.clean_high_pct,
            recovery_records_replayed: st.replayed,
            format_version: self.sb.version,
            max_logical_bytes: crate::layout::logical_bytes_max(&self.sb),
            max_data_area_bytes: crate::layout::extent_count_max(&self.sb) * eb,
            failed: self.storage.failure(),
            counters: c,
            dictionary: self.dicts.enabled,
            dictionary_setting: self.sb.settings & crate::format::SB_SETTING_DICTIONARY != 0,
            dedup_index: self.dedup.as_ref().map(|d| d.stats()),
            dedup_setting: self.sb.settings & crate::format::SB_SETTING_DEDUP != 0,
            devices: self.devices_of(&st.map),
            dictionaries: {
                let active = self.dicts.active().map(|d| d.id());
                st.dicts
                    .iter()
                    .filter(|d| d.id != 0)
                    .map(|d| crate::stats::DictStat {
                        id: d.id,
                        bytes: d.len,
                        trained_seq: d.created_seq,
                        loaded: self.dicts.get(d.id as u8).is_some(),
                        active: active == Some(d.id),
                        live_blocks: m
                            .savings_known
                            .then(|| m.by_dict[usize::from(d.id) % crate::map::DICT_IDS]),
                    })
                    .collect()
            },
            savings_known: m.savings_known,
            dict_blocks: m.dict_blocks,
            dict_ratio: ratio(m.dict_blocks, m.dict_bytes),
            // Raw blocks never use a dictionary: left out, so the two ratios compare what a
            // dictionary changes on blocks that compress at all.
            nodict_blocks: data.saturating_sub(m.dict_blocks + raw),
            nodict_ratio: ratio(
                data.saturating_sub(m.dict_blocks + raw),
                live.saturating_sub(m.dict_bytes + raw * BLOCK_BYTES as u64),
            ),
            units_by_size: crate::map::UNIT_SIZE_CLASSES
                .iter()
                .zip(m.by_unit)
                .map(|(&max, (blocks, bytes))| crate::stats::UnitSizeStat {
                    max_unit_bytes: u32::from(max) * BLOCK_BYTES as u32,
                    blocks,
                    ratio: ratio(blocks, bytes),
                })
                .collect(),
        }
    }

    /// A data block a check found damaged (its stored bytes fail their checksum) takes the
    /// damaged state, so reads answer EIO without touching the medium, `zbd stat` counts it
    /// and its extent's space can be reclaimed; it stays so until overwritten or trimmed.
    /// Only on a writable volume, and only if the block still maps where it did when it failed
    /// (read again between two looks at its entry under the lock: a write in between wins).
    /// Persisted by the next checkpoint; until then a crash leaves it as it was, damaged.
    fn remember_damage(&self, lba: u64) -> bool {
        if self.read_only || self.storage.check().is_err() {
            return false;
        }
        let Ok(before) = self.state.lock().map.get(lba) else {
            return false;
        };
        if before.state != BlockState::Data {
            return false;
        }
        let mut block = vec![0u8; BLOCK_BYTES];
        let still_bad = match self.read_into(lba, 1, false, &mut block) {
            Ok(r) => matches!(r.first(), Some(Err(Error::Corrupt { .. }))),
            Err(_) => false,
        };
        let mut st = self.state.lock();
        if !still_bad || st.map.get(lba).ok() != Some(before) {
            return false;
        }
        let damaged = MapEntry {
            state: BlockState::Corrupt,
            ..MapEntry::UNMAPPED
        };
        // A damage mark: every device that shares the leaf reads the block as damaged.
        st.set_entry_in_place(lba, damaged).is_ok()
    }

    /// Verifies metadata and the checksum of every stored block. `progress(done, total)` is
    /// called now and then.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> CheckReport {
        let mut report = self.verify(progress, None);
        self.persist_damage(&mut report);
        report
    }

    /// Makes the damaged state of blocks a check marked durable now (a checkpoint).
    fn persist_damage(&self, report: &mut CheckReport) {
        if report.marked_damaged > 0 {
            if let Err(e) = self.checkpoint() {
                report.metadata_problems.push(format!(
                    "damaged blocks could not be recorded (checkpoint: {e})"
                ));
            }
        }
    }

    /// A check of a volume in use (`zbd scrub`): reads at most `rate` stored bytes per second
    /// (unbounded if `None`) so host I/O goes on, and records when it ended and what it found
    /// (`zbd stat`, persisted with the next checkpoint).
    pub fn scrub(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> CheckReport {
        let mut report = self.verify(progress, rate.filter(|&r| r > 0));
        self.persist_damage(&mut report);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut st = self.state.lock();
        st.counters.last_scrub_unix = now;
        st.counters.last_scrub_damaged = report.damaged_blocks.len() as u64;
        report
    }

    pub(super) fn verify(&self, progress: &dyn Fn(u64, u64), rate: Option<u64>) -> CheckReport {
        let mut report = CheckReport::default();
        // Reading the whole map (to check the live accounting) also finds every damaged page.
        {
            let mut st = self.state.lock();
            let mut kept = st.map.counters();
            let fresh = match recovery::account(&mut st.map, self.sb.extent_count) {
                Ok(f) => f,
                Err(e) => {
                    report.metadata_problems.push(format!("map: {e}"));
                    Vec::new()
                }
            };
            for (i, (a, b)) in fresh.iter().zip(st.extents.as_slice()).enumerate() {
                if a.live_bytes() != b.live_bytes() || a.live_blocks() != b.live_blocks() {
                    report
                        .metadata_problems
                        .push(format!("extent {i}: live accounting differs from the map"));
                }
            }
            // The pending-free set and the counts per state, against the entries they follow.
            report.metadata_problems.extend(st.extents.problems());
            // Every shared item's count against the blocks that name it (bit 12).
            match st.map.check_references() {
                Ok(p) => report.metadata_problems.extend(p),
                Err(e) => report.metadata_problems.push(format!("shared items: {e}")),
            }
            let now = st.map.counters();
            if !kept.savings_known {
                // Not kept by the build that wrote the checkpoint: nothing to compare.
                (
                    kept.dict_blocks,
                    kept.dict_bytes,
                    kept.by_unit,
                    kept.by_dict,
                ) = (now.dict_blocks, now.dict_bytes, now.by_unit, now.by_dict);
                kept.savings_known = true;
            }
            if !fresh.is_empty() && now != kept {
                report
                    .metadata_problems
                    .push("volume counters differ from the map (recounted)".into());
            }
        }
        let (damaged_pages, lost, repaired) = {
            let st = self.state.lock();
            (st.map.damaged_pages(), st.map.lost(), st.map.repaired())
        };
        report.metadata_problems.extend(lost);
        report
            .metadata_problems
            .extend(self.open_problems.iter().cloned());
        report.repaired.extend(self.open_repaired.iter().cloned());
        report.repaired.extend(repaired);
        self.check_map_copies(&mut report, &damaged_pages);
        self.check_tree_copies(&mut report);
        let (_, intact) = recovery::superblock_copies(&*self.storage, &self.sb);
        for (ok, name) in intact.iter().zip(recovery::SUPERBLOCK_COPY_NAMES) {
            if !ok {
                report
                    .metadata_problems
                    .push(format!("superblock copy {name} is damaged"));
            }
        }
        const CHUNK: u64 = 256;
        const LEAF: u64 = crate::format::MAP_ENTRIES_PER_PAGE as u64;
        let started = std::time::Instant::now();
        let mut bytes_read = 0u64;
        let mut scratch = Vec::new();
        // Every device's blocks, one after the other (their keys: `format::block_key`). In a
        // page tree a chunk is one leaf's blocks, and a leaf another device's walk read already
        // (a snapshot shares it) is not read again: what it names was checked then, so the walk
        // costs the stored blocks, not the devices times their size (with 1,000 snapshots of
        // a volume holding 512 MiB, the check read 1,000 copies of its data).
        let (ranges, by_leaf) = {
            let st = self.state.lock();
            (
                st.map.device_ranges(),
                matches!(st.map, crate::map::VolumeMap::Tree(_)),
            )
        };
        let mut leaves_read = std::collections::HashSet::new();
        let total: u64 = ranges.iter().map(|&(_, blocks)| blocks).sum();
        let mut done = 0;
        'walk: for (base, blocks) in ranges {
            let end = base + blocks;
            let mut lba = base;
            while lba < end {
                let n = match by_leaf {
                    true => LEAF - (lba - base) % LEAF,
                    false => CHUNK,
                }
                .min(end - lba);
                let (mut mapped, mut bytes) = (0u64, 0u64);
                let mut read_before = false;
                let counted = {
                    let mut st = self.state.lock();
                    st.map
                        .leaf_id(lba)
                        .map(|leaf| read_before = leaf.is_some_and(|id| !leaves_read.insert(id)))
                        .and_then(|()| match read_before {
                            true => Ok(()),
                            false => st.map.for_each_data_in(lba, n, |_, e| {
                                mapped += 1;
                                bytes += u64::from(e.len);
                            }),
                        })
                        .and_then(|()| {
                            // Blocks naming a shared item are read and checked too (bit 12).
                            st.map.runs(lba, n, |state, blocks| {
                                if state == crate::format::BlockState::Shared {
                                    mapped += blocks;
                                }
                            })
                        })
                };
                match counted {
                    Ok(()) => {}
                    // A page-tree leaf with no intact copy: its blocks are lost (they read as
                    // errors); the others of the chunk are checked one by one.
                    Err(Error::Corrupt { .. }) => {
                        report.blocks_checked += self.check_blocks_one_by_one(lba, n, &mut report);
                        lba += n;
                        done += n;
                        progress(done, total);
                        continue;
                    }
                    Err(e) => {
                        report.metadata_problems.push(format!("map: {e}"));
                        break 'walk;
                    }
                }
                if read_before {
                    lba += n;
                    done += n;
                    progress(done, total);
                    continue;
                }
                if let Some(rate) = rate {
                    // Pace the reads: this chunk may start once the bytes read so far took their
                    // share of time at `rate`.
                    bytes_read += bytes;
                    let due = Duration::from_secs_f64(bytes_read as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                scratch.resize(n as usize * BLOCK_BYTES, 0);
                match self.read_into(lba, n, false, &mut scratch) {
                    Ok(blocks) => {
                        for (i, r) in blocks.into_iter().enumerate() {
                            if let Err(e) = r {
                                let at = lba + i as u64;
                                report.damaged_blocks.push(at);
                                if matches!(e, Error::Corrupt { .. }) && self.remember_damage(at) {
                                    report.marked_damaged += 1;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        report.metadata_problems.push(format!("map: {e}"));
                        break 'walk;
                    }
                }
                report.blocks_checked += mapped;
                lba += n;
                done += n;
                progress(done, total);
            }
        }
        report
    }

    /// Checks blocks `lba..lba + n` each on its own (a chunk whose map walk failed): a block
    /// whose entry cannot be read, or whose data cannot, is listed as damaged. Returns the data
    /// blocks checked.
    fn check_blocks_one_by_one(&self, lba: u64, n: u64, report: &mut CheckReport) -> u64 {
        let mut checked = 0;
        let mut block = vec![0u8; BLOCK_BYTES];
        for l in lba..lba + n {
            let entry = self.state.lock().map.get(l);
            match entry {
                Err(_) => report.damaged_blocks.push(l),
                Ok(e) if e.state == crate::format::BlockState::Data => {
                    checked += 1;
                    let r = self.read_into(l, 1, false, &mut block);
                    if !matches!(r.as_deref(), Ok([Ok(_)])) {
                        report.damaged_blocks.push(l);
                    }
                }
                Ok(_) => {}
            }
        }
        checked
    }

    /// Reads every copy of every current map page: a damaged copy is reported and, on a writable
    /// volume, the page is rewritten (both copies, into the other slot) by the next checkpoint.
    pub(super) fn check_map_copies(&self, report: &mut CheckReport, damaged_pages: &[u32]) {
        let (slots, gen) = {
            let st = self.state.lock();
            (st.map.slots().to_vec(), st.ckpt_seq)
        };
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        let mut entries = vec![MapEntry::UNMAPPED; MAP_ENTRIES_PER_PAGE];
        let mut rewrite = Vec::new();
        for (p, &slot) in slots.iter().enumerate() {
            if slot == PAGE_NONE || damaged_pages.contains(&(p as u32)) {
                continue;
            }
            let start = p * MAP_ENTRIES_PER_PAGE;
            let n = MAP_ENTRIES_PER_PAGE.min(self.sb.logical_blocks as usize - start);
            for copy in 0..self.sb.metadata_copies() {
                let off = self.sb.map_page_offset(p as u32, slot - 1, copy);
                let ok = self.storage.read_at(off, &mut buf).is_ok()
                    && decode_map_page(&buf, p as u32, gen, &mut entries[..n]).is_ok();
                if !ok && self.state.lock().ckpt_seq != gen {
                    // A checkpoint moved the page meanwhile: what was read may be its new copy
                    // being written. The next scrub looks again.
                    continue;
                }
                if !ok {
                    let line = format!("map page {p}: copy {copy} is damaged");
                    if !report.repaired.iter().any(|l| l.starts_with(&line)) {
                        report.repaired.push(format!("{line}, the other is intact"));
                    }
                    rewrite.push(p as u32);
                }
            }
        }
        if !self.read_only && !rewrite.is_empty() {
            self.state.lock().map.mark_dirty(rewrite);
        }
    }

    /// The page tree's scrub (bit 10): reads both durable copies of every page of the map
    /// tree, and of the pair-state and directory pages, 64 leaves' worth under the lock at a
    /// time and the copies without it. A damaged copy is reported; on a writable volume the
    /// page is queued for a phase 1 to write both copies again (from the intact copy, or from
    /// the page in memory when neither copy is intact). Pages with no intact copy and no
    /// copy in memory are reported: their blocks read as damaged (the block walk lists them).
    pub(super) fn check_tree_copies(&self, report: &mut CheckReport) {
        const SPAN: u64 = 64 * MAP_ENTRIES_PER_PAGE as u64;
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        let ranges = self.state.lock().map.device_ranges();
        for (base, blocks) in ranges {
            let end = base + blocks;
            let mut lba = base;
            loop {
                let n = SPAN.min(end - lba);
                let (pages, gen) = {
                    let mut st = self.state.lock();
                    let gen = st.ckpt_seq;
                    let State { map, extents, .. } = &mut *st;
                    let Some(tree) = map.tree() else {
                        return;
                    };
                    // A chunk under an interior page with no intact copy: the block walk lists
                    // its blocks as damaged.
                    let pages = tree.durable_copies_in(lba, n).unwrap_or_default();
                    // Invariant 6's other side: a page in use lies in a metadata extent pair, or
                    // the free list may hand its extent to data.
                    for (at, _) in &pages {
                        let Some(e) = tree.home_extent(at.id) else {
                            continue;
                        };
                        let h = tree.partner_offset();
                        if let Some(x) = [e, e + h]
                            .into_iter()
                            .find(|&x| extents.get(x).state() != ExtentState::Metadata)
                        {
                            report.metadata_problems.push(format!(
                            "metadata page {} ({:?}) lies in extent {x}, which the extent table \
                             does not list as metadata",
                            at.id, at.kind
                        ));
                        }
                    }
                    (pages, gen)
                };
                for (at, copies) in pages {
                    let mut bad = [false; 2];
                    for (b, &off) in bad.iter_mut().zip(&copies) {
                        *b = self.storage.read_at(off, &mut buf).is_err()
                            || !crate::meta::store::intact_copy(&buf, &self.sb.uuid, &at);
                    }
                    if bad == [false, false] {
                        continue;
                    }
                    let mut st = self.state.lock();
                    let still = st.ckpt_seq == gen
                        && st.map.tree().is_some_and(|t| t.still_at(&at, copies));
                    if !still {
                        // A checkpoint moved the page meanwhile: what was read may be its new
                        // copy being written. The next scrub looks again.
                        continue;
                    }
                    let tree = st.map.tree().expect("a tree");
                    let name = format!(
                        "metadata page {} ({:?}, level {}, position {})",
                        at.id, at.kind, at.level, at.position
                    );
                    let repairable = bad != [true, true] || tree.resident(&at);
                    if bad == [true, true] && repairable {
                        report.repaired.push(format!(
                            "{name}: both copies are damaged, the copy in memory is intact"
                        ));
                    } else if bad == [true, true] {
                        report
                            .metadata_problems
                            .push(format!("{name}: both copies are damaged"));
                    } else {
                        let (b, g) = if bad[0] { (0, 1) } else { (1, 0) };
                        let line = format!("{name}: copy {b} is damaged, copy {g} is intact");
                        if !report.repaired.contains(&line) {
                            report.repaired.push(line);
                        }
                    }
                    if repairable && !self.read_only {
                        tree.queue_rewrite(at);
                    }
                }
                lba += n;
                if lba >= end {
                    break;
                }
            }
        }
    }
}
