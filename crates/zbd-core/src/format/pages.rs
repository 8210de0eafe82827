//! Metadata pages of format v3's checkpoint flag bit 10 (docs/format.md, "Bit 10: metadata
//! pages"): the 4 KiB page frame with its seeded CRC, the bodies of the page kinds step 1b
//! writes, the pair-state list entry and the checkpoint's extension header.
//!
//! Build step 1b (docs/design.md, "Build order") lands in pieces; this one is the byte layout
//! alone, so the pieces that follow (carver, page-tree map, PCT, release queue) share one tested
//! encoding. Nothing here is written by the engine yet. As everywhere in `format`, decoders take
//! any bytes, return a `Result` and never panic.

use super::*;
use std::sync::Arc;

/// Bytes of the frame header every metadata page starts with.
pub const PAGE_FRAME_HEADER_BYTES: usize = 16;
/// Bytes of a page body (after the frame header).
pub const PAGE_BODY_BYTES: usize = MAP_PAGE_BYTES - PAGE_FRAME_HEADER_BYTES;
/// Child-slot summary "every block below is unmapped"; never a page id.
pub const PAGE_ID_ALL_UNMAPPED: u32 = 0xFFFF_FFFE;
/// "None" where a field names a page; as a child slot, the summary "every block below is zero".
pub const PAGE_ID_NONE: u32 = 0xFFFF_FFFF;
/// Child slots of a map interior page.
pub const MAP_INTERIOR_SLOTS: usize = PAGE_BODY_BYTES / 4;
/// Ids one pair-state page covers (2 bits each).
pub const PAIR_STATE_IDS_PER_PAGE: usize = PAGE_BODY_BYTES * 4;
/// Pair-state pages one directory page lists.
pub const DIRECTORY_ENTRIES_PER_PAGE: usize = PAGE_BODY_BYTES / 8;
/// Page ids one list page holds.
pub const LIST_IDS_PER_PAGE: usize = PAGE_BODY_BYTES / 4;
/// Device rows one device-table page holds.
pub const DEVICE_ROWS_PER_PAGE: usize = 31;
/// Bytes of a device row.
pub const DEVICE_ROW_BYTES: usize = 128;
/// Longest device name, in bytes of UTF-8.
pub const DEVICE_NAME_BYTES: usize = 64;
/// Bytes of the node header B+-tree pages (PCT, release queue) start their body with.
pub const NODE_HEADER_BYTES: usize = 16;
/// Entries of a PCT leaf or interior page.
pub const PCT_ENTRIES_PER_PAGE: usize = (PAGE_BODY_BYTES - NODE_HEADER_BYTES) / 16;
/// Entries of an SBT leaf (32 bytes each).
pub const SBT_LEAF_ENTRIES: usize = (PAGE_BODY_BYTES - NODE_HEADER_BYTES) / 32;
/// Child slots of an SBT interior page (12-byte first key and u32 child each).
pub const SBT_INTERIOR_ENTRIES: usize = (PAGE_BODY_BYTES - NODE_HEADER_BYTES) / 16;
/// Entries of a release-queue page.
pub const RELEASE_ENTRIES_PER_PAGE: usize = (PAGE_BODY_BYTES - NODE_HEADER_BYTES) / 32;
/// Bytes of the checkpoint's extension header.
pub const EXTENSION_HEADER_BYTES: usize = 256;
/// Bytes of a pair-state list entry.
pub const PAIR_LIST_ENTRY_BYTES: usize = 8;

/// What a metadata page holds; part of its CRC seed, so a page read for another kind fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PageKind {
    /// 255 map entries.
    MapLeaf = 1,
    /// 1,020 child slots of a device's map tree.
    MapInterior = 2,
    /// Shared-block table leaf (bit 12).
    SbtLeaf = 3,
    /// Shared-block table interior page (bit 12).
    SbtInterior = 4,
    /// Page count table leaf.
    PctLeaf = 5,
    /// Page count table interior page.
    PctInterior = 6,
    /// 2 bits per page id.
    PairState = 7,
    /// Where the pair-state pages are.
    PairStateDirectory = 8,
    /// Device rows.
    DeviceTable = 9,
    /// Pending deletes and rollbacks.
    ReleaseQueue = 10,
    /// Page ids, in order.
    List = 11,
    /// Free extents and dead bytes per extent-table page (bit 5).
    ExtentSummary = 12,
    /// The dedup index's saved hooks (bit 4).
    DedupHooks = 13,
}

/// Where a page sits, as the walk or list that names it knows: every field is in the CRC seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageAddress {
    /// Page id (names a pair of slots).
    pub id: u32,
    /// Kind of page.
    pub kind: PageKind,
    /// Level in its tree (0 = leaf); 0 for pages outside trees.
    pub level: u8,
    /// A map page's logical index at its level; a listed page's index in its list; else 0.
    pub position: u64,
}

/// The frame words after the CRC: who made a map page and which checkpoint wrote the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameStamp {
    /// Map pages: the device that created the page; other pages: the high 32 bits of the
    /// writing checkpoint's sequence.
    pub creator: u32,
    /// Map pages: the creator's epoch when it created the page; other pages: 0.
    pub epoch: u32,
    /// Low 32 bits of the writing checkpoint's sequence.
    pub seq_low: u32,
}

impl FrameStamp {
    /// The stamp of a map page made by `device` at `epoch`, written by checkpoint `seq`.
    pub fn map(device: u32, epoch: u32, seq: u64) -> FrameStamp {
        FrameStamp {
            creator: device,
            epoch,
            seq_low: seq as u32,
        }
    }

    /// The stamp of any other page written by checkpoint `seq` (ordered in 64 bits).
    pub fn other(seq: u64) -> FrameStamp {
        FrameStamp {
            creator: (seq >> 32) as u32,
            epoch: 0,
            seq_low: seq as u32,
        }
    }

    /// The writing checkpoint's sequence of a page that is not a map page.
    pub fn other_seq(&self) -> u64 {
        (u64::from(self.creator) << 32) | u64::from(self.seq_low)
    }
}

fn frame_crc(uuid: &[u8; 16], at: &PageAddress, frame: &[u8]) -> u32 {
    let mut seed = [0u8; 24];
    seed[0..8].copy_from_slice(&uuid[0..8]);
    put_u32(&mut seed, 8, at.id);
    seed[12] = at.kind as u8;
    seed[13] = at.level;
    put_u64(&mut seed, 16, at.position);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&seed), &[0u8; 4]);
    crc32c::crc32c_append(crc, &frame[4..])
}

/// A whole page: frame header (CRC over the seed of `at` and the frame), then `body`.
pub fn seal_page(
    uuid: &[u8; 16],
    at: &PageAddress,
    stamp: &FrameStamp,
    body: &[u8; PAGE_BODY_BYTES],
) -> Arc<[u8]> {
    // One allocation written in place: a checkpoint's phase 1 seals every dirty page with the
    // state lock held, and a Vec turned into an Arc cost a second allocation and copy.
    let mut frame: Arc<[u8]> = Arc::from(&ZERO_FRAME[..]);
    let b = Arc::get_mut(&mut frame).expect("a new Arc is not shared");
    put_u32(b, 4, stamp.creator);
    put_u32(b, 8, stamp.epoch);
    put_u32(b, 12, stamp.seq_low);
    b[PAGE_FRAME_HEADER_BYTES..].copy_from_slice(body);
    let crc = frame_crc(uuid, at, b);
    put_u32(b, 0, crc);
    frame
}

/// What a sealed frame starts from (copying it costs about what zeroing would).
static ZERO_FRAME: [u8; MAP_PAGE_BYTES] = [0; MAP_PAGE_BYTES];

/// Checks a page read for `at` and returns its stamp and body; an error when it is damaged, of
/// another kind, level or position, or another page's.
pub fn open_page<'a>(
    b: &'a [u8],
    uuid: &[u8; 16],
    at: &PageAddress,
) -> Result<(FrameStamp, &'a [u8])> {
    if b.len() != MAP_PAGE_BYTES {
        return Err(corrupt("metadata page has the wrong size"));
    }
    if get_u32(b, 0) != frame_crc(uuid, at, b) {
        return Err(Error::CorruptMetadata(format!(
            "metadata page {} ({:?}, level {}, position {}) damaged or not that page",
            at.id, at.kind, at.level, at.position
        )));
    }
    let stamp = FrameStamp {
        creator: get_u32(b, 4),
        epoch: get_u32(b, 8),
        seq_low: get_u32(b, 12),
    };
    Ok((stamp, &b[PAGE_FRAME_HEADER_BYTES..]))
}

fn body() -> Box<[u8; PAGE_BODY_BYTES]> {
    Box::new([0u8; PAGE_BODY_BYTES])
}

fn whole_body(b: &[u8]) -> Result<()> {
    if b.len() == PAGE_BODY_BYTES {
        Ok(())
    } else {
        Err(corrupt("page body has the wrong size"))
    }
}

