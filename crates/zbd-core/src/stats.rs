//! Statistics a user reads at a glance (`zbd stat`), and the lifetime counters behind them.

use crate::format::COUNTERS;
use serde::Serialize;

/// Lifetime counters, persisted in every checkpoint (positions are part of the format).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Bytes the host asked to write (write, partial writes count their length).
    pub host_bytes_written: u64,
    /// Bytes the host read.
    pub host_bytes_read: u64,
    /// Bytes of segments written to extents for host writes (payload, headers, records, padding).
    pub data_bytes_written: u64,
    /// Bytes of map pages and checkpoints written.
    pub metadata_bytes_written: u64,
    /// Bytes written by the cleaner.
    pub cleaner_bytes_written: u64,
    /// Bytes read from storage for host reads.
    pub storage_bytes_read: u64,
    /// Reads that failed their checksum.
    pub corrupt_reads: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Flushes completed.
    pub flushes: u64,
    /// Cleaner passes.
    pub cleaner_runs: u64,
    /// Extents the cleaner freed.
    pub extents_reclaimed: u64,
    /// Bytes of live blocks the cleaner moved.
    pub cleaner_bytes_moved: u64,
    /// When the last complete scrub (or check of the served volume) ended, Unix seconds; 0 never.
    pub last_scrub_unix: u64,
    /// Damaged blocks the last complete scrub found.
    pub last_scrub_damaged: u64,
}

impl Counters {
    /// Packs into the checkpoint's counter array.
    pub fn to_array(self) -> [u64; COUNTERS] {
        let mut a = [0u64; COUNTERS];
        a[0] = self.host_bytes_written;
        a[1] = self.host_bytes_read;
        a[2] = self.data_bytes_written;
        a[3] = self.metadata_bytes_written;
        a[4] = self.cleaner_bytes_written;
        a[5] = self.storage_bytes_read;
        a[6] = self.corrupt_reads;
        a[7] = self.checkpoints;
        a[8] = self.flushes;
        a[9] = self.cleaner_runs;
        a[10] = self.extents_reclaimed;
        a[11] = self.cleaner_bytes_moved;
        a[12] = self.last_scrub_unix;
        a[13] = self.last_scrub_damaged;
        a
    }

    /// Unpacks from a checkpoint.
    pub fn from_array(a: &[u64; COUNTERS]) -> Self {
        Counters {
            host_bytes_written: a[0],
            host_bytes_read: a[1],
            data_bytes_written: a[2],
            metadata_bytes_written: a[3],
            cleaner_bytes_written: a[4],
            storage_bytes_read: a[5],
            corrupt_reads: a[6],
            checkpoints: a[7],
            flushes: a[8],
            cleaner_runs: a[9],
            extents_reclaimed: a[10],
            cleaner_bytes_moved: a[11],
            last_scrub_unix: a[12],
            last_scrub_damaged: a[13],
        }
    }
}

