//! Opening a volume: superblock, newest valid checkpoint, map pages, and roll-forward of the
//! segments written to the checkpoint's allocation queue since. Recovery reads at most
//! `queue_len` extents, whatever the volume size.

use crate::error::{Error, Result};
use crate::format::{
    decode_map_page, parse_segment, BlockState, Checkpoint, MapEntry, Record, RecordKind,
    Superblock, BLOCK_BYTES, MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES, PAGE_NONE, SUPERBLOCK_BYTES,
};
use crate::state::{ExtentInfo, ExtentState};
use crate::storage::Storage;

/// Reads the superblock (copy A, else copy B).
pub fn read_superblock(storage: &dyn Storage) -> Result<Superblock> {
    let len = storage.len_bytes()?;
    if len < 2 * SUPERBLOCK_BYTES as u64 {
        return Err(Error::NotAVolume(format!(
            "only {len} bytes, too small to hold a zbd superblock"
        )));
    }
    let mut b = vec![0u8; SUPERBLOCK_BYTES];
    storage.read_at(0, &mut b)?;
    let first = Superblock::decode(&b);
    let sb = match first {
        Ok(sb) => sb,
        Err(e) => {
            storage.read_at(SUPERBLOCK_BYTES as u64, &mut b)?;
            match Superblock::decode(&b) {
                Ok(sb) => sb,
                // Report the primary copy's problem: it is what the user most likely hit.
                Err(_) => return Err(e),
            }
        }
    };
    if len < sb.total_bytes() {
        return Err(Error::CorruptMetadata(format!(
            "volume is truncated: {len} bytes, its superblock needs {}",
            sb.total_bytes()
        )));
    }
    Ok(sb)
}

/// Reads both checkpoint slots and returns the newest valid one.
pub fn read_checkpoint(storage: &dyn Storage, sb: &Superblock) -> Result<Checkpoint> {
    let mut best: Option<Checkpoint> = None;
    let mut b = vec![0u8; sb.checkpoint_slot_bytes as usize];
    for slot in 0..2 {
        storage.read_at(sb.checkpoint_slot_offset(slot), &mut b)?;
        if let Some(c) = Checkpoint::decode(&b, &sb.uuid, sb.queue_len, sb.map_pages) {
            if c.seq % 2 == slot && best.as_ref().is_none_or(|x| c.seq > x.seq) {
                best = Some(c);
            }
        }
    }
    best.ok_or_else(|| Error::CorruptMetadata("no valid checkpoint in either slot".into()))
}

/// The map loaded from a checkpoint; damaged pages are reported, their entries marked corrupt.
pub struct LoadedMap {
    /// Entries.
    pub map: Vec<MapEntry>,
    /// Pages whose current copy failed validation.
    pub damaged_pages: Vec<u32>,
}

/// Loads every map page the checkpoint names.
pub fn load_map(storage: &dyn Storage, sb: &Superblock, ck: &Checkpoint) -> Result<LoadedMap> {
    let blocks = sb.logical_blocks as usize;
    let mut map = vec![MapEntry::UNMAPPED; blocks];
    let mut damaged_pages = Vec::new();
    // Read the map area in large chunks: both slots of up to 128 pages at a time.
    const CHUNK_PAGES: u32 = 128;
    let mut buf = vec![0u8; 2 * CHUNK_PAGES as usize * MAP_PAGE_BYTES];
    let mut first = 0u32;
    while first < sb.map_pages {
        let n = CHUNK_PAGES.min(sb.map_pages - first);
        if ck.page_slots[first as usize..(first + n) as usize]
            .iter()
            .all(|&s| s == PAGE_NONE)
        {
            first += n;
            continue;
        }
        let bytes = 2 * n as usize * MAP_PAGE_BYTES;
        storage.read_at(sb.map_page_offset(first, 0), &mut buf[..bytes])?;
        for p in first..first + n {
            let slot = ck.page_slots[p as usize];
            if slot == PAGE_NONE {
                continue;
            }
            let at = (2 * (p - first) as usize + (slot as usize - 1)) * MAP_PAGE_BYTES;
            let start = p as usize * MAP_ENTRIES_PER_PAGE;
            let end = (start + MAP_ENTRIES_PER_PAGE).min(blocks);
            let page = &buf[at..at + MAP_PAGE_BYTES];
            let ok = slot <= 2 && decode_map_page(page, p, ck.seq, &mut map[start..end]).is_some();
            let valid = ok && map[start..end].iter().all(|e| entry_in_bounds(e, sb));
            if !valid {
                damaged_pages.push(p);
                map[start..end].fill(MapEntry {
                    state: BlockState::Corrupt,
                    ..MapEntry::UNMAPPED
                });
            }
        }
        first += n;
    }
    Ok(LoadedMap { map, damaged_pages })
}

