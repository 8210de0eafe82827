//! Opening a volume: superblock, newest valid checkpoint, map pages, and roll-forward of the
//! segments written to the checkpoint's allocation queue since. Recovery reads at most
//! `queue_len` extents, whatever the volume size.
//!
//! Metadata that matters (checkpoints, map pages) has two copies in format v2: a damaged copy is
//! replaced by the other one, never by an older version. Roll-forward tells a segment torn by
//! the crash from a damaged durable one by the durable write-sequence watermark that every v2
//! segment header carries (docs/design.md, "Torn or damaged").

use crate::backend::{Storage, WRITE_ALIGN_MAX};
use crate::error::{Error, Result};
use crate::extents::{ExtentInfo, ExtentState};
use crate::format::{
    align_up, parse_segment, parse_segment_footer, Checkpoint, MapEntry, Record, RecordKind,
    RefPayload, SbtKey, SbtValue, SegmentHeader, SegmentOwner, Superblock, SECTOR_BYTES,
    SUPERBLOCK_BYTES,
};
use crate::map::VolumeMap;
use crate::meta::shared::Owner;
use std::collections::{BTreeMap, HashSet};

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

/// Rewrites both superblock copies from the intact one `sb` was read from, each synced, A first
/// (a writable open, before it writes anything else). What this open read may not be on the
/// medium: after a failed sync in this boot the kernel serves pages it never wrote (a
/// `zbd upgrade` or `zbd grow` whose copy-A sync failed reads as done), and a volume written
/// under that superblock would open under the old one after a power cut. A damaged copy is
/// repaired on the way; that is returned for `check` to report.
pub fn rewrite_superblock(storage: &dyn Storage, sb: &Superblock) -> Result<Option<String>> {
    let (copies, intact) = superblock_copies(storage, sb);
    let Some(good) = intact.iter().position(|&ok| ok) else {
        return Ok(None);
    };
    for copy in 0..copies.len() {
        storage.write_at((copy * SUPERBLOCK_BYTES) as u64, &copies[good])?;
        storage.sync()?;
    }
    Ok(intact.iter().position(|&ok| !ok).map(|bad| {
        format!(
            "superblock copy {} was damaged: rewritten from copy {}",
            SUPERBLOCK_COPY_NAMES[bad], SUPERBLOCK_COPY_NAMES[good]
        )
    }))
}

/// Names of the two superblock copies, as messages give them.
pub const SUPERBLOCK_COPY_NAMES: [&str; 2] = ["A", "B"];

/// Both superblock copies as read, and whether each is intact and equal to `sb` (what `check`
/// reports and a writable open repairs).
pub fn superblock_copies(storage: &dyn Storage, sb: &Superblock) -> ([Vec<u8>; 2], [bool; 2]) {
    let mut copies = [vec![0u8; SUPERBLOCK_BYTES], vec![0u8; SUPERBLOCK_BYTES]];
    let mut intact = [false; 2];
    for (copy, b) in copies.iter_mut().enumerate() {
        intact[copy] = storage.read_at((copy * SUPERBLOCK_BYTES) as u64, b).is_ok()
            && Superblock::decode(b).is_ok_and(|c| c == *sb);
    }
    (copies, intact)
}

/// The checkpoint recovery starts from, and what was noticed on the way.
pub struct FoundCheckpoint {
    /// Its bytes as read (an intact copy), for [`make_durable`].
    pub bytes: Vec<u8>,
    /// The newest checkpoint with at least one intact copy.
    pub checkpoint: Checkpoint,
    /// Damaged copies of it (they are superseded by the next checkpoint).
    pub damaged_copies: Vec<String>,
}

