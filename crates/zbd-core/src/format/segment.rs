//! Log segments: what an extent receives at each write-back, a header and record table (and
//! from v2 a trailing copy of both) around the stored payload; records name each block.

use super::*;

/// Kind of a block record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// One logical block's stored bytes.
    Data,
    /// A range of blocks written with zeros.
    Zero,
    /// A range of blocks trimmed.
    Trim,
    /// One block becomes a reference to a stored item (a verified dedup hit); the record's
    /// payload is a [`RefPayload`] naming the target (64-byte records only; bit 12).
    Ref,
    /// One block of an item the cleaner copied: the copy here replaces the one at
    /// `source_extent`/`source_offset`, content unchanged (64-byte records only; bit 12).
    Move,
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
    /// First block, as a block key (`block_key`: its device and LBA; a 64-byte record
    /// stores them apart, a 40-byte one only names the default device, whose keys are LBAs).
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
    /// Data records: `crc` is the seeded item checksum (v3; flag bit 0), not the plain CRC32C
    /// of the stored bytes.
    pub seeded: bool,
    /// Data records in 64-byte form: the top 32 bits of the block's xxh3-128
    /// (`Fingerprint::manifest_part`), what makes an extent's record table a dedup manifest;
    /// 0 = none (40-byte records, and blocks the cleaner copied without decoding).
    pub fingerprint: u32,
    /// Move records: the extent and byte offset of the copy this one replaces (0 otherwise).
    pub source_extent: u32,
    pub source_offset: u32,
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
            seeded: false,
            fingerprint: 0,
            source_extent: 0,
            source_offset: 0,
        }
    }

    /// The device it writes (or, for a move, the item's birth device).
    pub fn device(&self) -> u32 {
        key_device(self.lba)
    }

    /// Whether it names a dictionary id a map entry cannot hold (7 bits), or has a unit shape
    /// that no writer produces (a damaged or foreign table).
    pub fn uses_unsupported_features(&self) -> bool {
        matches!(self.kind, RecordKind::Data | RecordKind::Move)
            && (self.dict > 127
                || !(1..=u16::from(UNIT_BLOCKS_MAX)).contains(&self.unit_blocks)
                || u16::from(self.unit_index) >= self.unit_blocks)
    }

    /// Whether it is one block of a multi-block compression unit.
    pub fn in_unit(&self) -> bool {
        self.kind == RecordKind::Data && self.unit_blocks > 1
    }

    fn kind_byte(&self) -> u8 {
        match self.kind {
            RecordKind::Data => 1,
            RecordKind::Zero => 2,
            RecordKind::Trim => 3,
            RecordKind::Ref => 4,
            RecordKind::Move => 5,
        }
    }

    fn kind_of(b: u8) -> Option<RecordKind> {
        match b {
            1 => Some(RecordKind::Data),
            2 => Some(RecordKind::Zero),
            3 => Some(RecordKind::Trim),
            4 => Some(RecordKind::Ref),
            5 => Some(RecordKind::Move),
            // 6 release step: its checkpoint bit (13) is refused first.
            _ => None,
        }
    }

    /// Encodes into `b`, 40 or 64 bytes (format.md, "Extents and segments" and "Bit 11").
    pub(super) fn encode(&self, b: &mut [u8]) {
        b.fill(0);
        b[0] = self.kind_byte();
        b[1] = self.codec;
        b[2] = self.unit_index;
        b[3] = u8::from(self.seeded);
        put_u32(b, 4, self.len);
        if b.len() == WIDE_RECORD_BYTES {
            // A unit holds at most 16 blocks and a dictionary id at most 127 (checked by every
            // writer's source, `uses_unsupported_features` on what it read).
            debug_assert!(self.unit_blocks <= 255 && self.dict <= 255);
            put_u32(b, 8, key_device(self.lba));
            put_u32(b, 12, self.fingerprint);
            put_u64(b, 16, key_lba(self.lba));
            put_u32(b, 24, self.count);
            put_u32(b, 28, self.offset);
            put_u64(b, 32, self.seq);
            put_u32(b, 40, self.crc);
            b[44] = self.unit_blocks as u8;
            b[45] = self.dict as u8;
            put_u32(b, 48, self.source_extent);
            put_u32(b, 52, self.source_offset);
            return;
        }
        debug_assert!(
            matches!(
                self.kind,
                RecordKind::Data | RecordKind::Zero | RecordKind::Trim
            ),
            "refs and moves are 64-byte records"
        );
        debug_assert_eq!(
            key_device(self.lba),
            DEFAULT_DEVICE,
            "a 40-byte record names device 1"
        );
        put_u64(b, 8, self.lba);
        put_u32(b, 16, self.count);
        put_u32(b, 20, self.offset);
        put_u64(b, 24, self.seq);
        put_u32(b, 32, self.crc);
        put_u16(b, 36, self.unit_blocks);
        put_u16(b, 38, self.dict);
    }

    /// Decodes a 40- or 64-byte record (by `b`'s length); `None` for a kind or flag this build
    /// does not write, or reserved bytes in use (the table's checksum passed, so a newer
    /// writer's, which its checkpoint flag refuses first).
    pub(super) fn decode(b: &[u8]) -> Option<Record> {
        let kind = Record::kind_of(b[0])?;
        if b[3] & !1 != 0 {
            return None;
        }
        let mut r = Record {
            codec: b[1],
            unit_index: b[2],
            seeded: b[3] & 1 != 0,
            len: get_u32(b, 4),
            ..Record::new(kind, 0, 0, 0)
        };
        if b.len() == WIDE_RECORD_BYTES {
            // Bytes 48-55 are a move's source (zero and trim steps' counts come with bit 14).
            let reserved_from = if kind == RecordKind::Move { 56 } else { 46 };
            if b[46..48] != [0, 0] || b[reserved_from..].iter().any(|&x| x != 0) {
                return None;
            }
            // A device no key can name, or an LBA past a device's keys, is no record this
            // build writes.
            let (device, lba) = (get_u32(b, 8), get_u64(b, 16));
            if !(DEFAULT_DEVICE..=DEVICE_KEY_MAX).contains(&device) || lba >= DEVICE_KEY_STRIDE {
                return None;
            }
            r.lba = block_key(device, lba);
            r.fingerprint = get_u32(b, 12);
            r.count = get_u32(b, 24);
            r.offset = get_u32(b, 28);
            r.seq = get_u64(b, 32);
            r.crc = get_u32(b, 40);
            r.unit_blocks = u16::from(b[44]);
            r.dict = u16::from(b[45]);
            r.source_extent = get_u32(b, 48);
            r.source_offset = get_u32(b, 52);
            if kind == RecordKind::Ref && r.len != REF_PAYLOAD_BYTES as u32 {
                return None;
            }
        } else {
            if matches!(kind, RecordKind::Ref | RecordKind::Move) {
                // v2's layout never held them.
                return None;
            }
            r.lba = get_u64(b, 8);
            r.count = get_u32(b, 16);
            r.offset = get_u32(b, 20);
            r.seq = get_u64(b, 24);
            r.crc = get_u32(b, 32);
            r.unit_blocks = get_u16(b, 36);
            r.dict = get_u16(b, 38);
        }
        Some(r)
    }
}