/// A map leaf's body: up to 255 entries (the rest unmapped).
pub fn encode_map_leaf(entries: &[MapEntry]) -> Box<[u8; PAGE_BODY_BYTES]> {
    let mut b = body();
    for (i, e) in entries.iter().take(MAP_ENTRIES_PER_PAGE).enumerate() {
        e.encode(&mut b[i * MAP_ENTRY_BYTES..(i + 1) * MAP_ENTRY_BYTES]);
    }
    b
}

/// Decodes a map leaf's body into its 255 entries.
pub fn decode_map_leaf(b: &[u8]) -> Result<Vec<MapEntry>> {
    whole_body(b)?;
    b.chunks_exact(MAP_ENTRY_BYTES)
        .map(|c| MapEntry::decode(c).ok_or_else(|| corrupt("map entry with an unknown state")))
        .collect()
}

/// Entry `i` of a map leaf's body, read in place (a leaf frame stays its 4 KiB body).
pub fn map_leaf_entry(b: &[u8; PAGE_BODY_BYTES], i: usize) -> Result<MapEntry> {
    MapEntry::decode(&b[i * MAP_ENTRY_BYTES..(i + 1) * MAP_ENTRY_BYTES])
        .ok_or_else(|| corrupt("map entry with an unknown state"))
}

/// Writes entry `i` of a map leaf's body in place.
pub fn set_map_leaf_entry(b: &mut [u8; PAGE_BODY_BYTES], i: usize, e: &MapEntry) {
    e.encode(&mut b[i * MAP_ENTRY_BYTES..(i + 1) * MAP_ENTRY_BYTES]);
}

/// Child slot `i` of a map interior page's body, read in place.
pub fn map_child_slot(b: &[u8; PAGE_BODY_BYTES], i: usize) -> ChildSlot {
    ChildSlot::from_word(get_u32(&b[..], i * 4))
}

/// Writes child slot `i` of a map interior page's body in place.
pub fn set_map_child_slot(b: &mut [u8; PAGE_BODY_BYTES], i: usize, s: ChildSlot) {
    put_u32(&mut b[..], i * 4, s.word());
}

/// One child slot of a map interior page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildSlot {
    /// The child page.
    Page(u32),
    /// Every block below is unmapped (no page).
    AllUnmapped,
    /// Every block below reads as zeros (no page).
    AllZero,
}

impl ChildSlot {
    fn word(self) -> u32 {
        match self {
            ChildSlot::Page(id) => id,
            ChildSlot::AllUnmapped => PAGE_ID_ALL_UNMAPPED,
            ChildSlot::AllZero => PAGE_ID_NONE,
        }
    }

    fn from_word(w: u32) -> ChildSlot {
        match w {
            PAGE_ID_ALL_UNMAPPED => ChildSlot::AllUnmapped,
            PAGE_ID_NONE => ChildSlot::AllZero,
            id => ChildSlot::Page(id),
        }
    }
}

/// A map interior page's body: up to 1,020 child slots (the rest all unmapped).
pub fn encode_map_interior(slots: &[ChildSlot]) -> Box<[u8; PAGE_BODY_BYTES]> {
    let mut b = body();
    for i in 0..MAP_INTERIOR_SLOTS {
        let w = slots.get(i).map_or(PAGE_ID_ALL_UNMAPPED, |s| s.word());
        put_u32(&mut b[..], i * 4, w);
    }
    b
}

/// Decodes a map interior page's body into its 1,020 child slots.
pub fn decode_map_interior(b: &[u8]) -> Result<Vec<ChildSlot>> {
    whole_body(b)?;
    Ok((0..MAP_INTERIOR_SLOTS)
        .map(|i| ChildSlot::from_word(get_u32(b, i * 4)))
        .collect())
}

/// The state of one page id's pair of slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairState {
    /// Not in use.
    Free,
    /// In use; the current copy is in slot A.
    SlotA,
    /// In use; the current copy is in slot B.
    SlotB,
    /// Held out of allocation (docs/design.md, "Metadata extents").
    Reserved,
}

impl PairState {
    fn bits(self) -> u8 {
        match self {
            PairState::Free => 0,
            PairState::SlotA => 1,
            PairState::SlotB => 2,
            PairState::Reserved => 3,
        }
    }

    fn from_bits(v: u8) -> PairState {
        match v & 3 {
            0 => PairState::Free,
            1 => PairState::SlotA,
            2 => PairState::SlotB,
            _ => PairState::Reserved,
        }
    }
}

/// The state of the `i`-th id a pair-state page body covers (`i` below 16,320).
pub fn pair_state_at(body: &[u8; PAGE_BODY_BYTES], i: usize) -> PairState {
    PairState::from_bits(body[i / 4] >> (2 * (i % 4)))
}

/// Sets the state of the `i`-th id a pair-state page body covers (`i` below 16,320).
pub fn set_pair_state_at(body: &mut [u8; PAGE_BODY_BYTES], i: usize, s: PairState) {
    let shift = 2 * (i % 4);
    body[i / 4] = (body[i / 4] & !(3 << shift)) | (s.bits() << shift);
}

/// A pair-state page's body: the states of 16,320 consecutive ids.
pub fn encode_pair_states(states: &[PairState]) -> Box<[u8; PAGE_BODY_BYTES]> {
    let mut b = body();
    for (i, &s) in states.iter().take(PAIR_STATE_IDS_PER_PAGE).enumerate() {
        set_pair_state_at(&mut b, i, s);
    }
    b
}

/// Decodes a pair-state page's body (every 2-bit value is a state, so only its size can fail).
pub fn decode_pair_states(b: &[u8]) -> Result<Vec<PairState>> {
    let body: &[u8; PAGE_BODY_BYTES] = b
        .try_into()
        .map_err(|_| corrupt("page body has the wrong size"))?;
    Ok((0..PAIR_STATE_IDS_PER_PAGE)
        .map(|i| pair_state_at(body, i))
        .collect())
}

/// Which of a pair's two slots holds the current copy (directory entries, the checkpoint's
/// directory list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairSlot {
    /// The first slot of the pair.
    A,
    /// The second.
    B,
}

fn slot_byte(s: PairSlot) -> u8 {
    match s {
        PairSlot::A => 1,
        PairSlot::B => 2,
    }
}

fn slot_from(v: u8) -> Result<PairSlot> {
    match v {
        1 => Ok(PairSlot::A),
        2 => Ok(PairSlot::B),
        _ => Err(corrupt("pair slot is neither A nor B")),
    }
}

/// One entry of a pair-state directory page: where one pair-state page is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectoryEntry {
    /// The pair-state page's id (`None`: never written, every id it covers free).
    pub page: Option<u32>,
    /// Free ids in that page.
    pub free: u16,
    /// Its current slot.
    pub slot: PairSlot,
}

/// A directory page's body: up to 510 entries (the rest "never written").
pub fn encode_directory(entries: &[DirectoryEntry]) -> Box<[u8; PAGE_BODY_BYTES]> {
    let mut b = body();
    for i in 0..DIRECTORY_ENTRIES_PER_PAGE {
        let o = i * 8;
        match entries.get(i) {
            Some(e) => {
                put_u32(&mut b[..], o, e.page.unwrap_or(PAGE_ID_NONE));
                put_u16(&mut b[..], o + 4, e.free);
                b[o + 6] = slot_byte(e.slot);
            }
            None => put_u32(&mut b[..], o, PAGE_ID_NONE),
        }
    }
    b
}

/// Decodes a directory page's body into its 510 entries.
pub fn decode_directory(b: &[u8]) -> Result<Vec<DirectoryEntry>> {
    whole_body(b)?;
    b.chunks_exact(8)
        .map(|c| {
            let page = Some(get_u32(c, 0)).filter(|&p| p != PAGE_ID_NONE);
            let free = get_u16(c, 4);
            if usize::from(free) > PAIR_STATE_IDS_PER_PAGE {
                return Err(corrupt(
                    "directory entry counts more free ids than a page has",
                ));
            }
            // An entry never written names no slot; treat it as A (nothing to read).
            let slot = match page {
                Some(_) => slot_from(c[6])?,
                None => PairSlot::A,
            };
            Ok(DirectoryEntry { page, free, slot })
        })
        .collect()
}

/// A list page's body: up to 1,020 page ids in order, then "none".
pub fn encode_list(ids: &[u32]) -> Box<[u8; PAGE_BODY_BYTES]> {
    let mut b = body();
    for i in 0..LIST_IDS_PER_PAGE {
        put_u32(
            &mut b[..],
            i * 4,
            ids.get(i).copied().unwrap_or(PAGE_ID_NONE),
        );
    }
    b
}