/// A snapshot of a volume's state and lifetime counters.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    /// Logical size in bytes.
    pub logical_bytes: u64,
    /// Codec used for new writes.
    pub codec: String,
    /// Extent size.
    pub extent_bytes: u32,
    /// Data area size in bytes.
    pub data_area_bytes: u64,
    /// Metadata area size in bytes (superblocks, checkpoints, map).
    pub metadata_bytes: u64,
    /// The part of it in extents of the data area (bit 10: create's stock and what carving
    /// added since, for the map pages of every device, the SBT and the PCT), which the data
    /// area's "used" counts with live data.
    pub metadata_extent_bytes: u64,
    /// The part of `metadata_extent_bytes` in pairs no map page uses (after snapshot deletes,
    /// say): later map pages take them; whole extent pairs beyond the carver's stock go back
    /// to data at the next checkpoints.
    pub metadata_extent_free_bytes: u64,
    /// Blocks holding stored data.
    pub data_blocks: u64,
    /// Blocks in the zero state (no data stored).
    pub zero_blocks: u64,
    /// Blocks never written or trimmed.
    pub unmapped_blocks: u64,
    /// Data blocks stored raw (did not compress enough).
    pub raw_blocks: u64,
    /// Compression unit size of new writes (4096: every block on its own).
    pub unit_bytes: u32,
    /// Data blocks stored in multi-block compression units.
    pub unit_blocks: u64,
    /// Logical bytes of the blocks in units / their shares of their units' stored bytes (0: none).
    pub unit_ratio: f64,
    /// Logical bytes of single blocks / their stored bytes (0: none).
    pub single_ratio: f64,
    /// Blocks whose map page is damaged.
    pub damaged_blocks: u64,
    /// Logical bytes in use: data and zero blocks.
    pub logical_bytes_in_use: u64,
    /// Bytes of stored (compressed or raw) block data that is live.
    pub physical_bytes_live: u64,
    /// Bytes of extents in use (live, partly dead, open).
    pub physical_bytes_allocated: u64,
    /// 100 * (1 - physical live / logical in use).
    pub savings_pct: f64,
    /// logical in use / physical live: compression and deduplication together.
    pub compression_ratio: f64,
    /// Blocks holding data / blocks stored for them (1.0 without shared items): what
    /// deduplication saves; `compression_ratio / dedup_ratio` is what compression does alone.
    pub dedup_ratio: f64,
    /// Shared items (format bit 12) and the blocks that name them.
    pub shared: crate::map::SharedTotals,
    /// Extents in the data area.
    pub extents_total: u64,
    /// Extents free (including those queued for allocation).
    pub extents_free: u64,
    /// Extents holding live data or open in the extent buffer.
    pub extents_in_use: u64,
    /// Extents without live data waiting for a checkpoint before reuse.
    pub extents_pending_free: u64,
    /// Extents open in the extent buffer.
    pub extents_open: u64,
    /// Space reserve of this open, bytes (`OpenOptions::space_reserve_bytes` in whole extents):
    /// free extents host writes leave for a filesystem's repair.
    pub reserve_bytes: u64,
    /// Whether this open lent the reserve to host writes (it opened at its reserve: full).
    pub reserve_lent: bool,
    /// Bytes of the data area host writes may fill: less the space reserve (held) and the
    /// cleaner's last extent. Live data and map extents reach it at ENOSPC.
    pub writable_bytes: u64,
    /// Bytes of extents that are in use but hold no live data (cleaner's work).
    pub dead_bytes: u64,
    /// Times a write cleaned with the state lock held, every other request waiting (v2
    /// volumes, when cleaning ahead fell behind), in this open.
    pub locked_cleanings: u64,
    /// Times a write found space short and cleaned with the lock released before placing
    /// again (volumes with metadata pages, which never clean under the lock), in this open.
    pub space_short_rounds: u64,
    /// (data + metadata + cleaner bytes written) / host bytes written.
    pub write_amplification: f64,
    /// RAM used by the map and extent table, bytes.
    pub metadata_ram_bytes: u64,
    /// Map page cache: hits, pages read, residency (the map is paged, see `map/`).
    pub map_cache: crate::map::MapCacheStats,
    /// Read cache of stored bytes and decoded units: hits, misses, size.
    pub read_cache: crate::readcache::ReadCacheStats,
    /// Cleaner low watermark in force (% free extents).
    pub clean_low_pct: u8,
    /// Cleaner high watermark in force.
    pub clean_high_pct: u8,
    /// Records replayed by the last recovery.
    pub recovery_records_replayed: u64,
    /// On-disk format version of the volume.
    pub format_version: u32,
    /// Largest logical size `zbd grow` can reach (the room the map region was laid out for).
    pub max_logical_bytes: u64,
    /// Largest data area `zbd grow` can reach (the room of the extent-table region).
    pub max_data_area_bytes: u64,
    /// Set when the volume stopped writing after a failed write or sync (docs/design.md,
    /// "Failed syncs"): writes fail with EIO until it is reopened; reads go on.
    pub failed: Option<String>,
    /// Lifetime counters.
    pub counters: Counters,
    /// Whether new blocks train and use dictionaries (in this open).
    pub dictionary: bool,
    /// The volume's setting (`zbd create --dict`), what opens do unless told otherwise.
    pub dictionary_setting: bool,
    /// Dictionaries in the volume's directory.
    pub dictionaries: Vec<DictStat>,
    /// Whether the dictionary and unit-size figures below are known (a checkpoint written by
    /// a build that did not keep them, opened read-only: not known).
    pub savings_known: bool,
    /// Data blocks stored with a trained dictionary.
    pub dict_blocks: u64,
    /// Logical bytes of those blocks / their stored bytes (0: none).
    pub dict_ratio: f64,
    /// Compressed data blocks stored without a dictionary (raw blocks not counted).
    pub nodict_blocks: u64,
    /// Logical bytes of those blocks / their stored bytes (0: none).
    pub nodict_ratio: f64,
    /// Blocks in compression units by unit size class.
    pub units_by_size: Vec<UnitSizeStat>,
    /// Whether this open deduplicates inline, and what its index did (`None`: off).
    pub dedup_index: Option<DedupIndexStat>,
    /// The volume's setting (`zbd create --dedup`), what opens do unless told otherwise.
    pub dedup_setting: bool,
    /// The volume's block devices (`zbd device`), the default one first.
    pub devices: Vec<DeviceInfo>,
}

