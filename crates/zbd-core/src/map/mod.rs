//! The translation map: logical block -> where its stored bytes are (docs/design.md, "Map").
//!
//! Entries are reached only through [`Map`]'s methods, so how they are kept (resident, paged,
//! summarized) is this module's business. Map pages are written copy-on-write at checkpoints:
//! a dirty page goes to the slot the durable checkpoint does not use, in every metadata copy.

use crate::error::Result;
use crate::format::{
    encode_map_page, BlockState, MapEntry, PageSlot, Superblock, MAP_ENTRIES_PER_PAGE,
};
use crate::storage::Storage;
use std::collections::BTreeSet;

/// Map page holding `lba`.
pub fn page_of(lba: u64) -> u32 {
    (lba / MAP_ENTRIES_PER_PAGE as u64) as u32
}

/// The map of one volume.
pub struct Map {
    entries: Vec<MapEntry>,
    /// Current slot of each map page in the durable checkpoint.
    slots: Vec<PageSlot>,
    /// Map pages changed since the last checkpoint.
    dirty: BTreeSet<u32>,
}

/// Map pages written for a checkpoint that is not durable yet (see [`Map::write_dirty`]).
pub struct WrittenPages {
    /// Slot of every page once the checkpoint is durable.
    pub slots: Vec<PageSlot>,
    /// Bytes written.
    pub bytes: u64,
}

impl Map {
    /// A map over `entries` whose pages sit in `slots` of the durable checkpoint.
    pub fn new(entries: Vec<MapEntry>, slots: Vec<PageSlot>) -> Map {
        Map {
            entries,
            slots,
            dirty: BTreeSet::new(),
        }
    }

    /// Logical blocks.
    pub fn blocks(&self) -> u64 {
        self.entries.len() as u64
    }

    /// The entry of `lba`.
    pub fn get(&mut self, lba: u64) -> Result<MapEntry> {
        Ok(self.entries[lba as usize])
    }

    /// Sets the entry of `lba`; returns the old entry if it changed (its page is then dirty).
    pub fn set(&mut self, lba: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        let old = self.replace(lba, new);
        if old.is_some() {
            self.dirty.insert(page_of(lba));
        }
        Ok(old)
    }

    fn replace(&mut self, lba: u64, new: MapEntry) -> Option<MapEntry> {
        let e = &mut self.entries[lba as usize];
        if *e == new {
            return None;
        }
        Some(std::mem::replace(e, new))
    }

    /// Sets `count` entries from `first` to `new`; `changed(old)` sees every entry replaced.
    pub fn set_range(
        &mut self,
        first: u64,
        count: u64,
        new: MapEntry,
        mut changed: impl FnMut(MapEntry),
    ) -> Result<()> {
        // Ranges can span the whole volume (mkfs discards everything): one dirty-page insert per
        // page, none for blocks already in that state.
        let mut last_page = None;
        for l in first..first + count {
            if let Some(old) = self.replace(l, new) {
                changed(old);
                let page = page_of(l);
                if last_page != Some(page) {
                    self.dirty.insert(page);
                    last_page = Some(page);
                }
            }
        }
        Ok(())
    }

    /// Marks pages for rewriting (both copies) by the next checkpoint.
    pub fn mark_dirty(&mut self, pages: impl IntoIterator<Item = u32>) {
        self.dirty.extend(pages);
    }

    /// Slot of every page in the durable checkpoint.
    pub fn slots(&self) -> &[PageSlot] {
        &self.slots
    }

    /// Calls `f(lba, entry)` for every block, in LBA order.
    pub fn for_each(&mut self, mut f: impl FnMut(u64, &MapEntry)) -> Result<()> {
        for (l, e) in self.entries.iter().enumerate() {
            f(l as u64, e);
        }
        Ok(())
    }

    /// Calls `f(lba, entry)` for every block in state `Data`, in LBA order.
    pub fn for_each_data(&mut self, f: impl FnMut(u64, &MapEntry)) -> Result<()> {
        self.for_each_data_in(0, self.blocks(), f)
    }

    /// Like [`Map::for_each_data`] over `first..first + count`.
    pub fn for_each_data_in(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(u64, &MapEntry),
    ) -> Result<()> {
        for l in first..first + count {
            let e = &self.entries[l as usize];
            if e.state == BlockState::Data {
                f(l, e);
            }
        }
        Ok(())
    }

    /// Calls `f(state, blocks)` for each run of blocks of one state in `first..first + count`.
    pub fn runs(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(BlockState, u64),
    ) -> Result<()> {
        let mut run: Option<(BlockState, u64)> = None;
        for e in &self.entries[first as usize..(first + count) as usize] {
            match &mut run {
                Some((s, n)) if *s == e.state => *n += 1,
                _ => {
                    if let Some((s, n)) = run {
                        f(s, n);
                    }
                    run = Some((e.state, 1));
                }
            }
        }
        if let Some((s, n)) = run {
            f(s, n);
        }
        Ok(())
    }

    /// Writes every dirty page for checkpoint `seq` into the slot the durable checkpoint does
    /// not use, in every metadata copy (no sync). Nothing changes in RAM until [`Map::commit`].
    pub fn write_dirty(
        &mut self,
        storage: &dyn Storage,
        sb: &Superblock,
        seq: u64,
    ) -> Result<WrittenPages> {
        let mut slots = self.slots.clone();
        let mut bytes = 0u64;
        for &p in &self.dirty {
            let slot = if slots[p as usize] == 1 { 2 } else { 1 };
            let start = p as usize * MAP_ENTRIES_PER_PAGE;
            let end = (start + MAP_ENTRIES_PER_PAGE).min(self.entries.len());
            let page = encode_map_page(p, seq, &self.entries[start..end]);
            // Every copy (v2: two, a metadata half apart): one bad sector loses nothing.
            for copy in 0..sb.metadata_copies() {
                storage.write_at(sb.map_page_offset(p, slot - 1, copy), &page)?;
                bytes += page.len() as u64;
            }
            slots[p as usize] = slot;
        }
        Ok(WrittenPages { slots, bytes })
    }

    /// The checkpoint that `written` belongs to is durable.
    pub fn commit(&mut self, written: WrittenPages) {
        self.slots = written.slots;
        self.dirty.clear();
    }
}