/// Bytes of a ref record's payload.
pub const REF_PAYLOAD_BYTES: usize = 64;
/// Ref payload flag: the target's checksum is v2's plain CRC32C, not a seeded one.
pub const REF_FLAG_UNSEEDED: u8 = 1;
/// Ref payload flag: the target's owner was an SBT entry when the ref committed, so replay's
/// owner search tries the SBT first (an order, never an answer).
pub const REF_FLAG_OWNER_SHARED: u8 = 2;
const REF_FLAGS_KNOWN: u8 = REF_FLAG_UNSEEDED | REF_FLAG_OWNER_SHARED;

/// What a ref record points at (format.md, "Ref payload"): the target item as its owner named
/// it when the ref committed, found again at replay by owner search from its birth and
/// location. Names no page id and no SBT serial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefPayload {
    /// Index of the referenced block in the target item.
    pub index: u32,
    /// Block key of the referenced block in its birth device (the item's birth key +
    /// `index`); stored as the device and its LBA.
    pub lba: u64,
    /// Where the target item lies: extent and byte offset.
    pub extent: u32,
    pub offset: u32,
    /// Its stored length, codec, unit blocks and dictionary id.
    pub stored_len: u32,
    pub codec: u8,
    pub unit_blocks: u8,
    pub dict: u8,
    /// [`REF_FLAG_UNSEEDED`], [`REF_FLAG_OWNER_SHARED`].
    pub flags: u8,
    /// The target item's checksum (seeded unless [`REF_FLAG_UNSEEDED`]).
    pub crc: u32,
}

