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
    /// Data records: `crc` is the seeded item checksum (v3; flag bit 0), not the plain CRC32C
    /// of the stored bytes.
    pub seeded: bool,
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
        b[3] = u8::from(self.seeded);
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
            seeded: b[3] & 1 != 0,
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
    // A volume upgraded from v2 to v3 keeps its v2 segments (their records say how their items
    // are checksummed); otherwise a segment has its volume's version.
    let version_fits =
        h.version == owner.version || (owner.version >= SEEDED_CHECKSUMS_VERSION && h.version == 2);
    if h.alloc_seq != owner.alloc_seq || h.extent != owner.extent || !version_fits {
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
    // Only now, with the checksum good, is a flag a writer's word rather than damage.
    let unknown = get_u16(hb, 50) & !SEG_FLAGS_KNOWN;
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

/// Sets the flags of a sealed segment's header and (v2) footer and reseals both checksums, as a
/// newer writer would: what the refusal of unknown flags is tested with.
#[cfg(test)]
pub(crate) fn set_segment_flags(buf: &mut [u8], h: &SegmentHeader, flags: u16) {
    let start = h.seg_offset as usize;
    let tlen = h.record_count as usize * RECORD_BYTES;
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
