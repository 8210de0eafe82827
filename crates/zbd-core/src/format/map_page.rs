//! Map entries (16 bytes per logical block) and the 4 KiB map pages that hold them.

use super::*;

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
    /// `crc` is the seeded item checksum (v3, state 5 on disk) rather than the plain CRC32C of
    /// the stored bytes (state 2). Meaningful for `Data` only.
    pub seeded: bool,
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
        seeded: false,
    };

    /// Whether it is a block of a multi-block compression unit.
    pub fn in_unit(&self) -> bool {
        self.state == BlockState::Data && self.unit_blocks > 1
    }

    pub(super) fn encode(&self, b: &mut [u8]) {
        let state = match self.state {
            BlockState::Unmapped => 0,
            BlockState::Zero => 1,
            BlockState::Data if self.seeded => 5,
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

    pub(super) fn decode(b: &[u8]) -> Option<MapEntry> {
        let state = match b[0] & 7 {
            0 => BlockState::Unmapped,
            1 => BlockState::Zero,
            2 | 5 => BlockState::Data,
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
            seeded: b[0] & 7 == 5,
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