/// Decodes a list page's body: the ids before the first "none".
pub fn decode_list(b: &[u8]) -> Result<Vec<u32>> {
    whole_body(b)?;
    let ids: Vec<u32> = (0..LIST_IDS_PER_PAGE)
        .map(|i| get_u32(b, i * 4))
        .take_while(|&id| id != PAGE_ID_NONE)
        .collect();
    if ids.contains(&PAGE_ID_ALL_UNMAPPED) {
        return Err(corrupt("list page names a summary as a page"));
    }
    Ok(ids)
}

/// What a device is (device row byte 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The volume's first device, the default export.
    Default,
    /// A read-only point-in-time image.
    Snapshot,
    /// A writable device made from a snapshot.
    Clone,
    /// Any other writable device.
    Other,
}

/// Device row flag: the device is being deleted, its tree given up in checkpointed steps
/// (part of it may be gone): it is never read, written or served, and a delete of it again
/// finishes the release.
pub const ROW_FLAG_DELETING: u16 = 4;
/// Device row flag: the origin is no longer listed (`zbd flatten`). A clone never depends on
/// its origin here (it holds its own references to every page and block it shares), so the
/// flag changes listings only.
pub const ROW_FLAG_FLATTENED: u16 = 2;
/// Snapshot row flag: the snapshot's origin (`parent`) is being rolled back to it. Set by a
/// checkpoint before the origin is emptied and cleared by the one that gives it the
/// snapshot's tree, so an origin a crash left half emptied is listed as "rolling back" and
/// the rollback can be finished (`zbd serve` does it before it serves), never served as if
/// whole.
pub const ROW_FLAG_ROLLBACK_TARGET: u16 = 8;
/// Row flag bits this build knows (read-only, origin hidden by flatten, being deleted,
/// rollback target). A row with another bit set was written by a build with a device state
/// this one cannot honour (bit 2 came without a checkpoint flag of its own), so it is
/// refused, never ignored.
const ROW_FLAGS_KNOWN: u16 = 0b1111;

/// One device row (128 bytes; docs/format.md, "Device row").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRow {
    /// Device id (1 = the default device; never reused).
    pub id: u32,
    /// The origin's id, for listings (0: none).
    pub parent: u32,
    /// Kind.
    pub kind: DeviceKind,
    /// Levels of its map tree, leaves included.
    pub depth: u8,
    /// Bit 0 read-only, bit 1 origin hidden by flatten ([`ROW_FLAG_FLATTENED`]), bit 2 being
    /// deleted ([`ROW_FLAG_DELETING`]), bit 3 the target of its origin's unfinished rollback
    /// ([`ROW_FLAG_ROLLBACK_TARGET`]).
    pub flags: u16,
    /// Root of its map tree.
    pub root: ChildSlot,
    /// Name, unique among rows.
    pub name: String,
    /// Logical size in blocks.
    pub blocks: u64,
    /// Write-sequence watermark of the checkpoint that created it.
    pub created_seq: u64,
    /// Creation time (Unix seconds).
    pub created_at: u64,
    /// Logical bytes in use.
    pub bytes_used: u64,
    /// Blocks in use.
    pub blocks_used: u64,
    /// Snapshots taken of it plus rollbacks.
    pub epoch: u32,
    /// Upper bound of its tree's pages.
    pub pages_max: u32,
}

impl DeviceRow {
    /// Encodes the row into 128 bytes; an error for a name that does not fit.
    pub fn encode(&self, b: &mut [u8]) -> Result<()> {
        let name = self.name.as_bytes();
        if name.is_empty() || name.len() > DEVICE_NAME_BYTES || name.contains(&0) {
            return Err(Error::Invalid(format!(
                "device name {:?}: 1 to {DEVICE_NAME_BYTES} bytes of UTF-8, no NUL",
                self.name
            )));
        }
        b[..DEVICE_ROW_BYTES].fill(0);
        put_u32(b, 0, self.id);
        put_u32(b, 4, self.parent);
        b[8] = match self.kind {
            DeviceKind::Default => 1,
            DeviceKind::Snapshot => 2,
            DeviceKind::Clone => 3,
            DeviceKind::Other => 4,
        };
        b[9] = self.depth;
        put_u16(b, 10, self.flags);
        put_u32(b, 12, self.root.word());
        b[16..16 + name.len()].copy_from_slice(name);
        put_u64(b, 80, self.blocks);
        put_u64(b, 88, self.created_seq);
        put_u64(b, 96, self.created_at);
        put_u64(b, 104, self.bytes_used);
        put_u64(b, 112, self.blocks_used);
        put_u32(b, 120, self.epoch);
        put_u32(b, 124, self.pages_max);
        Ok(())
    }

    /// Decodes a 128-byte row; `None` for an empty one (id 0).
    pub fn decode(b: &[u8]) -> Result<Option<DeviceRow>> {
        if b.len() < DEVICE_ROW_BYTES {
            return Err(corrupt("device row is short"));
        }
        let id = get_u32(b, 0);
        if id == 0 {
            return Ok(None);
        }
        let kind = match b[8] {
            1 => DeviceKind::Default,
            2 => DeviceKind::Snapshot,
            3 => DeviceKind::Clone,
            4 => DeviceKind::Other,
            _ => return Err(corrupt("device row of an unknown kind")),
        };
        let raw = &b[16..16 + DEVICE_NAME_BYTES];
        let len = raw
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(DEVICE_NAME_BYTES);
        if len == 0 || raw[len..].iter().any(|&c| c != 0) {
            return Err(corrupt("device name is empty or not zero-padded"));
        }
        let name = std::str::from_utf8(&raw[..len])
            .map_err(|_| corrupt("device name is not UTF-8"))?
            .to_string();
        let flags = get_u16(b, 10);
        if flags & !ROW_FLAGS_KNOWN != 0 {
            return Err(corrupt(&format!(
                "device row {id} ({name:?}) has flag bits {:#06x} this build does not know \
                 (written by a newer zbd?)",
                flags & !ROW_FLAGS_KNOWN
            )));
        }
        Ok(Some(DeviceRow {
            id,
            parent: get_u32(b, 4),
            kind,
            depth: b[9],
            flags,
            root: ChildSlot::from_word(get_u32(b, 12)),
            name,
            blocks: get_u64(b, 80),
            created_seq: get_u64(b, 88),
            created_at: get_u64(b, 96),
            bytes_used: get_u64(b, 104),
            blocks_used: get_u64(b, 112),
            epoch: get_u32(b, 120),
            pages_max: get_u32(b, 124),
        }))
    }
}

/// A device-table page's body: up to 31 rows (then empty rows and 112 reserved bytes).
pub fn encode_device_table(rows: &[DeviceRow]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
    if rows.len() > DEVICE_ROWS_PER_PAGE {
        return Err(Error::Invalid("more device rows than a page holds".into()));
    }
    let mut b = body();
    for (i, r) in rows.iter().enumerate() {
        r.encode(&mut b[i * DEVICE_ROW_BYTES..(i + 1) * DEVICE_ROW_BYTES])?;
    }
    Ok(b)
}

/// Decodes a device-table page's body: its rows, in order, up to the first empty one.
pub fn decode_device_table(b: &[u8]) -> Result<Vec<DeviceRow>> {
    whole_body(b)?;
    let mut rows = Vec::new();
    for c in b.chunks_exact(DEVICE_ROW_BYTES).take(DEVICE_ROWS_PER_PAGE) {
        match DeviceRow::decode(c)? {
            Some(r) => rows.push(r),
            None => break,
        }
    }
    Ok(rows)
}

/// One PCT entry: a leaf's (key, page, count) or an interior page's (first key, child).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PctEntry {
    /// Level in bits 60-63, position at that level in bits 0-59.
    pub key: u64,
    /// The counted page's id (leaf) or, with `key`, the first key of the child (interior).
    pub page: u32,
    /// The count (leaf) or the child page's id (interior).
    pub value: u32,
}

impl PctEntry {
    /// The key of a page at `level` and `position` (position below 2^60).
    pub fn key(level: u8, position: u64) -> u64 {
        (u64::from(level & 15) << 60) | (position & ((1 << 60) - 1))
    }
}

fn encode_node(entries: usize, body: &mut [u8]) {
    put_u16(body, 0, entries as u16);
}

fn node_entries(b: &[u8], max: usize) -> Result<usize> {
    whole_body(b)?;
    let n = usize::from(get_u16(b, 0));
    if n > max {
        return Err(corrupt("tree page holds more entries than fit"));
    }
    Ok(n)
}

/// A PCT page's body (leaf or interior: same layout); entries must be sorted by (key, page).
pub fn encode_pct(entries: &[PctEntry]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
    if entries.len() > PCT_ENTRIES_PER_PAGE {
        return Err(Error::Invalid("more PCT entries than a page holds".into()));
    }
    let mut b = body();
    encode_node(entries.len(), &mut b[..]);
    for (i, e) in entries.iter().enumerate() {
        let o = NODE_HEADER_BYTES + i * 16;
        put_u64(&mut b[..], o, e.key);
        put_u32(&mut b[..], o + 8, e.page);
        put_u32(&mut b[..], o + 12, e.value);
    }
    Ok(b)
}