/// Reads every copy of both checkpoint slots and returns the newest valid checkpoint. A damaged
/// copy of the newest checkpoint is replaced by its other copy, not by the previous checkpoint.
pub fn read_checkpoint(storage: &dyn Storage, sb: &Superblock) -> Result<FoundCheckpoint> {
    let mut found: Vec<(u64, u8, Option<Checkpoint>)> = Vec::new();
    let mut b = vec![0u8; sb.checkpoint_slot_bytes as usize];
    let mut bytes: Option<(u64, Vec<u8>)> = None;
    for copy in 0..sb.metadata_copies() {
        for slot in 0..2u64 {
            storage.read_at(sb.checkpoint_slot_offset(slot, copy), &mut b)?;
            let c = match Checkpoint::decode(&b, sb) {
                // An intact checkpoint of features this build lacks: never fall back past it.
                Err(e @ Error::NotAVolume(_)) => return Err(e),
                c => c.ok().filter(|c| c.seq % 2 == slot),
            };
            if let Some(c) = &c {
                if bytes.as_ref().is_none_or(|(seq, _)| c.seq > *seq) {
                    bytes = Some((c.seq, b.clone()));
                }
            }
            found.push((slot, copy, c));
        }
    }
    let best = found
        .iter()
        .filter_map(|(_, _, c)| c.as_ref())
        .max_by_key(|c| c.seq)
        .cloned()
        .ok_or_else(|| Error::CorruptMetadata("no valid checkpoint in any slot".into()))?;
    let damaged_copies = found
        .iter()
        .filter(|(slot, _, c)| {
            *slot == best.seq % 2 && c.as_ref().is_none_or(|c| c.seq != best.seq)
        })
        .map(|(_, copy, _)| format!("checkpoint {} copy {copy} is damaged", best.seq))
        .collect();
    Ok(FoundCheckpoint {
        bytes: bytes.map(|(_, b)| b).unwrap_or_default(),
        checkpoint: best,
        damaged_copies,
    })
}

/// Live accounting derived from the map by reading all of it (also rebuilds the map's
/// counters). A block of a unit counts its share of the unit (units.rs).
pub fn account(map: &mut VolumeMap, extent_count: u32) -> Result<Vec<ExtentInfo>> {
    let mut extents = vec![ExtentInfo::FREE; extent_count as usize];
    let mut over = None;
    map.recount(|e| {
        let x = &mut extents[e.extent as usize];
        let (bytes, blocks) = (x.live_bytes() + crate::units::share(e), x.live_blocks() + 1);
        if ExtentInfo::holds(bytes, blocks) {
            *x = ExtentInfo::new(ExtentState::Closed, bytes, blocks, 0);
        } else {
            over.get_or_insert(e.extent);
        }
    })?;
    if let Some(e) = over {
        return Err(Error::CorruptMetadata(format!(
            "the map names more blocks in extent {e} than an extent can hold"
        )));
    }
    Ok(extents)
}

/// The live blocks of closed extent `extent` (its image `ext`), from its segments' record
/// tables: the data and move records whose block still maps directly to exactly that place,
/// in LBA order, each with the fingerprint its record carries (0: none, 40-byte records), and
/// the shared items lying there (bit 12), each once, found by owner search from a record's
/// birth and location. `None` when they do not account for all `live_blocks` (a shared item
/// counts as one: design.md, build order 2a; a damaged header, say): the caller then walks the
/// map instead.
pub fn live_blocks_in(
    map: &mut VolumeMap,
    sb: &Superblock,
    extent: u32,
    ext: &[u8],
    live_blocks: u32,
) -> Result<Option<Live>> {
    let owner = current_use(sb, extent, ext);
    let mut live = Live::default();
    let kinds = |r: &&Record| matches!(r.kind, RecordKind::Data | RecordKind::Move);
    for (_, records) in index_segments(ext, &owner)?.values() {
        for r in records.iter().filter(kinds) {
            match map.owner(r.lba, r.unit_index, extent, r.offset)? {
                Owner::Direct(e) => live.blocks.push(LiveBlock {
                    lba: r.lba,
                    entry: e,
                    fingerprint: r.fingerprint,
                }),
                Owner::Shared(key, value) => {
                    let item = live.shared.entry(key).or_insert(LiveShared {
                        value,
                        fingerprints: Vec::new(),
                    });
                    if r.fingerprint != 0 {
                        item.fingerprints.push((r.unit_index, r.fingerprint));
                    }
                }
                Owner::Dead => {}
            }
        }
    }
    live.blocks.sort_by_key(|b| b.lba);
    live.blocks.dedup_by_key(|b| b.lba);
    let found = live.blocks.len() + live.shared.len();
    Ok((found == live_blocks as usize).then_some(live))
}

/// Who wrote the segments of `extent` (its image `ext`) in its current use. Every segment of
/// one use carries the allocation sequence of that use; the first segment's header has it (a
/// stale header from an earlier use cannot match the map).
fn current_use<'a>(sb: &'a Superblock, extent: u32, ext: &[u8]) -> SegmentOwner<'a> {
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&ext[24..32]);
    SegmentOwner {
        uuid: &sb.uuid,
        version: sb.version,
        extent,
        alloc_seq: u64::from_le_bytes(seq),
    }
}

