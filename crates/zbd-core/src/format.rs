//! On-disk structures (docs/format.md is the specification; keep both in step).
//! Pure encode/decode: no I/O here. Every decoder takes `&[u8]`, returns a `Result` and never
//! panics, whatever the input (they are fuzzed).
//!
//! Two versions are read and written: 1 (the first format) and 2 (the current one: two copies
//! of checkpoints and map pages, segments with a trailing copy of their header and record table
//! and the durable write-sequence watermark, multi-block compression units behind an
//! incompatible checkpoint flag, room reserved for an extent table, dictionaries, per-page
//! summaries and volume counters). A volume keeps the version it was created with;
//! `Superblock::version` selects the rules.

use crate::error::{Error, Result};

/// Logical block size: the unit of mapping and compression.
pub const BLOCK_BYTES: usize = 4096;
/// Sector size: segments start on sector boundaries so a torn tail never damages durable bytes.
pub const SECTOR_BYTES: usize = 512;
/// Format version of new volumes (docs/format.md, "Version changes").
pub const FORMAT_VERSION: u32 = 2;
/// Oldest format version this build still opens (and writes, keeping its rules).
pub const FORMAT_VERSION_MIN: u32 = 1;
/// Bytes per superblock copy; two copies at offsets 0 and 4096.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Segment header size (the v2 footer has the same size).
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// Block record size.
pub const RECORD_BYTES: usize = 40;
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
/// Flag bits a reader must understand to open the volume (bits 8..16). The others (0..8) are
/// compatible: a writer that does not maintain what they announce clears them.
pub const CKPT_FLAGS_INCOMPAT: u32 = 0xff00;
/// Incompatible flags this build implements.
pub const CKPT_FLAGS_INCOMPAT_KNOWN: u32 = CKPT_FLAG_COMPRESSION_UNITS | CKPT_FLAG_DICTIONARIES;
/// Largest compression unit, in blocks (64 KiB: its stored length, kept compressed only when
/// that saves a sector, fits the u16 of a map entry).
pub const UNIT_BLOCKS_MAX: u8 = 16;
/// Map entry location word: bits 0-19 byte offset, 20-24 index in the unit, 25-31 dictionary.
const LOC_OFFSET_MASK: u32 = (1 << 20) - 1;

const SUPER_MAGIC: &[u8; 8] = b"ZBDSUPER";
const CKPT_MAGIC: &[u8; 8] = b"ZBDCKPT1";
const SEG_MAGIC: &[u8; 8] = b"ZBDSEGM1";
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

/// Static description of a volume, written once at create time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version the volume was created with (1 or 2); selects the layout rules.
    pub version: u32,
    /// Volume identity; every segment carries it so foreign data is never replayed.
    pub uuid: [u8; 16],
    /// Logical size in 4 KiB blocks.
    pub logical_blocks: u64,
    /// Extent size in bytes.
    pub extent_bytes: u32,
    /// Extents in the data area.
    pub extent_count: u32,
    /// Codec id for new writes.
    pub codec_id: u8,
    /// Codec level.
    pub codec_level: i32,
    /// Allocation queue length K (extents replayed at most by recovery).
    pub queue_len: u32,
    /// Map pages (each stored in two slots, copy-on-write; v2: each slot twice).
    pub map_pages: u32,
    /// Byte offset of checkpoint slot A of copy 0 (slot B follows).
    pub checkpoint_offset: u64,
    /// Bytes per checkpoint slot.
    pub checkpoint_slot_bytes: u32,
    /// Byte offset of the map area, copy 0.
    pub map_offset: u64,
    /// Byte offset of extent 0.
    pub data_offset: u64,
    /// Cleaner low watermark, % of extents free.
    pub clean_low_pct: u8,
    /// Cleaner high watermark, % of extents free.
    pub clean_high_pct: u8,
    /// Creation time, seconds since the epoch.
    pub created_unix: u64,
    /// v2: byte offset of checkpoint copy 1 (v1: same as copy 0, there is one copy).
    pub checkpoint_offset1: u64,
    /// v2: byte offset of map copy 1 (v1: same as copy 0).
    pub map_offset1: u64,
    /// v2 (reserved for the paged map): extent-table pages per slot; 0 in v1.
    pub extent_table_pages: u32,
    /// v2: byte offsets of the two extent-table copies (each 2 slots x pages x 4 KiB).
    pub extent_table_offset: [u64; 2],
    /// v2 (reserved for trained dictionaries): bytes of each dictionary region copy; 0 in v1.
    pub dict_bytes: u32,
    /// v2: byte offsets of the two dictionary region copies.
    pub dict_offset: [u64; 2],
    /// v2: compression unit size for new writes, in blocks (1 = every block on its own; a
    /// power of two up to `UNIT_BLOCKS_MAX`). Only a writer's choice: what a volume holds is
    /// in its records and map entries.
    pub unit_blocks: u8,
    /// v2: settings new opens default to (`SB_SETTING_*` bits; offset 160). Only a writer's
    /// choice, like `unit_blocks`: unknown bits are ignored.
    pub settings: u32,
}

/// Superblock setting: new blocks train and use dictionaries unless the open says otherwise
/// (`zbd create --dict on`).
pub const SB_SETTING_DICTIONARY: u32 = 1;

impl Superblock {
    /// Total bytes the volume occupies.
    pub fn total_bytes(&self) -> u64 {
        self.data_offset + u64::from(self.extent_count) * u64::from(self.extent_bytes)
    }

    /// Bytes of metadata (everything before the data area).
    pub fn metadata_bytes(&self) -> u64 {
        self.data_offset
    }

    /// Copies of the checkpoint and of each map page (1 in v1, 2 in v2).
    pub fn metadata_copies(&self) -> u8 {
        if self.version >= 2 {
            2
        } else {
            1
        }
    }

