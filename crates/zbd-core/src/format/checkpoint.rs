//! Checkpoints: the allocation queue, map page slots and summaries, extent-table slots,
//! counters and the dictionary directory, written alternately to two slots. With flag bit 10
//! the map page slots give way to the metadata pages' extension ([`ExtensionBody`]).

use super::*;

/// Bytes a checkpoint body uses (before rounding to a slot).
pub(super) fn checkpoint_body_bytes(
    version: u32,
    queue_len: u32,
    map_pages: u32,
    et_pages: u32,
) -> u64 {
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

/// Where a bit-10 checkpoint's extension starts: after v2's header, the queue and the
/// extent-table slots, 8-aligned (format.md, "Checkpoint slot with bit 10").
fn extension_offset(queue_len: u32, et_pages: u32) -> usize {
    let fixed = CHECKPOINT_V2_HEADER_BYTES
        + queue_len as usize * QUEUE_ENTRY_BYTES
        + (et_pages as usize).div_ceil(4);
    fixed.next_multiple_of(8)
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

impl DictEntry {
    /// What item checksums name this dictionary by (equal to its loaded `Dictionary`'s).
    pub fn identity(&self) -> DictIdentity {
        DictIdentity {
            id: self.id,
            crc: self.crc,
            trained_seq: self.created_seq,
        }
    }
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
    /// Bit 10: the metadata pages' extension, in place of `page_slots` and `page_summaries`
    /// (both empty then). `Some` exactly when `flags` has `CKPT_FLAG_METADATA_PAGES`.
    pub extension: Option<ExtensionBody>,
}

/// Records the used length and the CRC over it, and keeps only the used part in whole 4 KiB
/// blocks: a reader checks `used` bytes and ignores the rest of the slot, which is sized for
/// the volume grown to its room.
fn seal(mut b: Vec<u8>, used: usize) -> Vec<u8> {
    put_u32(&mut b, 64 + COUNTERS * 8, used as u32);
    let crc = crc_skipping(&b[..used], 12);
    put_u32(&mut b, 12, crc);
    b.truncate(used.next_multiple_of(BLOCK_BYTES));
    b
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
            extension: None,
        }
    }

    /// An empty bit-10 checkpoint for `sb`'s geometry carrying `extension`.
    pub fn empty_bit10(sb: &Superblock, extension: ExtensionBody) -> Checkpoint {
        Checkpoint {
            page_slots: Vec::new(),
            page_summaries: Vec::new(),
            flags: CKPT_FLAG_METADATA_PAGES,
            extension: Some(extension),
            ..Checkpoint::empty(sb)
        }
    }

    /// Encodes for a checkpoint slot of `sb`'s size and version (the used part of it). An
    /// error when a bit-10 extension is inconsistent (`ExtensionBody::counted`), its flag and
    /// its presence disagree, or it passes the slot (a write past it would reach the next).
    pub fn encode(&self, sb: &Superblock) -> Result<Vec<u8>> {
        let bit10 = self.flags & CKPT_FLAG_METADATA_PAGES != 0;
        if bit10 != self.extension.is_some() || (bit10 && sb.version < 2) {
            return Err(Error::Invalid(
                "checkpoint flag bit 10 and its extension disagree".into(),
            ));
        }
        if let Some(x) = &self.extension {
            let at = extension_offset(
                self.queue.len() as u32,
                self.extent_table_slots.len() as u32,
            );
            return self.encode_bit10(sb, x, at);
        }
        let mut b = vec![0u8; sb.checkpoint_slot_bytes as usize];
        let v2 = sb.version >= 2;
        let mut o = self.encode_header(sb, &mut b, self.page_slots.len() as u32);
        if v2 {
            for (i, s) in self.page_slots.iter().enumerate() {
                let sum = self.page_summaries.get(i).copied().unwrap_or(0);
                b[o + i / 2] |= ((s & 3) | ((sum & 3) << 2)) << ((i % 2) * 4);
            }
            o += self.page_slots.len().div_ceil(2);
            o = self.encode_table_slots(&mut b, o);
        } else {
            for (i, s) in self.page_slots.iter().enumerate() {
                b[o + i / 4] |= (s & 3) << ((i % 4) * 2);
            }
            o += self.page_slots.len().div_ceil(4);
        }
        Ok(seal(b, o))
    }

    /// Bit 10's layout: v2's header, queue and table slots, then the extension at `at`.
    fn encode_bit10(&self, sb: &Superblock, x: &ExtensionBody, at: usize) -> Result<Vec<u8>> {
        let ext = x.encode()?;
        let used = at + ext.len();
        if used > sb.checkpoint_slot_bytes as usize {
            return Err(Error::Invalid(format!(
                "checkpoint of {used} bytes passes its slot of {} bytes",
                sb.checkpoint_slot_bytes
            )));
        }
        let mut b = vec![0u8; used.next_multiple_of(BLOCK_BYTES)];
        // Byte 60 keeps the map page count's place: region 0's ids, `pairs0`.
        let o = self.encode_header(sb, &mut b, x.header.pairs0);
        let o = self.encode_table_slots(&mut b, o);
        debug_assert_eq!(o.next_multiple_of(8), at);
        b[at..used].copy_from_slice(&ext);
        Ok(seal(b, used))
    }

    /// Magic, identity, sequences, the queue and page counts (`pages` at byte 60), counters,
    /// v2's flags, volume counters and dictionaries, then the queue: the offset after it.
    fn encode_header(&self, sb: &Superblock, b: &mut [u8], pages: u32) -> usize {
        b[0..8].copy_from_slice(CKPT_MAGIC);
        put_u32(b, 8, sb.version);
        b[16..32].copy_from_slice(&sb.uuid);
        put_u32(b, 56, self.queue.len() as u32);
        put_u32(b, 60, pages);
        put_u64(b, 32, self.seq);
        put_u64(b, 40, self.write_seq);
        put_u64(b, 48, self.next_alloc_seq);
        for (i, c) in self.counters.iter().enumerate() {
            put_u64(b, 64 + i * 8, *c);
        }
        let v2 = sb.version >= 2;
        let mut o = if v2 {
            put_u32(b, 196, self.flags);
            put_u32(b, 200, self.extent_table_slots.len() as u32);
            for (i, c) in self.volume_counters.iter().enumerate() {
                put_u64(b, 256 + i * 8, *c);
            }
            for (i, d) in self.dicts.iter().enumerate() {
                let o = 384 + i * DICT_ENTRY_BYTES;
                put_u16(b, o, d.id);
                b[o + 2] = d.codec;
                b[o + 3] = d.flags;
                put_u32(b, o + 4, d.region_offset);
                put_u32(b, o + 8, d.len);
                put_u32(b, o + 12, d.crc);
                put_u64(b, o + 16, d.created_seq);
                put_u64(b, o + 24, d.live_blocks);
            }
            CHECKPOINT_V2_HEADER_BYTES
        } else {
            CHECKPOINT_HEADER_BYTES
        };
        for q in &self.queue {
            put_u32(b, o, q.extent);
            put_u64(b, o + 8, q.alloc_seq);
            o += QUEUE_ENTRY_BYTES;
        }
        o
    }

    /// The extent-table slots at `o`: the offset after them.
    fn encode_table_slots(&self, b: &mut [u8], o: usize) -> usize {
        for (i, s) in self.extent_table_slots.iter().enumerate() {
            b[o + i / 4] |= (s & 3) << ((i % 4) * 2);
        }
        o + self.extent_table_slots.len().div_ceil(4)
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
        // v3's checkpoint is v2's: a volume just upgraded (`zbd upgrade`) opens from the v2
        // checkpoint its last v2 close wrote, and its next checkpoint says 3.
        let version = get_u32(b, 8);
        if version != sb.version && !(sb.version >= SEEDED_CHECKSUMS_VERSION && version == 2) {
            return Err(corrupt("checkpoint of another format version"));
        }
        let used = get_u32(b, 64 + COUNTERS * 8) as usize;
        if used > b.len() || used < 64 + COUNTERS * 8 + 4 {
            return Err(corrupt("checkpoint sizes are inconsistent"));
        }
        if get_u32(b, 12) != crc_skipping(&b[..used], 12) {
            return Err(corrupt("checkpoint checksum mismatch"));
        }
        let v2 = sb.version >= 2;
        // Intact, so a newer build wrote it: refuse by name before judging its layout, which
        // such a feature may change (taking it for damage would fall back to an older
        // checkpoint and undo the newer build's work).
        let unknown =
            if v2 { get_u32(b, 196) } else { 0 } & CKPT_FLAGS_INCOMPAT & !CKPT_FLAGS_INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(Error::NotAVolume(format!(
                "the volume uses features this zbd does not have (checkpoint flags {unknown:#x}); \
                 use a newer zbd"
            )));
        }
        let queue_len = get_u32(b, 56);
        let pages = get_u32(b, 60);
        let et_pages = if v2 { get_u32(b, 200) } else { 0 };
        // A v3 volume grown since this checkpoint was written (`zbd grow`) has more map and
        // extent-table pages than it lists: those were never written (all unmapped, all free).
        let grown_ok = |listed: u32, now: u32| {
            listed == now || (sb.version >= SEEDED_CHECKSUMS_VERSION && listed < now)
        };
        let bit10 = v2 && get_u32(b, 196) & CKPT_FLAG_METADATA_PAGES != 0;
        let needs = CKPT_FLAG_METADATA_PAGES | CKPT_FLAG_V3_SEGMENTS;
        if v2
            && get_u32(b, 196) & (CKPT_FLAG_SHARED_ITEMS | CKPT_FLAG_DEVICES | CKPT_FLAG_SNAPSHOTS)
                != 0
            && get_u32(b, 196) & needs != needs
        {
            return Err(corrupt(
                "checkpoint names shared items or devices without metadata pages and v3 segments",
            ));
        }
        // Bit 10: the extension follows the table slots and ends the used part; byte 60 is
        // its `pairs0`.
        let extension = if bit10 {
            let at = extension_offset(queue_len, et_pages);
            if at + EXTENSION_HEADER_BYTES > used {
                return Err(corrupt("checkpoint sizes are inconsistent"));
            }
            let x = ExtensionBody::decode(&b[at..used])?;
            if at + x.header.bytes as usize != used || x.header.pairs0 != pages {
                return Err(corrupt("checkpoint extension disagrees with its slot"));
            }
            Some(x)
        } else {
            None
        };
        if queue_len > sb.queue_len
            || !(bit10 || grown_ok(pages, sb.map_pages))
            || !grown_ok(et_pages, sb.extent_table_pages)
            || !(bit10
                || used as u64 == checkpoint_body_bytes(sb.version, queue_len, pages, et_pages))
        {
            return Err(corrupt("checkpoint sizes are inconsistent"));
        }
        let mut ck = match extension {
            Some(x) => Checkpoint::empty_bit10(sb, x),
            None => Checkpoint::empty(sb),
        };
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
            if !bit10 {
                // Pages past those listed (a grown volume) keep `empty`'s "never written".
                let nibble = |i: usize| (b[o + i / 2] >> ((i % 2) * 4)) & 15;
                for i in 0..pages {
                    ck.page_slots[i] = nibble(i) & 3;
                    ck.page_summaries[i] = nibble(i) >> 2;
                }
                o += pages.div_ceil(2);
            }
            for i in 0..et_pages as usize {
                ck.extent_table_slots[i] = (b[o + i / 4] >> ((i % 4) * 2)) & 3;
            }
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