/// Decodes a PCT page's body; an error when its entries are out of order.
pub fn decode_pct(b: &[u8]) -> Result<Vec<PctEntry>> {
    let n = node_entries(b, PCT_ENTRIES_PER_PAGE)?;
    let entries: Vec<PctEntry> = (0..n)
        .map(|i| {
            let o = NODE_HEADER_BYTES + i * 16;
            PctEntry {
                key: get_u64(b, o),
                page: get_u32(b, o + 8),
                value: get_u32(b, o + 12),
            }
        })
        .collect();
    if entries
        .windows(2)
        .any(|w| (w[0].key, w[0].page) >= (w[1].key, w[1].page))
    {
        return Err(corrupt("PCT page entries out of order"));
    }
    Ok(entries)
}

/// An SBT key: the shared item's birth LBA and its serial (48 bits each), compared in that
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SbtKey {
    pub birth: u64,
    pub serial: u64,
}

/// Largest value of a 48-bit SBT key field.
pub const SBT_KEY_FIELD_MAX: u64 = (1 << 48) - 1;

impl SbtKey {
    /// An error for a field past 48 bits: the page would hold another key.
    fn fits(&self) -> Result<()> {
        if self.birth > SBT_KEY_FIELD_MAX || self.serial > SBT_KEY_FIELD_MAX {
            return Err(Error::Invalid(format!("SBT key {self:?} passes 48 bits")));
        }
        Ok(())
    }

    fn encode(&self, b: &mut [u8]) {
        b[..6].copy_from_slice(&self.birth.to_le_bytes()[..6]);
        b[6..12].copy_from_slice(&self.serial.to_le_bytes()[..6]);
    }

    fn decode(b: &[u8]) -> SbtKey {
        let mut w = [0u8; 8];
        w[..6].copy_from_slice(&b[..6]);
        let birth = u64::from_le_bytes(w);
        w[..6].copy_from_slice(&b[6..12]);
        SbtKey {
            birth,
            serial: u64::from_le_bytes(w),
        }
    }
}

/// An SBT entry's value: where the shared item is, how it is stored, and its references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbtValue {
    pub extent: u32,
    /// Location word, as a map entry's (offset, unit blocks - 1, dictionary id).
    pub location: u32,
    pub stored_len: u16,
    pub codec: u8,
    /// Bit 0 damaged, bit 1 unseeded v2 checksum, bit 2 pinned.
    pub flags: u8,
    pub crc: u32,
    /// Exact reference count.
    pub count: u32,
}

/// SBT entry flag: the item's bytes failed their check; every reference reads EIO.
pub const SBT_FLAG_DAMAGED: u8 = 1;
/// SBT entry flag: the item carries v2's plain CRC32C, not a seeded checksum.
pub const SBT_FLAG_UNSEEDED: u8 = 2;
/// SBT entry flag: the count saturated; the item is never freed until `zbd compact` recounts.
pub const SBT_FLAG_PINNED: u8 = 4;

impl SbtValue {
    /// The entry of the direct item `e` names (any of its blocks: they share location, length,
    /// codec, unit, dictionary and checksum), with `count` references.
    pub fn of_item(e: &MapEntry, count: u32) -> SbtValue {
        SbtValue {
            extent: e.extent,
            location: (e.offset & LOC_OFFSET_MASK)
                | u32::from(e.unit_blocks.max(1) - 1) << 20
                | u32::from(e.dict & 127) << 25,
            stored_len: e.len,
            codec: e.codec,
            flags: if e.seeded { 0 } else { SBT_FLAG_UNSEEDED },
            crc: e.crc,
            count,
        }
    }

    /// Block `index` of the item as a direct entry would name it: what reads decode and
    /// check (damaged when the entry says so).
    pub fn block(&self, index: u8) -> MapEntry {
        MapEntry {
            state: if self.flags & SBT_FLAG_DAMAGED != 0 {
                BlockState::Corrupt
            } else {
                BlockState::Data
            },
            codec: self.codec,
            len: self.stored_len,
            extent: self.extent,
            offset: self.location & LOC_OFFSET_MASK,
            crc: self.crc,
            unit_index: index,
            unit_blocks: self.unit_blocks(),
            dict: (self.location >> 25) as u8,
            seeded: self.flags & SBT_FLAG_UNSEEDED == 0,
        }
    }

    /// The item as one entry of its whole stored length (a one-block view): what its extent
    /// is charged, one live block of `stored_len` bytes (`units::share` of it is the length).
    pub fn whole(&self) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            unit_blocks: 1,
            unit_index: 0,
            ..self.block(0)
        }
    }

    /// Blocks in the item (1 = a single block).
    pub fn unit_blocks(&self) -> u8 {
        ((self.location >> 20) & 15) as u8 + 1
    }

    /// Byte offset of the item in its extent.
    pub fn offset(&self) -> u32 {
        self.location & LOC_OFFSET_MASK
    }
}

/// An SBT leaf's body: up to 127 entries sorted by key, each key once.
pub fn encode_sbt_leaf(entries: &[(SbtKey, SbtValue)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
    if entries.len() > SBT_LEAF_ENTRIES {
        return Err(Error::Invalid("more SBT entries than a leaf holds".into()));
    }
    let mut b = body();
    encode_node(entries.len(), &mut b[..]);
    for (i, (k, v)) in entries.iter().enumerate() {
        let o = NODE_HEADER_BYTES + i * 32;
        k.fits()?;
        k.encode(&mut b[o..]);
        put_sbt_value(&mut b[..], o, v);
    }
    Ok(b)
}

/// The value half of the SBT leaf entry at byte `o`.
fn put_sbt_value(b: &mut [u8], o: usize, v: &SbtValue) {
    put_u32(b, o + 12, v.extent);
    put_u32(b, o + 16, v.location);
    put_u16(b, o + 20, v.stored_len);
    b[o + 22] = v.codec;
    b[o + 23] = v.flags;
    put_u32(b, o + 24, v.crc);
    put_u32(b, o + 28, v.count);
}

fn ascending<K: Ord, V>(entries: &[(K, V)], what: &str) -> Result<()> {
    if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(corrupt(what));
    }
    Ok(())
}

/// Decodes an SBT leaf's body; an error when its keys are out of order or repeated.
pub fn decode_sbt_leaf(b: &[u8]) -> Result<Vec<(SbtKey, SbtValue)>> {
    let n = node_entries(b, SBT_LEAF_ENTRIES)?;
    let entries: Vec<(SbtKey, SbtValue)> = (0..n).map(|i| sbt_leaf_entry(b, i)).collect();
    ascending(&entries, "SBT leaf entries out of order")?;
    Ok(entries)
}

fn sbt_leaf_entry(b: &[u8], i: usize) -> (SbtKey, SbtValue) {
    let o = NODE_HEADER_BYTES + i * 32;
    (
        SbtKey::decode(&b[o..]),
        SbtValue {
            extent: get_u32(b, o + 12),
            location: get_u32(b, o + 16),
            stored_len: get_u16(b, o + 20),
            codec: b[o + 22],
            flags: b[o + 23],
            crc: get_u32(b, o + 24),
            count: get_u32(b, o + 28),
        },
    )
}

/// The entries of an SBT leaf's body and where `key` is among them: `Ok(i)` at entry `i`,
/// `Err(i)` absent, to go at `i`; by binary search over the encoded keys (~7 decoded, not the
/// page: the dedup write path looks items up, counts and promotes them per block). Order is not
/// re-checked: a page out of order finds nothing or an error, as a decode would.
fn search_sbt_leaf(b: &[u8], key: &SbtKey) -> Result<(usize, std::result::Result<usize, usize>)> {
    let n = node_entries(b, SBT_LEAF_ENTRIES)?;
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match SbtKey::decode(&b[NODE_HEADER_BYTES + mid * 32..]).cmp(key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok((n, Ok(mid))),
        }
    }
    Ok((n, Err(lo)))
}

/// The value of `key` in an SBT leaf's body.
pub fn find_in_sbt_leaf(b: &[u8], key: &SbtKey) -> Result<Option<SbtValue>> {
    Ok(search_sbt_leaf(b, key)?
        .1
        .ok()
        .map(|i| sbt_leaf_entry(b, i).1))
}

/// Sets the value of `key` in an SBT leaf's body in place (a count changes, the page's order
/// does not); false when the leaf does not hold `key`, and then the body is unchanged.
pub fn replace_in_sbt_leaf(b: &mut [u8], key: &SbtKey, v: &SbtValue) -> Result<bool> {
    let Ok(i) = search_sbt_leaf(b, key)?.1 else {
        return Ok(false);
    };
    put_sbt_value(b, NODE_HEADER_BYTES + i * 32, v);
    Ok(true)
}

/// Entries an SBT leaf's body holds.
pub fn sbt_leaf_len(b: &[u8]) -> Result<usize> {
    node_entries(b, SBT_LEAF_ENTRIES)
}