    /// Encodes into one superblock copy.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(SUPER_MAGIC);
        put_u32(&mut b, 8, self.version);
        b[16..32].copy_from_slice(&self.uuid);
        put_u64(&mut b, 32, self.logical_blocks);
        put_u32(&mut b, 40, self.extent_bytes);
        put_u32(&mut b, 44, self.extent_count);
        b[48] = self.codec_id;
        b[49] = self.clean_low_pct;
        b[50] = self.clean_high_pct;
        put_u32(&mut b, 52, self.codec_level as u32);
        put_u32(&mut b, 56, self.queue_len);
        put_u32(&mut b, 60, self.map_pages);
        put_u64(&mut b, 64, self.checkpoint_offset);
        put_u32(&mut b, 72, self.checkpoint_slot_bytes);
        put_u32(&mut b, 76, BLOCK_BYTES as u32);
        put_u64(&mut b, 80, self.map_offset);
        put_u64(&mut b, 88, self.data_offset);
        put_u64(&mut b, 96, self.created_unix);
        if self.version >= 2 {
            put_u64(&mut b, 104, self.checkpoint_offset1);
            put_u64(&mut b, 112, self.map_offset1);
            put_u64(&mut b, 120, self.extent_table_offset[0]);
            put_u64(&mut b, 128, self.extent_table_offset[1]);
            put_u32(&mut b, 136, self.extent_table_pages);
            put_u32(&mut b, 140, self.dict_bytes);
            put_u64(&mut b, 144, self.dict_offset[0]);
            put_u64(&mut b, 152, self.dict_offset[1]);
            b[51] = self.unit_blocks;
            put_u32(&mut b, 160, self.settings);
        }
        let crc = crc_skipping(&b, 12);
        put_u32(&mut b, 12, crc);
        b
    }

    /// Decodes one copy, checking magic, version, checksum and geometry.
    pub fn decode(b: &[u8]) -> Result<Superblock> {
        if b.len() < SUPERBLOCK_BYTES || &b[0..8] != SUPER_MAGIC {
            return Err(Error::NotAVolume("no zbd superblock (bad magic)".into()));
        }
        if get_u32(b, 12) != crc_skipping(&b[..SUPERBLOCK_BYTES], 12) {
            return Err(corrupt("superblock checksum mismatch"));
        }
        let version = get_u32(b, 8);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return Err(Error::NotAVolume(format!(
                "format version {version}, this zbd reads {FORMAT_VERSION_MIN} to \
                 {FORMAT_VERSION}: use a newer zbd"
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let checkpoint_offset = get_u64(b, 64);
        let map_offset = get_u64(b, 80);
        let v2 = version >= 2;
        let sb = Superblock {
            version,
            uuid,
            logical_blocks: get_u64(b, 32),
            extent_bytes: get_u32(b, 40),
            extent_count: get_u32(b, 44),
            codec_id: b[48],
            clean_low_pct: b[49],
            clean_high_pct: b[50],
            codec_level: get_u32(b, 52) as i32,
            queue_len: get_u32(b, 56),
            map_pages: get_u32(b, 60),
            checkpoint_offset,
            checkpoint_slot_bytes: get_u32(b, 72),
            map_offset,
            data_offset: get_u64(b, 88),
            created_unix: get_u64(b, 96),
            checkpoint_offset1: if v2 {
                get_u64(b, 104)
            } else {
                checkpoint_offset
            },
            map_offset1: if v2 { get_u64(b, 112) } else { map_offset },
            extent_table_offset: if v2 {
                [get_u64(b, 120), get_u64(b, 128)]
            } else {
                [0, 0]
            },
            extent_table_pages: if v2 { get_u32(b, 136) } else { 0 },
            dict_bytes: if v2 { get_u32(b, 140) } else { 0 },
            dict_offset: if v2 {
                [get_u64(b, 144), get_u64(b, 152)]
            } else {
                [0, 0]
            },
            // 0 in volumes made before units existed: single blocks.
            unit_blocks: if v2 { b[51].max(1) } else { 1 },
            // 0 in volumes made before settings existed: every setting off.
            settings: if v2 { get_u32(b, 160) } else { 0 },
        };
        if get_u32(b, 76) as usize != BLOCK_BYTES
            || !sb.extent_bytes.is_power_of_two()
            || !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&sb.extent_bytes)
            || u64::from(sb.map_pages) != sb.logical_blocks.div_ceil(MAP_ENTRIES_PER_PAGE as u64)
            || sb.queue_len == 0
            || (v2
                && u64::from(sb.extent_table_pages)
                    != u64::from(sb.extent_count).div_ceil(EXTENT_TABLE_ENTRIES_PER_PAGE as u64))
            || !sb.unit_blocks.is_power_of_two()
            || sb.unit_blocks > UNIT_BLOCKS_MAX
            || !sb.regions_fit()
        {
            return Err(corrupt("superblock geometry is inconsistent"));
        }
        Ok(sb)
    }

    /// The metadata regions in on-disk order, as (offset, length).
    fn regions(&self) -> Vec<(u64, u64)> {
        let slots = 2 * u64::from(self.checkpoint_slot_bytes);
        let map = 2 * u64::from(self.map_pages) * MAP_PAGE_BYTES as u64;
        if self.version < 2 {
            return vec![(self.checkpoint_offset, slots), (self.map_offset, map)];
        }
        let et = 2 * u64::from(self.extent_table_pages) * MAP_PAGE_BYTES as u64;
        let dict = u64::from(self.dict_bytes);
        vec![
            (self.checkpoint_offset, slots),
            (self.map_offset, map),
            (self.extent_table_offset[0], et),
            (self.dict_offset[0], dict),
            (self.checkpoint_offset1, slots),
            (self.map_offset1, map),
            (self.extent_table_offset[1], et),
            (self.dict_offset[1], dict),
        ]
    }

    /// Whether the regions lie in order after the superblocks without overlapping, the checkpoint
    /// slot can hold a full queue, and the total size is representable. Checked arithmetic: a
    /// superblock with a valid CRC may still come from a foreign or hostile file, and an overflow
    /// here would panic (debug) or wrap into a bogus geometry (release).
    fn regions_fit(&self) -> bool {
        let slot_needed = checkpoint_body_bytes(
            self.version,
            self.queue_len,
            self.map_pages,
            self.extent_table_pages,
        );
        if u64::from(self.checkpoint_slot_bytes) < slot_needed {
            return false;
        }
        let mut end = 2 * SUPERBLOCK_BYTES as u64;
        for (off, len) in self.regions() {
            let Some(e) = off.checked_add(len) else {
                return false;
            };
            if off < end {
                return false;
            }
            end = e;
        }
        let data_bytes = u64::from(self.extent_count) * u64::from(self.extent_bytes);
        self.data_offset >= end && self.data_offset.checked_add(data_bytes).is_some()
    }

    /// Byte offset of extent `e`.
    pub fn extent_offset(&self, e: u32) -> u64 {
        self.data_offset + u64::from(e) * u64::from(self.extent_bytes)
    }

    /// Byte offset of map page `page` in slot `slot` (0 = A, 1 = B) of copy `copy` (0 or 1).
    pub fn map_page_offset(&self, page: u32, slot: u8, copy: u8) -> u64 {
        let base = if copy == 0 {
            self.map_offset
        } else {
            self.map_offset1
        };
        base + (u64::from(page) * 2 + u64::from(slot)) * MAP_PAGE_BYTES as u64
    }

    /// Byte offset of the checkpoint slot for sequence `seq` (slot = seq mod 2) of copy `copy`.
    pub fn checkpoint_slot_offset(&self, seq: u64, copy: u8) -> u64 {
        let base = if copy == 0 {
            self.checkpoint_offset
        } else {
            self.checkpoint_offset1
        };
        base + (seq % 2) * u64::from(self.checkpoint_slot_bytes)
    }
}

/// Bytes a checkpoint body uses (before rounding to a slot).
fn checkpoint_body_bytes(version: u32, queue_len: u32, map_pages: u32, et_pages: u32) -> u64 {
    let q = u64::from(queue_len) * QUEUE_ENTRY_BYTES as u64;
    if version < 2 {
        CHECKPOINT_HEADER_BYTES as u64 + q + u64::from(map_pages).div_ceil(4)
    } else {
        CHECKPOINT_V2_HEADER_BYTES as u64
            + q
            + u64::from(map_pages).div_ceil(2)
            + u64::from(et_pages).div_ceil(4)
    }
}

/// Checkpoint slot size of a version-`FORMAT_VERSION` volume.
pub fn checkpoint_slot_bytes(queue_len: u32, map_pages: u32, extent_table_pages: u32) -> u32 {
    let body = checkpoint_body_bytes(FORMAT_VERSION, queue_len, map_pages, extent_table_pages);
    align_up(body, BLOCK_BYTES as u64) as u32
}

/// One extent that may receive segments after a checkpoint, with the allocation sequence its
/// segments must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    /// Extent index.
    pub extent: u32,
    /// Allocation sequence (unique per allocation of an extent).
    pub alloc_seq: u64,
}

