//! On-disk structures (docs/format.md is the specification; keep both in step).
//! Pure encode/decode: no I/O here. Every decoder takes `&[u8]`, returns a `Result` and never
//! panics, whatever the input (they are fuzzed).
//!
//! Three versions are read and written: 1 (the first format), 2 (two copies of checkpoints and
//! map pages, segments with a trailing copy of their header and record table and the durable
//! write-sequence watermark, multi-block compression units behind an incompatible checkpoint
//! flag, room reserved for an extent table, dictionaries, per-page summaries and volume
//! counters) and 3 (v2's layout; new items carry seeded checksums, `item.rs`; the container
//! that shared blocks will extend by flags). A volume keeps the version it was created or
//! upgraded to; `Superblock::version` selects the rules.

mod checkpoint;
mod item;
mod map_page;
mod pages;
mod segment;
mod superblock;
#[cfg(test)]
mod tests;

pub use checkpoint::*;
pub use item::*;
pub use map_page::*;
pub use pages::*;
pub use segment::*;
pub use superblock::*;

use crate::error::{Error, Result};

/// Logical block size: the unit of mapping and compression.
pub const BLOCK_BYTES: usize = 4096;
/// Sector size: segments start on sector boundaries so a torn tail never damages durable bytes.
pub const SECTOR_BYTES: usize = 512;
/// Format version of new volumes (docs/format.md, "Version changes").
pub const FORMAT_VERSION: u32 = 3;
/// First format version whose new items carry seeded checksums (`item.rs`).
pub const SEEDED_CHECKSUMS_VERSION: u32 = 3;
/// Oldest format version this build still opens (and writes, keeping its rules).
pub const FORMAT_VERSION_MIN: u32 = 1;
/// Bytes per superblock copy; two copies at offsets 0 and 4096.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Segment header size (the v2 footer has the same size).
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// Block record size (v1, v2, and v3 without bit 11).
pub const RECORD_BYTES: usize = 40;
/// Block record size of bit 11's segments (header flag [`SEG_FLAG_WIDE_RECORDS`]).
pub const WIDE_RECORD_BYTES: usize = 64;
/// The device sector of bit 11's 4 KiB form.
pub const SECTOR_4K_BYTES: usize = 4096;
/// Smallest extent whose segments take bit 11's 4 KiB form (a raw block alone takes 12 KiB).
pub const SECTOR_4K_FORM_EXTENT_MIN: u32 = 16 * 1024;
/// The device every record of a volume without devices (bit 13) names.
pub const DEFAULT_DEVICE: u32 = 1;
/// Block keys: the engine names a block of device `d` at LBA `l` by one u64,
/// `(d - 1) * DEVICE_KEY_STRIDE + l`, so the extent buffer, the read cache, units and
/// records need no second field (design.md, "Devices"). The default device's keys are its
/// LBAs. The stride is a multiple of a map leaf, of 64 leaves (a range step) and of every unit
/// size, so a key is at the same place in its leaf, step and unit as its LBA; it bounds a
/// device at 2^30 x 16,320 blocks (65 PiB) and ids at about a million.
pub const DEVICE_KEY_STRIDE: u64 = (64 * MAP_ENTRIES_PER_PAGE as u64) << 30;
/// Largest device id a block key can name.
pub const DEVICE_KEY_MAX: u32 = (u64::MAX / DEVICE_KEY_STRIDE) as u32;

/// The key of block `lba` of `device` (see [`DEVICE_KEY_STRIDE`]).
pub fn block_key(device: u32, lba: u64) -> u64 {
    debug_assert!((DEFAULT_DEVICE..=DEVICE_KEY_MAX).contains(&device));
    debug_assert!(lba < DEVICE_KEY_STRIDE);
    u64::from(device - 1) * DEVICE_KEY_STRIDE + lba
}

/// The device of block key `key`.
pub fn key_device(key: u64) -> u32 {
    (key / DEVICE_KEY_STRIDE) as u32 + 1
}

