//! Open and close: formatting a new volume, opening one (superblock, checkpoint, extent
//! table, roll-forward of the log tail, the recovery checkpoint), and a clean close.

use super::*;
use crate::backend::fence::Fenced;
use crate::backend::queued::QueuedStorage;
use crate::backend::{Storage, WRITE_ALIGN_MAX};
use crate::buffer::{BufferConfig, ExtentBuffer};
use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::extents::{ExtentInfo, ExtentState, ExtentTable, Extents};
use crate::format::{
    key_device, BlockState, Checkpoint, MapEntry, QueueEntry, RecordKind, SegmentForm, Superblock,
    BLOCK_BYTES, CKPT_FLAG_COMPRESSION_UNITS, CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_METADATA_PAGES,
    CKPT_FLAG_SAVINGS_COUNTERS, CKPT_FLAG_V3_SEGMENTS, CKPT_FLAG_VOLUME_COUNTERS, SECTOR_BYTES,
    SUPERBLOCK_BYTES,
};
use crate::layout::{created_list_capacity, plan, CreateOptions};
use crate::map::{Map, TreeMap, VolumeMap};
use crate::meta::shared::Owner;
use crate::meta::MetaGeometry;
use crate::readcache::ReadCache;
use crate::recovery;
use crate::state::State;
use crate::stats::Counters;
use crate::writeback::Outbox;
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The metadata extents (copy 0) a volume created with metadata pages carves: the last
/// `stock` of the first half of the data area, their partners being the last of the second.
fn metadata_stock(sb: &Superblock, opts: &CreateOptions) -> Result<std::ops::Range<u32>> {
    let g = MetaGeometry::at_enable(sb)?;
    let stock = crate::layout::stock_extents_for(opts, &g, sb.logical_blocks);
    if 2 * stock + sb.queue_len > sb.extent_count || stock > g.h {
        return Err(Error::Invalid(format!(
            "metadata pages need {} extents beside a queue of {}; the data area has {}: give \
             the volume more capacity",
            2 * stock,
            sb.queue_len,
            sb.extent_count
        )));
    }
    Ok(g.h - stock..g.h)
}

/// Turns checkpoint 1 of a volume being created (`sb`) into one with metadata pages (bit
/// 10): carves `stock` and its partners, writes the extent table naming them, and writes the
/// default device's empty tree and the catalog's pages, synced, before the caller writes the
/// slot.
fn format_metadata_pages(
    storage: &Arc<dyn Storage>,
    sb: &Superblock,
    stock: std::ops::Range<u32>,
    list_capacity: u32,
    ck: Checkpoint,
    open_opts: &OpenOptions,
) -> Result<Checkpoint> {
    let h = MetaGeometry::at_enable(sb)?.h;
    let mut extents = Extents::new(vec![ExtentInfo::FREE; sb.extent_count as usize]);
    for e in stock.clone() {
        extents.carve(e);
        extents.carve(e + h);
    }
    let (writes, table) = ExtentTable::unwritten(sb).snapshot(sb, extents.as_slice(), ck.seq);
    for (at, page) in writes {
        storage.write_at(at, &page)?;
    }
    let cache = open_opts.map_cache_bytes;
    let mut tree = TreeMap::create(Arc::clone(storage), sb, stock, list_capacity, cache)?;
    let ext = tree.checkpoint()?.ext;
    Ok(Checkpoint {
        // Bit-10 volumes are created with bit 11's segments too: both are the shared-block
        // format's (docs/design.md, "Build order" 1b and 1d).
        flags: ck.flags | CKPT_FLAG_EXTENT_TABLE | CKPT_FLAG_METADATA_PAGES | CKPT_FLAG_V3_SEGMENTS,
        extent_table_slots: table.slots,
        page_slots: Vec::new(),
        page_summaries: Vec::new(),
        extension: Some(ext),
        ..ck
    })
}

