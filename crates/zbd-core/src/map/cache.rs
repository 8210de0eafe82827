//! The map page cache: a bounded set of resident pages, evicted by CLOCK (second chance).
//! Dirty pages are pinned: they leave only after a checkpoint wrote them.

use crate::format::{MapEntry, MAP_ENTRIES_PER_PAGE};
use std::collections::HashMap;

/// Default budget of the map cache (dm-vdo serves ~100 GB with 128 MB).
pub const MAP_CACHE_BYTES_DEFAULT: usize = 64 << 20;

/// RAM one resident page takes: its entries plus bookkeeping (frame, index slot).
pub const FRAME_BYTES: usize = MAP_ENTRIES_PER_PAGE * std::mem::size_of::<MapEntry>() + 64;

/// One resident page.
pub struct Frame {
    /// Page index.
    pub page: u32,
    /// Its entries.
    pub entries: Box<[MapEntry]>,
    referenced: bool,
    dirty: bool,
}

/// Resident pages.
pub struct Cache {
    frames: Vec<Frame>,
    index: HashMap<u32, usize>,
    hand: usize,
    budget: usize,
    dirty: usize,
    /// Frames' worth of RAM held outside the cache for the map (a checkpoint's encoded pages):
    /// counted in the budget, so fewer pages stay resident meanwhile.
    reserved: usize,
}

impl Cache {
    /// A cache of about `bytes` (at least one page).
    pub fn new(bytes: usize) -> Cache {
        Cache {
            frames: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            budget: (bytes / FRAME_BYTES).max(1),
            dirty: 0,
            reserved: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Frames' worth of RAM reserved outside the cache.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Pages the cache may hold now: the budget less what is reserved (at least one).
    fn room(&self) -> usize {
        self.budget.saturating_sub(self.reserved).max(1)
    }

    /// Counts `frames` of RAM held outside the cache in its budget from now on (replacing what
    /// was reserved before), evicting clean pages to make room; returns the pages evicted.
    pub fn reserve(&mut self, frames: usize) -> Vec<Frame> {
        self.reserved = frames;
        self.shrink()
    }

    /// Evicts clean pages until the cache is within its room (pinned ones may keep it above).
    fn shrink(&mut self) -> Vec<Frame> {
        let mut out = Vec::new();
        while self.frames.len() > self.room() {
            match self.evict_one() {
                Some(f) => out.push(f),
                None => break,
            }
        }
        out
    }

    /// Dirty (pinned) pages.
    pub fn dirty(&self) -> usize {
        self.dirty
    }

    pub fn contains(&self, page: u32) -> bool {
        self.index.contains_key(&page)
    }

    /// The frame of `page`, marked recently used.
    pub fn get(&mut self, page: u32) -> Option<&mut Frame> {
        let f = &mut self.frames[*self.index.get(&page)?];
        f.referenced = true;
        Some(f)
    }

    pub fn mark_dirty(&mut self, page: u32) {
        if let Some(&i) = self.index.get(&page) {
            let f = &mut self.frames[i];
            if !f.dirty {
                f.dirty = true;
                self.dirty += 1;
            }
        }
    }

    /// Adds a page, evicting a clean one first when the cache is full (none clean: it grows
    /// past the budget until the next checkpoint). Returns the page evicted.
    pub fn insert(&mut self, page: u32, entries: Box<[MapEntry]>, dirty: bool) -> Option<Frame> {
        let evicted = if self.frames.len() >= self.room() {
            self.evict_one()
        } else {
            None
        };
        self.index.insert(page, self.frames.len());
        self.frames.push(Frame {
            page,
            entries,
            referenced: true,
            dirty,
        });
        self.dirty += usize::from(dirty);
        evicted
    }

    /// Drops `page` (dirty or not: its content is now described by its summary).
    pub fn remove(&mut self, page: u32) {
        if let Some(&i) = self.index.get(&page) {
            self.take(i);
        }
    }

    fn take(&mut self, i: usize) -> Frame {
        let f = self.frames.swap_remove(i);
        self.index.remove(&f.page);
        if let Some(moved) = self.frames.get(i) {
            self.index.insert(moved.page, i);
        }
        self.dirty -= usize::from(f.dirty);
        f
    }

    /// CLOCK: the first clean page not used since the hand last passed it.
    fn evict_one(&mut self) -> Option<Frame> {
        for _ in 0..2 * self.frames.len() {
            if self.hand >= self.frames.len() {
                self.hand = 0;
            }
            let f = &mut self.frames[self.hand];
            if !f.dirty && !f.referenced {
                return Some(self.take(self.hand));
            }
            f.referenced = false;
            self.hand += 1;
        }
        None
    }

    /// A checkpoint wrote the pinned pages: all but those `still_dirty` are clean; pages past
    /// the room leave.
    pub fn clean_except(&mut self, still_dirty: impl Fn(u32) -> bool) -> Vec<Frame> {
        for f in self.frames.iter_mut() {
            if f.dirty && !still_dirty(f.page) {
                f.dirty = false;
                self.dirty -= 1;
            }
        }
        self.shrink()
    }
}
