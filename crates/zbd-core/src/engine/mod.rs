//! The engine: the volume proper (`Inner`), split by what it does: `open` (create, open,
//! recovery, close), `write`, `read`, `flush` (flush and checkpoints), `clean` (running the
//! cleaner), `train` (dictionaries), `verify` (stats, check, scrub). The state behind the lock
//! and its parts are in `state/`; [`crate::Volume`] (volume.rs) is the public handle.

pub mod bench;
mod clean;
mod dedup;
mod devices;
pub use crate::stats::DeviceInfo;
mod flush;
mod open;
mod read;
mod train;
pub use train::Retrained;
mod verify;
mod write;

pub use dedup::DedupReport;

use crate::backend::fence::Fenced;
use crate::backend::queued::IoOptions;
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::format::{MapEntry, SegmentForm, Superblock, BLOCK_BYTES};
use crate::map::MAP_CACHE_BYTES_DEFAULT;
use crate::readcache::ReadCache;
use crate::state::{Ctx, State};
use crate::writeback::Outbox;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default extent buffer size (paper: 16 MiB).
pub const BUFFER_BYTES_DEFAULT: usize = 16 << 20;
/// Default aging timeout of an open extent.
pub const AGING_DEFAULT: Duration = Duration::from_secs(30);
/// Default budget of the read cache.
pub const READ_CACHE_BYTES_DEFAULT: usize = 32 << 20;
/// Default RAM budget of the inline dedup index: measured, 1 MiB finds 98 % of the duplicates
/// of 6.5 GiB of /usr and 0.42 B per block finds 98 % of a clone set's (docs/benchmarks.md),
/// so 64 MiB covers ~150 M blocks (~600 GiB written) at that density before it samples.
pub const DEDUP_INDEX_BYTES_DEFAULT: u64 = 64 << 20;
/// Requests with at least this many units (or, on reads, runs of blocks decoded together) are
/// compressed / decompressed in parallel (par.rs).
const PARALLEL_ITEMS_MIN: usize = 2;
/// Reads of at least this many blocks (128 KiB, the size of the kernel's readahead requests)
/// are streaming: they use the read cache but do not fill it. A sequential scan would evict
/// what random reads come back for, and copying its bytes into the cache was a measurable part
/// of a sequential read's CPU time (a third of 128 KiB reads' on one core: issue 13).
const STREAMING_BLOCKS_MIN: u64 = 32;
/// Largest gap between two runs of one read request that are still read as one device request
/// (engine/read.rs, `fetch`): on a disk that charges ~2 ms per request, 32 KiB more costs ~0.3
/// ms at 100 MiB/s; an extent's tail and the next one's segment header fit in it.
const READ_GAP_MAX: u64 = 32 << 10;
/// Largest device request that joined runs make (see `READ_GAP_MAX`).
const READ_JOIN_BYTES_MAX: u64 = 256 << 10;

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
    /// How storage writes are issued (queued to I/O threads by default; see `backend/queued.rs`).
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
    /// Space reserve (docs/design.md, "Thin provisioning"): bytes of free extents host writes
    /// leave untouched, so that a filesystem that met ENOSPC can still replay its journal and
    /// be repaired. Rounded up to whole extents, at most half the data area; 0 (the library's
    /// default): host writes may take all but the cleaner's last extent.
    pub space_reserve_bytes: u64,
    /// Deduplicate inline (design.md, "Deduplication"): `None`, as set at create time
    /// (superblock); needs a volume with metadata pages (format bits 10 and 11).
    pub dedup: Option<bool>,
    /// RAM budget of the dedup index (fixed for the open; at least 64 KiB). Past it the index
    /// samples and forgets: dedup finds less, writes never fail or wait for it.
    pub dedup_index_bytes: u64,
    /// Fingerprint bits the dedup index keys blocks by (128). Tests keep a few, so that
    /// different blocks collide in the index and the byte comparison must tell them apart.
    #[doc(hidden)]
    pub dedup_fingerprint_bits: u32,
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
            space_reserve_bytes: 0,
            dedup: None,
            dedup_index_bytes: DEDUP_INDEX_BYTES_DEFAULT,
            dedup_fingerprint_bits: 128,
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
    /// Damaged blocks this check put into the damaged state (a writable volume): they read as
    /// errors without touching the medium until overwritten or trimmed.
    #[serde(default)]
    pub marked_damaged: u64,
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
    /// Log segments are padded to this (see `Ctx::write_align`).
    write_align: usize,
    /// How this open writes segments (see `Ctx::form`).
    seg_form: SegmentForm,
    closed: AtomicBool,
    host_bytes_read: AtomicU64,
    storage_bytes_read: AtomicU64,
    corrupt_reads: AtomicU64,
    /// Damaged block reads since this open (the log's rate limit; `corrupt_reads` is the total).
    damaged_reads_since_open: AtomicU64,
    /// When a writer last logged that it cleans in the foreground (seconds since
    /// `opened_at` + 1; 0: never).
    behind_logged_at: AtomicU64,
    opened_at: std::time::Instant,
    /// Readers waiting for the state lock; writers and the cleaner let them go first.
    readers_waiting: AtomicUsize,
    /// Held by a checkpoint written outside the state lock, from snapshot to commit (taken
    /// before the state lock): such checkpoints run one at a time.
    ckpt_lock: Mutex<()>,
    /// Held by whoever runs cleaning passes outside the state lock: a writer cleaning before
    /// space runs out (`clean_ahead`) or at "space short" (`space_short_round`), and on bit-10
    /// volumes each of the background cleaner's passes. One at a time; the others wait here,
    /// without the state lock, so a writer at "space short" waits for the pass in flight
    /// before its own round.
    clean_ahead_lock: Mutex<()>,
    /// `State::extents_opened` when cleaning ahead last ended (`clean_ahead`).
    clean_ahead_opened: AtomicU64,
    /// A background thread (volume.rs) writes the checkpoints that writes ask for, so a write
    /// does not wait for the checkpoint's syncs; without one, the write writes it.
    ckpt_in_background: AtomicBool,
    /// A write asked for a checkpoint that the background thread has not taken yet.
    ckpt_requested: AtomicBool,
    /// The owner is closing the volume (`Volume::stop_rollbacks`): a rollback emptying its
    /// device stops at its next chunk; its durable mark makes the next open finish it.
    rollbacks_stopped: AtomicBool,
    /// Cleaner watermarks, % of extents free.
    pub(crate) clean_low_pct: u8,
    pub(crate) clean_high_pct: u8,
    /// Write sequence at the last cleaning attempt that made no progress (avoid spinning).
    clean_idle_seq: AtomicU64,
    /// Trained dictionaries (dicts.rs).
    dicts: crate::dicts::Dicts,
    /// Held by each device operation (create, delete, snapshot, clone, rollback, flatten)
    /// for its whole run, outside the state lock: their checks and their checkpointed
    /// steps are not atomic together, so two of them (a rollback and its retry, a delete of
    /// a rollback's target) must not interleave.
    device_ops: Mutex<()>,
    /// The inline dedup index, when this open deduplicates (engine/dedup/inline.rs).
    dedup: Option<dedup::InlineDedup>,
}