impl Inner {
    /// Formats `storage` as a new volume and opens it with `open_opts`.
    pub fn create_with(
        storage: Box<dyn Storage>,
        opts: &CreateOptions,
        open_opts: OpenOptions,
    ) -> Result<Inner> {
        let mut sb = plan(opts)?;
        let storage: Arc<dyn Storage> = Arc::from(storage);
        sb.uuid = *uuid::Uuid::new_v4().as_bytes();
        sb.created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if storage.len_bytes()? < sb.total_bytes() {
            return Err(Error::Invalid(format!(
                "storage has {} bytes, the volume needs {}",
                storage.len_bytes()?,
                sb.total_bytes()
            )));
        }
        let sbb = sb.encode();
        storage.write_at(0, &sbb)?;
        storage.write_at(SUPERBLOCK_BYTES as u64, &sbb)?;
        // Any old checkpoint invalidated (the first block of a slot holds the magic and uuid
        // every reader checks first) and the new superblock durable before anything else is
        // written: metadata pages written next over an old volume must never be read as that
        // volume's (its table pages carry no uuid); a cut from here on leaves a volume that is
        // refused, never a mix.
        for copy in 0..sb.metadata_copies() {
            for slot in 0..2 {
                storage.write_at(sb.checkpoint_slot_offset(slot, copy), &[0u8; BLOCK_BYTES])?;
            }
        }
        storage.sync()?;
        let stock = match opts.metadata_pages {
            true => Some(metadata_stock(&sb, opts)?),
            false => None,
        };
        let h = MetaGeometry::at_enable(&sb).map_or(0, |g| g.h);
        let carved = |e: u32| {
            stock
                .as_ref()
                .is_some_and(|s| s.contains(&e) || s.contains(&e.wrapping_sub(h)))
        };
        let queue: Vec<QueueEntry> = (0..sb.extent_count)
            .filter(|&e| !carved(e))
            .take(sb.queue_len as usize)
            .zip(1..)
            .map(|(extent, alloc_seq)| QueueEntry { extent, alloc_seq })
            .collect();
        let mut ck = Checkpoint {
            seq: 1,
            next_alloc_seq: u64::from(sb.queue_len) + 1,
            queue,
            // An empty volume: zero counters, every extent free (no table page written).
            flags: if sb.version >= 2 {
                CKPT_FLAG_VOLUME_COUNTERS | CKPT_FLAG_EXTENT_TABLE | CKPT_FLAG_SAVINGS_COUNTERS
            } else {
                0
            },
            ..Checkpoint::empty(&sb)
        };
        if let Some(stock) = stock {
            let capacity = created_list_capacity(opts, sb.extent_count);
            ck = format_metadata_pages(&storage, &sb, stock, capacity, ck, &open_opts)?;
        }
        let ckb = ck.encode(&sb)?;
        for copy in 0..sb.metadata_copies() {
            storage.write_at(sb.checkpoint_slot_offset(1, copy), &ckb)?;
        }
        storage.sync()?;
        Inner::open(Box::new(storage), open_opts)
    }