/// The inline dedup index of an open (`Stats::dedup`).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DedupIndexStat {
    /// Its RAM budget, fixed for the open (`--dedup-index`).
    pub budget_bytes: u64,
    /// Blocks written whose bytes equalled a stored block's, and became references, over
    /// blocks looked up (this open).
    pub hit_rate: f64,
    /// Lookups, candidates, comparisons, hooks and sampling level.
    #[serde(flatten)]
    pub index: crate::dedup::IndexStats,
}

/// How full the data area is, cheaply (`Volume::space`: no walk of the extents): what a
/// server looks at often (warning threshold, `zbd serve --warn-used`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Space {
    /// Stored bytes of live blocks (`Stats::physical_bytes_live`).
    pub live_bytes: u64,
    /// Size of the data area.
    pub data_area_bytes: u64,
    /// Extents of the data area carved for map pages (`Stats::metadata_extent_bytes`).
    pub metadata_extent_bytes: u64,
    /// Extents free now (queued or on the free list).
    pub extents_free: u64,
    /// The space reserve of this open, bytes.
    pub reserve_bytes: u64,
    /// Whether it is lent to host writes.
    pub reserve_lent: bool,
    /// Bytes of the data area host writes may fill (`Stats::writable_bytes`).
    pub writable_bytes: u64,
}

/// Blocks stored in units of one size class (`zbd stat`).
#[derive(Clone, Debug, Serialize)]
pub struct UnitSizeStat {
    /// Largest unit of the class in bytes (units of 2, 3..4, 5..16 blocks: 8K, 16K, 64K).
    pub max_unit_bytes: u32,
    /// Blocks in such units.
    pub blocks: u64,
    /// Their logical bytes / their shares of the units' stored bytes (0: none).
    pub ratio: f64,
}

/// One dictionary of the volume (`zbd stat`).
#[derive(Clone, Debug, Serialize)]
pub struct DictStat {
    /// Id blocks name it by.
    pub id: u16,
    /// Stored (encoded) bytes of each copy.
    pub bytes: u32,
    /// Write sequence when it was trained.
    pub trained_seq: u64,
    /// Whether it was read intact (false: both copies damaged, its blocks read as errors).
    pub loaded: bool,
    /// Whether new blocks use it.
    pub active: bool,
    /// Live blocks that name it (`None`: not known, see `Stats::savings_known`); a dictionary
    /// that no live block names and new blocks do not use is retired by the next checkpoint.
    pub live_blocks: Option<u64>,
}

/// One device as `Volume::devices` lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Id (1 is the default device; ids are never reused).
    pub id: u32,
    /// Name: the NBD export name (the default device is also the default export).
    pub name: String,
    /// "default", "snapshot", "clone", "writable", "deleting" (a delete that a crash or an
    /// error stopped: deleting it again finishes) or "rolling back" (a rollback under way, or
    /// stopped part way by a crash or an error: it may read part emptied until rolling back
    /// again finishes; `zbd serve` does that before it serves).
    pub kind: &'static str,
    /// What it was made as: `kind`, but never "deleting" or "rolling back" (a snapshot being
    /// deleted is still listed among the snapshots, as such).
    pub made_as: &'static str,
    /// Logical size in bytes.
    pub size_bytes: u64,
    /// Creation time, Unix seconds (0 for the default device).
    pub created_at: u64,
    /// Whether it takes writes.
    pub writable: bool,
    /// The device it was made from (a snapshot's origin, a clone's snapshot; 0: none).
    pub parent: u32,
}

impl DeviceInfo {
    pub(crate) fn of(row: &crate::format::DeviceRow, rolling_back: bool) -> DeviceInfo {
        let deleting = row.flags & crate::format::ROW_FLAG_DELETING != 0;
        let made_as = match row.kind {
            crate::format::DeviceKind::Default => "default",
            crate::format::DeviceKind::Snapshot => "snapshot",
            crate::format::DeviceKind::Clone => "clone",
            crate::format::DeviceKind::Other => "writable",
        };
        DeviceInfo {
            id: row.id,
            name: row.name.clone(),
            kind: if deleting {
                "deleting"
            } else if rolling_back {
                "rolling back"
            } else {
                made_as
            },
            made_as,
            size_bytes: row.blocks * crate::format::BLOCK_BYTES as u64,
            created_at: row.created_at,
            writable: row.flags & 1 == 0
                && !deleting
                && row.kind != crate::format::DeviceKind::Snapshot,
            // A flattened clone lists no origin (`zbd flatten`).
            parent: if row.flags & crate::format::ROW_FLAG_FLATTENED != 0 {
                0
            } else {
                row.parent
            },
        }
    }
}