/// The manifest of extent `extent` (its image `ext`) for inline dedup: the fingerprint and LBA
/// of each data and move record that carries one, as its segments' record tables list them
/// (nothing when the extent holds no valid segment). Hints only: the blocks may have been
/// overwritten since.
pub fn manifest_in(sb: &Superblock, extent: u32, ext: &[u8]) -> Vec<(u32, u64)> {
    let owner = current_use(sb, extent, ext);
    let Ok(segments) = index_segments(ext, &owner) else {
        return Vec::new();
    };
    segments
        .values()
        .flat_map(|(_, records)| records)
        .filter(|r| matches!(r.kind, RecordKind::Data | RecordKind::Move) && r.fingerprint != 0)
        .map(|r| (r.fingerprint, r.lba))
        .collect()
}

/// What [`live_blocks_in`] found live in an extent.
#[derive(Default)]
pub struct Live {
    /// Blocks of direct items, in LBA order.
    pub blocks: Vec<LiveBlock>,
    /// Shared items, by key.
    pub shared: BTreeMap<SbtKey, LiveShared>,
}

/// A live block found by [`live_blocks_in`].
pub struct LiveBlock {
    /// Its LBA.
    pub lba: u64,
    /// Its map entry (naming the extent searched).
    pub entry: MapEntry,
    /// The fingerprint its record carries (`Record::fingerprint`; 0 = none).
    pub fingerprint: u32,
}

/// A live shared item found by [`live_blocks_in`]: its SBT entry, and the fingerprints its
/// blocks' records carry, by index in the item.
pub struct LiveShared {
    pub value: SbtValue,
    pub fingerprints: Vec<(u8, u32)>,
}

/// A record found by roll-forward, with the extent it was found in.
pub struct Replayed {
    /// The record.
    pub record: Record,
    /// Extent holding its data.
    pub extent: u32,
    /// Its stored bytes fail their checksum although a sync covered them: the block takes the
    /// damaged state (unless an identical copy is still mapped).
    pub damaged: bool,
    /// A ref record's payload (its CRC and fields checked): the item it references.
    pub target: Option<RefPayload>,
}

/// What roll-forward found.
pub struct RollForward {
    /// Records newer than the checkpoint, in write-sequence order.
    pub replay: Vec<Replayed>,
    /// Highest write sequence known to have been covered by a completed sync.
    pub durable_seq: u64,
    /// Damage that could not be attributed to blocks (one line each).
    pub problems: Vec<String>,
    /// `(offset, bytes)` of each queued extent that holds replayed records, up to the end of
    /// its last valid segment, as read: what [`make_durable`] writes again.
    pub tail: Vec<(u64, Vec<u8>)>,
}

/// All valid segments of one extent image, by offset: headers found at sector starts, and (v2)
/// segments whose header is damaged, found by their footer at sector ends. A valid segment using
/// a feature this build lacks is an error: skipping it would end the log early.
fn index_segments(
    ext: &[u8],
    owner: &SegmentOwner,
) -> Result<BTreeMap<usize, (SegmentHeader, Vec<Record>)>> {
    type Index = BTreeMap<usize, (SegmentHeader, Vec<Record>)>;
    fn keep(index: &mut Index, found: Result<(SegmentHeader, Vec<Record>)>) -> Result<()> {
        match found {
            Ok(seg) => {
                index.entry(seg.0.seg_offset as usize).or_insert(seg);
                Ok(())
            }
            Err(e @ Error::NotAVolume(_)) => Err(e),
            Err(_) => Ok(()),
        }
    }
    let mut index = Index::new();
    for s in (0..ext.len()).step_by(SECTOR_BYTES) {
        keep(&mut index, parse_segment(ext, owner, s))?;
    }
    if owner.version >= 2 {
        for end in (SECTOR_BYTES..=ext.len()).step_by(SECTOR_BYTES) {
            keep(&mut index, parse_segment_footer(ext, owner, end))?;
        }
    }
    Ok(index)
}

/// Whether a data record's stored bytes match its checksum. A seeded record (v3) names its
/// dictionary by the identity the checkpoint's directory lists for its id: every dictionary a
/// record newer than the checkpoint can name is listed there (train.rs installs one with two
/// checkpoints before any record uses it).
fn record_intact(sb: &Superblock, ck: &Checkpoint, r: &Record, stored: &[u8]) -> bool {
    // A seeded record naming a dictionary the directory does not list fails (its seed named
    // one); a plain one is checked as before.
    let dict = (r.dict != 0)
        .then(|| ck.dicts.iter().find(|e| e.id == r.dict))
        .flatten()
        .map(|e| e.identity());
    r.checksum_matches(&sb.uuid, dict.as_ref(), stored)
}