    /// Opens a volume read-only.
    pub fn open_read_only(storage: Box<dyn Storage>) -> Result<Inner> {
        Inner::open(
            storage,
            OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            },
        )
    }

    /// Opens a volume, recovering from a crash if needed.
    pub fn open(storage: Box<dyn Storage>, opts: OpenOptions) -> Result<Inner> {
        // The fence sits above the queue: a queued write that failed fails the next sync, and
        // that failed sync fails the volume (the queue's retries never get to vouch for it).
        let storage: Box<dyn Storage> = if opts.io.queues() && !opts.read_only {
            Box::new(QueuedStorage::new(
                Arc::<dyn Storage>::from(storage),
                &opts.io,
            )?)
        } else {
            storage
        };
        let storage = Arc::new(Fenced::new(storage));
        let sb = recovery::read_superblock(&*storage)?;
        let found = recovery::read_checkpoint(&*storage, &sb)?;
        let ck = found.checkpoint;
        // Nothing proportional to the map is read: pages come in on demand, counters and the
        // extent table come with the checkpoint (v1 or without them: one scan, persisted by
        // the next checkpoint).
        let loaded = ExtentTable::load(&*storage, &sb, &ck)?;
        let mut map = match &ck.extension {
            None => VolumeMap::Pages(Box::new(Map::open(
                storage.clone(),
                &sb,
                &ck,
                opts.map_cache_bytes,
            ))),
            Some(_) => {
                // Bit 10: the extent table names the metadata extents, and only it does.
                let Some((_, infos)) = &loaded else {
                    return Err(Error::CorruptMetadata(
                        "the extent table has no intact copy, and only it names the metadata \
                         extents of this volume"
                            .into(),
                    ));
                };
                let metadata = (0..infos.len() as u32)
                    .filter(|&e| infos[e as usize].state() == ExtentState::Metadata);
                VolumeMap::Tree(Box::new(TreeMap::open(
                    storage.clone(),
                    &sb,
                    &ck,
                    metadata,
                    opts.map_cache_bytes,
                )?))
            }
        };
        let (table, extents) = match loaded {
            Some(loaded) if ck.flags & CKPT_FLAG_VOLUME_COUNTERS != 0 => loaded,
            _ => (
                ExtentTable::unwritten(&sb),
                recovery::account(&mut map, sb.extent_count)?,
            ),
        };
        // Dictionary and unit-size counters of a checkpoint written by a build that did not
        // keep them: one scan now, persisted by the next checkpoint. A read-only open reports
        // them unknown instead (stats).
        if !opts.read_only && !map.counters().savings_known {
            map.recount(|_| {})?;
        }
        let write_align = segment_align(&*storage, &sb);
        let seg_form = SegmentForm::for_volume(sb.version, ck.flags, write_align, sb.extent_bytes);
        let rolled = recovery::roll_forward(&*storage, &sb, &ck, write_align)?;
        let mut open_repaired = found.damaged_copies;
        if !opts.read_only {
            open_repaired.extend(recovery::rewrite_superblock(&*storage, &sb)?);
            recovery::make_durable(&*storage, &sb, (ck.seq, &found.bytes), &rolled.tail)?;
        }
        let mut open_problems = rolled.problems;
        let loaded = crate::dicts::load(&*storage, &sb, &ck.dicts);
        let codec = match opts.codec {
            Some(c) => c,
            None => Codec::from_id(sb.codec_id, sb.codec_level)?,
        };
        let extents = Extents::new(extents);
        let data_extents = extents.data_len() as u32;
        // Open extents are partly empty: keep them a small share of the data area (1/32) so a
        // nearly full volume is not exhausted by its own buffer, and within the recovery queue.
        let max_open = (opts.buffer_bytes / sb.extent_bytes as usize)
            .min(data_extents as usize / 32)
            .clamp(1, (sb.queue_len as usize / 2).max(1));
        let mut st = State {
            map,
            table,
            extents,
            free: Default::default(),
            queue: VecDeque::new(),
            next_seq: ck.write_seq + 1,
            ckpt_seq: ck.seq,
            next_alloc_seq: ck.next_alloc_seq,
            counters: Counters::from_array(&ck.counters),
            buffer: ExtentBuffer::new(
                BufferConfig {
                    max_open,
                    aging: opts.aging,
                    reserve: cleaner_reserve(data_extents),
                },
                sb.extent_bytes as usize,
                write_align,
            ),
            replayed: 0,
            dicts: ck.dicts,
            // Dictionaries not listed by the checkpoint recovery starts from are free: the
            // open's own checkpoint, below, is written before anything reuses them.
            retiring: Vec::new(),
            cleaning: Vec::new(),
            unreadable: Vec::new(),
            units_flag: ck.flags & CKPT_FLAG_COMPRESSION_UNITS != 0,
            shared_items: ck.flags & crate::format::CKPT_FLAG_SHARED_ITEMS != 0,
            clean_gen: 0,
            placing_dict: 0,
            extents_opened: 0,
            locked_cleanings: 0,
            space_short_rounds: 0,
            below_host_floor: false,
            carving: false,
            reuses: 0,
            placed_extent: 0,
            promoted_unlogged: false,
            shared_items_durable: ck.flags & crate::format::CKPT_FLAG_SHARED_ITEMS != 0,
            inflight: None,
            ckpt_wanted: false,
            refill_early: true,
            space_reserve: space_reserve_extents(opts.space_reserve_bytes, &sb, data_extents),
            reserve_lent: false,
        };
        open_problems.extend(apply_replay(&mut st, &rolled.replay, rolled.durable_seq)?);
        st.next_seq = st.next_seq.max(rolled.durable_seq + 1);
        st.free = (0..sb.extent_count)
            .filter(|&e| st.extents.get(e).state() == ExtentState::Free)
            .collect();
        let counters = st.counters;
        let (low, high) = opts
            .clean_watermarks
            .unwrap_or((sb.clean_low_pct, sb.clean_high_pct));
        if low >= high || high > 90 {
            return Err(Error::Invalid(format!(
                "cleaner watermarks {low}/{high}: need low < high <= 90 (%)"
            )));
        }
        // Units only where they pay and fit: not with `none`, never beyond the extent size.
        // v1 map entries and checkpoints cannot say "unit": v1 volumes keep single blocks.
        let unit_blocks = if codec.id() == codec::id::RAW || sb.version < 2 {
            1
        } else {
            opts.unit_bytes
                .map_or(sb.unit_blocks, |b| (b as usize / BLOCK_BYTES) as u8)
                .clamp(
                    1,
                    crate::layout::unit_blocks_max(
                        sb.extent_bytes,
                        SegmentForm::widest(sb.version, ck.flags, sb.extent_bytes),
                    ),
                )
        };
        let dicts = crate::dicts::Dicts::new(
            opts.dictionary
                .unwrap_or(sb.settings & crate::format::SB_SETTING_DICTIONARY != 0)
                && !opts.read_only
                && crate::dicts::Dicts::supports(codec)
                && sb.version >= 2
                && crate::dicts::content_bytes(&sb) >= crate::codec::dict::CONTENT_BYTES_MIN,
            &sb,
        );
        // The newest dictionary serves new blocks, once the recovery checkpoint below has made
        // both checkpoint slots list it (dicts.rs).
        // Newest by training sequence (ids wrap around once retired ones are reused), the
        // higher id first among equals (builds before retirement could give two the same).
        let newest = ck
            .dicts
            .iter()
            .filter(|e| e.id != 0 && loaded.dicts.iter().any(|d| d.id() == e.id))
            .max_by_key(|e| (e.created_seq, e.id))
            .map(|e| e.id);
        for d in &loaded.dicts {
            dicts.add(Arc::clone(d), Some(d.id()) == newest);
        }
        open_problems.extend(loaded.problems);
        open_repaired.extend(loaded.repaired);
        if !opts.read_only {
            crate::dicts::repair(&*storage, &sb, &loaded.rewrite)?;
        }
        let dedup = opts
            .dedup
            .unwrap_or(sb.settings & crate::format::SB_SETTING_DEDUP != 0)
            && !opts.read_only;
        if dedup
            && !(st.cleans_unlocked() && seg_form.flags & crate::format::SEG_FLAG_WIDE_RECORDS != 0)
        {
            return Err(Error::Invalid(
                "deduplication needs a volume with metadata pages (format bits 10 and 11: \
                 zbd create --metadata-pages)"
                    .into(),
            ));
        }
        let dedup = dedup.then(|| {
            super::dedup::InlineDedup::new(opts.dedup_index_bytes, opts.dedup_fingerprint_bits)
        });
        let vol = Inner {
            storage,
            sb,
            codec,
            unit_blocks,
            read_only: opts.read_only,
            state: Mutex::new(st),
            gate: RwLock::new(()),
            cache: ReadCache::new(opts.read_cache_bytes),
            outbox: Outbox::default(),
            open_problems,
            open_repaired,
            durable_seq: AtomicU64::new(rolled.durable_seq),
            write_align,
            seg_form,
            closed: AtomicBool::new(false),
            host_bytes_read: AtomicU64::new(counters.host_bytes_read),
            storage_bytes_read: AtomicU64::new(counters.storage_bytes_read),
            corrupt_reads: AtomicU64::new(counters.corrupt_reads),
            damaged_reads_since_open: AtomicU64::new(0),
            behind_logged_at: AtomicU64::new(0),
            opened_at: std::time::Instant::now(),
            clean_low_pct: low,
            clean_high_pct: high,
            clean_idle_seq: AtomicU64::new(u64::MAX),
            readers_waiting: AtomicUsize::new(0),
            dicts,
            ckpt_lock: Mutex::new(()),
            clean_ahead_lock: Mutex::new(()),
            clean_ahead_opened: AtomicU64::new(u64::MAX),
            ckpt_in_background: AtomicBool::new(false),
            ckpt_requested: AtomicBool::new(false),
            rollbacks_stopped: AtomicBool::new(false),
            dedup,
            device_ops: Mutex::new(()),
        };
        if !vol.read_only {
            // Make the replayed state durable and start a fresh allocation queue.
            let mut st = vol.state.lock();
            let cx = vol.ctx();
            // After replay, so the open's checkpoint may carve: what the window needed was
            // in hand (design, "Replay needs what the live run had"), and a volume created
            // with a small stock gets its ids before its first write.
            st.carving = st.cleans_unlocked();
            st.checkpoint(&cx)?;
            st.lend_reserve_if_full();
            drop(st);
            vol.dicts.start_sampling_if_needed();
        }
        Ok(vol)
    }

    /// Makes `close` a no-op (see `Volume::abandon`).
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Flushes, writes a final checkpoint and marks the volume closed. Idempotent.
    pub fn close(&self) -> Result<()> {
        if self.read_only || self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // A failed volume writes nothing more; the next open recovers from the disk.
        self.storage.check()?;
        let mut st = self.state.lock();
        let cx = self.ctx();
        let n = st.buffer.len();
        for i in (0..n).rev() {
            st.close_open(&cx, i)?;
        }
        self.sync_read_counters(&mut st);
        st.checkpoint(&cx)
    }
}

