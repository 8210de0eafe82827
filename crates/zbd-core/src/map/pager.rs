//! The pager: reads a map page from the slot the durable checkpoint names, copy 0 else the
//! others, checking each (CRC, page number, generation). The only part of the map that does
//! I/O; the cache, the dirty set and the counters are the map's (`mod.rs`).

use super::decode_page;
use crate::backend::Storage;
use crate::error::Result;
use crate::format::{BlockState, MapEntry, PageSlot, Superblock, MAP_PAGE_BYTES, PAGE_NONE};
use std::sync::Arc;

/// How a page read went.
pub(super) enum PageRead {
    /// From its first copy (or never written: all unmapped).
    Intact,
    /// The first copy is damaged, another one was intact: rewrite both.
    Repaired,
    /// No intact copy: every entry is `Corrupt`.
    Damaged,
}

/// Where each page is on the medium, and the reads of them.
pub(super) struct Pager {
    storage: Arc<dyn Storage>,
    sb: Superblock,
    /// Sequence of the durable checkpoint: a page claiming a newer one is stale.
    gen: u64,
    /// Slot of each page in the durable checkpoint.
    slots: Vec<PageSlot>,
    /// Pages read from storage, and their bytes.
    pub faults: u64,
    pub bytes_read: u64,
}

impl Pager {
    pub fn new(storage: Arc<dyn Storage>, sb: &Superblock, gen: u64, slots: Vec<PageSlot>) -> Self {
        Pager {
            storage,
            sb: sb.clone(),
            gen,
            slots,
            faults: 0,
            bytes_read: 0,
        }
    }

    /// Slot of each page in the durable checkpoint.
    pub fn slots(&self) -> &[PageSlot] {
        &self.slots
    }

    /// Reads page `p` into `entries` (which the caller filled with `UNMAPPED`).
    pub fn read(&mut self, p: u32, entries: &mut [MapEntry]) -> Result<PageRead> {
        let slot = self.slots[p as usize];
        if slot == PAGE_NONE {
            return Ok(PageRead::Intact);
        }
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        for copy in 0..self.sb.metadata_copies() {
            self.storage
                .read_at(self.sb.map_page_offset(p, slot - 1, copy), &mut buf)?;
            self.faults += 1;
            self.bytes_read += MAP_PAGE_BYTES as u64;
            if decode_page(&buf, p, &self.sb, self.gen, entries) {
                return Ok(if copy > 0 {
                    PageRead::Repaired
                } else {
                    PageRead::Intact
                });
            }
        }
        entries.fill(MapEntry {
            state: BlockState::Corrupt,
            ..MapEntry::UNMAPPED
        });
        Ok(PageRead::Damaged)
    }

    /// Checkpoint `gen` is durable: its pages (page, slot, summary) are where it wrote them.
    pub fn commit(&mut self, gen: u64, pages: &[(u32, PageSlot, u8)]) {
        for &(p, slot, _) in pages {
            self.slots[p as usize] = slot;
        }
        self.gen = gen;
    }
}