/// Extents host writes leave to the cleaner: 2 % of the data area, 4..64.
fn cleaner_reserve(extent_count: u32) -> usize {
    (extent_count as usize / 50)
        .clamp(4, 64)
        .min(extent_count as usize / 4)
}

/// Extents of a space reserve of `bytes`: whole extents, at most half of the `data_extents`
/// data may use.
fn space_reserve_extents(bytes: u64, sb: &Superblock, data_extents: u32) -> usize {
    let extents = bytes.div_ceil(u64::from(sb.extent_bytes));
    extents.min(u64::from(data_extents) / 2) as usize
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
    pub(super) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            storage: &*self.storage,
            sb: &self.sb,
            gate: &self.gate,
            durable_seq: &self.durable_seq,
            write_align: self.write_align,
            form: self.seg_form,
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
    pub(super) fn lock_for_write(&self) -> parking_lot::MutexGuard<'_, State> {
        const YIELDS_MAX: usize = 32;
        for _ in 0..YIELDS_MAX {
            if self.readers_waiting.load(Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::yield_now();
        }
        self.state.lock()
    }

    /// Checks a byte range of `device` (to change it when `write`: a snapshot is read-only);
    /// returns the block key of the device's first block (`format::block_key`), from which
    /// the request's blocks are named.
    pub(super) fn check_range(
        &self,
        device: u32,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<u64> {
        let (size, writable) = self.device_size(device)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { offset, len, size });
        }
        if write && !writable {
            return Err(Error::ReadOnly);
        }
        Ok(crate::format::block_key(device, 0))
    }

    pub(super) fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.storage.check()
    }
}

#[cfg(test)]
mod tests;