impl Inner {
    /// Closes the volume cleanly and upgrades it to the current format in place (`zbd upgrade`;
    /// `layout::upgrade` says what changes and `layout::write_superblock_update` why each
    /// step is crash safe). The storage stays held until the new superblock is durable.
    pub fn close_upgraded(&self) -> Result<Superblock> {
        if self.read_only {
            return Err(Error::Invalid("upgrade needs a writable open".into()));
        }
        let upgraded = crate::layout::upgrade(&self.sb)?;
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Invalid("the volume is already closed".into()));
        }
        self.close()?;
        crate::layout::write_superblock_update(&*self.storage, &self.sb, &upgraded)?;
        Ok(upgraded)
    }
}

impl Inner {
    /// Whether the volume is closed (nothing more is written through this handle).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The superblock `close_grown` would write, or why not; writes nothing (`Volume::close_grown`
    /// checks everything it can before it closes, so a refusal leaves the volume open).
    pub(crate) fn plan_grow(
        &self,
        logical_bytes: Option<u64>,
        capacity_bytes: Option<u64>,
    ) -> Result<Superblock> {
        self.growable()?;
        let grown = crate::layout::grow(&self.sb, logical_bytes, capacity_bytes)?;
        let len = self.storage.len_bytes()?;
        if len < grown.total_bytes() {
            return Err(Error::Invalid(format!(
                "storage has {len} bytes, the grown volume needs {}: extend it first",
                grown.total_bytes()
            )));
        }
        Ok(grown)
    }