/// Scans the checkpoint's allocation queue and returns every record newer than the checkpoint,
/// sorted by write sequence.
///
/// Each extent's segments are found by scanning sector boundaries for headers and (v2) footers
/// that carry the volume uuid, the extent and its allocation sequence, so a damaged segment
/// does not hide the ones after it. A data record whose payload fails its checksum is damage if
/// a sync covered it (its sequence is at most the highest durable watermark any valid segment
/// carries), else it was torn by the crash and is dropped (the block keeps its flushed value).
pub fn roll_forward(
    storage: &dyn Storage,
    sb: &Superblock,
    ck: &Checkpoint,
    write_align: usize,
) -> Result<RollForward> {
    let mut found: Vec<Replayed> = Vec::new();
    let mut durable_seq = ck.write_seq;
    let mut gaps: Vec<(u32, usize, usize)> = Vec::new();
    let mut ext = vec![0u8; sb.extent_bytes as usize];
    let mut tail = Vec::new();
    for q in &ck.queue {
        if q.extent >= sb.extent_count {
            return Err(Error::CorruptMetadata(format!(
                "checkpoint queues extent {} past the end",
                q.extent
            )));
        }
        let base = sb.extent_offset(q.extent);
        // Records in it may be newer than every copy the map has: without them blocks would
        // read older data, so the open stops, saying where and what to do.
        let unreadable = |e: Error| {
            Error::CorruptMetadata(format!(
                "the log tail cannot be read: extent {} at byte {base}: {e}; the volume \
                 cannot be recovered without it: copy the device (e.g. with ddrescue) and open \
                 the copy",
                q.extent
            ))
        };
        // Most queued extents were never used: look at the first sector before reading it all.
        // (v2 reads any extent whose first sector is not blank, so a damaged first header does
        // not hide the extent.)
        storage
            .read_at(base, &mut ext[..SECTOR_BYTES])
            .map_err(unreadable)?;
        let used = if sb.version >= 2 {
            ext[..SECTOR_BYTES].iter().any(|&b| b != 0)
        } else {
            &ext[0..8] == b"ZBDSEGM1"
        };
        if !used {
            continue;
        }
        storage.read_at(base, &mut ext).map_err(unreadable)?;
        let owner = SegmentOwner {
            uuid: &sb.uuid,
            version: sb.version,
            extent: q.extent,
            alloc_seq: q.alloc_seq,
        };
        let index = index_segments(&ext, &owner)?;
        let mut at = 0usize;
        let replayed_before = found.len();
        loop {
            let (h, records) = match index.get(&at) {
                Some(seg) => seg,
                None => match index.range(at + 1..).next() {
                    Some((&next, _)) => {
                        // A writer padded its segment to a device block (zeros up to the next
                        // boundary of at most WRITE_ALIGN_MAX): not a gap.
                        let padding = next <= align_up(at as u64, WRITE_ALIGN_MAX as u64) as usize
                            && ext[at..next].iter().all(|&b| b == 0);
                        if !padding {
                            gaps.push((q.extent, at, next));
                        }
                        at = next;
                        continue;
                    }
                    None => break,
                },
            };
            durable_seq = durable_seq.max(h.durable_seq);
            for r in records.iter().filter(|r| r.seq > ck.write_seq) {
                if r.uses_unsupported_features() {
                    return Err(Error::NotAVolume(format!(
                        "extent {} holds a record this zbd does not know (a dictionary, a \
                         unit shape, another device, a ref or a move); use a newer zbd",
                        q.extent
                    )));
                }
                let stored = &ext[r.offset as usize..(r.offset + r.len) as usize];
                let mut target = None;
                let intact = match r.kind {
                    RecordKind::Data | RecordKind::Move => record_intact(sb, ck, r, stored),
                    RecordKind::Ref => {
                        target = (crc32c::crc32c(stored) == r.crc)
                            .then(|| RefPayload::decode(stored).ok())
                            .flatten();
                        target.is_some()
                    }
                    RecordKind::Zero | RecordKind::Trim => true,
                };
                found.push(Replayed {
                    record: *r,
                    extent: q.extent,
                    damaged: !intact,
                    target,
                });
            }
            at += h.padded_len() as usize;
        }
        if found.len() > replayed_before {
            // Rewritten in whole device blocks (make_durable): what lies past the last segment
            // up to the boundary is written back as it was read.
            let end = (align_up(at as u64, write_align as u64) as usize).min(ext.len());
            tail.push((base, ext[..end].to_vec()));
        }
    }
    // Torn (not covered by a sync): drop. Covered: damage.
    found.retain(|r| !r.damaged || r.record.seq <= durable_seq);
    found.sort_by_key(|r| r.record.seq);
    let mut problems = Vec::new();
    // Every write sequence up to the durable watermark belongs to a record that was written
    // before a completed sync. One that no valid segment holds was lost with a segment damaged
    // beyond repair (both copies of its header and record table): its blocks are unknown.
    let seen: HashSet<u64> = found.iter().map(|r| r.record.seq).collect();
    let lost = (ck.write_seq + 1..=durable_seq)
        .filter(|s| !seen.contains(s))
        .count();
    if lost > 0 {
        let places: Vec<String> = gaps
            .iter()
            .map(|(e, a, b)| format!("extent {e} bytes {a}..{b}"))
            .collect();
        problems.push(format!(
            "{lost} durable log records are unreadable (segment header and its copy damaged: \
             {}); the blocks they wrote may read older data",
            if places.is_empty() {
                "no readable trace".to_string()
            } else {
                places.join(", ")
            }
        ));
    }
    Ok(RollForward {
        replay: found,
        durable_seq,
        problems,
        tail,
    })
}