/// Which slot of a map page is current: none yet (all unmapped), slot A (1) or slot B (2).
pub type PageSlot = u8;
/// Map page never written: every entry unmapped.
pub const PAGE_NONE: PageSlot = 0;

/// v2, reserved for trained dictionaries (issue 10): one entry of the checkpoint's dictionary
/// directory. The dictionary's bytes lie at `region_offset` in both dictionary region copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DictEntry {
    /// Dictionary id as records carry it (1..; 0 = no dictionary). Ids are never reused while a
    /// live block needs them.
    pub id: u16,
    /// Codec the dictionary is for.
    pub codec: u8,
    /// Bit 0: entry in use.
    pub flags: u8,
    /// Byte offset inside each dictionary region copy.
    pub region_offset: u32,
    /// Dictionary length in bytes.
    pub len: u32,
    /// CRC32C of the dictionary bytes (each copy is checked on its own).
    pub crc: u32,
    /// Write sequence when it was trained.
    pub created_seq: u64,
    /// Live blocks that name it, valid with `CKPT_FLAG_DICT_COUNTS` (bytes 24..32, reserved
    /// zeros before that flag).
    pub live_blocks: u64,
}

/// A checkpoint: the root of all metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Checkpoint sequence; slot = seq % 2.
    pub seq: u64,
    /// Highest record write sequence reflected in the map.
    pub write_seq: u64,
    /// Next allocation sequence to hand out.
    pub next_alloc_seq: u64,
    /// Lifetime counters (stats), see `stats::Counter`.
    pub counters: [u64; COUNTERS],
    /// Extents that may hold segments newer than this checkpoint, in allocation order.
    pub queue: Vec<QueueEntry>,
    /// Current slot per map page (PAGE_NONE, 1 = A, 2 = B).
    pub page_slots: Vec<PageSlot>,
    /// v2: per map page summary (0 = mixed or unknown, 1 = all unmapped, 2 = all zero);
    /// reserved for the paged map, written as 0 until it is maintained.
    pub page_summaries: Vec<u8>,
    /// v2: `CKPT_FLAG_*` bits.
    pub flags: u32,
    /// v2: volume counters, valid when `CKPT_FLAG_VOLUME_COUNTERS` is set (docs/format.md).
    pub volume_counters: [u64; VOLUME_COUNTERS],
    /// v2: dictionary directory (entries not in use are all zero).
    pub dicts: [DictEntry; DICT_ENTRIES],
    /// v2: current slot per extent-table page (like `page_slots`), valid with
    /// `CKPT_FLAG_EXTENT_TABLE`.
    pub extent_table_slots: Vec<PageSlot>,
}

impl Checkpoint {
    /// An empty checkpoint for `sb`'s geometry.
    pub fn empty(sb: &Superblock) -> Checkpoint {
        let v2 = sb.version >= 2;
        Checkpoint {
            seq: 0,
            write_seq: 0,
            next_alloc_seq: 0,
            counters: [0; COUNTERS],
            queue: Vec::new(),
            page_slots: vec![PAGE_NONE; sb.map_pages as usize],
            page_summaries: if v2 {
                vec![0; sb.map_pages as usize]
            } else {
                Vec::new()
            },
            flags: 0,
            volume_counters: [0; VOLUME_COUNTERS],
            dicts: [DictEntry::default(); DICT_ENTRIES],
            extent_table_slots: vec![PAGE_NONE; sb.extent_table_pages as usize],
        }
    }

    /// Encodes into a checkpoint slot of `sb`'s size and version.
    pub fn encode(&self, sb: &Superblock) -> Vec<u8> {
        let mut b = vec![0u8; sb.checkpoint_slot_bytes as usize];
        b[0..8].copy_from_slice(CKPT_MAGIC);
        put_u32(&mut b, 8, sb.version);
        b[16..32].copy_from_slice(&sb.uuid);
        put_u64(&mut b, 32, self.seq);
        put_u64(&mut b, 40, self.write_seq);
        put_u64(&mut b, 48, self.next_alloc_seq);
        put_u32(&mut b, 56, self.queue.len() as u32);
        put_u32(&mut b, 60, self.page_slots.len() as u32);
        for (i, c) in self.counters.iter().enumerate() {
            put_u64(&mut b, 64 + i * 8, *c);
        }
        let v2 = sb.version >= 2;
        let mut o = if v2 {
            put_u32(&mut b, 196, self.flags);
            put_u32(&mut b, 200, self.extent_table_slots.len() as u32);
            for (i, c) in self.volume_counters.iter().enumerate() {
                put_u64(&mut b, 256 + i * 8, *c);
            }
            for (i, d) in self.dicts.iter().enumerate() {
                let o = 384 + i * DICT_ENTRY_BYTES;
                put_u16(&mut b, o, d.id);
                b[o + 2] = d.codec;
                b[o + 3] = d.flags;
                put_u32(&mut b, o + 4, d.region_offset);
                put_u32(&mut b, o + 8, d.len);
                put_u32(&mut b, o + 12, d.crc);
                put_u64(&mut b, o + 16, d.created_seq);
                put_u64(&mut b, o + 24, d.live_blocks);
            }
            CHECKPOINT_V2_HEADER_BYTES
        } else {
            CHECKPOINT_HEADER_BYTES
        };
        for q in &self.queue {
            put_u32(&mut b, o, q.extent);
            put_u64(&mut b, o + 8, q.alloc_seq);
            o += QUEUE_ENTRY_BYTES;
        }
        if v2 {
            for (i, s) in self.page_slots.iter().enumerate() {
                let sum = self.page_summaries.get(i).copied().unwrap_or(0);
                b[o + i / 2] |= ((s & 3) | ((sum & 3) << 2)) << ((i % 2) * 4);
            }
            o += self.page_slots.len().div_ceil(2);
            for (i, s) in self.extent_table_slots.iter().enumerate() {
                b[o + i / 4] |= (s & 3) << ((i % 4) * 2);
            }
            o += self.extent_table_slots.len().div_ceil(4);
        } else {
            for (i, s) in self.page_slots.iter().enumerate() {
                b[o + i / 4] |= (s & 3) << ((i % 4) * 2);
            }
            o += self.page_slots.len().div_ceil(4);
        }
        put_u32(&mut b, 64 + COUNTERS * 8, o as u32);
        let crc = crc_skipping(&b[..o], 12);
        put_u32(&mut b, 12, crc);
        b
    }