    /// Why this open cannot be grown at any size, if it cannot (`Volume::growable`): asked
    /// before the storage is extended and, served, before I/O is paused for the grow.
    pub(crate) fn growable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("growing needs a writable open".into()));
        }
        if self.is_closed() {
            return Err(Error::Invalid("the volume is already closed".into()));
        }
        // A failed volume writes nothing more (the close would fail half way).
        self.storage.check()?;
        if matches!(self.state.lock().map, VolumeMap::Tree(_)) {
            // The device row holds the size, and H must not move: not built yet.
            return Err(Error::Invalid(
                "growing a volume with metadata pages is not supported yet".into(),
            ));
        }
        Ok(())
    }

    /// The superblock with `settings` (`SB_SETTING_*`: what opens do by default), or why not;
    /// writes nothing.
    pub(crate) fn plan_settings(&self, settings: u32) -> Result<Superblock> {
        if self.read_only || self.is_closed() {
            return Err(Error::Invalid(
                "changing settings needs a writable open".into(),
            ));
        }
        self.storage.check()?;
        let tree = matches!(self.state.lock().map, VolumeMap::Tree(_));
        if settings & crate::format::SB_SETTING_DEDUP != 0 && !tree {
            return Err(Error::Invalid(
                "deduplication needs a volume with metadata pages (format bits 10 and 11: \
                 zbd create --metadata-pages)"
                    .into(),
            ));
        }
        Ok(Superblock {
            settings,
            ..self.sb.clone()
        })
    }

    /// Closes the volume cleanly and writes `grown` (from `plan_grow` or `plan_settings`) over
    /// its superblock, as `close_upgraded` does: the storage stays held until the new
    /// superblock is durable.
    pub(crate) fn close_rewritten(&self, grown: &Superblock) -> Result<()> {
        self.close()?;
        if *grown == self.sb {
            return Ok(());
        }
        crate::layout::write_superblock_update(&*self.storage, &self.sb, grown)
    }
}