fn entry_in_bounds(e: &MapEntry, sb: &Superblock) -> bool {
    e.state != BlockState::Data
        || (e.extent < sb.extent_count
            && e.len as usize <= BLOCK_BYTES
            && e.len > 0
            && e.offset as u64 + u64::from(e.len) <= u64::from(sb.extent_bytes))
}

/// Live accounting derived from the map.
pub fn account(map: &[MapEntry], extent_count: u32) -> Vec<ExtentInfo> {
    let mut extents = vec![
        ExtentInfo {
            live_bytes: 0,
            live_blocks: 0,
            state: ExtentState::Free,
            stamp: 0,
        };
        extent_count as usize
    ];
    for e in map.iter().filter(|e| e.state == BlockState::Data) {
        let x = &mut extents[e.extent as usize];
        x.live_bytes += u32::from(e.len);
        x.live_blocks += 1;
        x.state = ExtentState::Closed;
    }
    extents
}

/// A record found by roll-forward, with the extent it was found in.
pub struct Replayed {
    /// The record.
    pub record: Record,
    /// Extent holding its data.
    pub extent: u32,
}

/// Scans the checkpoint's allocation queue and returns every record newer than the checkpoint,
/// sorted by write sequence. A segment is taken only if its header, table and every payload it
/// needs verify: the last segment of an extent may be torn or half-written by a crash.
pub fn roll_forward(
    storage: &dyn Storage,
    sb: &Superblock,
    ck: &Checkpoint,
) -> Result<Vec<Replayed>> {
    let mut out = Vec::new();
    let mut ext = vec![0u8; sb.extent_bytes as usize];
    for q in &ck.queue {
        if q.extent >= sb.extent_count {
            return Err(Error::CorruptMetadata(format!(
                "checkpoint queues extent {} past the end",
                q.extent
            )));
        }
        let base = sb.extent_offset(q.extent);
        // Most queued extents were never used: look at the first sector before reading it all.
        storage.read_at(base, &mut ext[..512])?;
        if parse_header_magic(&ext) {
            storage.read_at(base, &mut ext)?;
        } else {
            continue;
        }
        let mut at = 0usize;
        while at < ext.len() {
            let Some((h, records)) = parse_segment(&ext, &sb.uuid, q.extent, q.alloc_seq, at)
            else {
                break;
            };
            let fresh: Vec<Record> = records
                .into_iter()
                .filter(|r| r.seq > ck.write_seq)
                .collect();
            let intact = fresh.iter().all(|r| {
                r.kind != RecordKind::Data
                    || crc32c::crc32c(&ext[r.offset as usize..(r.offset + r.len) as usize]) == r.crc
            });
            if !intact {
                break;
            }
            out.extend(fresh.into_iter().map(|record| Replayed {
                record,
                extent: q.extent,
            }));
            at += h.padded_len() as usize;
        }
    }
    out.sort_by_key(|r| r.record.seq);
    Ok(out)
}

fn parse_header_magic(ext: &[u8]) -> bool {
    &ext[0..8] == b"ZBDSEGM1"
}