/// The LBA in its device of block key `key`.
pub fn key_lba(key: u64) -> u64 {
    key % DEVICE_KEY_STRIDE
}
/// Map page size.
pub const MAP_PAGE_BYTES: usize = 4096;
/// Map page header size.
pub const MAP_PAGE_HEADER_BYTES: usize = 16;
/// Map entry size (on disk and in RAM).
pub const MAP_ENTRY_BYTES: usize = 16;
/// Map entries per map page.
pub const MAP_ENTRIES_PER_PAGE: usize = (MAP_PAGE_BYTES - MAP_PAGE_HEADER_BYTES) / MAP_ENTRY_BYTES;
/// Fixed part of a v1 checkpoint before the allocation queue.
pub const CHECKPOINT_HEADER_BYTES: usize = 256;
/// Fixed part of a v2 checkpoint before the allocation queue (header, volume counters,
/// dictionary directory).
pub const CHECKPOINT_V2_HEADER_BYTES: usize = 896;
/// Bytes per allocation queue entry in a checkpoint.
pub const QUEUE_ENTRY_BYTES: usize = 16;
/// Persistent counters carried in each checkpoint.
pub const COUNTERS: usize = 16;
/// Volume counters (v2, reserved for incrementally maintained totals).
pub const VOLUME_COUNTERS: usize = 16;
/// Dictionary directory entries in a v2 checkpoint.
pub const DICT_ENTRIES: usize = 16;
/// Bytes per dictionary directory entry.
pub const DICT_ENTRY_BYTES: usize = 32;
/// Extent-table page: 16-byte header then 8-byte entries (v2, reserved).
pub const EXTENT_TABLE_ENTRIES_PER_PAGE: usize = (MAP_PAGE_BYTES - 16) / 8;
/// Smallest and largest extent sizes.
pub const EXTENT_BYTES_MIN: u32 = 8 * 1024;
/// Largest extent size.
pub const EXTENT_BYTES_MAX: u32 = 1024 * 1024;
/// Checkpoint flag: the volume counters are maintained and valid (v2).
pub const CKPT_FLAG_VOLUME_COUNTERS: u32 = 1;
/// Checkpoint flag: the extent table is maintained and valid (v2).
pub const CKPT_FLAG_EXTENT_TABLE: u32 = 2;
/// Checkpoint flag: volume counters 8..16 (blocks and bytes with a dictionary, by unit size)
/// are maintained and valid too (v2; a checkpoint without it carries zeros there).
pub const CKPT_FLAG_SAVINGS_COUNTERS: u32 = 4;
/// Checkpoint flag: each directory entry's live-block count (its bytes 24..32, reserved zeros
/// before) is maintained and valid (v2; without it a writable open recounts from the map).
pub const CKPT_FLAG_DICT_COUNTS: u32 = 8;
/// Checkpoint flag (incompatible): records and map entries may use multi-block compression
/// units. A build that does not know a bit of `CKPT_FLAGS_INCOMPAT` refuses to open the volume.
pub const CKPT_FLAG_COMPRESSION_UNITS: u32 = 1 << 8;
/// Checkpoint flag (incompatible): blocks may need a trained dictionary.
pub const CKPT_FLAG_DICTIONARIES: u32 = 1 << 9;
/// Checkpoint flag (incompatible): metadata pages (docs/format.md, "Bit 10: metadata pages"):
/// maps are page trees, pair states name page slots, and extent-table state 3 marks metadata
/// extents. The format reads and writes it; the engine refuses such volumes by name until it
/// opens their maps (design.md, "Build order", the wiring of step 1b).
pub const CKPT_FLAG_METADATA_PAGES: u32 = 1 << 10;
/// Checkpoint flag (incompatible): segments may carry bit 11's header flags, 64-byte records
/// with a device and a fingerprint, and the 4 KiB form (docs/format.md, "Bit 11").
pub const CKPT_FLAG_V3_SEGMENTS: u32 = 1 << 11;
/// Checkpoint flag (incompatible): map entries may be shared (state 4) through the shared-block
/// table, and segments may hold move records (docs/format.md, "Bit 12"). Needs bits 10 and 11.
pub const CKPT_FLAG_SHARED_ITEMS: u32 = 1 << 12;
/// Checkpoint flag (incompatible): the device table has more than one row, and records may
/// name devices other than the default one (docs/format.md, "Bit 13"). Needs bits 10 and 11.
pub const CKPT_FLAG_DEVICES: u32 = 1 << 13;
/// Checkpoint flag (incompatible): map pages may have more than one parent (snapshots and
/// clones); the PCT counts them and a host change copies a shared page first (docs/format.md,
/// "Bit 14"). A build without copy on write would change a snapshot's pages in place.
pub const CKPT_FLAG_SNAPSHOTS: u32 = 1 << 14;
/// Flag bits a reader must understand to open the volume (bits 8..16). The others (0..8) are
/// compatible: a writer that does not maintain what they announce clears them.
pub const CKPT_FLAGS_INCOMPAT: u32 = 0xff00;
/// Incompatible flags this build implements.
pub const CKPT_FLAGS_INCOMPAT_KNOWN: u32 = CKPT_FLAG_COMPRESSION_UNITS
    | CKPT_FLAG_DICTIONARIES
    | CKPT_FLAG_METADATA_PAGES
    | CKPT_FLAG_V3_SEGMENTS
    | CKPT_FLAG_SHARED_ITEMS
    | CKPT_FLAG_DEVICES
    | CKPT_FLAG_SNAPSHOTS;
/// Largest compression unit, in blocks (64 KiB: its stored length, kept compressed only when
/// that saves a sector, fits the u16 of a map entry).
pub const UNIT_BLOCKS_MAX: u8 = 16;
/// Map entry location word: bits 0-19 byte offset, 20-24 index in the unit, 25-31 dictionary.
const LOC_OFFSET_MASK: u32 = (1 << 20) - 1;

const SUPER_MAGIC: &[u8; 8] = b"ZBDSUPER";
const CKPT_MAGIC: &[u8; 8] = b"ZBDCKPT1";
const SEG_MAGIC: &[u8; 8] = b"ZBDSEGM1";
/// Segment header flag (bit 11): records are [`WIDE_RECORD_BYTES`] long, in both table copies.
pub const SEG_FLAG_WIDE_RECORDS: u16 = 1;
/// Segment header flag (bit 11): the 4 KiB form (`SegmentForm::padded_len`).
pub const SEG_FLAG_4K: u16 = 2;
/// Segment header flags (u16 at byte 50) this build reads. A writer sets a flag only after the
/// checkpoint flag announcing it is durable, so an older build refuses the checkpoint first;
/// refusing the segment as well keeps it from taking a segment it cannot parse for the end of
/// the log (docs/format.md, "Flags").
const SEG_FLAGS_KNOWN: u16 = SEG_FLAG_WIDE_RECORDS | SEG_FLAG_4K;
const SEG_FOOTER_MAGIC: &[u8; 8] = b"ZBDSEGFT";

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn corrupt(what: &str) -> Error {
    Error::CorruptMetadata(what.to_string())
}

// Callers check lengths first; these never index out of bounds for in-range offsets.
fn get_u16(b: &[u8], o: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[o..o + 2]);
    u16::from_le_bytes(a)
}
fn get_u32(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// CRC32C of `data` with the 4 bytes at `crc_at` counted as zero.
fn crc_skipping(data: &[u8], crc_at: usize) -> u32 {
    let c = crc32c::crc32c(&data[..crc_at]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &data[crc_at + 4..])
}