/// What this open pads log segments to: the storage's write alignment when zbd supports it (a
/// power of two up to 4 KiB dividing the extent size, format v2), else 512 bytes. Readers of
/// any build find segments at any sector, so the padding is no format change (format.md).
fn segment_align(storage: &dyn Storage, sb: &Superblock) -> usize {
    let a = storage.write_align();
    if sb.version >= 2
        && a.is_power_of_two()
        && (SECTOR_BYTES..=WRITE_ALIGN_MAX).contains(&a)
        && (sb.extent_bytes as usize).is_multiple_of(a)
    {
        a
    } else {
        SECTOR_BYTES
    }
}

/// Applies roll-forward records to the map, in write-sequence order.
/// Replays the records found after the checkpoint into the map. Returns the problems met: on a
/// page-tree map, a record whose leaf has no intact copy is skipped (its blocks are lost with
/// the leaf and read as errors), where an error would keep the whole volume from opening.
fn apply_replay(
    st: &mut State,
    replay: &[recovery::Replayed],
    durable_seq: u64,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for r in replay {
        let rec = &r.record;
        let end = rec.lba.saturating_add(u64::from(rec.count));
        // A move names its item's birth block, which owner search finds or not (a shared
        // item's birth device may be another); every other record stays inside its device.
        let inside = rec.count > 0
            && st.map.holds(rec.lba)
            && st.map.holds(end - 1)
            && key_device(end - 1) == key_device(rec.lba);
        if rec.kind != RecordKind::Move && !inside {
            continue;
        }
        match replay_one(st, r, end, durable_seq) {
            Ok(()) => {}
            Err(Error::Corrupt { .. } | Error::CorruptMetadata(_))
                if matches!(st.map, VolumeMap::Tree(_)) =>
            {
                problems.push(format!(
                    "blocks {}..{end}: a {:?} record was not replayed, its map leaf is damaged",
                    rec.lba, rec.kind
                ));
            }
            Err(e) => return Err(e),
        }
        st.next_seq = st.next_seq.max(rec.seq + 1);
    }
    st.replayed = replay.len() as u64;
    // Extents that lost their last live block during replay are free after the recovery checkpoint.
    st.extents.release_all_pending();
    Ok(problems)
}

