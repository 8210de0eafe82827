//! The persisted extent table (format v2, checkpoint flag bit 1): live bytes, live blocks and
//! state of every extent as of a checkpoint, so opening a volume needs no scan of the map.
//!
//! Pages are written copy-on-write like map pages (the slot the durable checkpoint does not use,
//! every metadata copy), and only those whose extents' live accounting changed since the last
//! checkpoint ([`ExtentTable::touch`]). A page never written ("none" slot) holds only free
//! extents, and a page whose extents are all free goes back to that slot instead of being written. A page with no intact copy makes open fall back to
//! recounting from the map (nothing is lost: the table is derived data).

use super::{ExtentInfo, ExtentState};
use crate::backend::Storage;
use crate::error::Result;
use crate::format::{
    Checkpoint, PageSlot, Superblock, CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_METADATA_PAGES,
    EXTENT_TABLE_ENTRIES_PER_PAGE, MAP_PAGE_BYTES, PAGE_NONE, RECORD_BYTES,
};

const HEADER_BYTES: usize = 16;
const ENTRY_BYTES: usize = 8;
const STATE_FREE: u8 = 0;
const STATE_CLOSED: u8 = 1;
/// A metadata extent (bit 10): live bytes 0, live blocks = its pairs in use.
const STATE_METADATA: u8 = 3;

/// Where the table's pages are and what they hold.
pub struct ExtentTable {
    /// Slot of each page in the durable checkpoint.
    slots: Vec<PageSlot>,
    /// Pages whose extents changed since the last checkpoint's snapshot (one bit each).
    dirty: Vec<u64>,
    /// Pages of the snapshot a checkpoint in flight writes.
    writing: Vec<u64>,
}

/// Table pages written for a checkpoint that is not durable yet.
pub struct WrittenTable {
    /// Slot of every page once the checkpoint is durable.
    pub slots: Vec<PageSlot>,
    /// Bytes written.
    pub bytes: u64,
}

fn page_offset(sb: &Superblock, page: u32, slot: u8, copy: u8) -> u64 {
    sb.extent_table_offset[copy as usize]
        + (u64::from(page) * 2 + u64::from(slot)) * MAP_PAGE_BYTES as u64
}

/// Entries of page `p` as stored (state: metadata as kept, else closed when it holds live
/// blocks and free otherwise: what a checkpoint references is exactly what has live blocks).
fn encode_entries(extents: &[ExtentInfo], p: u32) -> Vec<u8> {
    let mut b = vec![0u8; MAP_PAGE_BYTES - HEADER_BYTES];
    let first = p as usize * EXTENT_TABLE_ENTRIES_PER_PAGE;
    let last = (first + EXTENT_TABLE_ENTRIES_PER_PAGE).min(extents.len());
    for (i, x) in extents[first..last].iter().enumerate() {
        let o = i * ENTRY_BYTES;
        b[o..o + 4].copy_from_slice(&x.live_bytes().to_le_bytes());
        b[o + 4..o + 7].copy_from_slice(&x.live_blocks().to_le_bytes()[..3]);
        b[o + 7] = if x.state() == ExtentState::Metadata {
            STATE_METADATA
        } else if x.live_blocks() > 0 {
            STATE_CLOSED
        } else {
            STATE_FREE
        };
    }
    b
}

impl ExtentTable {
    /// A table with no page written (every extent free), e.g. v1 or after a recount.
    pub fn unwritten(sb: &Superblock) -> ExtentTable {
        let n = sb.extent_table_pages as usize;
        ExtentTable {
            slots: vec![PAGE_NONE; n],
            // The first checkpoint writes every page that has a live extent.
            dirty: vec![u64::MAX; n.div_ceil(64)],
            writing: vec![0; n.div_ceil(64)],
        }
    }

    /// Extent `e`'s live accounting changed: its page is written by the next checkpoint.
    pub fn touch(&mut self, e: u32) {
        let p = e as usize / EXTENT_TABLE_ENTRIES_PER_PAGE;
        if let Some(w) = self.dirty.get_mut(p / 64) {
            *w |= 1 << (p % 64);
        }
    }