/// Inserts `key`, which the SBT leaf's body lacks, in place, keeping the order: the body an
/// encode of the entries with `key` added would give. An error when the leaf is full, holds
/// `key` already, or `key` does not fit; the body is then unchanged.
pub fn insert_in_sbt_leaf(b: &mut [u8], key: &SbtKey, v: &SbtValue) -> Result<()> {
    key.fits()?;
    let (n, at) = search_sbt_leaf(b, key)?;
    if n == SBT_LEAF_ENTRIES {
        return Err(Error::Invalid("an insert into a full SBT leaf".into()));
    }
    let Err(lo) = at else {
        return Err(corrupt("SBT leaf holds the key inserted"));
    };
    let o = NODE_HEADER_BYTES + lo * 32;
    b.copy_within(o..NODE_HEADER_BYTES + n * 32, o + 32);
    key.encode(&mut b[o..]);
    put_sbt_value(b, o, v);
    encode_node(n + 1, b);
    Ok(())
}

/// The child of an SBT interior page's body that covers `key` (the last slot whose first key
/// is at most `key`), by binary search over the encoded slots.
pub fn child_in_sbt_interior(b: &[u8], key: &SbtKey) -> Result<u32> {
    let n = node_entries(b, SBT_INTERIOR_ENTRIES)?;
    if n == 0 {
        return Err(corrupt("SBT interior page has no child"));
    }
    let slot = |i: usize| {
        let o = NODE_HEADER_BYTES + i * 16;
        (SbtKey::decode(&b[o..]), get_u32(b, o + 12))
    };
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if slot(mid).0 <= *key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let child = slot(lo.saturating_sub(1)).1;
    if child >= PAGE_ID_ALL_UNMAPPED {
        return Err(corrupt("SBT interior page names a summary as a child"));
    }
    Ok(child)
}

/// An SBT interior page's body: up to 254 (first key, child) slots sorted by key.
pub fn encode_sbt_interior(slots: &[(SbtKey, u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
    if slots.len() > SBT_INTERIOR_ENTRIES {
        return Err(Error::Invalid(
            "more SBT children than an interior page holds".into(),
        ));
    }
    let mut b = body();
    encode_node(slots.len(), &mut b[..]);
    for (i, (k, child)) in slots.iter().enumerate() {
        let o = NODE_HEADER_BYTES + i * 16;
        k.fits()?;
        k.encode(&mut b[o..]);
        put_u32(&mut b[..], o + 12, *child);
    }
    Ok(b)
}

/// Decodes an SBT interior page's body; an error when its keys are out of order or a child is
/// a summary value.
pub fn decode_sbt_interior(b: &[u8]) -> Result<Vec<(SbtKey, u32)>> {
    let n = node_entries(b, SBT_INTERIOR_ENTRIES)?;
    let slots: Vec<(SbtKey, u32)> = (0..n)
        .map(|i| {
            let o = NODE_HEADER_BYTES + i * 16;
            (SbtKey::decode(&b[o..]), get_u32(b, o + 12))
        })
        .collect();
    ascending(&slots, "SBT interior keys out of order")?;
    if slots.iter().any(|&(_, c)| c >= PAGE_ID_ALL_UNMAPPED) {
        return Err(corrupt("SBT interior page names a summary as a child"));
    }
    Ok(slots)
}

/// One release-queue entry (32 bytes): a device deleted or rolled back, released in steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseEntry {
    /// The device deleted or rolled back.
    pub device: u32,
    /// Root page of the subtree to release.
    pub root: u32,
    /// Level of that root.
    pub level: u8,
    /// Bit 0: may promote (the device had surviving sharers when queued).
    pub flags: u8,
    /// Entry number (never reused; release records name it).
    pub number: u32,
    /// Position of the root at its level.
    pub position: u64,
    /// Next LBA to visit.
    pub cursor: u64,
}

/// A release-queue page's body: up to 127 entries.
pub fn encode_release_queue(entries: &[ReleaseEntry]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
    if entries.len() > RELEASE_ENTRIES_PER_PAGE {
        return Err(Error::Invalid(
            "more release entries than a page holds".into(),
        ));
    }
    let mut b = body();
    encode_node(entries.len(), &mut b[..]);
    for (i, e) in entries.iter().enumerate() {
        let o = NODE_HEADER_BYTES + i * 32;
        put_u32(&mut b[..], o, e.device);
        put_u32(&mut b[..], o + 4, e.root);
        b[o + 8] = e.level;
        b[o + 9] = e.flags;
        put_u32(&mut b[..], o + 12, e.number);
        put_u64(&mut b[..], o + 16, e.position);
        put_u64(&mut b[..], o + 24, e.cursor);
    }
    Ok(b)
}

/// Decodes a release-queue page's body.
pub fn decode_release_queue(b: &[u8]) -> Result<Vec<ReleaseEntry>> {
    let n = node_entries(b, RELEASE_ENTRIES_PER_PAGE)?;
    Ok((0..n)
        .map(|i| {
            let o = NODE_HEADER_BYTES + i * 32;
            ReleaseEntry {
                device: get_u32(b, o),
                root: get_u32(b, o + 4),
                level: b[o + 8],
                flags: b[o + 9],
                number: get_u32(b, o + 12),
                position: get_u64(b, o + 16),
                cursor: get_u64(b, o + 24),
            }
        })
        .collect())
}

/// One pair-state list entry: the latest state of one id, newer than its pair-state page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairListEntry {
    /// Page id.
    pub id: u32,
    /// Its state (never `Reserved`: reservations are not listed).
    pub state: PairState,
}

impl PairListEntry {
    /// Encodes into 8 bytes.
    pub fn encode(&self, b: &mut [u8]) {
        b[..PAIR_LIST_ENTRY_BYTES].fill(0);
        put_u32(b, 0, self.id);
        b[4] = self.state.bits();
    }

    /// Decodes 8 bytes.
    pub fn decode(b: &[u8]) -> Result<PairListEntry> {
        if b.len() < PAIR_LIST_ENTRY_BYTES || b[4] > 2 {
            return Err(corrupt("pair-state list entry damaged"));
        }
        Ok(PairListEntry {
            id: get_u32(b, 0),
            state: PairState::from_bits(b[4]),
        })
    }
}

/// The checkpoint's extension header (bit 10): the sizes of the lists after it and the roots of
/// the volume's metadata. Covered by the checkpoint's CRC, so it has none of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extension {
    /// Bytes of the extension: this header and the lists after it.
    pub bytes: u32,
    /// Metadata extent pairs' span `H` (copy 1 of extent `e` is extent `e + H`).
    pub h: u32,
    /// Ids below this are region 0 (the superblock's map room).
    pub pairs0: u32,
    /// Pair-state directory pages listed (`S`).
    pub directory_pages: u32,
    /// List pages of extent-table summary pages listed (`U`).
    pub summary_lists: u32,
    /// Pair-state list entries present (`L`).
    pub list_entries: u32,
    /// Pair-state list capacity (`C`).
    pub list_capacity: u32,
    /// List page of the device-table pages.
    pub device_list: u32,
    /// Device rows.
    pub device_rows: u32,
    /// CRC32C of all rows in id order (a lost device-table page is named, never silent).
    pub device_rows_crc: u32,
    /// Next device id.
    pub next_device: u32,
    /// List page of the release-queue pages (`PAGE_ID_NONE`: none).
    pub release_list: u32,
    /// Release-queue entries.
    pub release_entries: u32,
    /// Next release entry number.
    pub next_release: u32,
    /// PCT root (`PAGE_ID_NONE`: empty).
    pub pct_root: u32,
    /// PCT height.
    pub pct_height: u8,
    /// SBT height (bit 12).
    pub sbt_height: u8,
    /// SBT root (`PAGE_ID_NONE`: empty; bit 12).
    pub sbt_root: u32,
    /// SBT entries.
    pub sbt_entries: u64,
    /// Next SBT serial (48 bits used).
    pub next_sbt_serial: u64,
    /// List page of the saved dedup hooks (`PAGE_ID_NONE`: none; bit 4).
    pub hooks_list: u32,
    /// Sequence of the checkpoint that set bit 10 (0: created with it).
    pub enabled_seq: u64,
    /// PCT entries.
    pub pct_entries: u64,
}

impl Extension {
    /// Encodes into 256 bytes (the unnamed rest reserved, zero).
    pub fn encode(&self, b: &mut [u8]) {
        b[..EXTENSION_HEADER_BYTES].fill(0);
        let words = [
            self.bytes,
            self.h,
            self.pairs0,
            self.directory_pages,
            self.summary_lists,
            self.list_entries,
            self.list_capacity,
            self.device_list,
            self.device_rows,
            self.device_rows_crc,
            self.next_device,
            self.release_list,
            self.release_entries,
            self.next_release,
            self.pct_root,
        ];
        for (i, w) in words.iter().enumerate() {
            put_u32(b, i * 4, *w);
        }
        b[60] = self.pct_height;
        b[61] = self.sbt_height;
        put_u32(b, 64, self.sbt_root);
        put_u64(b, 68, self.sbt_entries);
        put_u64(b, 76, self.next_sbt_serial);
        put_u32(b, 84, self.hooks_list);
        put_u64(b, 88, self.enabled_seq);
        put_u64(b, 96, self.pct_entries);
    }

