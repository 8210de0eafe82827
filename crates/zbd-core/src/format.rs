//! On-disk structures (docs/format.md is the specification; keep both in step).
//! Pure encode/decode: no I/O here.

use crate::error::{Error, Result};

/// Logical block size: the unit of mapping and compression.
pub const BLOCK_BYTES: usize = 4096;
/// Sector size: segments start on sector boundaries so a torn tail never damages durable bytes.
pub const SECTOR_BYTES: usize = 512;
/// On-disk format version (docs/format.md, "Version changes").
pub const FORMAT_VERSION: u32 = 1;
/// Bytes per superblock copy; two copies at offsets 0 and 4096.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Segment header size.
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
/// Fixed part of a checkpoint before the allocation queue.
pub const CHECKPOINT_HEADER_BYTES: usize = 256;
/// Bytes per allocation queue entry in a checkpoint.
pub const QUEUE_ENTRY_BYTES: usize = 16;
/// Persistent counters carried in each checkpoint.
pub const COUNTERS: usize = 16;
/// Smallest and largest extent sizes.
pub const EXTENT_BYTES_MIN: u32 = 8 * 1024;
/// Largest extent size.
pub const EXTENT_BYTES_MAX: u32 = 1024 * 1024;

const SUPER_MAGIC: &[u8; 8] = b"ZBDSUPER";
const CKPT_MAGIC: &[u8; 8] = b"ZBDCKPT1";
const SEG_MAGIC: &[u8; 8] = b"ZBDSEGM1";

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

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
    /// Map pages (each stored twice, copy-on-write).
    pub map_pages: u32,
    /// Byte offset of checkpoint slot A (slot B follows).
    pub checkpoint_offset: u64,
    /// Bytes per checkpoint slot.
    pub checkpoint_slot_bytes: u32,
    /// Byte offset of the map area.
    pub map_offset: u64,
    /// Byte offset of extent 0.
    pub data_offset: u64,
    /// Cleaner low watermark, % of extents free.
    pub clean_low_pct: u8,
    /// Cleaner high watermark, % of extents free.
    pub clean_high_pct: u8,
    /// Creation time, seconds since the epoch.
    pub created_unix: u64,
}

impl Superblock {
    /// Total bytes the volume occupies.
    pub fn total_bytes(&self) -> u64 {
        self.data_offset + u64::from(self.extent_count) * u64::from(self.extent_bytes)
    }

    /// Bytes of metadata (everything before the data area).
    pub fn metadata_bytes(&self) -> u64 {
        self.data_offset
    }