impl RefPayload {
    pub fn encode(&self) -> [u8; REF_PAYLOAD_BYTES] {
        let mut b = [0u8; REF_PAYLOAD_BYTES];
        put_u32(&mut b, 0, key_device(self.lba));
        put_u32(&mut b, 4, self.index);
        put_u64(&mut b, 8, key_lba(self.lba));
        put_u32(&mut b, 16, self.extent);
        put_u32(&mut b, 20, self.offset);
        put_u32(&mut b, 24, self.stored_len);
        b[28] = self.codec;
        b[29] = self.unit_blocks;
        b[30] = self.dict;
        b[31] = self.flags;
        put_u32(&mut b, 32, self.crc);
        b
    }

    /// Decodes a payload whose CRC (the record's) already passed: unknown flags, reserved
    /// bytes in use, an index outside its unit or a unit no writer makes are damage.
    pub fn decode(b: &[u8]) -> Result<RefPayload> {
        if b.len() != REF_PAYLOAD_BYTES {
            return Err(corrupt("ref payload has the wrong size"));
        }
        let (device, lba) = (get_u32(b, 0), get_u64(b, 8));
        if !(DEFAULT_DEVICE..=DEVICE_KEY_MAX).contains(&device) || lba >= DEVICE_KEY_STRIDE {
            return Err(corrupt("ref payload names no device's block"));
        }
        let p = RefPayload {
            index: get_u32(b, 4),
            lba: block_key(device, lba),
            extent: get_u32(b, 16),
            offset: get_u32(b, 20),
            stored_len: get_u32(b, 24),
            codec: b[28],
            unit_blocks: b[29],
            dict: b[30],
            flags: b[31],
            crc: get_u32(b, 32),
        };
        if p.flags & !REF_FLAGS_KNOWN != 0 || b[36..].iter().any(|&x| x != 0) {
            return Err(corrupt("ref payload uses reserved bits"));
        }
        if !(1..=UNIT_BLOCKS_MAX).contains(&p.unit_blocks)
            || p.index >= u32::from(p.unit_blocks)
            || u64::from(p.index) > key_lba(p.lba)
            || p.dict > 127
        {
            return Err(corrupt("ref payload names no block of a unit"));
        }
        Ok(p)
    }

    /// The target item's birth LBA (its first block's).
    pub fn birth_lba(&self) -> u64 {
        self.lba - u64::from(self.index)
    }
}

/// How a segment is laid out: the format version and the header flags of bit 11 (format.md,
/// "Bit 11: v3 segments"). Writers take theirs from the volume and the write alignment
/// ([`SegmentForm::for_volume`]); readers from each segment's header, so one extent may hold
/// several forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentForm {
    /// Format version of the segment.
    pub version: u32,
    /// Header flags: [`SEG_FLAG_WIDE_RECORDS`], [`SEG_FLAG_4K`].
    pub flags: u16,
}

impl SegmentForm {
    /// The form of a volume without bit 11 (flags 0).
    pub const fn plain(version: u32) -> SegmentForm {
        SegmentForm { version, flags: 0 }
    }

    /// The form a writer of this volume uses: with checkpoint bit 11, 64-byte records, and the
    /// 4 KiB form where segments are padded to 4 KiB (a device of 4 KiB logical blocks), so
    /// that a lost device sector takes one copy of the header and record table, never both.
    /// Extents below [`SECTOR_4K_FORM_EXTENT_MIN`] keep the 512-byte form (padded to 4 KiB all
    /// the same): a raw block alone takes 12 KiB in the 4 KiB form.
    pub fn for_volume(
        version: u32,
        ckpt_flags: u32,
        write_align: usize,
        extent_bytes: u32,
    ) -> SegmentForm {
        if ckpt_flags & CKPT_FLAG_V3_SEGMENTS == 0 {
            return SegmentForm::plain(version);
        }
        let sector4k =
            if write_align >= SECTOR_4K_BYTES && extent_bytes >= SECTOR_4K_FORM_EXTENT_MIN {
                SEG_FLAG_4K
            } else {
                0
            };
        SegmentForm {
            version,
            flags: SEG_FLAG_WIDE_RECORDS | sector4k,
        }
    }

    /// The largest form a writer of this volume may use (on any device it is opened on): what
    /// decides whether a unit fits an extent.
    pub fn widest(version: u32, ckpt_flags: u32, extent_bytes: u32) -> SegmentForm {
        SegmentForm::for_volume(version, ckpt_flags, SECTOR_4K_BYTES, extent_bytes)
    }