    /// Decodes 256 bytes; an error when the lists it announces exceed their capacity.
    pub fn decode(b: &[u8]) -> Result<Extension> {
        if b.len() < EXTENSION_HEADER_BYTES {
            return Err(corrupt("checkpoint extension header is short"));
        }
        let w = |i: usize| get_u32(b, i * 4);
        let e = Extension {
            bytes: w(0),
            h: w(1),
            pairs0: w(2),
            directory_pages: w(3),
            summary_lists: w(4),
            list_entries: w(5),
            list_capacity: w(6),
            device_list: w(7),
            device_rows: w(8),
            device_rows_crc: w(9),
            next_device: w(10),
            release_list: w(11),
            release_entries: w(12),
            next_release: w(13),
            pct_root: w(14),
            pct_height: b[60],
            sbt_height: b[61],
            sbt_root: get_u32(b, 64),
            sbt_entries: get_u64(b, 68),
            next_sbt_serial: get_u64(b, 76),
            hooks_list: get_u32(b, 84),
            enabled_seq: get_u64(b, 88),
            pct_entries: get_u64(b, 96),
        };
        e.check()?;
        Ok(e)
    }

    /// What every header must hold: lists within their room and capacity, a default device.
    fn check(&self) -> Result<()> {
        let lists = EXTENSION_HEADER_BYTES as u64
            + 8 * u64::from(self.directory_pages)
            + 4 * u64::from(self.summary_lists)
            + 8 * u64::from(self.list_entries);
        if self.list_entries > self.list_capacity || lists > u64::from(self.bytes) {
            return Err(corrupt("checkpoint extension lists exceed their room"));
        }
        if self.device_rows == 0 || self.next_device <= 1 {
            return Err(corrupt("checkpoint extension names no default device"));
        }
        Ok(())
    }
}

/// The extension as a checkpoint slot holds it: the header and the three lists after it
/// (format.md, "Checkpoint slot with bit 10"). The header's counts and byte total are the lists'
/// own, set by [`ExtensionBody::encode`], so they can never disagree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtensionBody {
    pub header: Extension,
    /// Pair-state directory page `k`'s id and current slot, `k` in order (`S`).
    pub directory: Vec<(u32, PairSlot)>,
    /// List pages of the extent-table summary pages (`U`, bit 5).
    pub summary_lists: Vec<u32>,
    /// The pair-state list, one entry per id, ascending (`L`).
    pub pair_list: Vec<PairListEntry>,
}

impl ExtensionBody {
    /// Bytes it takes: the header and the lists.
    pub fn len(&self) -> usize {
        EXTENSION_HEADER_BYTES
            + 8 * self.directory.len()
            + 4 * self.summary_lists.len()
            + PAIR_LIST_ENTRY_BYTES * self.pair_list.len()
    }

    /// Whether it holds no list entry at all.
    pub fn is_empty(&self) -> bool {
        self.directory.is_empty() && self.summary_lists.is_empty() && self.pair_list.is_empty()
    }

    /// The header as the slot holds it: counts and total taken from the lists. An error when
    /// the pair list is not ascending by id or passes its capacity, or the header fails what
    /// [`Extension::decode`] checks.
    pub fn counted(&self) -> Result<Extension> {
        if self.pair_list.windows(2).any(|w| w[0].id >= w[1].id) {
            return Err(Error::Invalid(
                "pair-state list is not one entry per id in ascending order".into(),
            ));
        }
        let mut header = self.header;
        header.bytes = self.len() as u32;
        header.directory_pages = self.directory.len() as u32;
        header.summary_lists = self.summary_lists.len() as u32;
        header.list_entries = self.pair_list.len() as u32;
        if header.list_entries > header.list_capacity {
            return Err(Error::Invalid(format!(
                "pair-state list of {} entries passes its capacity of {}",
                header.list_entries, header.list_capacity
            )));
        }
        header.check()?;
        Ok(header)
    }