    /// Decodes a checkpoint slot of volume `sb`; an error when it is empty, torn, damaged or
    /// foreign.
    pub fn decode(b: &[u8], sb: &Superblock) -> Result<Checkpoint> {
        if b.len() < CHECKPOINT_V2_HEADER_BYTES.max(CHECKPOINT_HEADER_BYTES) {
            return Err(corrupt("checkpoint slot too short"));
        }
        if &b[0..8] != CKPT_MAGIC || b[16..32] != sb.uuid {
            return Err(corrupt("no checkpoint of this volume"));
        }
        if get_u32(b, 8) != sb.version {
            return Err(corrupt("checkpoint of another format version"));
        }
        let used = get_u32(b, 64 + COUNTERS * 8) as usize;
        let queue_len = get_u32(b, 56);
        let pages = get_u32(b, 60);
        let v2 = sb.version >= 2;
        let et_pages = if v2 { get_u32(b, 200) } else { 0 };
        if used > b.len()
            || queue_len > sb.queue_len
            || pages != sb.map_pages
            || et_pages != sb.extent_table_pages
            || used as u64 != checkpoint_body_bytes(sb.version, queue_len, pages, et_pages)
        {
            return Err(corrupt("checkpoint sizes are inconsistent"));
        }
        if get_u32(b, 12) != crc_skipping(&b[..used], 12) {
            return Err(corrupt("checkpoint checksum mismatch"));
        }
        let mut ck = Checkpoint::empty(sb);
        ck.seq = get_u64(b, 32);
        ck.write_seq = get_u64(b, 40);
        ck.next_alloc_seq = get_u64(b, 48);
        for (i, c) in ck.counters.iter_mut().enumerate() {
            *c = get_u64(b, 64 + i * 8);
        }
        let mut o = if v2 {
            ck.flags = get_u32(b, 196);
            for (i, c) in ck.volume_counters.iter_mut().enumerate() {
                *c = get_u64(b, 256 + i * 8);
            }
            for (i, d) in ck.dicts.iter_mut().enumerate() {
                let o = 384 + i * DICT_ENTRY_BYTES;
                *d = DictEntry {
                    id: get_u16(b, o),
                    codec: b[o + 2],
                    flags: b[o + 3],
                    region_offset: get_u32(b, o + 4),
                    len: get_u32(b, o + 8),
                    crc: get_u32(b, o + 12),
                    created_seq: get_u64(b, o + 16),
                    live_blocks: get_u64(b, o + 24),
                };
            }
            CHECKPOINT_V2_HEADER_BYTES
        } else {
            CHECKPOINT_HEADER_BYTES
        };
        ck.queue = (0..queue_len as usize)
            .map(|i| QueueEntry {
                extent: get_u32(b, o + i * QUEUE_ENTRY_BYTES),
                alloc_seq: get_u64(b, o + i * QUEUE_ENTRY_BYTES + 8),
            })
            .collect();
        o += queue_len as usize * QUEUE_ENTRY_BYTES;
        let pages = pages as usize;
        if v2 {
            let nibble = |i: usize| (b[o + i / 2] >> ((i % 2) * 4)) & 15;
            ck.page_slots = (0..pages).map(|i| nibble(i) & 3).collect();
            ck.page_summaries = (0..pages).map(|i| nibble(i) >> 2).collect();
            o += pages.div_ceil(2);
            ck.extent_table_slots = (0..et_pages as usize)
                .map(|i| (b[o + i / 4] >> ((i % 4) * 2)) & 3)
                .collect();
        } else {
            ck.page_slots = (0..pages)
                .map(|i| (b[o + i / 4] >> ((i % 4) * 2)) & 3)
                .collect();
        }
        if ck.page_slots.iter().any(|&s| s > 2) {
            return Err(corrupt(
                "checkpoint names a map page slot that does not exist",
            ));
        }
        Ok(ck)
    }
}

/// State of one logical block in the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BlockState {
    /// Never written or trimmed: reads as zeros, reported as a hole.
    #[default]
    Unmapped,
    /// Written with zeros: reads as zeros, no data stored.
    Zero,
    /// Stored in an extent.
    Data,
    /// Its location was lost with a damaged map page: reads fail with `Corrupt` until the block
    /// is overwritten, zeroed or trimmed. Stored as state 3 so that rewriting the page (after a
    /// write to another block of it) keeps the damage reported instead of turning it into holes.
    Corrupt,
}

/// One map entry: where a logical block lives. 16 bytes on disk.
///
/// A block of a multi-block compression unit points at the whole unit (`offset`, `len` and `crc`
/// are the unit's, shared by all its blocks) and knows its place in it (`unit_index` of
/// `unit_blocks`); its data are bytes `4096 * unit_index ..` of the decompressed unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// Block state.
    pub state: BlockState,
    /// Codec id of the stored bytes.
    pub codec: u8,
    /// Stored length in bytes.
    pub len: u16,
    /// Extent index.
    pub extent: u32,
    /// Byte offset inside the extent.
    pub offset: u32,
    /// CRC32C of the stored bytes.
    pub crc: u32,
    /// Index of the block in its compression unit (0 for a single block).
    pub unit_index: u8,
    /// Blocks in its compression unit (1 = a single block).
    pub unit_blocks: u8,
    /// Dictionary id (0 = none).
    pub dict: u8,
}

