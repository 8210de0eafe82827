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
    /// Block `unit_index` of a shared item: its location, length and count are in the
    /// shared-block table under [`MapEntry::sbt_key`] (state 4, format bit 12: docs/format.md,
    /// "Bit 12: shared items"; only bit-10 map leaves hold it, never a v2 map page).
    Shared,
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

    /// A shared entry: block `index` of the item the SBT holds under `key` (both key fields
    /// below 2^48, which the SBT itself enforces).
    ///
    /// In RAM the key lives in fields a shared entry has no other use for, so a map entry stays
    /// 20 bytes (v2's map cache holds them decoded): the birth LBA in `extent` (low 32 bits)
    /// and `len` (high 16), the serial in `crc` (low 32) and `offset` (high 16). Read it back
    /// only through [`MapEntry::sbt_key`].
    pub fn shared(key: SbtKey, index: u8) -> MapEntry {
        debug_assert!(key.birth <= SBT_KEY_FIELD_MAX && key.serial <= SBT_KEY_FIELD_MAX);
        debug_assert!(index < UNIT_BLOCKS_MAX);
        MapEntry {
            state: BlockState::Shared,
            extent: key.birth as u32,
            len: (key.birth >> 32) as u16,
            crc: key.serial as u32,
            offset: ((key.serial >> 32) & 0xffff) as u32,
            unit_index: index,
            ..MapEntry::UNMAPPED
        }
    }

    /// The SBT key a shared entry names (`None` for any other state).
    pub fn sbt_key(&self) -> Option<SbtKey> {
        (self.state == BlockState::Shared).then(|| SbtKey {
            birth: u64::from(self.extent) | u64::from(self.len) << 32,
            serial: u64::from(self.crc) | u64::from(self.offset & 0xffff) << 32,
        })
    }

    pub(super) fn encode(&self, b: &mut [u8]) {
        if let Some(key) = self.sbt_key() {
            // State 4: index in bits 3-6, birth LBA at 1-6, serial at 8-13, the rest zero.
            b.fill(0);
            b[0] = 4 | (self.unit_index & 15) << 3;
            b[1..7].copy_from_slice(&key.birth.to_le_bytes()[..6]);
            b[8..14].copy_from_slice(&key.serial.to_le_bytes()[..6]);
            return;
        }
        let state = match self.state {
            BlockState::Unmapped => 0,
            BlockState::Zero => 1,
            BlockState::Data if self.seeded => 5,
            BlockState::Data => 2,
            BlockState::Corrupt => 3,
            BlockState::Shared => unreachable!("encoded above"),
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
        if b[0] & 7 == 4 {
            // Bytes no state-4 writer sets are refused: such an entry is damage, not a key.
            if b[0] & 0x80 != 0 || b[7] != 0 || b[14..16] != [0, 0] {
                return None;
            }
            let mut w = [0u8; 8];
            w[..6].copy_from_slice(&b[1..7]);
            let birth = u64::from_le_bytes(w);
            w[..6].copy_from_slice(&b[8..14]);
            let serial = u64::from_le_bytes(w);
            return Some(MapEntry::shared(SbtKey { birth, serial }, (b[0] >> 3) & 15));
        }
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
        // A v2 map page never holds a shared entry (state 4 is bit 12's, on bit-10 leaves).
        *e = MapEntry::decode(&b[o..o + MAP_ENTRY_BYTES])
            .filter(|e| e.state != BlockState::Shared)
            .ok_or_else(|| corrupt("map entry with an unknown state"))?;
    }
    Ok(())
}
