//! Item checksums: what a map entry or record's `crc` is computed over.
//!
//! v1 and v2 items (map state 2, records without flag bit 0) carry CRC32C of their stored bytes.
//! That does not notice bytes decoded under the wrong interpretation: an lz4 block decodes to
//! the right length with any dictionary of the same size. v3 items (map state 5, records with
//! flag bit 0) carry a *seeded* checksum: CRC32C over a 24-byte seed naming the volume, codec,
//! unit size and dictionary identity, then the stored bytes. A block attributed to another
//! dictionary (an id reused after retirement, a misattributed entry), unit size or codec then
//! fails its check and reads as an error for every codec (docs/format.md, "Item checksum").

/// Bytes of the seed.
pub const ITEM_SEED_BYTES: usize = 24;

/// The identity of a trained dictionary as seeds name it: its id, the CRC32C of its encoded
/// bytes (the directory entry's `crc`) and its training sequence. An id reused after a
/// retirement names another identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DictIdentity {
    /// Dictionary id (1..=127).
    pub id: u16,
    /// CRC32C of the encoded dictionary.
    pub crc: u32,
    /// Training sequence.
    pub trained_seq: u64,
}

/// What an item's checksum is seeded with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemSeed([u8; ITEM_SEED_BYTES]);

impl ItemSeed {
    /// The seed of an item of `codec` and `unit_blocks` blocks on volume `uuid`, compressed
    /// with `dict` (`None`: no dictionary; its three fields are then zero).
    pub fn new(
        uuid: &[u8; 16],
        codec: u8,
        unit_blocks: u8,
        dict: Option<&DictIdentity>,
    ) -> ItemSeed {
        let d = dict.copied().unwrap_or_default();
        let mut s = [0u8; ITEM_SEED_BYTES];
        s[0..8].copy_from_slice(&uuid[..8]);
        s[8] = codec;
        s[9] = unit_blocks;
        s[10..12].copy_from_slice(&d.id.to_le_bytes());
        s[12..16].copy_from_slice(&d.crc.to_le_bytes());
        s[16..24].copy_from_slice(&d.trained_seq.to_le_bytes());
        ItemSeed(s)
    }

    /// The seeded checksum of `stored`.
    pub fn checksum(&self, stored: &[u8]) -> u32 {
        crc32c::crc32c_append(crc32c::crc32c(&self.0), stored)
    }
}

/// The checksum an item's map entry or record must carry: seeded with `uuid`, `codec`,
/// `unit_blocks` and `dict` when `seeded`, else the plain CRC32C of `stored`.
pub fn item_crc(
    uuid: &[u8; 16],
    seeded: bool,
    codec: u8,
    unit_blocks: u8,
    dict: Option<&DictIdentity>,
    stored: &[u8],
) -> u32 {
    if seeded {
        ItemSeed::new(uuid, codec, unit_blocks, dict).checksum(stored)
    } else {
        crc32c::crc32c(stored)
    }
}

impl super::MapEntry {
    /// Whether `stored` matches this entry's checksum, given the identity of the dictionary it
    /// names (if loaded): a seeded entry also checks codec, unit size and dictionary.
    pub fn checksum_matches(
        &self,
        uuid: &[u8; 16],
        dict: Option<&DictIdentity>,
        stored: &[u8],
    ) -> bool {
        item_crc(
            uuid,
            self.seeded,
            self.codec,
            self.unit_blocks,
            dict,
            stored,
        ) == self.crc
    }
}

impl super::Record {
    /// Whether `stored` matches this data record's checksum (as `MapEntry::checksum_matches`).
    pub fn checksum_matches(
        &self,
        uuid: &[u8; 16],
        dict: Option<&DictIdentity>,
        stored: &[u8],
    ) -> bool {
        let unit_blocks = u8::try_from(self.unit_blocks).unwrap_or(0);
        item_crc(uuid, self.seeded, self.codec, unit_blocks, dict, stored) == self.crc
    }
}

impl super::Superblock {
    /// Whether items written now carry seeded checksums (format v3 and later).
    pub fn seeds_items(&self) -> bool {
        self.version >= super::SEEDED_CHECKSUMS_VERSION
    }

    /// The checksum a new item of this volume carries, and whether it is seeded.
    pub fn new_item_checksum(
        &self,
        codec: u8,
        unit_blocks: u8,
        dict: Option<&DictIdentity>,
        stored: &[u8],
    ) -> (u32, bool) {
        let seeded = self.seeds_items();
        let crc = item_crc(&self.uuid, seeded, codec, unit_blocks, dict, stored);
        (crc, seeded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [7; 16];

    #[test]
    fn every_seed_field_changes_the_checksum() {
        let d = DictIdentity {
            id: 3,
            crc: 0x1234_5678,
            trained_seq: 99,
        };
        let bytes = b"stored bytes of one item";
        let base = ItemSeed::new(&UUID, 1, 1, Some(&d)).checksum(bytes);
        let mut other_uuid = UUID;
        other_uuid[0] ^= 1;
        let variants = [
            ItemSeed::new(&other_uuid, 1, 1, Some(&d)),
            ItemSeed::new(&UUID, 2, 1, Some(&d)),
            ItemSeed::new(&UUID, 1, 2, Some(&d)),
            ItemSeed::new(&UUID, 1, 1, Some(&DictIdentity { id: 4, ..d })),
            ItemSeed::new(&UUID, 1, 1, Some(&DictIdentity { crc: 1, ..d })),
            ItemSeed::new(
                &UUID,
                1,
                1,
                Some(&DictIdentity {
                    trained_seq: 100,
                    ..d
                }),
            ),
            ItemSeed::new(&UUID, 1, 1, None),
        ];
        for v in variants {
            assert_ne!(v.checksum(bytes), base, "{v:?}");
        }
        let plain = item_crc(&UUID, false, 1, 1, Some(&d), bytes);
        assert_ne!(plain, base);
        assert_eq!(plain, crc32c::crc32c(bytes));
        assert_eq!(item_crc(&UUID, true, 1, 1, Some(&d), bytes), base);
    }
}