impl MapEntry {
    /// A zero-state entry.
    pub const ZERO: MapEntry = MapEntry {
        state: BlockState::Zero,
        ..MapEntry::UNMAPPED
    };
    /// An unmapped entry.
    pub const UNMAPPED: MapEntry = MapEntry {
        state: BlockState::Unmapped,
        codec: 0,
        len: 0,
        extent: 0,
        offset: 0,
        crc: 0,
        unit_index: 0,
        unit_blocks: 1,
        dict: 0,
    };

    /// Whether it is a block of a multi-block compression unit.
    pub fn in_unit(&self) -> bool {
        self.state == BlockState::Data && self.unit_blocks > 1
    }

    fn encode(&self, b: &mut [u8]) {
        let state = match self.state {
            BlockState::Unmapped => 0,
            BlockState::Zero => 1,
            BlockState::Data => 2,
            BlockState::Corrupt => 3,
        };
        // Bits 3-7: unit blocks - 1 (format.md; only on volumes with the units flag).
        b[0] = state | (self.unit_blocks.saturating_sub(1) << 3);
        b[1] = self.codec;
        put_u16(b, 2, self.len);
        put_u32(b, 4, self.extent);
        let loc = (self.offset & LOC_OFFSET_MASK)
            | (u32::from(self.unit_index & 31) << 20)
            | (u32::from(self.dict & 127) << 25);
        put_u32(b, 8, loc);
        put_u32(b, 12, self.crc);
    }

    fn decode(b: &[u8]) -> Option<MapEntry> {
        let state = match b[0] & 7 {
            0 => BlockState::Unmapped,
            1 => BlockState::Zero,
            2 => BlockState::Data,
            3 => BlockState::Corrupt,
            _ => return None,
        };
        let loc = get_u32(b, 8);
        Some(MapEntry {
            state,
            codec: b[1],
            len: get_u16(b, 2),
            extent: get_u32(b, 4),
            offset: loc & LOC_OFFSET_MASK,
            crc: get_u32(b, 12),
            unit_index: ((loc >> 20) & 31) as u8,
            unit_blocks: (b[0] >> 3) + 1,
            dict: (loc >> 25) as u8,
        })
    }
}

/// Encodes a map page (`entries` may be shorter than a full page at the end of the volume).
pub fn encode_map_page(page: u32, gen: u64, entries: &[MapEntry]) -> Vec<u8> {
    let mut b = vec![0u8; MAP_PAGE_BYTES];
    put_u32(&mut b, 0, page);
    put_u64(&mut b, 8, gen);
    for (i, e) in entries.iter().enumerate() {
        let o = MAP_PAGE_HEADER_BYTES + i * MAP_ENTRY_BYTES;
        e.encode(&mut b[o..o + MAP_ENTRY_BYTES]);
    }
    let crc = crc_skipping(&b, 4);
    put_u32(&mut b, 4, crc);
    b
}

/// Decodes a map page into `out` (at most `MAP_ENTRIES_PER_PAGE` entries); an error if it is
/// damaged, belongs to another page or is newer than the checkpoint `max_gen`.
pub fn decode_map_page(b: &[u8], page: u32, max_gen: u64, out: &mut [MapEntry]) -> Result<()> {
    if b.len() != MAP_PAGE_BYTES || out.len() > MAP_ENTRIES_PER_PAGE {
        return Err(corrupt("map page has the wrong size"));
    }
    if get_u32(b, 0) != page || get_u32(b, 4) != crc_skipping(b, 4) || get_u64(b, 8) > max_gen {
        return Err(corrupt("map page damaged or stale"));
    }
    for (i, e) in out.iter_mut().enumerate() {
        let o = MAP_PAGE_HEADER_BYTES + i * MAP_ENTRY_BYTES;
        *e = MapEntry::decode(&b[o..o + MAP_ENTRY_BYTES])
            .ok_or_else(|| corrupt("map entry with an unknown state"))?;
    }
    Ok(())
}

/// Kind of a block record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// One logical block's stored bytes.
    Data,
    /// A range of blocks written with zeros.
    Zero,
    /// A range of blocks trimmed.
    Trim,
}

/// A record in a segment's record table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Kind.
    pub kind: RecordKind,
    /// Codec id (data records).
    pub codec: u8,
    /// Stored length (data records; of the whole compression unit).
    pub len: u32,
    /// First logical block.
    pub lba: u64,
    /// Blocks covered (1 for data records).
    pub count: u32,
    /// Byte offset of the stored bytes inside the extent (data records; of the unit).
    pub offset: u32,
    /// Global write sequence: replay applies records in this order.
    pub seq: u64,
    /// CRC32C of the stored bytes (data records; of the unit).
    pub crc: u32,
    /// v2: index of this block inside its compression unit (0 for a single block).
    pub unit_index: u8,
    /// Blocks in the compression unit (1 = a single block).
    pub unit_blocks: u16,
    /// Dictionary id (0 = none; 1..=127, listed in the checkpoint's dictionary directory).
    pub dict: u16,
}

impl Record {
    /// A record with the reserved fields at their defaults.
    pub fn new(kind: RecordKind, lba: u64, count: u32, seq: u64) -> Record {
        Record {
            kind,
            codec: 0,
            len: 0,
            lba,
            count,
            offset: 0,
            seq,
            crc: 0,
            unit_index: 0,
            unit_blocks: 1,
            dict: 0,
        }
    }

    /// Whether it names a dictionary id a map entry cannot hold (7 bits), or has a unit shape
    /// that no writer produces (a damaged or foreign table).
    pub fn uses_unsupported_features(&self) -> bool {
        self.kind == RecordKind::Data
            && (self.dict > 127
                || !(1..=u16::from(UNIT_BLOCKS_MAX)).contains(&self.unit_blocks)
                || u16::from(self.unit_index) >= self.unit_blocks)
    }

    /// Whether it is one block of a multi-block compression unit.
    pub fn in_unit(&self) -> bool {
        self.kind == RecordKind::Data && self.unit_blocks > 1
    }

    fn encode(&self, b: &mut [u8]) {
        b[0] = match self.kind {
            RecordKind::Data => 1,
            RecordKind::Zero => 2,
            RecordKind::Trim => 3,
        };
        b[1] = self.codec;
        b[2] = self.unit_index;
        put_u32(b, 4, self.len);
        put_u64(b, 8, self.lba);
        put_u32(b, 16, self.count);
        put_u32(b, 20, self.offset);
        put_u64(b, 24, self.seq);
        put_u32(b, 32, self.crc);
        put_u16(b, 36, self.unit_blocks);
        put_u16(b, 38, self.dict);
    }