    /// Incompressible 4 KiB blocks one segment of this form holds in an empty extent of
    /// `extent_bytes` (one record each; 0 when not even one fits).
    pub fn raw_blocks_fitting(self, extent_bytes: u32) -> u64 {
        (1..)
            .take_while(|&k| self.padded_len(k * BLOCK_BYTES, k) <= u64::from(extent_bytes))
            .last()
            .unwrap_or(0) as u64
    }

    /// Bytes per record.
    pub fn record_bytes(self) -> usize {
        if self.flags & SEG_FLAG_WIDE_RECORDS != 0 {
            WIDE_RECORD_BYTES
        } else {
            RECORD_BYTES
        }
    }

    /// The device sector the layout keeps header and footer apart by (and the alignment of the
    /// segment's start and end).
    pub fn sector(self) -> usize {
        if self.flags & SEG_FLAG_4K != 0 {
            SECTOR_4K_BYTES
        } else {
            SECTOR_BYTES
        }
    }

    /// Bytes of a segment before padding: header (and footer, v2), payload, record table (and
    /// its copy, v2). Never more than [`SegmentForm::padded_len`].
    pub fn raw_len(self, payload_len: usize, records: usize) -> u64 {
        let table = records * self.record_bytes();
        if self.version < 2 {
            return (SEGMENT_HEADER_BYTES + payload_len + table) as u64;
        }
        (2 * SEGMENT_HEADER_BYTES + payload_len + 2 * table) as u64
    }

    /// Bytes a segment of `payload_len` payload and `records` records takes, padded to its
    /// sector. A v2 segment takes at least two sectors, so that its header and footer never
    /// share one. The 4 KiB form goes further: the second table copy starts in a sector after
    /// the one the first copy ends in, so a lost 4 KiB sector takes one copy of the records,
    /// never both (issue 26), and a flushed block whose payload is lost reads as damage, never
    /// as its older value.
    pub fn padded_len(self, payload_len: usize, records: usize) -> u64 {
        let a = self.sector() as u64;
        let raw = self.raw_len(payload_len, records);
        if self.version < 2 {
            return align_up(raw, a);
        }
        let padded = align_up(raw, a).max(2 * a);
        if self.flags & SEG_FLAG_4K == 0 {
            return padded;
        }
        let table = (records * self.record_bytes()) as u64;
        let first_end = (SEGMENT_HEADER_BYTES + payload_len) as u64 + table;
        padded.max(align_up(
            align_up(first_end, a) + table + SEGMENT_HEADER_BYTES as u64,
            a,
        ))
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
    /// Header flags (bit 11's forms; 0 before it).
    pub flags: u16,
}

impl SegmentHeader {
    /// Its layout.
    pub fn form(&self) -> SegmentForm {
        SegmentForm {
            version: self.version,
            flags: self.flags,
        }
    }

    /// Total bytes of the segment including sector padding.
    pub fn padded_len(&self) -> u64 {
        self.form()
            .padded_len(self.payload_len as usize, self.record_count as usize)
    }

