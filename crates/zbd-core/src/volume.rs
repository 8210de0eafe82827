//! The public handle: a thread-safe compressed block volume over a [`Storage`].

use crate::buffer::{BufferConfig, Prepared};
use crate::codec::{self, unit, Codec};
use crate::error::{Error, Result};
use crate::extent_table::ExtentTable;
use crate::fence::Fenced;
use crate::format::{
    decode_map_page, BlockState, Checkpoint, MapEntry, QueueEntry, RecordKind, Superblock,
    BLOCK_BYTES, CKPT_FLAG_COMPRESSION_UNITS, CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_SAVINGS_COUNTERS,
    CKPT_FLAG_VOLUME_COUNTERS, MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES, PAGE_NONE, SECTOR_BYTES,
    SUPERBLOCK_BYTES,
};
use crate::io::{IoOptions, QueuedStorage};
use crate::layout::{plan, CreateOptions};
use crate::map::{Map, MAP_CACHE_BYTES_DEFAULT};
use crate::readcache::ReadCache;
use crate::recovery;
use crate::state::{is_zero, Ctx, ExtentState, State};
use crate::stats::{Counters, Stats};
use crate::storage::Storage;
use crate::writeback::Outbox;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default extent buffer size (paper: 16 MiB).
pub const BUFFER_BYTES_DEFAULT: usize = 16 << 20;
/// Default aging timeout of an open extent.
pub const AGING_DEFAULT: Duration = Duration::from_secs(30);
/// Default budget of the read cache.
pub const READ_CACHE_BYTES_DEFAULT: usize = 32 << 20;
/// Whether new volumes train and use dictionaries unless told otherwise (docs/savings.md).
pub const DICTIONARY_DEFAULT: bool = false;
/// Requests with at least this many units (or, on reads, runs of blocks decoded together) are
/// compressed / decompressed in parallel (par.rs).
const PARALLEL_ITEMS_MIN: usize = 2;
/// Reads of at least this many blocks (128 KiB, the size of the kernel's readahead requests)
/// are streaming: they use the read cache but do not fill it. A sequential scan would evict
/// what random reads come back for, and copying its bytes into the cache was a measurable part
/// of a sequential read's CPU time (a third of 128 KiB reads' on one core: issue 13).
const STREAMING_BLOCKS_MIN: u64 = 32;

/// Open-time tunables.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Open read-only (no recovery checkpoint; writes fail with `ReadOnly`).
    pub read_only: bool,
    /// Codec for new writes (default: the one recorded at create time).
    pub codec: Option<Codec>,
    /// Extent buffer size in bytes.
    pub buffer_bytes: usize,
    /// Aging timeout of open extents.
    pub aging: Duration,
    /// Run the background thread: the cleaner (foreground cleaning happens regardless) and the
    /// checkpoints writes ask for (without it, the write that asks writes it).
    pub background_cleaner: bool,
    /// Cleaner watermarks (low, high) in % of free extents; default: those set at create time.
    pub clean_watermarks: Option<(u8, u8)>,
    /// How storage writes are issued (queued to I/O threads by default; see `io.rs`).
    pub io: IoOptions,
    /// Budget of the cache of stored block bytes recently read (0: none; see `readcache.rs`).
    pub read_cache_bytes: usize,
    /// Budget of the map page cache (see `map/`); dirty pages bring a checkpoint forward.
    pub map_cache_bytes: usize,
    /// Compression unit size of new writes (default: the one recorded at create time; 4K =
    /// every block on its own).
    pub unit_bytes: Option<u32>,
    /// Train a dictionary from the first compressible blocks written and compress new blocks
    /// with it (lz4 and zstd; see dicts.rs); `None`: as set at create time (superblock).
    /// Dictionaries already in the volume are read whatever this says.
    pub dictionary: Option<bool>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            codec: None,
            buffer_bytes: BUFFER_BYTES_DEFAULT,
            aging: AGING_DEFAULT,
            background_cleaner: true,
            clean_watermarks: None,
            io: IoOptions::default(),
            read_cache_bytes: READ_CACHE_BYTES_DEFAULT,
            map_cache_bytes: MAP_CACHE_BYTES_DEFAULT,
            unit_bytes: None,
            dictionary: None,
        }
    }
}

/// What a range of the volume holds (for NBD block status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum AllocState {
    /// Stored data.
    Data,
    /// Written with zeros: reads zeros, takes no space.
    Zero,
    /// Never written or trimmed: reads zeros, takes no space.
    Hole,
}

/// Result of [`crate::Volume::check`].
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CheckReport {
    /// Data blocks read and verified.
    pub blocks_checked: u64,
    /// Logical blocks that cannot be read back correctly.
    pub damaged_blocks: Vec<u64>,
    /// Metadata problems found (one line each).
    pub metadata_problems: Vec<String>,
    /// Damaged metadata copies whose other copy is intact: nothing is lost, and the next
    /// checkpoint of a writable volume rewrites both copies (one line each).
    pub repaired: Vec<String>,
}

impl CheckReport {
    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.damaged_blocks.is_empty() && self.metadata_problems.is_empty()
    }
}

/// The volume proper; [`crate::Volume`] wraps it with the background cleaner.
pub(crate) struct Inner {
    storage: Arc<Fenced>,
    sb: Superblock,
    codec: Codec,
    /// Compression unit size of new writes, in blocks (1: every block on its own).
    unit_blocks: u8,
    read_only: bool,
    state: Mutex<State>,
    gate: RwLock<()>,
    cache: ReadCache,
    /// Sealed segments not yet issued (see writeback.rs).
    outbox: Outbox,
    /// Problems found at open: damaged checkpoint copies, unattributable log damage.
    open_problems: Vec<String>,
    open_repaired: Vec<String>,
    /// Highest write sequence covered by a completed sync (see `Ctx::durable_seq`).
    durable_seq: AtomicU64,
    closed: AtomicBool,
    host_bytes_read: AtomicU64,
    storage_bytes_read: AtomicU64,
    corrupt_reads: AtomicU64,
    /// Readers waiting for the state lock; writers and the cleaner let them go first.
    readers_waiting: AtomicUsize,
    /// Held by a checkpoint written outside the state lock, from snapshot to commit (taken
    /// before the state lock): such checkpoints run one at a time.
    ckpt_lock: Mutex<()>,
    /// Held by a writer cleaning before space runs out (`clean_ahead`): one at a time, the
    /// others wait here, without the state lock.
    clean_ahead_lock: Mutex<()>,
    /// `State::extents_opened` when cleaning ahead last ended (`clean_ahead`).
    clean_ahead_opened: AtomicU64,
    /// A background thread (handle.rs) writes the checkpoints that writes ask for, so a write
    /// does not wait for the checkpoint's syncs; without one, the write writes it.
    ckpt_in_background: AtomicBool,
    /// A write asked for a checkpoint that the background thread has not taken yet.
    ckpt_requested: AtomicBool,
    /// Cleaner watermarks, % of extents free.
    pub(crate) clean_low_pct: u8,
    pub(crate) clean_high_pct: u8,
    /// Write sequence at the last cleaning attempt that made no progress (avoid spinning).
    clean_idle_seq: AtomicU64,
    /// Trained dictionaries (dicts.rs).
    dicts: crate::dicts::Dicts,
}

/// Extents host writes leave to the cleaner: 2 % of the data area, 4..64.
fn cleaner_reserve(extent_count: u32) -> usize {
    (extent_count as usize / 50)
        .clamp(4, 64)
        .min(extent_count as usize / 4)
}

/// Stored bytes fetched for one block (`None` when it has none).
/// The stored bytes of one block, as fetched: a slice of a device read, of the read cache or of
/// an open extent's buffer, shared rather than copied.
type Fetched = Result<Option<Bytes>>;

/// The map entry of a source that is a block of a multi-block unit.
fn unit_entry(src: &Source) -> Option<&MapEntry> {
    match src {
        Source::Bytes { entry, .. } | Source::Disk { entry } | Source::Decoded { entry, .. }
            if entry.unit_blocks > 1 =>
        {
            Some(entry)
        }
        _ => None,
    }
}