    fn decode(b: &[u8]) -> Option<Record> {
        let kind = match b[0] {
            1 => RecordKind::Data,
            2 => RecordKind::Zero,
            3 => RecordKind::Trim,
            _ => return None,
        };
        Some(Record {
            kind,
            codec: b[1],
            len: get_u32(b, 4),
            lba: get_u64(b, 8),
            count: get_u32(b, 16),
            offset: get_u32(b, 20),
            seq: get_u64(b, 24),
            crc: get_u32(b, 32),
            unit_index: b[2],
            unit_blocks: get_u16(b, 36),
            dict: get_u16(b, 38),
        })
    }
}

/// Header of a segment. v1: header, payloads, record table, zero padding to a sector. v2: the
/// same followed by a second copy of the record table and a footer (a copy of the header with
/// its own magic) that end exactly at the segment's last sector, so that a damaged header is
/// recovered from the footer and a reader can find the segment by scanning sector ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Format version of the segment (the volume's).
    pub version: u32,
    /// Allocation sequence of the extent when this segment was written.
    pub alloc_seq: u64,
    /// Extent index.
    pub extent: u32,
    /// Byte offset of this segment inside its extent.
    pub seg_offset: u32,
    /// Bytes of payload after the header.
    pub payload_len: u32,
    /// Records in the table.
    pub record_count: u32,
    /// v2: every record with a write sequence up to this was covered by a completed sync when
    /// the segment was written (v1: 0). Recovery uses it to tell damage from a torn write.
    pub durable_seq: u64,
}

impl SegmentHeader {
    /// Total bytes of the segment including sector padding.
    pub fn padded_len(&self) -> u64 {
        segment_padded_len(
            self.version,
            self.payload_len as usize,
            self.record_count as usize,
        )
    }
}

/// Bytes a segment of `payload_len` payload and `records` records takes in format `version`,
/// padded to a sector. A v2 segment takes at least two sectors, so that its header and footer
/// never share one.
pub fn segment_padded_len(version: u32, payload_len: usize, records: usize) -> u64 {
    let raw = segment_raw_len(version, payload_len, records);
    if version < 2 {
        return align_up(raw, SECTOR_BYTES as u64);
    }
    align_up(raw, SECTOR_BYTES as u64).max(2 * SECTOR_BYTES as u64)
}

/// Bytes of a segment before padding: header (and footer, v2), payload, record table (and its
/// copy, v2). Never more than [`segment_padded_len`].
pub fn segment_raw_len(version: u32, payload_len: usize, records: usize) -> u64 {
    let table = records * RECORD_BYTES;
    if version < 2 {
        return (SEGMENT_HEADER_BYTES + payload_len + table) as u64;
    }
    (2 * SEGMENT_HEADER_BYTES + payload_len + 2 * table) as u64
}

fn encode_seg_block(hb: &mut [u8], magic: &[u8; 8], uuid: &[u8; 16], h: &SegmentHeader) {
    hb.fill(0);
    hb[0..8].copy_from_slice(magic);
    hb[8..24].copy_from_slice(uuid);
    put_u64(hb, 24, h.alloc_seq);
    put_u32(hb, 32, h.extent);
    put_u32(hb, 36, h.seg_offset);
    put_u32(hb, 40, h.payload_len);
    put_u32(hb, 44, h.record_count);
    put_u16(hb, 48, h.version as u16);
    if h.version >= 2 {
        put_u64(hb, 56, h.durable_seq);
    }
}

fn seg_block_crc(hb: &[u8], table: &[u8]) -> u32 {
    let mut zeroed = [0u8; SEGMENT_HEADER_BYTES];
    zeroed.copy_from_slice(&hb[..SEGMENT_HEADER_BYTES]);
    zeroed[52..56].fill(0);
    crc32c::crc32c_append(crc32c::crc32c(&zeroed), table)
}

/// Writes header, record table(s) and (v2) footer around the payload already at
/// `buf[seg_offset + SEGMENT_HEADER_BYTES ..]`; returns the padded segment length.
pub fn seal_segment(
    buf: &mut [u8],
    uuid: &[u8; 16],
    h: &SegmentHeader,
    records: &[Record],
) -> usize {
    let h = SegmentHeader {
        record_count: records.len() as u32,
        ..*h
    };
    let start = h.seg_offset as usize;
    let table = start + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let tlen = records.len() * RECORD_BYTES;
    let total = h.padded_len() as usize;
    for (i, r) in records.iter().enumerate() {
        let o = table + i * RECORD_BYTES;
        buf[o..o + RECORD_BYTES].fill(0);
        r.encode(&mut buf[o..o + RECORD_BYTES]);
    }
    buf[table + tlen..start + total].fill(0);
    encode_seg_block(
        &mut buf[start..start + SEGMENT_HEADER_BYTES],
        SEG_MAGIC,
        uuid,
        &h,
    );
    let crc = seg_block_crc(&buf[start..], &buf[table..table + tlen]);
    put_u32(&mut buf[start..], 52, crc);
    if h.version >= 2 {
        let footer = start + total - SEGMENT_HEADER_BYTES;
        let table2 = footer - tlen;
        buf.copy_within(table..table + tlen, table2);
        encode_seg_block(
            &mut buf[footer..footer + SEGMENT_HEADER_BYTES],
            SEG_FOOTER_MAGIC,
            uuid,
            &h,
        );
        let crc = seg_block_crc(&buf[footer..], &buf[table2..footer]);
        put_u32(&mut buf[footer..], 52, crc);
    }
    total
}

/// What a segment must carry to belong to an extent's current allocation.
#[derive(Clone, Copy, Debug)]
pub struct SegmentOwner<'a> {
    /// Volume uuid.
    pub uuid: &'a [u8; 16],
    /// Format version of the volume.
    pub version: u32,
    /// Extent index.
    pub extent: u32,
    /// Allocation sequence of the extent.
    pub alloc_seq: u64,
}