    /// Reads the table of checkpoint `ck`: `None` if the checkpoint has none or a page has no
    /// intact copy (the caller recounts from the map).
    pub fn load(
        storage: &dyn Storage,
        sb: &Superblock,
        ck: &Checkpoint,
    ) -> Result<Option<(ExtentTable, Vec<ExtentInfo>)>> {
        if sb.version < 2 || ck.flags & CKPT_FLAG_EXTENT_TABLE == 0 {
            return Ok(None);
        }
        let mut extents = vec![ExtentInfo::FREE; sb.extent_count as usize];
        let table = ExtentTable {
            slots: ck.extent_table_slots.clone(),
            dirty: vec![0; (sb.extent_table_pages as usize).div_ceil(64)],
            writing: vec![0; (sb.extent_table_pages as usize).div_ceil(64)],
        };
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        for p in 0..sb.extent_table_pages {
            let slot = table.slots[p as usize];
            if slot == PAGE_NONE {
                continue;
            }
            let mut ok = false;
            for copy in 0..sb.metadata_copies() {
                storage.read_at(page_offset(sb, p, slot - 1, copy), &mut buf)?;
                if decode_page(&buf, p, ck, sb, &mut extents) {
                    ok = true;
                    break;
                }
            }
            if !ok {
                return Ok(None);
            }
        }
        Ok(Some((table, extents)))
    }

    /// Encodes every touched page for checkpoint `seq` as of `extents` now: the (storage
    /// offset, bytes) writes and the slots the checkpoint records. The pages leave the touched
    /// set (extents changed from now on touch them again); [`ExtentTable::commit`] or
    /// [`ExtentTable::abort`] follows.
    pub fn snapshot(
        &mut self,
        sb: &Superblock,
        extents: &[ExtentInfo],
        seq: u64,
    ) -> (Vec<crate::map::PageWrite>, WrittenTable) {
        let mut out = WrittenTable {
            slots: self.slots.clone(),
            bytes: 0,
        };
        let mut writes = Vec::new();
        for p in 0..sb.extent_table_pages {
            if self.dirty[p as usize / 64] & (1 << (p % 64)) == 0 {
                continue;
            }
            let entries = encode_entries(extents, p);
            if entries.iter().all(|&b| b == 0) {
                out.slots[p as usize] = PAGE_NONE;
                continue;
            }
            let slot = if out.slots[p as usize] == 1 { 2 } else { 1 };
            let mut page = vec![0u8; MAP_PAGE_BYTES];
            page[0..4].copy_from_slice(&p.to_le_bytes());
            page[8..16].copy_from_slice(&seq.to_le_bytes());
            page[HEADER_BYTES..].copy_from_slice(&entries);
            let page_crc = crc32c::crc32c(&page);
            page[4..8].copy_from_slice(&page_crc.to_le_bytes());
            let page: std::sync::Arc<[u8]> = page.into();
            for copy in 0..sb.metadata_copies() {
                out.bytes += page.len() as u64;
                writes.push((
                    page_offset(sb, p, slot - 1, copy),
                    std::sync::Arc::clone(&page),
                ));
            }
            out.slots[p as usize] = slot;
        }
        self.writing = std::mem::replace(&mut self.dirty, vec![0; self.writing.len()]);
        (writes, out)
    }

    /// The checkpoint `written` belongs to is durable.
    pub fn commit(&mut self, written: WrittenTable) {
        self.slots = written.slots;
        self.writing.fill(0);
    }

    /// The checkpoint of the snapshot failed: its pages are touched again.
    pub fn abort(&mut self) {
        for (d, w) in self.dirty.iter_mut().zip(self.writing.iter_mut()) {
            *d |= std::mem::take(w);
        }
    }
}