    /// Encodes into one superblock copy.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(SUPER_MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
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
            return Err(Error::CorruptMetadata(
                "superblock checksum mismatch".into(),
            ));
        }
        let version = get_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(Error::NotAVolume(format!(
                "format version {version}, this zbd reads {FORMAT_VERSION}"
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let sb = Superblock {
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
            checkpoint_offset: get_u64(b, 64),
            checkpoint_slot_bytes: get_u32(b, 72),
            map_offset: get_u64(b, 80),
            data_offset: get_u64(b, 88),
            created_unix: get_u64(b, 96),
        };
        if get_u32(b, 76) as usize != BLOCK_BYTES
            || !sb.extent_bytes.is_power_of_two()
            || !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&sb.extent_bytes)
            || u64::from(sb.map_pages) != sb.logical_blocks.div_ceil(MAP_ENTRIES_PER_PAGE as u64)
            || sb.queue_len == 0
            || !sb.regions_fit()
        {
            return Err(Error::CorruptMetadata(
                "superblock geometry is inconsistent".into(),
            ));
        }
        Ok(sb)
    }

    /// Whether the regions lie in order after the superblocks without overlapping, the checkpoint
    /// slot can hold a full queue, and the total size is representable. Checked arithmetic: a
    /// superblock with a valid CRC may still come from a foreign or hostile file, and an overflow
    /// here would panic (debug) or wrap into a bogus geometry (release).
    fn regions_fit(&self) -> bool {
        let slot = u64::from(self.checkpoint_slot_bytes);
        let slot_needed = CHECKPOINT_HEADER_BYTES as u64
            + u64::from(self.queue_len) * QUEUE_ENTRY_BYTES as u64
            + u64::from(self.map_pages).div_ceil(4);
        let map_bytes = 2 * u64::from(self.map_pages) * MAP_PAGE_BYTES as u64;
        let checkpoints_end = self.checkpoint_offset.checked_add(2 * slot);
        let map_end = self.map_offset.checked_add(map_bytes);
        let data_bytes = u64::from(self.extent_count) * u64::from(self.extent_bytes);
        self.checkpoint_offset >= 2 * SUPERBLOCK_BYTES as u64
            && slot >= slot_needed
            && checkpoints_end.is_some_and(|end| self.map_offset >= end)
            && map_end.is_some_and(|end| self.data_offset >= end)
            && self.data_offset.checked_add(data_bytes).is_some()
    }

    /// Byte offset of extent `e`.
    pub fn extent_offset(&self, e: u32) -> u64 {
        self.data_offset + u64::from(e) * u64::from(self.extent_bytes)
    }

    /// Byte offset of map page `page` in slot `slot` (0 = A, 1 = B).
    pub fn map_page_offset(&self, page: u32, slot: u8) -> u64 {
        self.map_offset + (u64::from(page) * 2 + u64::from(slot)) * MAP_PAGE_BYTES as u64
    }

    /// Byte offset of checkpoint slot `slot`.
    pub fn checkpoint_slot_offset(&self, slot: u64) -> u64 {
        self.checkpoint_offset + (slot % 2) * u64::from(self.checkpoint_slot_bytes)
    }
}

/// Checkpoint slot size for a queue of `queue_len` and `map_pages` map pages.
pub fn checkpoint_slot_bytes(queue_len: u32, map_pages: u32) -> u32 {
    let body = CHECKPOINT_HEADER_BYTES
        + queue_len as usize * QUEUE_ENTRY_BYTES
        + (map_pages as usize).div_ceil(4);
    align_up(body as u64, BLOCK_BYTES as u64) as u32
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

/// Which copy of a map page is current: none yet (all unmapped), slot A or slot B.
pub type PageSlot = u8;
/// Map page never written: every entry unmapped.
pub const PAGE_NONE: PageSlot = 0;

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
}