    /// Bytes of its record table (one copy).
    fn table_len(&self) -> usize {
        self.record_count as usize * self.form().record_bytes()
    }
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
    put_u16(hb, 50, h.flags);
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
    debug_assert!(
        start.is_multiple_of(h.form().sector()),
        "segment start off its sector"
    );
    let table = start + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let rb = h.form().record_bytes();
    let tlen = h.table_len();
    let total = h.padded_len() as usize;
    for (i, r) in records.iter().enumerate() {
        let o = table + i * rb;
        r.encode(&mut buf[o..o + rb]);
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
        flags: get_u16(hb, 50),
    };
    // A volume upgraded from v2 to v3 keeps its v2 segments (their records say how their items
    // are checksummed); otherwise a segment has its volume's version.
    let version_fits =
        h.version == owner.version || (owner.version >= SEEDED_CHECKSUMS_VERSION && h.version == 2);
    // Bit 11's forms exist from v3 on; a 4 KiB-form segment starts on a 4 KiB boundary.
    if h.alloc_seq != owner.alloc_seq
        || h.extent != owner.extent
        || !version_fits
        || (h.flags & SEG_FLAGS_KNOWN != 0 && h.version < SEEDED_CHECKSUMS_VERSION)
        || !(h.seg_offset as usize).is_multiple_of(h.form().sector())
    {
        return Err(bad());
    }
    let seg_offset = h.seg_offset as usize;
    let rb = h.form().record_bytes();
    let end = (h.record_count as usize)
        .checked_mul(rb)
        .and_then(|t| seg_offset.checked_add(SEGMENT_HEADER_BYTES)?.checked_add(t))
        .and_then(|e| e.checked_add(h.payload_len as usize));
    let Some(end) = end else { return Err(bad()) };
    if end > ext.len() || seg_offset as u64 + h.padded_len() > ext.len() as u64 {
        return Err(bad());
    }
    let table = table_at(&h).ok_or_else(bad)?;
    let tb = ext.get(table..table + h.table_len()).ok_or_else(bad)?;
    if seg_block_crc(hb, tb) != get_u32(hb, 52) {
        return Err(bad());
    }
    // Only now, with the checksum good, is a flag a writer's word rather than damage. (The
    // table's length came from bit 0, whose meaning a newer writer keeps.)
    let unknown = h.flags & !SEG_FLAGS_KNOWN;
    if unknown != 0 {
        return Err(Error::NotAVolume(format!(
            "the volume uses features this zbd does not have (segment flags {unknown:#x} in \
             extent {}); use a newer zbd",
            h.extent
        )));
    }
    let payload_end = seg_offset + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    let mut records = Vec::with_capacity(h.record_count as usize);
    for i in 0..h.record_count as usize {
        let r = Record::decode(&tb[i * rb..(i + 1) * rb]).ok_or_else(bad)?;
        // Data, move and ref records name bytes of this segment's payload.
        if matches!(
            r.kind,
            RecordKind::Data | RecordKind::Move | RecordKind::Ref
        ) {
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
        footer.checked_sub(h.table_len())
    })?;
    if h.seg_offset as u64 + h.padded_len() != end as u64 {
        return Err(corrupt("segment footer names another extent range"));
    }
    Ok((h, r))
}

/// Sets the flags of a sealed segment's header and (v2) footer and reseals both checksums, as a
/// newer writer would: what the refusal of unknown flags is tested with.
#[cfg(test)]
pub(crate) fn set_segment_flags(buf: &mut [u8], h: &SegmentHeader, flags: u16) {
    let start = h.seg_offset as usize;
    let tlen = h.table_len();
    let table = start + SEGMENT_HEADER_BYTES + h.payload_len as usize;
    put_u16(&mut buf[start..], 50, flags);
    let crc = seg_block_crc(&buf[start..], &buf[table..table + tlen]);
    put_u32(&mut buf[start..], 52, crc);
    if h.version >= 2 {
        let footer = start + h.padded_len() as usize - SEGMENT_HEADER_BYTES;
        put_u16(&mut buf[footer..], 50, flags);
        let crc = seg_block_crc(&buf[footer..], &buf[footer - tlen..footer]);
        put_u32(&mut buf[footer..], 52, crc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_with_an_unknown_flag_is_refused_by_name_and_a_damaged_one_is_not_a_segment() {
        for version in [2u32, 3] {
            let mut ext = vec![0u8; 8192];
            let h = SegmentHeader {
                version,
                alloc_seq: 5,
                extent: 3,
                seg_offset: 0,
                payload_len: 0,
                record_count: 1,
                durable_seq: 1,
                flags: 0,
            };
            let n = seal_segment(
                &mut ext,
                &[1; 16],
                &h,
                &[Record::new(RecordKind::Trim, 0, 1, 1)],
            );
            let owner = SegmentOwner {
                uuid: &[1; 16],
                version,
                extent: 3,
                alloc_seq: 5,
            };
            assert!(parse_segment(&ext, &owner, 0).is_ok());
            let mut flagged = ext.clone();
            set_segment_flags(&mut flagged, &h, 1 << 3);
            for found in [
                parse_segment(&flagged, &owner, 0),
                parse_segment_footer(&flagged, &owner, n),
            ] {
                let msg = found.expect_err("flagged segment accepted").to_string();
                assert!(msg.contains("segment flags 0x8"), "{msg}");
            }
            // The same bits without a resealed checksum are damage: no segment, no refusal.
            ext[50] = 8;
            assert!(matches!(
                parse_segment(&ext, &owner, 0),
                Err(Error::CorruptMetadata(_))
            ));
        }
    }
}