/// Checks one header or footer block and its record table.
fn parse_seg_block(
    hb: &[u8],
    magic: &[u8; 8],
    ext: &[u8],
    owner: &SegmentOwner,
    table_at: impl Fn(&SegmentHeader) -> Option<usize>,
) -> Result<(SegmentHeader, Vec<Record>)> {
    let bad = || corrupt("no valid segment here");
    if hb.len() < SEGMENT_HEADER_BYTES || &hb[0..8] != magic || &hb[8..24] != owner.uuid {
        return Err(bad());
    }
    let h = SegmentHeader {
        version: u32::from(get_u16(hb, 48)),
        alloc_seq: get_u64(hb, 24),
        extent: get_u32(hb, 32),
        seg_offset: get_u32(hb, 36),
        payload_len: get_u32(hb, 40),
        record_count: get_u32(hb, 44),
        durable_seq: if owner.version >= 2 {
            get_u64(hb, 56)
        } else {
            0
        },
    };
    if h.alloc_seq != owner.alloc_seq || h.extent != owner.extent || h.version != owner.version {
        return Err(bad());
    }
    let seg_offset = h.seg_offset as usize;
    let end = (h.record_count as usize)
        .checked_mul(RECORD_BYTES)
        .and_then(|t| seg_offset.checked_add(SEGMENT_HEADER_BYTES)?.checked_add(t))
        .and_then(|e| e.checked_add(h.payload_len as usize));
    let Some(end) = end else { return Err(bad()) };
    if end > ext.len() || seg_offset as u64 + h.padded_len() > ext.len() as u64 {
        return Err(bad());
    }
    let table = table_at(&h).ok_or_else(bad)?;
    let tlen = h.record_count as usize * RECORD_BYTES;
    let tb = ext.get(table..table + tlen).ok_or_else(bad)?;
    if seg_block_crc(hb, tb) != get_u32(hb, 52) {
        return Err(bad());
    }
    let payload_end = seg_offset + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let mut records = Vec::with_capacity(h.record_count as usize);
    for i in 0..h.record_count as usize {
        let r = Record::decode(&tb[i * RECORD_BYTES..(i + 1) * RECORD_BYTES]).ok_or_else(bad)?;
        if r.kind == RecordKind::Data {
            let end = r.offset as usize + r.len as usize;
            if (r.offset as usize) < seg_offset + SEGMENT_HEADER_BYTES
                || end > payload_end
                || r.len as usize > BLOCK_BYTES * usize::from(r.unit_blocks.max(1))
            {
                return Err(bad());
            }
        }
        records.push(r);
    }
    Ok((h, records))
}

/// Parses the segment whose header is at `seg_offset` of an extent image. An error when there
/// is no valid header there (end of the chain, torn, damaged, foreign, or from an older
/// allocation of the extent). Payload checksums are verified by the caller.
pub fn parse_segment(
    ext: &[u8],
    owner: &SegmentOwner,
    seg_offset: usize,
) -> Result<(SegmentHeader, Vec<Record>)> {
    let hb = ext
        .get(seg_offset..seg_offset + SEGMENT_HEADER_BYTES)
        .ok_or_else(|| corrupt("segment offset past the extent"))?;
    let (h, r) = parse_seg_block(hb, SEG_MAGIC, ext, owner, |h| {
        Some(h.seg_offset as usize + SEGMENT_HEADER_BYTES + h.payload_len as usize)
    })?;
    if h.seg_offset as usize != seg_offset {
        return Err(corrupt("segment header names another offset"));
    }
    Ok((h, r))
}