impl Checkpoint {
    /// Encodes into a checkpoint slot of `slot_bytes`.
    pub fn encode(&self, uuid: &[u8; 16], slot_bytes: u32) -> Vec<u8> {
        let mut b = vec![0u8; slot_bytes as usize];
        b[0..8].copy_from_slice(CKPT_MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
        b[16..32].copy_from_slice(uuid);
        put_u64(&mut b, 32, self.seq);
        put_u64(&mut b, 40, self.write_seq);
        put_u64(&mut b, 48, self.next_alloc_seq);
        put_u32(&mut b, 56, self.queue.len() as u32);
        put_u32(&mut b, 60, self.page_slots.len() as u32);
        for (i, c) in self.counters.iter().enumerate() {
            put_u64(&mut b, 64 + i * 8, *c);
        }
        let mut o = CHECKPOINT_HEADER_BYTES;
        for q in &self.queue {
            put_u32(&mut b, o, q.extent);
            put_u64(&mut b, o + 8, q.alloc_seq);
            o += QUEUE_ENTRY_BYTES;
        }
        for (i, s) in self.page_slots.iter().enumerate() {
            b[o + i / 4] |= (s & 3) << ((i % 4) * 2);
        }
        let used = o + self.page_slots.len().div_ceil(4);
        put_u32(&mut b, 64 + COUNTERS * 8, used as u32);
        let crc = crc_skipping(&b[..used], 12);
        put_u32(&mut b, 12, crc);
        b
    }

    /// Decodes a checkpoint slot; `None` when it is empty, torn or foreign.
    pub fn decode(b: &[u8], uuid: &[u8; 16], queue_max: u32, map_pages: u32) -> Option<Checkpoint> {
        if b.len() < CHECKPOINT_HEADER_BYTES || &b[0..8] != CKPT_MAGIC || &b[16..32] != uuid {
            return None;
        }
        let used = get_u32(b, 64 + COUNTERS * 8) as usize;
        let queue_len = get_u32(b, 56);
        let pages = get_u32(b, 60);
        if used > b.len()
            || queue_len > queue_max
            || pages != map_pages
            || get_u32(b, 8) != FORMAT_VERSION
        {
            return None;
        }
        if used
            != CHECKPOINT_HEADER_BYTES
                + queue_len as usize * QUEUE_ENTRY_BYTES
                + (pages as usize).div_ceil(4)
        {
            return None;
        }
        if get_u32(b, 12) != crc_skipping(&b[..used], 12) {
            return None;
        }
        let mut counters = [0u64; COUNTERS];
        for (i, c) in counters.iter_mut().enumerate() {
            *c = get_u64(b, 64 + i * 8);
        }
        let mut o = CHECKPOINT_HEADER_BYTES;
        let mut queue = Vec::with_capacity(queue_len as usize);
        for _ in 0..queue_len {
            queue.push(QueueEntry {
                extent: get_u32(b, o),
                alloc_seq: get_u64(b, o + 8),
            });
            o += QUEUE_ENTRY_BYTES;
        }
        let page_slots = (0..pages as usize)
            .map(|i| (b[o + i / 4] >> ((i % 4) * 2)) & 3)
            .collect();
        Some(Checkpoint {
            seq: get_u64(b, 32),
            write_seq: get_u64(b, 40),
            next_alloc_seq: get_u64(b, 48),
            counters,
            queue,
            page_slots,
        })
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

/// One map entry: where a logical block lives. 16 bytes on disk and in RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
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
}

impl MapEntry {
    /// A zero-state entry.
    pub const ZERO: MapEntry = MapEntry {
        state: BlockState::Zero,
        codec: 0,
        len: 0,
        extent: 0,
        offset: 0,
        crc: 0,
    };
    /// An unmapped entry.
    pub const UNMAPPED: MapEntry = MapEntry {
        state: BlockState::Unmapped,
        codec: 0,
        len: 0,
        extent: 0,
        offset: 0,
        crc: 0,
    };

    fn encode(&self, b: &mut [u8]) {
        b[0] = match self.state {
            BlockState::Unmapped => 0,
            BlockState::Zero => 1,
            BlockState::Data => 2,
            BlockState::Corrupt => 3,
        };
        b[1] = self.codec;
        put_u16(b, 2, self.len);
        put_u32(b, 4, self.extent);
        put_u32(b, 8, self.offset);
        put_u32(b, 12, self.crc);
    }

    fn decode(b: &[u8]) -> Option<MapEntry> {
        let state = match b[0] {
            0 => BlockState::Unmapped,
            1 => BlockState::Zero,
            2 => BlockState::Data,
            3 => BlockState::Corrupt,
            _ => return None,
        };
        Some(MapEntry {
            state,
            codec: b[1],
            len: get_u16(b, 2),
            extent: get_u32(b, 4),
            offset: get_u32(b, 8),
            crc: get_u32(b, 12),
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

/// Decodes a map page into `out`; `None` if it is damaged or belongs to another page.
pub fn decode_map_page(b: &[u8], page: u32, max_gen: u64, out: &mut [MapEntry]) -> Option<()> {
    if get_u32(b, 0) != page || get_u32(b, 4) != crc_skipping(b, 4) || get_u64(b, 8) > max_gen {
        return None;
    }
    for (i, e) in out.iter_mut().enumerate() {
        let o = MAP_PAGE_HEADER_BYTES + i * MAP_ENTRY_BYTES;
        *e = MapEntry::decode(&b[o..o + MAP_ENTRY_BYTES])?;
    }
    Some(())
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
    /// Stored length (data records).
    pub len: u32,
    /// First logical block.
    pub lba: u64,
    /// Blocks covered (1 for data records).
    pub count: u32,
    /// Byte offset of the stored bytes inside the extent (data records).
    pub offset: u32,
    /// Global write sequence: replay applies records in this order.
    pub seq: u64,
    /// CRC32C of the stored bytes (data records).
    pub crc: u32,
}

impl Record {
    fn encode(&self, b: &mut [u8]) {
        b[0] = match self.kind {
            RecordKind::Data => 1,
            RecordKind::Zero => 2,
            RecordKind::Trim => 3,
        };
        b[1] = self.codec;
        put_u32(b, 4, self.len);
        put_u64(b, 8, self.lba);
        put_u32(b, 16, self.count);
        put_u32(b, 20, self.offset);
        put_u64(b, 24, self.seq);
        put_u32(b, 32, self.crc);
        // 36..38 compression-unit blocks (reserved, 1), 38..40 dictionary id (reserved, 0).
        put_u16(b, 36, 1);
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
        })
    }
}

/// Header of a segment: `SEGMENT_HEADER_BYTES` at the segment start, payloads follow, then the
/// record table, then zero padding to a sector boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
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
}

impl SegmentHeader {
    /// Total bytes of the segment including sector padding.
    pub fn padded_len(&self) -> u64 {
        segment_padded_len(self.payload_len as usize, self.record_count as usize)
    }
}

/// Bytes a segment of `payload_len` payload and `records` records takes, padded to a sector.
pub fn segment_padded_len(payload_len: usize, records: usize) -> u64 {
    align_up(
        (SEGMENT_HEADER_BYTES + payload_len + records * RECORD_BYTES) as u64,
        SECTOR_BYTES as u64,
    )
}

/// Writes header and record table around the payload already at
/// `buf[seg_offset + SEGMENT_HEADER_BYTES ..]`; returns the padded segment length.
pub fn seal_segment(
    buf: &mut [u8],
    uuid: &[u8; 16],
    h: &SegmentHeader,
    records: &[Record],
) -> usize {
    let start = h.seg_offset as usize;
    let table = start + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let total = segment_padded_len(h.payload_len as usize, records.len()) as usize;
    for (i, r) in records.iter().enumerate() {
        let o = table + i * RECORD_BYTES;
        buf[o..o + RECORD_BYTES].fill(0);
        r.encode(&mut buf[o..o + RECORD_BYTES]);
    }
    let table_end = table + records.len() * RECORD_BYTES;
    buf[table_end..start + total].fill(0);
    let hb = &mut buf[start..start + SEGMENT_HEADER_BYTES];
    hb.fill(0);
    hb[0..8].copy_from_slice(SEG_MAGIC);
    hb[8..24].copy_from_slice(uuid);
    put_u64(hb, 24, h.alloc_seq);
    put_u32(hb, 32, h.extent);
    put_u32(hb, 36, h.seg_offset);
    put_u32(hb, 40, h.payload_len);
    put_u32(hb, 44, records.len() as u32);
    put_u16(hb, 48, FORMAT_VERSION as u16);
    let crc = crc32c::crc32c(&buf[start..start + SEGMENT_HEADER_BYTES]);
    let crc = crc32c::crc32c_append(crc, &buf[table..table_end]);
    put_u32(&mut buf[start..], 52, crc);
    total
}

/// Parses the segment at `seg_offset` of an extent image. Returns `None` when there is no valid
/// segment there (end of the chain, torn, foreign, or from an older allocation of the extent).
/// Payload checksums are verified by the caller.
pub fn parse_segment(
    ext: &[u8],
    uuid: &[u8; 16],
    extent: u32,
    alloc_seq: u64,
    seg_offset: usize,
) -> Option<(SegmentHeader, Vec<Record>)> {
    let hb = ext.get(seg_offset..seg_offset + SEGMENT_HEADER_BYTES)?;
    if &hb[0..8] != SEG_MAGIC || &hb[8..24] != uuid {
        return None;
    }
    let h = SegmentHeader {
        alloc_seq: get_u64(hb, 24),
        extent: get_u32(hb, 32),
        seg_offset: get_u32(hb, 36),
        payload_len: get_u32(hb, 40),
        record_count: get_u32(hb, 44),
    };
    if h.alloc_seq != alloc_seq || h.extent != extent || h.seg_offset as usize != seg_offset {
        return None;
    }
    let table = seg_offset + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let table_end = table.checked_add((h.record_count as usize).checked_mul(RECORD_BYTES)?)?;
    let tb = ext.get(table..table_end)?;
    let mut zeroed = [0u8; SEGMENT_HEADER_BYTES];
    zeroed.copy_from_slice(hb);
    zeroed[52..56].fill(0);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&zeroed), tb);
    if crc != get_u32(hb, 52) {
        return None;
    }
    let mut records = Vec::with_capacity(h.record_count as usize);
    for i in 0..h.record_count as usize {
        let r = Record::decode(&tb[i * RECORD_BYTES..(i + 1) * RECORD_BYTES])?;
        if r.kind == RecordKind::Data {
            let end = r.offset as usize + r.len as usize;
            if (r.offset as usize) < seg_offset + SEGMENT_HEADER_BYTES
                || end > table
                || r.len as usize > BLOCK_BYTES
            {
                return None;
            }
        }
        records.push(r);
    }
    Some((h, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_damage() {
        let sb = Superblock {
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
            data_offset: 65536,
            clean_low_pct: 10,
            clean_high_pct: 25,
            created_unix: 1,
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).ok(), Some(sb));
        b[33] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(Error::CorruptMetadata(_))
        ));
        assert!(matches!(
            Superblock::decode(&[0u8; 4096]),
            Err(Error::NotAVolume(_))
        ));
    }