/// Writes again, and syncs, what recovery trusted without knowing it is on the medium: the log
/// tail it replays and the checkpoint it starts from (sequence and bytes). Called by a writable open before it writes
/// anything else.
///
/// Why (docs/design.md, "Failed syncs"): after a failed fsync Linux marks the dirty pages clean
/// and keeps them readable, so a reopen in the same boot reads segments and a checkpoint that
/// never reached the disk, and they pass every check. Replaying them and then checkpointing
/// would let the recovery checkpoint free the extents of the older, durable values (and
/// overwrite the older durable checkpoint slot) on the strength of bytes a power cut then
/// takes away. Rewriting them dirties those pages again, so the sync puts them on the medium
/// (or fails, and the open with it); in every other case it writes the same bytes again. Its
/// cost is bounded by the queue (`queue_len` extents) and one checkpoint slot.
pub fn make_durable(
    storage: &dyn Storage,
    sb: &Superblock,
    checkpoint: (u64, &[u8]),
    tail: &[(u64, Vec<u8>)],
) -> Result<()> {
    for (offset, bytes) in tail {
        storage.write_at(*offset, bytes)?;
    }
    if !tail.is_empty() {
        storage.sync()?;
    }
    // Both copies of its slot (a damaged one is repaired too), after the log it covers; one
    // copy synced before the next is written, so a power cut mid-write leaves the other intact.
    let (seq, bytes) = checkpoint;
    for copy in 0..sb.metadata_copies() {
        storage.write_at(sb.checkpoint_slot_offset(seq, copy), bytes)?;
        storage.sync()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{seal_segment, set_segment_flags, RecordKind};

    /// Roll-forward must stop at a segment it cannot read rather than take it for the log's end.
    #[test]
    fn a_log_segment_with_an_unknown_flag_stops_recovery_by_name() {
        let owner = SegmentOwner {
            uuid: &[4; 16],
            version: 3,
            extent: 1,
            alloc_seq: 9,
        };
        let mut ext = vec![0u8; 16384];
        let first = SegmentHeader {
            version: 3,
            alloc_seq: 9,
            extent: 1,
            seg_offset: 0,
            payload_len: 0,
            record_count: 1,
            durable_seq: 0,
            flags: 0,
        };
        let n = seal_segment(
            &mut ext,
            owner.uuid,
            &first,
            &[Record::new(RecordKind::Trim, 0, 1, 1)],
        );
        let second = SegmentHeader {
            seg_offset: n as u32,
            ..first
        };
        seal_segment(
            &mut ext,
            owner.uuid,
            &second,
            &[Record::new(RecordKind::Trim, 8, 1, 2)],
        );
        assert_eq!(index_segments(&ext, &owner).map(|i| i.len()).ok(), Some(2));
        set_segment_flags(&mut ext, &second, 1 << 4);
        let err = index_segments(&ext, &owner).expect_err("flagged segment skipped");
        assert!(err.to_string().contains("use a newer zbd"), "{err}");
    }
}