/// Where the stored bytes of one block are, as seen at lookup time.
enum Source {
    Zeros,
    Bytes {
        entry: MapEntry,
        bytes: Bytes,
    },
    Disk {
        entry: MapEntry,
    },
    /// A block of a unit whose decoded form is in the read cache.
    Decoded {
        entry: MapEntry,
        unit: Arc<[u8]>,
    },
    Damaged,
}

impl Inner {
    /// Formats `storage` as a new volume and opens it with `open_opts`.
    pub fn create_with(
        storage: Box<dyn Storage>,
        opts: &CreateOptions,
        open_opts: OpenOptions,
    ) -> Result<Inner> {
        let mut sb = plan(opts)?;
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
        let queue: Vec<QueueEntry> = (0..sb.queue_len)
            .map(|e| QueueEntry {
                extent: e,
                alloc_seq: u64::from(e) + 1,
            })
            .collect();
        let ck = Checkpoint {
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
        let ckb = ck.encode(&sb);
        for copy in 0..sb.metadata_copies() {
            // Invalidate any old checkpoint left in slot A (slot B gets checkpoint 1).
            storage.write_at(
                sb.checkpoint_slot_offset(0, copy),
                &vec![0u8; sb.checkpoint_slot_bytes as usize],
            )?;
            storage.write_at(sb.checkpoint_slot_offset(1, copy), &ckb)?;
        }
        storage.sync()?;
        Inner::open(storage, open_opts)
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
        let mut map = Map::open(storage.clone(), &sb, &ck, opts.map_cache_bytes);
        let (table, extents) = match ExtentTable::load(&*storage, &sb, &ck)? {
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
        let rolled = recovery::roll_forward(&*storage, &sb, &ck)?;
        let mut open_repaired = found.damaged_copies;
        let mut open_problems = rolled.problems;
        let loaded = crate::dicts::load(&*storage, &sb, &ck.dicts);
        let codec = match opts.codec {
            Some(c) => c,
            None => Codec::from_id(sb.codec_id, sb.codec_level)?,
        };
        // Open extents are partly empty: keep them a small share of the data area (1/32) so a
        // nearly full volume is not exhausted by its own buffer, and within the recovery queue.
        let max_open = (opts.buffer_bytes / sb.extent_bytes as usize)
            .min(sb.extent_count as usize / 32)
            .clamp(1, (sb.queue_len as usize / 2).max(1));
        let mut st = State {
            map,
            table,
            extents,
            free: Default::default(),
            queue: VecDeque::new(),
            open: Vec::new(),
            room: Vec::new(),
            next_seq: ck.write_seq + 1,
            ckpt_seq: ck.seq,
            next_alloc_seq: ck.next_alloc_seq,
            counters: Counters::from_array(&ck.counters),
            buffer: BufferConfig {
                max_open,
                aging: opts.aging,
                reserve: cleaner_reserve(sb.extent_count),
            },
            replayed: 0,
            dicts: ck.dicts,
            // Dictionaries not listed by the checkpoint recovery starts from are free: the
            // open's own checkpoint, below, is written before anything reuses them.
            retiring: Vec::new(),
            cleaning: Vec::new(),
            units_flag: ck.flags & CKPT_FLAG_COMPRESSION_UNITS != 0,
            clean_gen: 0,
            extents_opened: 0,
            inflight: None,
            ckpt_wanted: false,
            refill_early: true,
        };
        apply_replay(&mut st, &sb, &rolled.replay)?;
        st.next_seq = st.next_seq.max(rolled.durable_seq + 1);
        st.free = (0..sb.extent_count)
            .filter(|&e| st.extents[e as usize].state == ExtentState::Free)
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
                .clamp(1, crate::layout::unit_blocks_max(sb.extent_bytes))
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
            closed: AtomicBool::new(false),
            host_bytes_read: AtomicU64::new(counters.host_bytes_read),
            storage_bytes_read: AtomicU64::new(counters.storage_bytes_read),
            corrupt_reads: AtomicU64::new(counters.corrupt_reads),
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
        };
        if !vol.read_only {
            // Make the replayed state durable and start a fresh allocation queue.
            let mut st = vol.state.lock();
            let cx = vol.ctx();
            st.checkpoint(&cx)?;
            drop(st);
            vol.dicts.start_sampling_if_needed();
        }
        Ok(vol)
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            storage: &*self.storage,
            sb: &self.sb,
            gate: &self.gate,
            durable_seq: &self.durable_seq,
            cache: &self.cache,
            outbox: &self.outbox,
            codec: self.codec,
            dicts: &self.dicts,
            make_space: crate::cleaner::make_space,
        }
    }