    #[test]
    fn checkpoint_round_trip() {
        let c = Checkpoint {
            seq: 9,
            write_seq: 100,
            next_alloc_seq: 50,
            counters: [3; COUNTERS],
            queue: vec![QueueEntry {
                extent: 4,
                alloc_seq: 49,
            }],
            page_slots: vec![0, 1, 2, 1, 2],
        };
        let slot = checkpoint_slot_bytes(8, 5);
        let mut b = c.encode(&[1; 16], slot);
        assert_eq!(Checkpoint::decode(&b, &[1; 16], 8, 5), Some(c));
        b[CHECKPOINT_HEADER_BYTES] ^= 4;
        assert_eq!(Checkpoint::decode(&b, &[1; 16], 8, 5), None);
    }

    #[test]
    fn segment_round_trip_rejects_other_generation() {
        let mut ext = vec![0u8; 8192];
        let payload_at = 512 + SEGMENT_HEADER_BYTES;
        ext[payload_at..payload_at + 10].copy_from_slice(b"0123456789");
        let r = Record {
            kind: RecordKind::Data,
            codec: 0,
            len: 10,
            lba: 3,
            count: 1,
            offset: payload_at as u32,
            seq: 5,
            crc: 1,
        };
        let h = SegmentHeader {
            alloc_seq: 77,
            extent: 2,
            seg_offset: 512,
            payload_len: 10,
            record_count: 1,
        };
        let n = seal_segment(&mut ext, &[9; 16], &h, &[r]);
        assert_eq!(n % SECTOR_BYTES, 0);
        assert_eq!(
            parse_segment(&ext, &[9; 16], 2, 77, 512),
            Some((h, vec![r]))
        );
        assert_eq!(parse_segment(&ext, &[9; 16], 2, 78, 512), None);
        ext[payload_at + 10] ^= 1;
        assert_eq!(parse_segment(&ext, &[9; 16], 2, 77, 512), None);
    }
}