/// Decodes table page `p` of checkpoint `ck` into `extents`; false if it is damaged, stale or
/// inconsistent (state 3 only with bit 10).
fn decode_page(
    b: &[u8],
    p: u32,
    ck: &Checkpoint,
    sb: &Superblock,
    extents: &mut [ExtentInfo],
) -> bool {
    let mut zeroed = b.to_vec();
    zeroed[4..8].fill(0);
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let gen = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
    if u32_at(0) != p || u32_at(4) != crc32c::crc32c(&zeroed) || gen > ck.seq {
        return false;
    }
    let metadata_allowed = ck.flags & CKPT_FLAG_METADATA_PAGES != 0;
    let first = p as usize * EXTENT_TABLE_ENTRIES_PER_PAGE;
    let last = (first + EXTENT_TABLE_ENTRIES_PER_PAGE).min(extents.len());
    let mut decoded = Vec::with_capacity(last - first);
    for i in 0..last - first {
        let o = HEADER_BYTES + i * ENTRY_BYTES;
        let live_bytes = u32_at(o);
        let live_blocks = u32::from_le_bytes([b[o + 4], b[o + 5], b[o + 6], 0]);
        let state = match b[o + 7] {
            STATE_FREE if live_blocks == 0 => ExtentState::Free,
            STATE_CLOSED if live_blocks > 0 => ExtentState::Closed,
            STATE_METADATA if metadata_allowed && live_bytes == 0 => ExtentState::Metadata,
            _ => return false,
        };
        if u64::from(live_bytes) > u64::from(sb.extent_bytes)
            || u64::from(live_blocks) > u64::from(sb.extent_bytes) / RECORD_BYTES as u64
            || (live_blocks == 0 && live_bytes != 0)
        {
            return false;
        }
        decoded.push(ExtentInfo::new(state, live_bytes, live_blocks, 0));
    }
    extents[first..last].copy_from_slice(&decoded);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemStorage;

    fn info(state: ExtentState, live_blocks: u32) -> ExtentInfo {
        let live_bytes = if state == ExtentState::Closed {
            4096
        } else {
            0
        };
        ExtentInfo::new(state, live_bytes, live_blocks, 0)
    }

    /// Writes `extents` as checkpoint 1's table and loads it back under `flags`.
    fn round_trip(extents: &[ExtentInfo], flags: u32) -> Option<Vec<ExtentInfo>> {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(1 << 30)).expect("plan");
        let storage = MemStorage::new(sb.total_bytes());
        let mut table = ExtentTable::unwritten(&sb);
        let (writes, written) = table.snapshot(&sb, extents, 1);
        for (at, page) in writes {
            storage.write_at(at, &page).expect("write");
        }
        let mut ck = Checkpoint::empty(&sb);
        ck.seq = 1;
        ck.flags = CKPT_FLAG_EXTENT_TABLE | flags;
        ck.extent_table_slots = written.slots;
        ExtentTable::load(&storage, &sb, &ck)
            .expect("load")
            .map(|(_, x)| x)
    }

    /// Metadata extents keep their state and pair count through the table (state 3), and a
    /// checkpoint without bit 10 refuses such a page (the open recounts instead of reading a
    /// metadata extent as free).
    #[test]
    fn metadata_extents_survive_the_table_only_with_bit_10() {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(1 << 30)).expect("plan");
        let mut extents = vec![info(ExtentState::Free, 0); sb.extent_count as usize];
        extents[0] = info(ExtentState::Metadata, 5);
        extents[1] = info(ExtentState::Metadata, 0);
        extents[2] = info(ExtentState::Closed, 1);
        let back = round_trip(&extents, CKPT_FLAG_METADATA_PAGES).expect("bit 10 loads");
        let view = |x: &[ExtentInfo]| -> Vec<(ExtentState, u32)> {
            x.iter().map(|i| (i.state(), i.live_blocks())).collect()
        };
        assert_eq!(view(&back), view(&extents));
        assert!(round_trip(&extents, 0).is_none());
    }

    /// An entry counting more live blocks than the extent has room for records is damage
    /// (whatever its checksum says): the page is refused and the open recounts.
    #[test]
    fn a_page_counting_more_blocks_than_records_fit_is_refused() {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(1 << 30)).expect("plan");
        let fit = sb.extent_bytes / RECORD_BYTES as u32;
        let mut extents = vec![info(ExtentState::Free, 0); sb.extent_count as usize];
        extents[2] = info(ExtentState::Closed, fit);
        assert!(round_trip(&extents, 0).is_some());
        extents[2] = info(ExtentState::Closed, fit + 1);
        assert!(round_trip(&extents, 0).is_none());
    }
}