/// Parses the v2 segment whose footer ends at `end` (a sector boundary) of an extent image:
/// how a segment with a damaged header is still read, and how recovery finds the segments after
/// one that is damaged beyond repair.
pub fn parse_segment_footer(
    ext: &[u8],
    owner: &SegmentOwner,
    end: usize,
) -> Result<(SegmentHeader, Vec<Record>)> {
    if owner.version < 2 || end < SEGMENT_HEADER_BYTES || end > ext.len() {
        return Err(corrupt("no segment footer here"));
    }
    let footer = end - SEGMENT_HEADER_BYTES;
    let (h, r) = parse_seg_block(&ext[footer..end], SEG_FOOTER_MAGIC, ext, owner, |h| {
        footer.checked_sub(h.record_count as usize * RECORD_BYTES)
    })?;
    if h.seg_offset as u64 + h.padded_len() != end as u64 {
        return Err(corrupt("segment footer names another extent range"));
    }
    Ok((h, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(version: u32) -> Superblock {
        let mut sb = Superblock {
            version,
            uuid: [7; 16],
            logical_blocks: 1000,
            extent_bytes: 32768,
            extent_count: 40,
            codec_id: 1,
            codec_level: 0,
            queue_len: 16,
            map_pages: 4,
            checkpoint_offset: 8192,
            checkpoint_slot_bytes: 4096,
            map_offset: 16384,
            data_offset: 0,
            clean_low_pct: 10,
            clean_high_pct: 25,
            settings: 0,
            created_unix: 1,
            checkpoint_offset1: 8192,
            map_offset1: 16384,
            extent_table_pages: 0,
            extent_table_offset: [0, 0],
            dict_bytes: 0,
            dict_offset: [0, 0],
            unit_blocks: 1,
        };
        if version >= 2 {
            sb.extent_table_pages = 1;
            sb.extent_table_offset = [16384 + 8 * 4096, 0];
            sb.dict_offset = [16384 + 10 * 4096, 0];
            sb.checkpoint_offset1 = 16384 + 10 * 4096;
            sb.map_offset1 = sb.checkpoint_offset1 + 8192;
            sb.extent_table_offset[1] = sb.map_offset1 + 8 * 4096;
            sb.dict_offset[1] = sb.extent_table_offset[1] + 2 * 4096;
            sb.data_offset = sb.dict_offset[1];
        } else {
            sb.data_offset = 65536;
        }
        sb
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        for v in [1, 2] {
            let sb = sb(v);
            let mut b = sb.encode();
            assert_eq!(Superblock::decode(&b).ok(), Some(sb));
            b[33] ^= 1;
            assert!(matches!(
                Superblock::decode(&b),
                Err(Error::CorruptMetadata(_))
            ));
        }
        assert!(matches!(
            Superblock::decode(&[0u8; 4096]),
            Err(Error::NotAVolume(_))
        ));
    }

    #[test]
    fn superblock_keeps_settings_in_v2_only() {
        let mut v2 = sb(2);
        v2.settings = SB_SETTING_DICTIONARY;
        let b = v2.encode();
        assert_eq!(get_u32(&b, 160), SB_SETTING_DICTIONARY);
        assert_eq!(Superblock::decode(&b).ok(), Some(v2));
        let mut v1 = sb(1);
        v1.settings = SB_SETTING_DICTIONARY;
        assert_eq!(
            Superblock::decode(&v1.encode()).map(|s| s.settings).ok(),
            Some(0)
        );
    }

    #[test]
    fn superblock_keeps_the_unit_size_in_v2_only() {
        let mut v2 = sb(2);
        v2.unit_blocks = 4;
        assert_eq!(Superblock::decode(&v2.encode()).ok(), Some(v2.clone()));
        // Volumes made before units (byte 51 zero) write single blocks.
        let mut b = v2.encode();
        b[51] = 0;
        let crc = crc_skipping(&b, 12);
        put_u32(&mut b, 12, crc);
        assert_eq!(Superblock::decode(&b).map(|s| s.unit_blocks).ok(), Some(1));
        for bad in [3u8, 32] {
            b[51] = bad;
            let crc = crc_skipping(&b, 12);
            put_u32(&mut b, 12, crc);
            assert!(Superblock::decode(&b).is_err(), "unit of {bad} blocks");
        }
        let mut v1 = sb(1);
        v1.unit_blocks = 4;
        assert_eq!(
            Superblock::decode(&v1.encode()).map(|s| s.unit_blocks).ok(),
            Some(1)
        );
    }

    #[test]
    fn map_entries_of_units_round_trip_in_the_reserved_bits() {
        let entries = [
            MapEntry {
                state: BlockState::Data,
                codec: 2,
                len: 65024,
                extent: 7,
                offset: (1 << 20) - 512,
                crc: 0xdead_beef,
                unit_index: 15,
                unit_blocks: 16,
                dict: 0,
            },
            MapEntry {
                state: BlockState::Data,
                codec: 1,
                len: 3000,
                extent: 1,
                offset: 4096,
                crc: 5,
                unit_index: 0,
                unit_blocks: 1,
                dict: 127,
            },
            MapEntry::ZERO,
            MapEntry {
                state: BlockState::Corrupt,
                ..MapEntry::UNMAPPED
            },
        ];
        let page = encode_map_page(3, 9, &entries);
        // Single blocks keep the v1 encoding: state byte 2, location word = offset.
        let o = MAP_PAGE_HEADER_BYTES + MAP_ENTRY_BYTES;
        assert_eq!(page[o], 2);
        let mut out = [MapEntry::UNMAPPED; 4];
        decode_map_page(&page, 3, 9, &mut out).expect("decode");
        assert_eq!(out, entries);
        // Unit fields: state byte bits 3-7, location word bits 20-24 and 25-31.
        assert_eq!(page[MAP_PAGE_HEADER_BYTES], 2 | (15 << 3));
        assert_eq!(
            get_u32(&page, MAP_PAGE_HEADER_BYTES + 8),
            ((1 << 20) - 512) | (15 << 20)
        );
    }

    #[test]
    fn records_of_units_and_dictionaries_are_supported_within_their_ranges() {
        let r = |index: u8, blocks: u16, dict: u16| Record {
            unit_index: index,
            unit_blocks: blocks,
            dict,
            ..Record::new(RecordKind::Data, 0, 1, 1)
        };
        assert!(!r(0, 1, 0).uses_unsupported_features());
        assert!(!r(3, 4, 0).uses_unsupported_features());
        assert!(!r(15, 16, 0).uses_unsupported_features());
        assert!(r(4, 4, 0).uses_unsupported_features());
        assert!(r(0, 17, 0).uses_unsupported_features());
        assert!(r(0, 0, 0).uses_unsupported_features());
        assert!(!r(0, 4, 1).uses_unsupported_features());
        assert!(!r(0, 1, 127).uses_unsupported_features());
        // A map entry holds 7 bits of dictionary id.
        assert!(r(0, 1, 128).uses_unsupported_features());
        assert!(r(0, 4, 0).in_unit() && !r(0, 1, 0).in_unit());
    }

    #[test]
    fn checkpoint_round_trip() {
        for v in [1, 2] {
            let sb = sb(v);
            let mut c = Checkpoint::empty(&sb);
            c.seq = 9;
            c.write_seq = 100;
            c.next_alloc_seq = 50;
            c.counters = [3; COUNTERS];
            c.queue = vec![QueueEntry {
                extent: 4,
                alloc_seq: 49,
            }];
            c.page_slots = vec![0, 1, 2, 1];
            let mut b = c.encode(&sb);
            assert_eq!(Checkpoint::decode(&b, &sb).ok(), Some(c));
            let at = if v == 1 {
                CHECKPOINT_HEADER_BYTES
            } else {
                CHECKPOINT_V2_HEADER_BYTES
            };
            b[at] ^= 4;
            assert!(Checkpoint::decode(&b, &sb).is_err());
        }
    }

    #[test]
    fn segment_round_trip_rejects_other_generation_and_survives_header_damage() {
        for version in [1u32, 2] {
            let mut ext = vec![0u8; 8192];
            let payload_at = 512 + SEGMENT_HEADER_BYTES;
            ext[payload_at..payload_at + 10].copy_from_slice(b"0123456789");
            let r = Record {
                len: 10,
                offset: payload_at as u32,
                crc: 1,
                ..Record::new(RecordKind::Data, 3, 1, 5)
            };
            let h = SegmentHeader {
                version,
                alloc_seq: 77,
                extent: 2,
                seg_offset: 512,
                payload_len: 10,
                record_count: 1,
                durable_seq: if version >= 2 { 4 } else { 0 },
            };
            let n = seal_segment(&mut ext, &[9; 16], &h, &[r]);
            assert_eq!(n % SECTOR_BYTES, 0);
            let owner = SegmentOwner {
                uuid: &[9; 16],
                version,
                extent: 2,
                alloc_seq: 77,
            };
            assert_eq!(parse_segment(&ext, &owner, 512).ok(), Some((h, vec![r])));
            let other = SegmentOwner {
                alloc_seq: 78,
                ..owner
            };
            assert!(parse_segment(&ext, &other, 512).is_err());
            // One bit of the record count: the header fails, the footer (v2) still reads.
            ext[512 + 44] ^= 1;
            assert!(parse_segment(&ext, &owner, 512).is_err());
            let footer = parse_segment_footer(&ext, &owner, 512 + n);
            assert_eq!(footer.ok(), (version >= 2).then(|| (h, vec![r])));
        }
    }

    #[test]
    fn decoders_reject_short_and_garbage_input() {
        let sb = sb(2);
        for len in [0usize, 1, 63, 64, 100, 4095] {
            let b = vec![0xffu8; len];
            assert!(Superblock::decode(&b).is_err());
            assert!(Checkpoint::decode(&b, &sb).is_err());
            let mut out = [MapEntry::UNMAPPED; 4];
            assert!(decode_map_page(&b, 0, 1, &mut out).is_err());
            let owner = SegmentOwner {
                uuid: &[0xff; 16],
                version: 2,
                extent: u32::MAX,
                alloc_seq: u64::MAX,
            };
            assert!(parse_segment(&b, &owner, 0).is_err());
            assert!(parse_segment_footer(&b, &owner, len).is_err());
        }
    }
}
