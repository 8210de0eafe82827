//! The superblock: geometry, codec and settings of a volume, in two copies (v2).

use super::*;

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
    /// v3: map pages the map region has room for (>= `map_pages`; offset 164, 0 = no room
    /// beyond `map_pages`): `zbd grow --size` goes up to `map_pages_room` x 255 blocks.
    pub map_pages_room: u32,
    /// v3: extent-table pages the table region has room for (>= `extent_table_pages`; offset
    /// 168, 0 = none beyond): `zbd grow --capacity` goes up to this x 510 extents.
    pub extent_table_pages_room: u32,
}

/// Superblock setting: new blocks train and use dictionaries unless the open says otherwise
/// (`zbd create --dict on`).
pub const SB_SETTING_DICTIONARY: u32 = 1;
/// Setting: opens deduplicate inline unless `OpenOptions::dedup` says otherwise (needs format
/// bits 10 and 11).
pub const SB_SETTING_DEDUP: u32 = 2;

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
        if self.version >= 3 {
            put_u32(&mut b, 164, self.map_pages_room);
            put_u32(&mut b, 168, self.extent_table_pages_room);
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
            map_pages_room: 0,
            extent_table_pages_room: 0,
        };
        // No room recorded (v1, v2, or none asked for): the regions hold exactly the pages in use.
        let room = |at: usize, pages: u32| match get_u32(b, at) {
            r if version >= 3 && r != 0 => r,
            _ => pages,
        };
        let sb = Superblock {
            map_pages_room: room(164, sb.map_pages),
            extent_table_pages_room: room(168, sb.extent_table_pages),
            ..sb
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
            || sb.map_pages_room < sb.map_pages
            || sb.extent_table_pages_room < sb.extent_table_pages
            || !sb.regions_fit()
        {
            return Err(corrupt("superblock geometry is inconsistent"));
        }
        Ok(sb)
    }

    /// The metadata regions in on-disk order, as (offset, length).
    fn regions(&self) -> Vec<(u64, u64)> {
        let slots = 2 * u64::from(self.checkpoint_slot_bytes);
        let map = 2 * u64::from(self.map_pages_room) * MAP_PAGE_BYTES as u64;
        if self.version < 2 {
            return vec![(self.checkpoint_offset, slots), (self.map_offset, map)];
        }
        let et = 2 * u64::from(self.extent_table_pages_room) * MAP_PAGE_BYTES as u64;
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
        // Sized for the grown volume: a checkpoint of it must fit the same slot.
        let slot_needed = checkpoint_body_bytes(
            self.version,
            self.queue_len,
            self.map_pages_room,
            self.extent_table_pages_room,
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