    /// Encodes into a new buffer with the [`counted`](Self::counted) header.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let header = self.counted()?;
        let mut b = vec![0u8; self.len()];
        header.encode(&mut b);
        let mut o = EXTENSION_HEADER_BYTES;
        for &(id, slot) in &self.directory {
            put_u32(&mut b, o, id);
            b[o + 4] = slot_byte(slot);
            o += 8;
        }
        for &id in &self.summary_lists {
            put_u32(&mut b, o, id);
            o += 4;
        }
        for e in &self.pair_list {
            e.encode(&mut b[o..]);
            o += PAIR_LIST_ENTRY_BYTES;
        }
        Ok(b)
    }

    /// Decodes the extension at the start of `b` (the rest of the slot may follow). An error
    /// names what is wrong: a header whose lists pass `b` or its capacity, an id that is a
    /// summary value, a slot that is neither A nor B, a pair list out of order.
    pub fn decode(b: &[u8]) -> Result<ExtensionBody> {
        let header = Extension::decode(b)?;
        if header.bytes as usize > b.len() {
            return Err(corrupt("checkpoint extension passes its slot"));
        }
        let page_id = |v: u32| {
            if v >= PAGE_ID_ALL_UNMAPPED {
                Err(corrupt(
                    "checkpoint extension lists a summary value as a page",
                ))
            } else {
                Ok(v)
            }
        };
        let mut o = EXTENSION_HEADER_BYTES;
        let mut directory = Vec::with_capacity(header.directory_pages as usize);
        for _ in 0..header.directory_pages {
            directory.push((page_id(get_u32(b, o))?, slot_from(b[o + 4])?));
            o += 8;
        }
        let mut summary_lists = Vec::with_capacity(header.summary_lists as usize);
        for _ in 0..header.summary_lists {
            summary_lists.push(page_id(get_u32(b, o))?);
            o += 4;
        }
        let mut pair_list = Vec::with_capacity(header.list_entries as usize);
        for _ in 0..header.list_entries {
            let e = PairListEntry::decode(&b[o..])?;
            page_id(e.id)?;
            if pair_list
                .last()
                .is_some_and(|l: &PairListEntry| l.id >= e.id)
            {
                return Err(corrupt("pair-state list is out of order"));
            }
            pair_list.push(e);
            o += PAIR_LIST_ENTRY_BYTES;
        }
        Ok(ExtensionBody {
            header,
            directory,
            summary_lists,
            pair_list,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [3; 16];

    /// The searches and the in-place replace and insert over encoded SBT pages answer as the
    /// decoded pages do, for keys present, between, before and after them, on full and nearly empty pages.
    #[test]
    fn sbt_searches_agree_with_decoded_pages() {
        let key = |i: u64| SbtKey {
            birth: i / 3 * 10,
            serial: i % 3 + 1,
        };
        for n in [1usize, 2, 7, SBT_LEAF_ENTRIES] {
            let entries: Vec<(SbtKey, SbtValue)> = (0..n as u64)
                .map(|i| {
                    let v = SbtValue {
                        extent: i as u32,
                        location: 0,
                        stored_len: 100,
                        codec: 1,
                        flags: 0,
                        crc: i as u32 * 7,
                        count: i as u32 + 1,
                    };
                    (key(i * 2 + 1), v)
                })
                .collect();
            let leaf = encode_sbt_leaf(&entries).expect("leaf");
            let slots: Vec<(SbtKey, u32)> = entries
                .iter()
                .take(SBT_INTERIOR_ENTRIES)
                .enumerate()
                .map(|(i, (k, _))| {
                    let first = SbtKey {
                        birth: 0,
                        serial: 0,
                    };
                    (if i == 0 { first } else { *k }, i as u32 + 5)
                })
                .collect();
            let interior = encode_sbt_interior(&slots).expect("interior");
            for probe in 0..(2 * n as u64 + 3) {
                let k = key(probe);
                let want = entries.iter().find(|(e, _)| *e == k).map(|(_, v)| *v);
                assert_eq!(
                    find_in_sbt_leaf(&leaf[..], &k).expect("leaf"),
                    want,
                    "{k:?}"
                );
                let child = slots.iter().rev().find(|(s, _)| *s <= k).expect("slot 0").1;
                assert_eq!(
                    child_in_sbt_interior(&interior[..], &k).expect("interior"),
                    child
                );
                // In place: the leaf a decode, change and encode would give; absent keys
                // change nothing.
                let mut changed = leaf.clone();
                let v = SbtValue {
                    count: 1000 + probe as u32,
                    extent: 77,
                    ..entries[0].1
                };
                let replaced = replace_in_sbt_leaf(&mut changed[..], &k, &v).expect("leaf");
                assert_eq!(replaced, want.is_some(), "{k:?}");
                let mut expect = entries.clone();
                if let Some(e) = expect.iter_mut().find(|(e, _)| *e == k) {
                    e.1 = v;
                }
                assert!(
                    changed[..] == encode_sbt_leaf(&expect).expect("leaf")[..],
                    "{k:?}"
                );
                // Insert in place: what encoding the entries with the key added gives; a full
                // leaf or a held key is an error that changes nothing.
                let mut grown = leaf.clone();
                let inserted = insert_in_sbt_leaf(&mut grown[..], &k, &v);
                if want.is_some() || n == SBT_LEAF_ENTRIES {
                    assert!(inserted.is_err() && grown[..] == leaf[..], "{k:?}");
                } else {
                    inserted.expect("insert");
                    let mut expect = entries.clone();
                    let at = expect.partition_point(|(e, _)| *e < k);
                    expect.insert(at, (k, v));
                    assert!(
                        grown[..] == encode_sbt_leaf(&expect).expect("leaf")[..],
                        "{k:?}"
                    );
                    assert_eq!(sbt_leaf_len(&grown[..]).expect("len"), n + 1);
                }
            }
        }
    }

    fn at(id: u32, kind: PageKind) -> PageAddress {
        PageAddress {
            id,
            kind,
            level: 1,
            position: 7,
        }
    }

    #[test]
    fn a_page_opens_only_as_itself_and_any_bit_flip_fails_it() {
        let mut body = body();
        body[100] = 0x5a;
        let a = at(42, PageKind::MapInterior);
        let stamp = FrameStamp::map(3, 9, 0x1_0000_0002);
        let page = seal_page(&UUID, &a, &stamp, &body);
        let (got, b) = open_page(&page, &UUID, &a).expect("valid");
        assert_eq!(got, stamp);
        assert_eq!(b, &body[..]);
        let others = [
            PageAddress { id: 43, ..a },
            PageAddress {
                kind: PageKind::MapLeaf,
                ..a
            },
            PageAddress { level: 0, ..a },
            PageAddress { position: 8, ..a },
        ];
        for o in others {
            assert!(open_page(&page, &UUID, &o).is_err(), "{o:?}");
        }
        assert!(open_page(&page, &[4; 16], &a).is_err());
        for bit in (0..MAP_PAGE_BYTES * 8).step_by(61) {
            let mut bad = page.to_vec();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(open_page(&bad, &UUID, &a).is_err(), "bit {bit}");
        }
        assert!(open_page(&page[..4095], &UUID, &a).is_err());
        let other = FrameStamp::other(0x7_0000_0009);
        assert_eq!(other.other_seq(), 0x7_0000_0009);
    }

    #[test]
    fn every_body_round_trips() {
        let mut e = MapEntry::UNMAPPED;
        e.state = BlockState::Data;
        e.extent = 9;
        e.len = 300;
        e.seeded = true;
        let leaf = decode_map_leaf(&encode_map_leaf(&[MapEntry::ZERO, e])[..]).expect("valid");
        assert_eq!(leaf.len(), MAP_ENTRIES_PER_PAGE);
        assert_eq!(
            (leaf[0], leaf[1], leaf[2]),
            (MapEntry::ZERO, e, MapEntry::UNMAPPED)
        );

        let slots = [
            ChildSlot::Page(5),
            ChildSlot::AllZero,
            ChildSlot::AllUnmapped,
        ];
        let got = decode_map_interior(&encode_map_interior(&slots)[..]).expect("valid");
        assert_eq!(&got[..3], &slots);
        assert!(got[3..].iter().all(|s| *s == ChildSlot::AllUnmapped));

        let states: Vec<PairState> = (0..PAIR_STATE_IDS_PER_PAGE)
            .map(|i| PairState::from_bits((i * 7 % 5) as u8))
            .collect();
        assert_eq!(
            decode_pair_states(&encode_pair_states(&states)[..]).expect("valid"),
            states
        );

        let dir = [
            DirectoryEntry {
                page: Some(77),
                free: 16_000,
                slot: PairSlot::B,
            },
            DirectoryEntry {
                page: None,
                free: 0,
                slot: PairSlot::A,
            },
        ];
        assert_eq!(
            &decode_directory(&encode_directory(&dir)[..]).expect("valid")[..2],
            &dir
        );

        let ids: Vec<u32> = (10..1030).collect();
        assert_eq!(decode_list(&encode_list(&ids)[..]).expect("valid"), ids);
        assert_eq!(
            decode_list(&encode_list(&[1, 2])[..]).expect("valid"),
            vec![1, 2]
        );

        let row = DeviceRow {
            id: 1,
            parent: 0,
            kind: DeviceKind::Default,
            depth: 3,
            flags: 0,
            root: ChildSlot::Page(1234),
            name: "vol-é".into(),
            blocks: 1 << 40,
            created_seq: 5,
            created_at: 1_790_000_000,
            bytes_used: 4096,
            blocks_used: 1,
            epoch: 2,
            pages_max: 99,
        };
        let snap = DeviceRow {
            id: 2,
            kind: DeviceKind::Snapshot,
            name: "x".repeat(DEVICE_NAME_BYTES),
            flags: 1,
            ..row.clone()
        };
        let rows = vec![row, snap];
        assert_eq!(
            decode_device_table(&encode_device_table(&rows).expect("valid")[..]).expect("valid"),
            rows
        );

        let pct = [
            PctEntry {
                key: PctEntry::key(0, 5),
                page: 9,
                value: 2,
            },
            PctEntry {
                key: PctEntry::key(0, 5),
                page: 10,
                value: 3,
            },
            PctEntry {
                key: PctEntry::key(1, 0),
                page: 1,
                value: 1,
            },
        ];
        assert_eq!(
            decode_pct(&encode_pct(&pct).expect("valid")[..]).expect("valid"),
            pct
        );

        let rel = ReleaseEntry {
            device: 4,
            root: 88,
            level: 2,
            flags: 1,
            number: 17,
            position: 3,
            cursor: 1 << 33,
        };
        assert_eq!(
            decode_release_queue(&encode_release_queue(&[rel; 127]).expect("valid")[..])
                .expect("valid"),
            vec![rel; 127]
        );

        let entry = PairListEntry {
            id: 0xFFFF_FFFD,
            state: PairState::SlotB,
        };
        let mut b = [0u8; 8];
        entry.encode(&mut b);
        assert_eq!(PairListEntry::decode(&b).expect("valid"), entry);

        let ext = Extension {
            bytes: 4096,
            h: 80,
            pairs0: 257,
            directory_pages: 1,
            list_entries: 3,
            list_capacity: 4096,
            device_list: 300,
            device_rows: 1,
            next_device: 2,
            release_list: PAGE_ID_NONE,
            pct_root: PAGE_ID_NONE,
            sbt_root: PAGE_ID_NONE,
            hooks_list: PAGE_ID_NONE,
            next_sbt_serial: 1 << 47,
            enabled_seq: u64::MAX,
            ..Extension::default()
        };
        let mut b = [0u8; EXTENSION_HEADER_BYTES];
        ext.encode(&mut b);
        assert_eq!(Extension::decode(&b).expect("valid"), ext);
    }

    #[test]
    fn decoders_reject_what_no_writer_makes() {
        // A PCT page out of order, an overfull node, an unknown entry state.
        let mut pct = encode_pct(&[
            PctEntry {
                key: 2,
                page: 1,
                value: 1,
            },
            PctEntry {
                key: 1,
                page: 1,
                value: 1,
            },
        ])
        .expect("valid");
        assert!(decode_pct(&pct[..]).is_err());
        put_u16(&mut pct[..], 0, PCT_ENTRIES_PER_PAGE as u16 + 1);
        assert!(decode_pct(&pct[..]).is_err());
        assert!(encode_pct(
            &[PctEntry {
                key: 0,
                page: 0,
                value: 0
            }; PCT_ENTRIES_PER_PAGE + 1]
        )
        .is_err());
        let mut leaf = encode_map_leaf(&[]);
        leaf[MAP_ENTRY_BYTES] = 7;
        assert!(decode_map_leaf(&leaf[..]).is_err());
        // Directory: a written entry names slot A or B and at most a page's ids.
        let mut dir = encode_directory(&[DirectoryEntry {
            page: Some(1),
            free: 1,
            slot: PairSlot::A,
        }]);
        dir[6] = 0;
        assert!(decode_directory(&dir[..]).is_err());
        dir[6] = 1;
        put_u16(&mut dir[..], 4, PAIR_STATE_IDS_PER_PAGE as u16 + 1);
        assert!(decode_directory(&dir[..]).is_err());
        // Device names: empty, too long, with NUL, not UTF-8, not zero-padded.
        let row = |name: &str| DeviceRow {
            id: 1,
            parent: 0,
            kind: DeviceKind::Default,
            depth: 1,
            flags: 0,
            root: ChildSlot::AllUnmapped,
            name: name.into(),
            blocks: 1,
            created_seq: 0,
            created_at: 0,
            bytes_used: 0,
            blocks_used: 0,
            epoch: 0,
            pages_max: 0,
        };
        let mut b = [0u8; DEVICE_ROW_BYTES];
        for bad in ["", "a\0b", &"y".repeat(DEVICE_NAME_BYTES + 1)] {
            assert!(row(bad).encode(&mut b).is_err(), "{bad:?}");
        }
        row("ok").encode(&mut b).expect("valid");
        b[16] = 0xff;
        assert!(DeviceRow::decode(&b).is_err());
        b[16] = b'o';
        b[20] = b'z';
        assert!(DeviceRow::decode(&b).is_err());
        b[20] = 0;
        b[8] = 5;
        assert!(DeviceRow::decode(&b).is_err());
        b[8] = 1;
        // Every known flag decodes; any other bit is refused by name.
        for known in [1u16, 2, 4, 8, 15] {
            b[10..12].copy_from_slice(&known.to_le_bytes());
            assert_eq!(
                DeviceRow::decode(&b).expect("known flags").map(|r| r.flags),
                Some(known)
            );
        }
        b[10..12].copy_from_slice(&0x0118u16.to_le_bytes());
        let e = DeviceRow::decode(&b)
            .expect_err("unknown flag bits")
            .to_string();
        assert!(e.contains("flag bits 0x0110"), "{e}");
        // Pair list: a state of 3 is never listed. Extension: lists past its room, no device.
        assert!(PairListEntry::decode(&[1, 0, 0, 0, 3, 0, 0, 0]).is_err());
        let ext = Extension {
            bytes: 256,
            list_entries: 1,
            list_capacity: 1,
            device_rows: 1,
            next_device: 2,
            ..Extension::default()
        };
        let mut b = [0u8; EXTENSION_HEADER_BYTES];
        ext.encode(&mut b);
        assert!(Extension::decode(&b).is_err());
        Extension { bytes: 264, ..ext }.encode(&mut b);
        assert!(Extension::decode(&b).is_ok());
        Extension {
            bytes: 264,
            device_rows: 0,
            ..ext
        }
        .encode(&mut b);
        assert!(Extension::decode(&b).is_err());
    }

    #[test]
    fn decoders_never_panic_on_any_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in [
            0usize,
            1,
            8,
            255,
            256,
            PAGE_BODY_BYTES - 1,
            PAGE_BODY_BYTES,
            4096,
        ] {
            for _ in 0..50 {
                let b: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let _ = open_page(&b, &UUID, &at(1, PageKind::List));
                let _ = decode_map_leaf(&b);
                let _ = decode_map_interior(&b);
                let _ = decode_pair_states(&b);
                let _ = decode_directory(&b);
                let _ = decode_list(&b);
                let _ = decode_device_table(&b);
                let _ = decode_pct(&b);
                let _ = decode_release_queue(&b);
                let _ = PairListEntry::decode(&b);
                let _ = Extension::decode(&b);
                let _ = DeviceRow::decode(&b);
            }
        }
    }

    fn body_with(pairs: usize) -> ExtensionBody {
        ExtensionBody {
            header: Extension {
                h: 80,
                pairs0: 257,
                list_capacity: 4096,
                device_list: 300,
                device_rows: 1,
                next_device: 2,
                release_list: PAGE_ID_NONE,
                pct_root: PAGE_ID_NONE,
                sbt_root: PAGE_ID_NONE,
                hooks_list: PAGE_ID_NONE,
                ..Extension::default()
            },
            directory: vec![(400, PairSlot::B), (401, PairSlot::A)],
            summary_lists: vec![500],
            pair_list: (0..pairs as u32)
                .map(|i| PairListEntry {
                    id: 3 * i + 1,
                    state: [PairState::Free, PairState::SlotA, PairState::SlotB][i as usize % 3],
                })
                .collect(),
        }
    }

    #[test]
    fn an_extension_body_round_trips_with_its_counts_from_its_lists() {
        let body = body_with(100);
        let b = body.encode().expect("encode");
        assert_eq!(b.len(), 256 + 16 + 4 + 800);
        let got = ExtensionBody::decode(&b).expect("decode");
        assert_eq!(got.header.bytes as usize, b.len());
        assert_eq!(
            (
                got.header.directory_pages,
                got.header.summary_lists,
                got.header.list_entries
            ),
            (2, 1, 100)
        );
        assert_eq!(
            (
                got.directory.clone(),
                got.summary_lists.clone(),
                got.pair_list.clone()
            ),
            (
                body.directory.clone(),
                body.summary_lists.clone(),
                body.pair_list.clone()
            )
        );
        // A slot that is longer than the extension decodes the same.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xee; 100]);
        assert_eq!(ExtensionBody::decode(&longer).expect("decode"), got);
    }

    #[test]
    fn an_extension_body_refuses_what_it_cannot_stand_for() {
        let mut unordered = body_with(3);
        unordered.pair_list.swap(0, 1);
        assert!(unordered.encode().is_err(), "out of order");
        let mut twice = body_with(3);
        twice.pair_list[1].id = twice.pair_list[0].id;
        assert!(twice.encode().is_err(), "one entry per id");
        let mut over = body_with(5);
        over.header.list_capacity = 4;
        assert!(over.encode().is_err(), "past its capacity");
    }

    #[test]
    fn a_damaged_extension_body_is_an_error_never_a_panic() {
        let b = body_with(20).encode().expect("encode");
        for cut in 0..b.len() {
            assert!(ExtensionBody::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let list = 256 + 16 + 4;
        // A directory slot of 0, a summary value as an id, a list out of order, a state of 3.
        let mut bad_slot = b.clone();
        bad_slot[256 + 4] = 0;
        let mut summary_id = b.clone();
        put_u32(&mut summary_id, 256 + 16, PAGE_ID_ALL_UNMAPPED);
        let mut unordered = b.clone();
        put_u32(&mut unordered, list + 8, 0);
        let mut reserved = b.clone();
        reserved[list + 4] = 3;
        for (what, bad) in [
            ("slot", bad_slot),
            ("summary id", summary_id),
            ("order", unordered),
            ("state", reserved),
        ] {
            assert!(ExtensionBody::decode(&bad).is_err(), "{what}");
        }
        // Every single bit flip decodes to an error or to a body, never a panic.
        for i in 0..b.len() * 8 {
            let mut f = b.clone();
            f[i / 8] ^= 1 << (i % 8);
            let _ = ExtensionBody::decode(&f);
        }
    }

    #[test]
    fn sbt_pages_round_trip_and_refuse_disorder() {
        let v = |n: u32| SbtValue {
            extent: n,
            location: n.rotate_left(7),
            stored_len: n as u16,
            codec: 3,
            flags: 4,
            crc: !n,
            count: n * 2,
        };
        let key = |b: u64, s: u64| SbtKey {
            birth: b,
            serial: s,
        };
        let leaf: Vec<_> = (0..SBT_LEAF_ENTRIES as u64)
            .map(|i| {
                (
                    key(SBT_KEY_FIELD_MAX - 200 + i, SBT_KEY_FIELD_MAX - i),
                    v(i as u32),
                )
            })
            .collect();
        let b = encode_sbt_leaf(&leaf).expect("encode");
        assert_eq!(decode_sbt_leaf(&b[..]).expect("decode"), leaf);
        let mut more = leaf.clone();
        more.push((key(SBT_KEY_FIELD_MAX, 0), v(1)));
        assert!(encode_sbt_leaf(&more).is_err(), "past a leaf's size");
        // The birth LBA sorts before the serial; a repeated key is damage.
        let pair = [(key(1, 9), v(1)), (key(2, 0), v(2))];
        assert!(decode_sbt_leaf(&encode_sbt_leaf(&pair).expect("encode")[..]).is_ok());
        let same = [(key(1, 9), v(1)), (key(1, 9), v(2))];
        assert!(decode_sbt_leaf(&encode_sbt_leaf(&same).expect("encode")[..]).is_err());
        let slots: Vec<_> = (0..SBT_INTERIOR_ENTRIES as u64)
            .map(|i| (key(i, 7), i as u32 + 10))
            .collect();
        let b = encode_sbt_interior(&slots).expect("encode");
        assert_eq!(decode_sbt_interior(&b[..]).expect("decode"), slots);
        let summary = [(key(0, 0), PAGE_ID_ALL_UNMAPPED)];
        assert!(decode_sbt_interior(&encode_sbt_interior(&summary).expect("encode")[..]).is_err());
        // A count past the page's entries is damage, never a read past the body.
        let mut b = encode_sbt_leaf(&pair).expect("encode");
        put_u16(&mut b[..], 0, SBT_LEAF_ENTRIES as u16 + 1);
        assert!(decode_sbt_leaf(&b[..]).is_err());
    }
}