    /// Logical size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.sb.logical_blocks * BLOCK_BYTES as u64
    }

    /// The superblock (geometry).
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Codec used for new writes.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Takes the state lock for a write or cleaning step, letting waiting readers in first
    /// (paper II-C: reads ahead of writes). Bounded, so writers cannot starve.
    fn lock_for_write(&self) -> parking_lot::MutexGuard<'_, State> {
        const YIELDS_MAX: usize = 32;
        for _ in 0..YIELDS_MAX {
            if self.readers_waiting.load(Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::yield_now();
        }
        self.state.lock()
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.size_bytes();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.storage.check()
    }

    /// Reads `buf.len()` bytes at byte `offset`. Whole-block reads are decoded straight into
    /// `buf`; only a read with a partial first or last block goes through a scratch buffer.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let _busy = crate::par::busy();
        let bs = BLOCK_BYTES as u64;
        let first = offset / bs;
        let count = (offset + buf.len() as u64 - 1) / bs - first + 1;
        if offset.is_multiple_of(bs) && buf.len().is_multiple_of(BLOCK_BYTES) {
            self.read_into(first, count, true, buf)?
                .into_iter()
                .collect::<Result<()>>()?;
        } else {
            let mut blocks = vec![0u8; count as usize * BLOCK_BYTES];
            self.read_into(first, count, true, &mut blocks)?
                .into_iter()
                .collect::<Result<()>>()?;
            let start = (offset % bs) as usize;
            buf.copy_from_slice(&blocks[start..start + buf.len()]);
        }
        self.host_bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Looks up `count` blocks from `first` and decodes them into `out` (`count` x 4 KiB);
    /// returns one result per block (a damaged block is an error, and its bytes in `out` are
    /// not data). `use_cache: false` reads every stored byte from the device (check must see
    /// the medium).
    fn read_into(
        &self,
        first: u64,
        count: u64,
        use_cache: bool,
        out: &mut [u8],
    ) -> Result<Vec<Result<()>>> {
        debug_assert_eq!(out.len() as u64, count * BLOCK_BYTES as u64);
        let (mut sources, _gate) = self.lookup(first, count, !use_cache)?;
        if use_cache {
            for src in sources.iter_mut() {
                if let Source::Disk { entry } = *src {
                    let len = usize::from(entry.unit_blocks) * BLOCK_BYTES;
                    if let Some(unit) = (entry.unit_blocks > 1)
                        .then(|| self.cache.get_unit(entry.extent, entry.offset, len))
                        .flatten()
                    {
                        *src = Source::Decoded { entry, unit };
                    }
                }
            }
        }
        let keep = use_cache && count < STREAMING_BLOCKS_MIN;
        let fetched = self.fetch(&sources, use_cache, keep);
        // Consecutive blocks of one compression unit are decoded together, once; each group
        // gets its own part of `out`, so groups decode in parallel without copies.
        let mut groups: Vec<(usize, usize, Fetched)> = Vec::new();
        for (i, stored) in fetched.into_iter().enumerate() {
            if let Some((start, end, _)) = groups.last_mut() {
                let same = match (unit_entry(&sources[*start]), unit_entry(&sources[i])) {
                    (Some(a), Some(b)) => {
                        (a.extent, a.offset, a.crc, a.len) == (b.extent, b.offset, b.crc, b.len)
                    }
                    _ => false,
                };
                if same {
                    *end = i + 1;
                    continue;
                }
            }
            groups.push((i, i + 1, stored));
        }
        let mut work = Vec::with_capacity(groups.len());
        let mut rest = out;
        for group in groups {
            let (part, tail) =
                std::mem::take(&mut rest).split_at_mut((group.1 - group.0) * BLOCK_BYTES);
            work.push((group, part));
            rest = tail;
        }
        let decode = |((start, end, stored), out): ((usize, usize, Fetched), &mut [u8])| {
            let lba = first + start as u64;
            let corrupt = |i: usize| {
                Err(Error::Corrupt {
                    lba: first + i as u64,
                })
            };
            let stored = match stored {
                Ok(s) => s,
                Err(e) => {
                    let mut res = vec![Err(e)];
                    res.extend((start + 1..end).map(corrupt));
                    return res;
                }
            };
            // The blocks of the group, in order, from their decoded unit.
            let blocks_of = |unit: &[u8], out: &mut [u8]| -> Vec<Result<()>> {
                for (s, block) in sources[start..end]
                    .iter()
                    .zip(out.chunks_exact_mut(BLOCK_BYTES))
                {
                    let i = usize::from(unit_entry(s).map_or(0, |e| e.unit_index));
                    block.copy_from_slice(&unit[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]);
                }
                (start..end).map(|_| Ok(())).collect()
            };
            let damaged = || {
                self.corrupt_reads
                    .fetch_add((end - start) as u64, Ordering::Relaxed);
                (start..end).map(corrupt).collect()
            };
            match (&sources[start], stored) {
                (Source::Zeros, _) => {
                    out.fill(0);
                    vec![Ok(())]
                }
                (Source::Damaged, _) => vec![corrupt(start)],
                (Source::Decoded { unit, .. }, _) => blocks_of(unit, out),
                // From the device: decode the whole unit once and keep it for its other blocks
                // (the CRC of what was decoded has just been checked).
                (Source::Disk { entry }, Some(bytes)) if keep && entry.unit_blocks > 1 => {
                    let mut unit = vec![0u8; usize::from(entry.unit_blocks) * BLOCK_BYTES];
                    match self.decode_unit(entry, &bytes, &mut unit) {
                        Some(()) => {
                            let unit: Arc<[u8]> = Arc::from(unit);
                            self.cache
                                .put_unit(entry.extent, entry.offset, Arc::clone(&unit));
                            blocks_of(&unit, out)
                        }
                        None => damaged(),
                    }
                }
                (Source::Bytes { entry, .. } | Source::Disk { entry }, Some(bytes))
                    if end - start > 1 =>
                {
                    // The whole unit, in order: decode in place.
                    let whole = end - start == usize::from(entry.unit_blocks)
                        && entry.unit_index == 0
                        && sources[start..end].iter().enumerate().all(|(k, s)| {
                            unit_entry(s).is_some_and(|e| usize::from(e.unit_index) == k)
                        });
                    if whole {
                        return match self.decode_unit(entry, &bytes, out) {
                            Some(()) => (start..end).map(|_| Ok(())).collect(),
                            None => damaged(),
                        };
                    }
                    let mut unit = vec![0u8; usize::from(entry.unit_blocks) * BLOCK_BYTES];
                    match self.decode_unit(entry, &bytes, &mut unit) {
                        Some(()) => blocks_of(&unit, out),
                        None => damaged(),
                    }
                }
                (Source::Bytes { entry, .. } | Source::Disk { entry }, Some(bytes)) => {
                    vec![self.decode_block(lba, entry, &bytes, out)]
                }
                (_, None) => vec![corrupt(start)],
            }
        };
        Ok(crate::par::map(work, PARALLEL_ITEMS_MIN, decode)
            .into_iter()
            .flatten()
            .collect())
    }

    /// Map lookup under the state lock; returns with the reuse gate held shared so the extents
    /// named cannot be reused before the caller has read them.
    /// `medium`: blocks of open extents already written to storage are read from it too, not
    /// from the extent's buffer in RAM (check and scrub must see what is on the medium).
    fn lookup(
        &self,
        first: u64,
        count: u64,
        medium: bool,
    ) -> Result<(Vec<Source>, parking_lot::RwLockReadGuard<'_, ()>)> {
        self.readers_waiting.fetch_add(1, Ordering::SeqCst);
        let mut st = self.state.lock();
        self.readers_waiting.fetch_sub(1, Ordering::SeqCst);
        let mut entries = Vec::with_capacity(count as usize);
        st.map.get_run(first, count, &mut entries)?;
        let mut out = Vec::with_capacity(count as usize);
        // Blocks of closed extents whose last segment is not issued yet are read from it.
        let outbox = !self.outbox.is_empty();
        // The open extent of the previous block: the blocks of one request mostly share
        // extents, and the buffer can hold hundreds of open extents (16 MiB of 32 KiB ones).
        let mut last: Option<(u32, Option<usize>)> = None;
        for entry in entries {
            let open = match last {
                Some((extent, i)) if extent == entry.extent => i,
                _ if entry.state != BlockState::Data => None,
                _ => {
                    let i = st.open.iter().position(|o| o.extent == entry.extent);
                    last = Some((entry.extent, i));
                    i
                }
            };
            out.push(match entry.state {
                BlockState::Unmapped | BlockState::Zero => Source::Zeros,
                BlockState::Corrupt => Source::Damaged,
                BlockState::Data => match open.map(|i| &st.open[i]) {
                    Some(o)
                        if !medium
                            || entry.offset as usize + entry.len as usize > o.durable_end =>
                    {
                        let s = entry.offset as usize;
                        Source::Bytes {
                            entry,
                            bytes: Bytes::copy_from_slice(&o.buf[s..s + entry.len as usize]),
                        }
                    }
                    _ => match outbox
                        .then(|| {
                            self.outbox
                                .find(entry.extent, entry.offset, entry.len.into())
                        })
                        .flatten()
                    {
                        Some(bytes) => Source::Bytes {
                            entry,
                            bytes: Bytes::from(bytes),
                        },
                        None => Source::Disk { entry },
                    },
                },
            });
        }
        let gate = self.gate.read();
        drop(st);
        Ok((out, gate))
    }

    /// Reads the stored bytes of every `Disk` source, one storage read per run of blocks in the
    /// same extent, all in one `Storage::read_many` (a network store has them in flight at
    /// once).
    /// `keep`: put what was read into the read cache. The blocks of one unit after its first
    /// get `None`: `read_blocks` decodes a unit once, from its first block's bytes.
    fn fetch(&self, sources: &[Source], use_cache: bool, keep: bool) -> Vec<Fetched> {
        // Runs of `Disk` sources (start, end, extent, lo, hi) that need a device read.
        let mut runs: Vec<(usize, usize, u32, u32, u32)> = Vec::new();
        let mut out: Vec<Option<Fetched>> = Vec::with_capacity(sources.len());
        let mut i = 0;
        while i < sources.len() {
            let Source::Disk { entry } = &sources[i] else {
                out.push(Some(Ok(match &sources[i] {
                    Source::Bytes { bytes, .. } => Some(bytes.clone()),
                    _ => None,
                })));
                i += 1;
                continue;
            };
            // Extend the run while the next block sits in the same extent, close by.
            let mut j = i + 1;
            let (mut lo, mut hi) = (entry.offset, entry.offset + u32::from(entry.len));
            while j < sources.len() {
                match &sources[j] {
                    Source::Disk { entry: e } if e.extent == entry.extent => {
                        lo = lo.min(e.offset);
                        hi = hi.max(e.offset + u32::from(e.len));
                        j += 1;
                    }
                    _ => break,
                }
            }
            // Every block of the run cached: no device read.
            let cached: Vec<Arc<[u8]>> = sources[i..j]
                .iter()
                .map_while(|src| match src {
                    Source::Disk { entry: e } if use_cache => {
                        self.cache.get(e.extent, e.offset, usize::from(e.len))
                    }
                    _ => None,
                })
                .collect();
            if cached.len() == j - i {
                out.extend(
                    cached
                        .into_iter()
                        .map(|b| Some(Ok(Some(Bytes::from_owner(b))))),
                );
            } else {
                runs.push((i, j, entry.extent, lo, hi));
                out.extend((i..j).map(|_| None));
            }
            i = j;
        }
        // One buffer for every run, all handed to the storage at once (a network store has them
        // in flight together); each block's bytes are then a slice of it, not a copy.
        let total: usize = runs.iter().map(|r| (r.4 - r.3) as usize).sum();
        let mut all = vec![0u8; total];
        let results = {
            let mut reads = Vec::with_capacity(runs.len());
            let mut rest = all.as_mut_slice();
            for &(_, _, extent, lo, hi) in &runs {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut((hi - lo) as usize);
                reads.push((self.sb.extent_offset(extent) + u64::from(lo), part));
                rest = tail;
            }
            self.storage.read_many(&mut reads)
        };
        self.storage_bytes_read
            .fetch_add(total as u64, Ordering::Relaxed);
        let all = Bytes::from(all);
        let mut at = 0;
        let spans = runs.iter().zip(results).map(|(&(_, _, _, lo, hi), res)| {
            let span = all.slice(at..at + (hi - lo) as usize);
            at += span.len();
            res.map(|()| span)
        });
        for (&(i, j, _, lo, _), res) in runs.iter().zip(spans) {
            let mut prev: Option<&MapEntry> = None;
            for (k, src) in sources.iter().enumerate().take(j).skip(i) {
                let Source::Disk { entry: e } = src else {
                    continue;
                };
                let same_unit = prev.is_some_and(|p| {
                    e.unit_blocks > 1
                        && p.unit_blocks > 1
                        && (p.offset, p.len, p.crc) == (e.offset, e.len, e.crc)
                });
                prev = Some(e);
                out[k] = Some(match &res {
                    Ok(_) if same_unit => Ok(None),
                    Ok(span) => {
                        let s = (e.offset - lo) as usize;
                        let bytes = span.slice(s..s + e.len as usize);
                        if keep {
                            // Under the reuse gate (held by our caller): see readcache.rs.
                            self.cache.put(e.extent, e.offset, &bytes);
                        }
                        Ok(Some(bytes))
                    }
                    Err(err) => Err(Error::Io(std::io::Error::other(err.to_string()))),
                });
            }
        }
        out.into_iter()
            .map(|f| f.expect("every source is fetched"))
            .collect()
    }

    /// Decodes one block from its stored bytes (of its unit: decoding no more than the unit)
    /// into `out` (4 KiB).
    fn decode_block(
        &self,
        lba: u64,
        entry: &MapEntry,
        stored: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        // A block whose dictionary is not loaded (both copies damaged) is an error, never data.
        let dict = (entry.dict != 0).then(|| self.dicts.get(entry.dict));
        let ok = crc32c::crc32c(stored) == entry.crc
            && !matches!(dict, Some(None))
            && if entry.unit_blocks > 1 {
                unit::read_stored_block(
                    entry.codec,
                    dict.clone().flatten().as_deref(),
                    stored,
                    usize::from(entry.unit_blocks),
                    usize::from(entry.unit_index),
                    &mut Vec::new(),
                    out,
                )
                .is_some()
            } else {
                match dict.flatten() {
                    Some(d) => d.decompress(entry.codec, stored, out).is_some(),
                    None => codec::decompress(entry.codec, stored, out).is_some(),
                }
            };
        if !ok {
            self.corrupt_reads.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Corrupt { lba });
        }
        Ok(())
    }

    /// Decodes a whole unit into `out` (`unit_blocks` x 4 KiB) after checking its CRC; `None`
    /// if damaged.
    fn decode_unit(&self, entry: &MapEntry, stored: &[u8], out: &mut [u8]) -> Option<()> {
        (crc32c::crc32c(stored) == entry.crc).then_some(())?;
        if entry.dict != 0 {
            self.dicts
                .get(entry.dict)?
                .decompress(entry.codec, stored, out)?;
        } else {
            codec::decompress(entry.codec, stored, out)?;
        }
        Some(())
    }

    /// Whether `p` names no dictionary or one the directory lists (`State::lists_dict`).
    fn listed(st: &State, p: &Prepared) -> bool {
        match p {
            Prepared::Zero => true,
            Prepared::Data { dict, .. } => st.lists_dict(*dict),
        }
    }

    /// Compresses one full block (outside any lock).
    fn prepare(&self, block: &[u8]) -> Prepared {
        if is_zero(block) {
            return Prepared::Zero;
        }
        let active = self.dicts.active();
        let z = match &active {
            Some(d) => d.compress(self.codec, block),
            None => self.codec.compress(block),
        };
        // Keep the compressed form only if it saves at least one sector.
        let (codec, bytes, dict) = match z {
            Some(z) if z.len() + SECTOR_BYTES <= BLOCK_BYTES => {
                if active.is_some() {
                    self.dicts.note(BLOCK_BYTES, z.len());
                }
                self.dicts.sample(block);
                (self.codec.id(), z, active.map_or(0, |d| d.id() as u8))
            }
            _ => (codec::id::RAW, block.to_vec(), 0),
        };
        let crc = crc32c::crc32c(&bytes);
        Prepared::Data {
            codec,
            bytes,
            crc,
            blocks: 1,
            dict,
        }
    }

    /// Compresses consecutive non-zero blocks as one unit (outside any lock). A unit that does
    /// not save a sector is stored as raw single blocks: never more than `none` would store,
    /// and reads of them decode nothing.
    fn prepare_unit(&self, data: &[u8]) -> Vec<Prepared> {
        let n = data.len() / BLOCK_BYTES;
        if n == 1 {
            return vec![self.prepare(data)];
        }
        let active = self.dicts.active();
        match unit::compress_unit(self.codec, active.as_deref(), data) {
            Ok(u) if u.codec_id != codec::id::RAW => {
                if u.dict_id != 0 {
                    self.dicts.note(data.len(), u.bytes.len());
                }
                self.dicts.sample(data);
                let crc = crc32c::crc32c(&u.bytes);
                vec![Prepared::Data {
                    codec: u.codec_id,
                    bytes: u.bytes,
                    crc,
                    blocks: n as u8,
                    dict: u.dict_id as u8,
                }]
            }
            _ => data
                .chunks(BLOCK_BYTES)
                .map(|b| Prepared::Data {
                    codec: codec::id::RAW,
                    bytes: b.to_vec(),
                    crc: crc32c::crc32c(b),
                    blocks: 1,
                    dict: 0,
                })
                .collect(),
        }
    }

    /// Writes `data` at byte `offset`. With `fua`, returns only once the data is durable.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let _busy = crate::par::busy();
        // Cleaning ahead is an optimisation: a failure of it (a victim that does not read) must
        // not refuse a write that fits. make_space meets the same error only if the write
        // needs the space. A failed device write or sync has tripped the fence: then this
        // write fails too, before it takes effect, like every write after it.
        if let Err(e) = self.clean_ahead(data.len()) {
            tracing::warn!("cleaning ahead of a write failed: {e}");
            self.check_writable()?;
        }
        self.wait_for_queue_refill(data.len());
        let bs = BLOCK_BYTES as u64;
        let end = offset + data.len() as u64;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        if first_full >= end_full {
            // Everything inside one or two partial blocks.
            self.write_partial_range(offset, data)?;
        } else {
            let head = (first_full * bs - offset) as usize;
            let tail_start = (end_full * bs - offset) as usize;
            if head > 0 {
                self.write_partial_range(offset, &data[..head])?;
            }
            self.write_full_blocks(first_full, &data[head..tail_start])?;
            if tail_start < data.len() {
                self.write_partial_range(end_full * bs, &data[tail_start..])?;
            }
        }
        let wanted = {
            let mut st = self.state.lock();
            st.counters.host_bytes_written += data.len() as u64;
            st.ckpt_wanted
        };
        self.issue_sealed()?;
        // The write itself is done: a dictionary that fails to install must not fail it, unless
        // a failed write or sync there has tripped the fence (then no write succeeds).
        if let Err(e) = self.train_if_ready() {
            tracing::warn!("trained dictionary not installed: {e}");
            self.check_writable()?;
        }
        if fua {
            self.flush()?;
        }
        if wanted {
            self.checkpoint_asked()?;
        }
        Ok(())
    }

    /// Writes whole blocks: runs of non-zero blocks become compression units (aligned to LBA
    /// multiples of the unit size, `unit::plan_units`), zero blocks map states.
    fn write_full_blocks(&self, first: u64, data: &[u8]) -> Result<()> {
        let nonzero: Vec<bool> = data.chunks(BLOCK_BYTES).map(|b| !is_zero(b)).collect();
        let mut pieces: Vec<std::ops::Range<usize>> = Vec::new();
        let mut at = 0;
        for u in unit::plan_units(first, &nonzero, usize::from(self.unit_blocks)) {
            pieces.extend((at..u.start).map(|i| i..i + 1));
            at = u.end;
            pieces.push(u);
        }
        pieces.extend((at..nonzero.len()).map(|i| i..i + 1));
        let prep = |r: &std::ops::Range<usize>| {
            let bytes = &data[r.start * BLOCK_BYTES..r.end * BLOCK_BYTES];
            (r.start, self.prepare_unit(bytes))
        };
        // `none` only copies and checksums: a helper's wake-up costs more than it takes over.
        let min = match self.codec {
            Codec::None => usize::MAX,
            _ => PARALLEL_ITEMS_MIN,
        };
        let prepared = crate::par::map(pieces.iter().collect(), min, prep);
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        for (start, mut ps) in prepared {
            let mut lba = first + start as u64;
            if !ps.iter().all(|p| Self::listed(&st, p)) {
                // Compressed with a dictionary retired meanwhile: compress again (rare).
                let n: usize = ps.iter().map(Prepared::blocks).sum();
                ps = self.prepare_unit(&data[start * BLOCK_BYTES..(start + n) * BLOCK_BYTES]);
            }
            for p in ps {
                let n = match &p {
                    Prepared::Zero => 1,
                    Prepared::Data { blocks, .. } => u64::from(*blocks),
                };
                st.put_block(&cx, lba, p)?;
                lba += n;
            }
        }
        st.age(&cx)
    }

    /// Writes bytes that lie within partial blocks (read-modify-write per block).
    fn write_partial_range(&self, offset: u64, data: &[u8]) -> Result<()> {
        let bs = BLOCK_BYTES as u64;
        let mut pos = 0usize;
        while pos < data.len() {
            let at = offset + pos as u64;
            let lba = at / bs;
            let within = (at % bs) as usize;
            let n = (BLOCK_BYTES - within).min(data.len() - pos);
            self.rmw_block(lba, within, &data[pos..pos + n])?;
            pos += n;
        }
        Ok(())
    }

    /// Read-modify-write of one block, optimistic: if the block changed between our read and our
    /// update (a concurrent write to another part of it), start again so neither write is lost.
    /// Bounded: after `RMW_OPTIMISTIC_MAX` lost races the block is read, patched and stored
    /// under the state lock, which no other write can overtake.
    fn rmw_block(&self, lba: u64, within: usize, patch: &[u8]) -> Result<()> {
        const RMW_OPTIMISTIC_MAX: usize = 8;
        for _ in 0..RMW_OPTIMISTIC_MAX {
            let (sources, gate) = self.lookup(lba, 1, false)?;
            let seen = match &sources[0] {
                Source::Bytes { entry, .. }
                | Source::Disk { entry }
                | Source::Decoded { entry, .. } => *entry,
                Source::Zeros | Source::Damaged => MapEntry::UNMAPPED,
            };
            let stored = self.fetch(&sources, true, true).pop().unwrap_or(Ok(None));
            drop(gate);
            let mut block = match (&sources[0], stored?) {
                (Source::Zeros, _) => vec![0u8; BLOCK_BYTES],
                (Source::Damaged, _) => return Err(Error::Corrupt { lba }),
                (_, Some(bytes)) => {
                    let mut block = vec![0u8; BLOCK_BYTES];
                    self.decode_block(lba, &seen, &bytes, &mut block)?;
                    block
                }
                (_, None) => return Err(Error::Corrupt { lba }),
            };
            block[within..within + patch.len()].copy_from_slice(patch);
            let mut p = self.prepare(&block);
            let mut st = self.lock_for_write();
            let now = st.map.get(lba)?;
            let unchanged = now == seen
                || (seen.state == BlockState::Unmapped && now.state != BlockState::Data);
            if !unchanged {
                continue;
            }
            if !Self::listed(&st, &p) {
                // Compressed with a dictionary retired meanwhile: compress again (rare).
                p = self.prepare(&block);
            }
            let cx = self.ctx();
            return st.put_block(&cx, lba, p);
        }
        self.rmw_block_locked(lba, within, patch)
    }

    /// The pessimistic read-modify-write: everything under the state lock (rare: only after
    /// repeated races on one block). Holding the lock also keeps any extent from being reused,
    /// so the storage read needs no reuse gate.
    fn rmw_block_locked(&self, lba: u64, within: usize, patch: &[u8]) -> Result<()> {
        let mut st = self.lock_for_write();
        let entry = st.map.get(lba)?;
        let mut block = match entry.state {
            BlockState::Unmapped | BlockState::Zero => vec![0u8; BLOCK_BYTES],
            BlockState::Corrupt => return Err(Error::Corrupt { lba }),
            BlockState::Data => {
                let (s, n) = (entry.offset as usize, entry.len as usize);
                let open = st.open.iter().find(|o| o.extent == entry.extent);
                let waiting = || self.outbox.find(entry.extent, entry.offset, n);
                let stored = match open.map(|o| o.buf[s..s + n].to_vec()).or_else(waiting) {
                    Some(bytes) => bytes,
                    None => {
                        let mut b = vec![0u8; n];
                        self.storage
                            .read_at(self.sb.extent_offset(entry.extent) + s as u64, &mut b)?;
                        b
                    }
                };
                let mut block = vec![0u8; BLOCK_BYTES];
                self.decode_block(lba, &entry, &stored, &mut block)?;
                block
            }
        };
        block[within..within + patch.len()].copy_from_slice(patch);
        let p = self.prepare(&block);
        let cx = self.ctx();
        st.put_block(&cx, lba, p)
    }

    /// Writes zeros over a range. Whole blocks become zero-state map entries (no data stored).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.range_op(offset, len, RecordKind::Zero)
    }

    /// Discards a range: whole blocks become holes; partial blocks at the edges are zeroed so the
    /// whole range reads back as zeros.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.range_op(offset, len, RecordKind::Trim)
    }

    fn range_op(&self, offset: u64, len: u64, kind: RecordKind) -> Result<()> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = BLOCK_BYTES as u64;
        let end = offset + len;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        if first_full >= end_full {
            return self.write_partial_range(offset, &vec![0u8; len as usize]);
        }
        // Whole blocks first: they free space the partial edges may need on a full volume.
        let wanted = {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            st.put_range(&cx, kind, first_full, end_full - first_full)?;
            st.ckpt_wanted
        };
        if offset < first_full * bs {
            self.write_partial_range(offset, &vec![0u8; (first_full * bs - offset) as usize])?;
        }
        if end > end_full * bs {
            self.write_partial_range(end_full * bs, &vec![0u8; (end - end_full * bs) as usize])?;
        }
        self.issue_sealed()?;
        if wanted {
            self.checkpoint_asked()?;
        }
        Ok(())
    }

    /// A write saw the allocation queue ask for its refill (`State::ckpt_wanted`): the
    /// background thread writes the checkpoint when there is one, while this write returns
    /// and later ones go on with the queue's last eighth (`buffer::refill_at`); a write that
    /// finds the queue that low waits for it (`wait_for_queue_refill`). On this machine's disk
    /// a sequential writer spent about half its time in these syncs (issue 13). A checkpoint
    /// is not what makes writes durable (a flush is), so the write need not wait for it; a
    /// failed sync there trips the fence and fails every later write and flush.
    fn checkpoint_asked(&self) -> Result<()> {
        if self.ckpt_in_background.load(Ordering::Relaxed) {
            self.ckpt_requested.store(true, Ordering::Release);
            return Ok(());
        }
        self.checkpoint_unlocked(true)
    }

    /// Whether writes leave their checkpoints to a background thread (handle.rs), which then
    /// takes them with [`Inner::take_checkpoint_request`].
    pub(crate) fn checkpoint_in_background(&self, on: bool) {
        self.ckpt_in_background.store(on, Ordering::Relaxed);
    }

    /// A checkpoint a write asked for since the last call (cleared by the call).
    pub(crate) fn take_checkpoint_request(&self) -> bool {
        self.ckpt_requested.swap(false, Ordering::AcqRel)
    }

    /// When the allocation queue has fewer extents left than a write of `bytes` may open and
    /// the checkpoint that refills it is in flight, waits for that checkpoint without the state
    /// lock (issue 9): otherwise the write runs the queue dry under the lock and waits there for
    /// the checkpoint's syncs (`State::alloc` joins it), and every read waits with it.
    fn wait_for_queue_refill(&self, bytes: usize) {
        let need = bytes.div_ceil(self.sb.extent_bytes as usize) + 1;
        let waiting = {
            let st = self.state.lock();
            st.queue.len() <= need && st.inflight.is_some()
        };
        if waiting {
            // The checkpoint in flight holds this from its snapshot to its commit.
            drop(self.ckpt_lock.lock());
        }
    }

    /// Foreground cleaning with the state lock released between its steps (issue 9). A write
    /// that may open extents down to the point where opening one cleans under the state lock
    /// (`State::space_short_for`, `cleaner::make_space`) cleans first, the way the background
    /// cleaner does: victims read and outputs issued without the lock, the checkpoint that
    /// frees them in three phases, until make_space's goal. Reads wait for neither; make_space
    /// stays for writers that outrun this. At most once per extent opened (`extents_opened`),
    /// like make_space: on a volume at its guaranteed overwrite fraction space is short all the
    /// time, and cleaning before every write would run passes that gain nothing. Writers that
    /// find one cleaning wait for it, without the state lock.
    fn clean_ahead(&self, bytes: usize) -> Result<()> {
        let need = bytes.div_ceil(self.sb.extent_bytes as usize) + 1;
        let due = |st: &State| {
            st.space_short_for(need)
                && st.extents_opened != self.clean_ahead_opened.load(Ordering::Relaxed)
        };
        if !due(&self.state.lock()) {
            return Ok(());
        }
        let _one = self.clean_ahead_lock.lock();
        if !due(&self.state.lock()) {
            // Another writer cleaned meanwhile.
            return Ok(());
        }
        let cx = self.ctx();
        let mut reclaimed = 0usize;
        for _ in 0..crate::cleaner::FOREGROUND_PASSES_MAX {
            let (short, refill) = {
                let st = self.state.lock();
                // A pass takes its outputs from the allocation queue and, finding it empty,
                // refills it with a checkpoint under the lock: refill it first, outside (from
                // the free list and the extents emptied since the last checkpoint).
                let low = st.queue.len() <= crate::buffer::refill_at(&self.sb);
                let refill = low
                    && (st.free.len() > 0
                        || reclaimed > 0
                        || st
                            .extents
                            .iter()
                            .any(|x| x.state == ExtentState::PendingFree));
                (st.space_short_after(reclaimed), refill)
            };
            if !short {
                break;
            }
            if refill {
                self.checkpoint_unlocked(false)?;
                reclaimed = 0;
            }
            let r = crate::cleaner::pass_unlocked(&|| self.lock_for_write(), &cx)?;
            self.issue_sealed()?;
            reclaimed += r.reclaimed;
            if !r.progressed() {
                break;
            }
        }
        // Victims emptied by the passes are free once a checkpoint no longer references them.
        if reclaimed > 0 {
            self.checkpoint_unlocked(false)?;
        }
        let opened = self.state.lock().extents_opened;
        self.clean_ahead_opened.store(opened, Ordering::Relaxed);
        Ok(())
    }

    /// Issues the segments sealed under the state lock to the storage (see writeback.rs). Called
    /// after the lock is released: the storage hand-off may wake an I/O thread or wait for room
    /// in the queue, and a thread holding the state lock must not wait meanwhile.
    fn issue_sealed(&self) -> Result<()> {
        self.outbox.issue_all(&self.storage)
    }

    /// Trains a dictionary once the sample is complete (off the state lock: it takes a fraction
    /// of a second) and installs it (dicts.rs).
    fn train_if_ready(&self) -> Result<()> {
        let Some(samples) = self.dicts.take_sample() else {
            return Ok(());
        };
        self.train_and_install(samples)
    }

    /// Trains a new dictionary from `samples` now, as if a drift check had asked for one and
    /// the sample were complete (tests: retraining as an operation of the model test).
    /// `Ok(true)`: a new dictionary was installed and serves new blocks.
    pub fn retrain_with(&self, samples: Vec<Vec<u8>>) -> Result<bool> {
        if !self.dicts.begin_forced() {
            return Ok(false);
        }
        let before = self.dicts.active().map(|d| d.id());
        self.train_and_install(samples)?;
        Ok(self.dicts.active().map(|d| d.id()) != before)
    }

    /// Trains on `samples` and installs the result if it pays; the caller holds the training
    /// turn (`Dicts::take_sample` or `Dicts::begin_forced`), released here.
    fn train_and_install(&self, samples: Vec<Vec<u8>>) -> Result<()> {
        // Train on seven groups in eight; the eighth (units of the volume's size) decides.
        let n = usize::from(self.unit_blocks);
        let (mut train, mut held) = (Vec::new(), Vec::new());
        for (i, g) in samples.chunks(n).enumerate() {
            if i % 8 == 7 && g.len() == n {
                held.push(g.concat());
            } else {
                train.extend(g.iter().cloned());
            }
        }
        drop(samples);
        let trained = crate::dicts::train(&self.sb, &train).and_then(|c| {
            crate::codec::dict::Dictionary::new(1, self.codec, 0, c.clone()).map(|d| (c, d))
        });
        let content = match trained {
            Ok((c, d)) => {
                // Adopted only if it saves >= 1 % of stored bytes on the held-out units (zstd's
                // trained entropy tables can lose to none: docs/savings.md).
                let stored = |with: Option<&crate::codec::dict::Dictionary>| -> usize {
                    held.iter()
                        .map(|u| match unit::compress_unit(self.codec, with, u) {
                            Ok(s) => s.bytes.len(),
                            Err(_) => u.len(),
                        })
                        .sum()
                };
                let (with, without) = (stored(Some(&d)), stored(None));
                if held.is_empty() || with * 100 > without * 99 {
                    self.dicts.done(true);
                    return Ok(());
                }
                c
            }
            // The sample did not train (too uniform, say): try again with the next one.
            Err(_) => {
                self.dicts.done(false);
                self.dicts.start_sampling_if_needed();
                return Ok(());
            }
        };
        let r = self.install_dictionary(content);
        match r {
            // Not installed: `no_room` stopped training until a retirement frees room.
            Ok(_) => {
                self.dicts.done(false);
                Ok(())
            }
            Err(e) => {
                self.dicts.done(true);
                Err(e)
            }
        }
    }

    /// Stores a trained dictionary and starts using it (the install order of dicts.rs).
    /// `Ok(false)`: the directory or the region is full; nothing was written.
    fn install_dictionary(&self, content: Vec<u8>) -> Result<bool> {
        self.check_writable()?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        // Strictly newer than every listed dictionary (which one is newest decides at open
        // which serves new blocks; ids alone do not, once they wrap around).
        let seq = st
            .dicts
            .iter()
            .map(|e| e.created_seq + 1)
            .max()
            .unwrap_or(0)
            .max(st.next_seq);
        let len = crate::codec::dict::HEADER_BYTES + content.len();
        let retiring: Vec<_> = st.retiring.iter().map(|&(e, _)| e).collect();
        let Some((slot, id, at)) = crate::dicts::place(&self.sb, &st.dicts, &retiring, len) else {
            // Training waits until a retirement frees room (`Dicts::resume`).
            self.dicts.no_room();
            return Ok(false);
        };
        let d = crate::codec::dict::Dictionary::new(id, self.codec, seq, content)?;
        let encoded = d.encode();
        crate::dicts::write_region(&*self.storage, &self.sb, at, &encoded)?;
        st.dicts[slot] = crate::format::DictEntry {
            id,
            codec: self.codec.id(),
            flags: 1,
            region_offset: at,
            len: encoded.len() as u32,
            crc: crc32c::crc32c(&encoded),
            created_seq: seq,
            live_blocks: 0,
        };
        self.sync_read_counters(&mut st);
        // Two checkpoints: both slots list it before any record names it.
        st.checkpoint(&cx)?;
        st.checkpoint(&cx)?;
        self.dicts.add(Arc::new(d), true);
        Ok(true)
    }

    /// Makes everything written so far durable.
    pub fn flush(&self) -> Result<()> {
        self.check_writable()?;
        let covered = {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            st.write_pending(&cx)?;
            st.counters.flushes += 1;
            st.next_seq - 1
        };
        // Sync outside the lock: reads and writes go on meanwhile. Segments written after this
        // point belong to later flushes; the ones above are covered by this sync. Only once it
        // succeeded do they count as durable (a failed sync stops the volume: fence.rs).
        self.issue_sealed()?;
        self.storage.sync()?;
        self.durable_seq.fetch_max(covered, Ordering::SeqCst);
        Ok(())
    }

    /// Writes a checkpoint now (bounded recovery; normally automatic).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        self.checkpoint_unlocked(false)
    }

    /// Writes a checkpoint in three phases (state.rs, `begin_checkpoint`): the snapshot under
    /// the state lock, its writes and syncs with the lock released (reads and writes go on),
    /// the commit under the lock again. A second caller waits for the first (`ckpt_lock`); a
    /// thread that must checkpoint with the state lock held waits for and commits the one in
    /// flight instead (`State::join_checkpoint`). `if_wanted`: only if one is still wanted
    /// (`State::ckpt_wanted`: several writers may have seen the wish; the first one does it).
    pub(crate) fn checkpoint_unlocked(&self, if_wanted: bool) -> Result<()> {
        let _one = self.ckpt_lock.lock();
        let cx = self.ctx();
        let io = {
            let mut st = self.lock_for_write();
            if if_wanted && !st.ckpt_wanted {
                return Ok(());
            }
            self.sync_read_counters(&mut st);
            st.begin_checkpoint(&cx)?
        };
        let r = io.run(&cx);
        let mut st = self.state.lock();
        st.finish_checkpoint(&cx, io.seq, r)
    }

    fn sync_read_counters(&self, st: &mut State) {
        st.counters.host_bytes_read = self.host_bytes_read.load(Ordering::Relaxed);
        st.counters.storage_bytes_read = self.storage_bytes_read.load(Ordering::Relaxed);
        st.counters.corrupt_reads = self.corrupt_reads.load(Ordering::Relaxed);
    }

    /// Allocation state of a byte range, as runs of (length, state).
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, AllocState)>> {
        self.check_range(offset, len)?;
        let mut runs: Vec<(u64, AllocState)> = Vec::new();
        if len == 0 {
            return Ok(runs);
        }
        let bs = BLOCK_BYTES as u64;
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let mut pos = offset;
        let mut st = self.state.lock();
        st.map.runs(first, last - first + 1, |state, blocks| {
            let s = match state {
                BlockState::Unmapped => AllocState::Hole,
                BlockState::Zero => AllocState::Zero,
                BlockState::Data | BlockState::Corrupt => AllocState::Data,
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
        let unmapped = self.sb.logical_blocks.saturating_sub(data + zero + damaged);
        let ratio = |blocks: u64, bytes: u64| {
            if bytes == 0 {
                0.0
            } else {
                (blocks * BLOCK_BYTES as u64) as f64 / bytes as f64
            }
        };
        let (in_units, unit_live) = (m.unit_blocks, m.unit_bytes);
        let eb = u64::from(self.sb.extent_bytes);
        let count = |s: ExtentState| st.extents.iter().filter(|x| x.state == s).count() as u64;
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
        Stats {
            logical_bytes: self.size_bytes(),
            codec: self.codec.to_string(),
            extent_bytes: self.sb.extent_bytes,
            data_area_bytes: u64::from(self.sb.extent_count) * eb,
            metadata_bytes: self.sb.metadata_bytes(),
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
                ((data - in_units) * BLOCK_BYTES as u64) as f64 / (live - unit_live) as f64
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
            extents_total: u64::from(self.sb.extent_count),
            extents_free: free,
            extents_in_use: in_use,
            extents_pending_free: pending,
            extents_open: open,
            dead_bytes: (in_use + pending) * eb - live,
            write_amplification: if c.host_bytes_written == 0 {
                0.0
            } else {
                written as f64 / c.host_bytes_written as f64
            },
            metadata_ram_bytes: st.map.ram_bytes()
                + (st.extents.len() * std::mem::size_of::<crate::state::ExtentInfo>()) as u64,
            map_cache: st.map.cache_stats(),
            clean_low_pct: self.clean_low_pct,
            clean_high_pct: self.clean_high_pct,
            recovery_records_replayed: st.replayed,
            format_version: self.sb.version,
            failed: self.storage.failure(),
            counters: c,
            dictionary: self.dicts.enabled,
            dictionary_setting: self.sb.settings & crate::format::SB_SETTING_DICTIONARY != 0,
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

    /// Verifies metadata and the checksum of every stored block. `progress(done, total)` is
    /// called now and then.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> CheckReport {
        self.verify(progress, None)
    }

    /// A check of a volume in use (`zbd scrub`): reads at most `rate` stored bytes per second
    /// (unbounded if `None`) so host I/O goes on, and records when it ended and what it found
    /// (`zbd stat`, persisted with the next checkpoint).
    pub fn scrub(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> CheckReport {
        let report = self.verify(progress, rate.filter(|&r| r > 0));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut st = self.state.lock();
        st.counters.last_scrub_unix = now;
        st.counters.last_scrub_damaged = report.damaged_blocks.len() as u64;
        report
    }

    fn verify(&self, progress: &dyn Fn(u64, u64), rate: Option<u64>) -> CheckReport {
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
            for (i, (a, b)) in fresh.iter().zip(st.extents.iter()).enumerate() {
                if a.live_bytes != b.live_bytes || a.live_blocks != b.live_blocks {
                    report
                        .metadata_problems
                        .push(format!("extent {i}: live accounting differs from the map"));
                }
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
        let (damaged_pages, repaired_pages) = {
            let st = self.state.lock();
            (st.map.damaged_pages(), st.map.repaired_pages())
        };
        for p in &damaged_pages {
            report.metadata_problems.push(format!(
                "map page {p} is damaged; its blocks are unreadable"
            ));
        }
        report
            .metadata_problems
            .extend(self.open_problems.iter().cloned());
        report.repaired.extend(self.open_repaired.iter().cloned());
        report.repaired.extend(
            repaired_pages
                .iter()
                .map(|p| format!("map page {p}: one copy is damaged, the other is intact")),
        );
        self.check_map_copies(&mut report, &damaged_pages);
        for copy in 0..2u64 {
            let mut b = vec![0u8; SUPERBLOCK_BYTES];
            let ok = self
                .storage
                .read_at(copy * SUPERBLOCK_BYTES as u64, &mut b)
                .is_ok()
                && Superblock::decode(&b).is_ok_and(|sb| sb == self.sb);
            if !ok {
                report.metadata_problems.push(format!(
                    "superblock copy {} is damaged",
                    ["A", "B"][copy as usize]
                ));
            }
        }
        let total = self.sb.logical_blocks;
        const CHUNK: u64 = 256;
        let started = std::time::Instant::now();
        let mut bytes_read = 0u64;
        let mut lba = 0;
        let mut scratch = Vec::new();
        while lba < total {
            let n = CHUNK.min(total - lba);
            let (mut mapped, mut bytes) = (0u64, 0u64);
            let counted = self.state.lock().map.for_each_data_in(lba, n, |_, e| {
                mapped += 1;
                bytes += u64::from(e.len);
            });
            if let Err(e) = counted {
                report.metadata_problems.push(format!("map: {e}"));
                break;
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
                        if r.is_err() {
                            report.damaged_blocks.push(lba + i as u64);
                        }
                    }
                }
                Err(e) => {
                    report.metadata_problems.push(format!("map: {e}"));
                    break;
                }
            }
            report.blocks_checked += mapped;
            lba += n;
            progress(lba, total);
        }
        report
    }

    /// Reads every copy of every current map page: a damaged copy is reported and, on a writable
    /// volume, the page is rewritten (both copies, into the other slot) by the next checkpoint.
    fn check_map_copies(&self, report: &mut CheckReport, damaged_pages: &[u32]) {
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

    /// Makes `close` a no-op (see `Volume::abandon`).
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether free extents are below the low watermark (cheap; called after writes).
    pub(crate) fn below_low_watermark(&self) -> bool {
        let st = self.state.lock();
        st.free_now() * 100 < self.clean_low_pct as usize * st.extents.len()
    }

    /// One background cleaning round: passes until free extents reach the high watermark or no
    /// pass makes progress. Each pass takes the state lock anew, so host I/O interleaves.
    pub(crate) fn background_round(&self) -> Result<()> {
        if self.read_only || self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        {
            let st = self.state.lock();
            let total = st.extents.len();
            let idle = self.clean_idle_seq.load(Ordering::Relaxed) == st.next_seq;
            if idle || st.free_now() * 100 >= self.clean_low_pct as usize * total {
                return Ok(());
            }
        }
        // Victims turn into free extents at a checkpoint (three syncs): batch a few passes.
        const CHECKPOINT_AFTER_RECLAIMED: usize = 32;
        let mut pending = 0usize;
        loop {
            let cx = self.ctx();
            // Victims are read without the state lock; it is taken to choose and to commit.
            let r = crate::cleaner::pass_unlocked(&|| self.lock_for_write(), &cx)?;
            let (done, checkpoint, wanted) = {
                let st = self.lock_for_write();
                pending += r.reclaimed;
                let total = st.extents.len();
                let done = !r.progressed()
                    || (st.free_now() + pending) * 100 >= self.clean_high_pct as usize * total;
                let checkpoint = pending > 0
                    && (done
                        || pending >= CHECKPOINT_AFTER_RECLAIMED
                        || st.free_now() <= st.buffer.reserve);
                if !r.progressed() {
                    self.clean_idle_seq.store(st.next_seq, Ordering::Relaxed);
                }
                (done, checkpoint, st.ckpt_wanted)
            };
            // The outputs went to the outbox under the lock: issue them now.
            self.issue_sealed()?;
            // Outside the state lock: host I/O goes on during its syncs. Also when the passes'
            // outputs brought the allocation queue low (`State::alloc`).
            if checkpoint {
                self.checkpoint_unlocked(false)?;
                pending = 0;
            } else if wanted {
                self.checkpoint_unlocked(true)?;
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Offline compaction: cleans every extent with dead space, least live first, until no pass
    /// frees anything. `progress(done, total)` counts candidate extents.
    pub(crate) fn compact(
        &self,
        progress: &dyn Fn(u64, u64),
    ) -> Result<crate::cleaner::PassResult> {
        self.check_writable()?;
        let mut total = crate::cleaner::PassResult::default();
        let mut st = self.state.lock();
        let cx = self.ctx();
        let n = st.open.len();
        for i in (0..n).rev() {
            st.close_open(&cx, i)?;
        }
        st.checkpoint(&cx)?;
        let candidates = |st: &State| {
            st.extents
                .iter()
                .filter(|x| x.state == ExtentState::Closed)
                .count() as u64
        };
        let first = candidates(&st);
        loop {
            let r = crate::cleaner::pass(&mut st, &cx, crate::cleaner::Mode::Compact)?;
            if r.reclaimed > 0 {
                st.checkpoint(&cx)?;
            }
            total.victims += r.victims;
            total.reclaimed += r.reclaimed;
            total.outputs += r.outputs;
            total.bytes_moved += r.bytes_moved;
            progress(first.saturating_sub(candidates(&st)).min(first), first);
            if !r.progressed() {
                break;
            }
        }
        // Then the blocks of older dictionaries move to the current one, batch by batch (each
        // batch's victims are freed by the checkpoint after it), so those can be retired. One
        // map walk finds them; a batch that does not fit the free extents is skipped.
        let todo = crate::cleaner::migrate_candidates(&mut st, &cx)?;
        for batch in todo.chunks(crate::cleaner::MIGRATE_BATCH) {
            let r = crate::cleaner::migrate(&mut st, &cx, batch.to_vec())?;
            if r.victims == 0 {
                continue;
            }
            st.checkpoint(&cx)?;
            total.victims += r.victims;
            total.reclaimed += r.reclaimed;
            total.outputs += r.outputs;
            total.bytes_moved += r.bytes_moved;
        }
        progress(first, first);
        drop(st);
        self.issue_sealed()?;
        Ok(total)
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
        let n = st.open.len();
        for i in (0..n).rev() {
            st.close_open(&cx, i)?;
        }
        self.sync_read_counters(&mut st);
        st.checkpoint(&cx)
    }
}

/// Applies roll-forward records to the map, in write-sequence order.
fn apply_replay(st: &mut State, sb: &Superblock, replay: &[recovery::Replayed]) -> Result<()> {
    let blocks = sb.logical_blocks;
    for r in replay {
        let rec = &r.record;
        let end = rec.lba.saturating_add(u64::from(rec.count));
        if end > blocks {
            continue;
        }
        match rec.kind {
            RecordKind::Data if r.damaged => {
                // The cleaner copies stored bytes verbatim: if the block still maps to bytes
                // with the same checksum (the victim's copy, kept until a checkpoint), those are
                // the same data. Otherwise the newest version is lost: the block reads as an
                // error, never as its older version.
                let now = st.map.get(rec.lba)?;
                let same = now.state == BlockState::Data
                    && now.crc == rec.crc
                    && u32::from(now.len) == rec.len
                    && now.codec == rec.codec
                    && now.unit_index == rec.unit_index
                    && u16::from(now.unit_blocks) == rec.unit_blocks
                    && u16::from(now.dict) == rec.dict;
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
                };
                st.set_entry(rec.lba, entry)?;
            }
            RecordKind::Zero => {
                for l in rec.lba..end {
                    st.set_entry(l, MapEntry::ZERO)?;
                }
            }
            RecordKind::Trim => {
                for l in rec.lba..end {
                    st.set_entry(l, MapEntry::UNMAPPED)?;
                }
            }
        }
        st.next_seq = st.next_seq.max(rec.seq + 1);
    }
    st.replayed = replay.len() as u64;
    // Extents that lost their last live block during replay are free after the recovery checkpoint.
    for x in st.extents.iter_mut() {
        if x.state == ExtentState::PendingFree {
            x.state = ExtentState::Free;
        }
    }
    Ok(())
}

#[cfg(test)]
mod buffer_tests {
    use super::*;
    use crate::format::RecordKind;
    use crate::sim::SimStorage;

    fn raw_block(n: usize) -> Prepared {
        Prepared::Data {
            codec: codec::id::RAW,
            bytes: vec![0x5a; n],
            crc: 0,
            blocks: 1,
            dict: 0,
        }
    }

    /// The extent buffer evicts the least recently appended extent. Here extent X took a trim
    /// record after Y took its last block: Y goes, X stays (`last_used` of a data append and of
    /// a range record must count alike, or the two tie and the first in `open` goes).
    #[test]
    fn lru_eviction_keeps_the_extent_a_range_record_went_to_last() {
        let opts = CreateOptions {
            extent_bytes: 16 * 1024,
            codec: Codec::None,
            unit_bytes: Some(4096),
            dictionary: false,
            ..CreateOptions::new(4 << 20)
        };
        let sb = plan(&opts).expect("plan");
        let open_opts = OpenOptions {
            background_cleaner: false,
            ..OpenOptions::default()
        };
        let vol = Inner::create_with(
            Box::new(SimStorage::new(sb.total_bytes() as usize)),
            &opts,
            open_opts,
        )
        .expect("create");
        let cx = vol.ctx();
        let mut st = vol.state.lock();
        st.buffer.max_open = 2;
        // X (open[0]) is filled most of the way; Y (open[1]) takes a block X has no room for.
        st.put_block(&cx, 0, raw_block(12_000)).expect("put X");
        st.put_block(&cx, 1, raw_block(4_500)).expect("put Y");
        assert_eq!(st.open.len(), 2);
        let (x, y) = (st.open[0].extent, st.open[1].extent);
        // Best fit puts the trim record in X, the fuller: X is now the most recently used.
        st.put_range(&cx, RecordKind::Trim, 100, 1).expect("trim");
        assert_eq!(
            st.open[0].records.last().map(|r| r.kind),
            Some(RecordKind::Trim)
        );
        // Fits neither: the least recently used, Y, is closed for it.
        st.put_block(&cx, 2, raw_block(12_000)).expect("put");
        let open: Vec<u32> = st.open.iter().map(|o| o.extent).collect();
        assert!(
            open.contains(&x) && !open.contains(&y),
            "evicted the extent used last: open {open:?}, x {x}, y {y}"
        );
    }
}