/// One replayed record (`end`: one past its last block) into the map.
fn replay_one(st: &mut State, r: &recovery::Replayed, end: u64, durable_seq: u64) -> Result<()> {
    let rec = &r.record;
    match rec.kind {
        RecordKind::Data if r.damaged => {
            // The cleaner copies stored bytes verbatim: if the block still maps to bytes
            // with the same checksum (the victim's copy, kept until a checkpoint), those are
            // the same data. Otherwise the newest version is lost: the block reads as an
            // error, never as its older version.
            // (A shared block is compared as the item it names.)
            let now = st.map.get(rec.lba)?;
            let now = st.map.resolve(now)?;
            let same = now.state == BlockState::Data
                && now.crc == rec.crc
                && u32::from(now.len) == rec.len
                && now.codec == rec.codec
                && now.unit_index == rec.unit_index
                && u16::from(now.unit_blocks) == rec.unit_blocks
                && u16::from(now.dict) == rec.dict
                && now.seeded == rec.seeded;
            if !same {
                st.set_entry(
                    rec.lba,
                    MapEntry {
                        state: BlockState::Corrupt,
                        ..MapEntry::UNMAPPED
                    },
                )?;
            }
        }
        RecordKind::Data => {
            let entry = MapEntry {
                state: BlockState::Data,
                codec: rec.codec,
                len: rec.len as u16,
                extent: r.extent,
                offset: rec.offset,
                crc: rec.crc,
                unit_index: rec.unit_index,
                unit_blocks: rec.unit_blocks as u8,
                dict: rec.dict as u8,
                seeded: rec.seeded,
            };
            st.set_entry(rec.lba, entry)?;
        }
        RecordKind::Zero => st.apply_range(rec.lba, end - rec.lba, MapEntry::ZERO)?,
        RecordKind::Trim => st.apply_range(rec.lba, end - rec.lba, MapEntry::UNMAPPED)?,
        // A move whose copy fails its checksum is skipped whatever its sequence: its victim
        // is released only by a checkpoint after the copy synced, so the source is intact.
        RecordKind::Move if r.damaged => {}
        // The owner that still names the source is pointed at this copy: a shared item's SBT
        // entry (its other blocks' records then find no owner there), or, where the promotion
        // that made it shared came after the checkpoint and is not replayed, the block's
        // direct entry, as a data record would (design.md, build order 2a).
        RecordKind::Move => {
            match st.map.owner(
                rec.lba,
                rec.unit_index,
                rec.source_extent,
                rec.source_offset,
            )? {
                Owner::Shared(key, _) => st.move_shared_item(key, r.extent, rec.offset)?,
                Owner::Direct(e) => st.set_entry_in_place(
                    rec.lba,
                    MapEntry {
                        extent: r.extent,
                        offset: rec.offset,
                        ..e
                    },
                )?,
                Owner::Dead => {}
            }
        }
        // A ref whose payload fails its check (only a durable one is kept: roll_forward
        // drops torn records) names nothing anyone can trust: the block is damaged.
        RecordKind::Ref => match &r.target {
            Some(p) => st.replay_ref(rec.lba, rec.seq, p, durable_seq)?,
            None => st.set_entry(
                rec.lba,
                MapEntry {
                    state: BlockState::Corrupt,
                    ..MapEntry::UNMAPPED
                },
            )?,
        },
    }
    Ok(())
}
