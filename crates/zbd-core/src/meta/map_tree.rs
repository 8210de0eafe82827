//! A device's map as a tree of pages (docs/design.md, "Map trees, pages and pairs"): leaves of
//! 255 entries, interior pages of 1,020 child slots, one root slot. A child slot is a page id
//! or a summary (all unmapped, all zero) that stands for a whole subtree with no page at all,
//! so a created volume's map is one summary and a discard of a terabyte changes a few slots.
//!
//! Pages live in the [`PagePool`]; the tree reads what it lacks and gets new ids through
//! [`TreeIo`], the one place with I/O and allocation, so the tree itself is pure and tested
//! against a model. Pages named by more than one parent (snapshots and clones share their
//! origin's pages) are copied on write ([`Sharing`], design.md "Copy on write"); a volume
//! without them changes every page in place.

use super::devices::DEFAULT_DEVICE;
use super::page::Page;
use super::pool::{Install, PagePool};
use super::tree::{blocks_under, child_slot, depth_for, entry_index, position, DEPTH_MAX};
use crate::error::{Error, Result};
use crate::format::{
    encode_map_interior, encode_map_leaf, map_child_slot, map_leaf_entry, set_map_child_slot,
    set_map_leaf_entry, BlockState, ChildSlot, MapEntry, PageAddress, PageKind, PairSlot,
    MAP_ENTRIES_PER_PAGE, MAP_INTERIOR_SLOTS, PAGE_ID_ALL_UNMAPPED,
};

fn kind_at(level: u8) -> PageKind {
    if level == 0 {
        PageKind::MapLeaf
    } else {
        PageKind::MapInterior
    }
}

/// The entry every block under a summary has.
fn summary_entry(s: ChildSlot) -> Option<MapEntry> {
    match s {
        ChildSlot::AllUnmapped => Some(MapEntry::UNMAPPED),
        ChildSlot::AllZero => Some(MapEntry::ZERO),
        ChildSlot::Page(_) => None,
    }
}

/// The summary that stands for blocks all holding `e` (unmapped or zero); `None` for any
/// other entry.
pub fn summary_slot(e: MapEntry) -> Option<ChildSlot> {
    [ChildSlot::AllUnmapped, ChildSlot::AllZero]
        .into_iter()
        .find(|&s| summary_entry(s) == Some(e))
}

impl Page {
    /// A page of `device` (at `epoch`) at `level`, `position` whose every block is what
    /// `summary` says.
    fn filled(device: u32, epoch: u32, level: u8, position: u64, summary: ChildSlot) -> Page {
        let body = match level {
            0 => {
                encode_map_leaf(&[summary_entry(summary).expect("a summary"); MAP_ENTRIES_PER_PAGE])
            }
            _ => encode_map_interior(&[summary; MAP_INTERIOR_SLOTS]),
        };
        Page {
            creator: device,
            epoch,
            ..Page::new(kind_at(level), level, position, body)
        }
    }

    fn entry(&self, i: usize) -> Result<MapEntry> {
        debug_assert_eq!(self.level, 0);
        map_leaf_entry(&self.body, i)
    }

    fn set_entry(&mut self, i: usize, e: &MapEntry) {
        debug_assert_eq!(self.level, 0);
        set_map_leaf_entry(&mut self.body, i, e);
    }

    fn slot(&self, i: usize) -> ChildSlot {
        debug_assert!(self.level > 0);
        map_child_slot(&self.body, i)
    }

    fn set_slot(&mut self, i: usize, s: ChildSlot) {
        debug_assert!(self.level > 0);
        set_map_child_slot(&mut self.body, i, s);
    }
}

/// What copy on write asks of the volume beside one tree (design.md, "Copy on write"): page
/// counts (the PCT: a page named by more than one parent is shared, and a change to it goes to
/// a copy) and the promotion of a leaf's direct items before a copy shares them (invariant P).
/// A volume where no page has more than one parent is [`NoSharing`]: every page is changed in
/// place, as before snapshots.
pub trait Sharing<I: TreeIo> {
    /// Whether any page may have more than one parent (else nothing below is asked).
    fn active(&self) -> bool;
    /// count(page): the parents that name page `id` at `level`, `pos` (1 when none is stored).
    fn count(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        level: u8,
        pos: u64,
        id: u32,
    ) -> Result<u32>;
    /// Sets count(page) (stored only when it is not 1).
    fn set_count(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        level: u8,
        pos: u64,
        id: u32,
        count: u32,
    ) -> Result<()>;
    /// A new shared item for the direct item `at` names, its blocks at `blocks` (each named
    /// once in a live leaf) and `extra` more slots the caller is adding (a leaf copy's): its
    /// SBT key, or an error with nothing stored.
    fn share_item(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        birth: u64,
        at: &MapEntry,
        blocks: &[(u64, MapEntry)],
        extra: u32,
    ) -> Result<crate::format::SbtKey>;
    /// One more leaf slot names the shared item of `e` (a leaf copy).
    fn add_ref(&mut self, pool: &mut PagePool<Page>, io: &mut I, e: &MapEntry) -> Result<()>;
    /// A copy made `blocks` more blocks of entry `e` live (the volume counters count each
    /// live page once).
    fn copied(&mut self, e: &MapEntry, blocks: u64);
}

/// A volume whose pages each have one parent: no copy on write.
pub struct NoSharing;

impl<I: TreeIo> Sharing<I> for NoSharing {
    fn active(&self) -> bool {
        false
    }
    fn count(&mut self, _: &mut PagePool<Page>, _: &mut I, _: u8, _: u64, _: u32) -> Result<u32> {
        Ok(1)
    }
    fn set_count(
        &mut self,
        _: &mut PagePool<Page>,
        _: &mut I,
        _: u8,
        _: u64,
        _: u32,
        _: u32,
    ) -> Result<()> {
        Err(Error::Invalid("no page is shared on this volume".into()))
    }
    fn share_item(
        &mut self,
        _: &mut PagePool<Page>,
        _: &mut I,
        _: u64,
        _: &MapEntry,
        _: &[(u64, MapEntry)],
        _: u32,
    ) -> Result<crate::format::SbtKey> {
        Err(Error::Invalid("no page is shared on this volume".into()))
    }
    fn add_ref(&mut self, _: &mut PagePool<Page>, _: &mut I, _: &MapEntry) -> Result<()> {
        Err(Error::Invalid("no page is shared on this volume".into()))
    }
    fn copied(&mut self, _: &MapEntry, _: u64) {}
}

/// Calls `f(lba, n)` for every run of blocks where trees `a` and `b` (of one depth and size)
/// hold different entries, in LBA order: slots that name the same page, or the same summary,
/// are skipped without a read (a snapshot and its origin differ only where the origin copied).
/// Zero and unmapped blocks both read zeros: they do not differ.
pub fn diff<I: TreeIo>(
    pool: &mut PagePool<Page>,
    io: &mut I,
    a: &MapTree,
    b: &MapTree,
    f: &mut impl FnMut(u64, u64),
) -> Result<()> {
    diff_below(pool, io, a.root, b.root, a.depth - 1, 0, a.blocks, f)
}

#[allow(clippy::too_many_arguments)]
fn diff_below<I: TreeIo>(
    pool: &mut PagePool<Page>,
    io: &mut I,
    a: ChildSlot,
    b: ChildSlot,
    level: u8,
    pos: u64,
    blocks: u64,
    f: &mut impl FnMut(u64, u64),
) -> Result<()> {
    let start = pos * blocks_under(level);
    let zeros = |s: ChildSlot| matches!(s, ChildSlot::AllZero | ChildSlot::AllUnmapped);
    if a == b || (zeros(a) && zeros(b)) || start >= blocks {
        return Ok(());
    }
    let end = (start + blocks_under(level)).min(blocks);
    if level == 0 {
        let entries = |pool: &mut PagePool<Page>, io: &mut I, s: ChildSlot| match s {
            ChildSlot::Page(id) => (0..MAP_ENTRIES_PER_PAGE)
                .map(|i| read(pool, io, id, 0, pos)?.entry(i))
                .collect::<Result<Vec<_>>>(),
            summary => Ok(vec![
                summary_entry(summary).expect("a summary");
                MAP_ENTRIES_PER_PAGE
            ]),
        };
        let (ea, eb) = (entries(pool, io, a)?, entries(pool, io, b)?);
        let zero = |e: &MapEntry| matches!(e.state, BlockState::Zero | BlockState::Unmapped);
        for lba in start..end {
            let i = (lba - start) as usize;
            if ea[i] != eb[i] && !(zero(&ea[i]) && zero(&eb[i])) {
                f(lba, 1);
            }
        }
        return Ok(());
    }
    if let (ChildSlot::Page(_), ChildSlot::Page(_))
    | (ChildSlot::Page(_), _)
    | (_, ChildSlot::Page(_)) = (a, b)
    {
        let child = |pool: &mut PagePool<Page>, io: &mut I, s: ChildSlot, i: usize| match s {
            ChildSlot::Page(id) => Ok::<_, Error>(read(pool, io, id, level, pos)?.slot(i)),
            summary => Ok(summary),
        };
        for i in 0..MAP_INTERIOR_SLOTS {
            let (ca, cb) = (child(pool, io, a, i)?, child(pool, io, b, i)?);
            let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
            diff_below(pool, io, ca, cb, level - 1, cpos, blocks, f)?;
        }
        return Ok(());
    }
    // Two different summaries: every block differs.
    f(start, end - start);
    Ok(())
}

/// The children of an interior page at `level` that blocks `lo .. hi` (inside it) reach: for
/// each, its slot, its position one level down and the part of the range under it.
fn children(level: u8, lo: u64, hi: u64) -> impl Iterator<Item = (usize, u64, u64, u64)> {
    let span = blocks_under(level - 1);
    (lo / span..=(hi - 1) / span).map(move |c| {
        let start = c * span;
        let slot = (c % MAP_INTERIOR_SLOTS as u64) as usize;
        (slot, c, lo.max(start), hi.min(start.saturating_add(span)))
    })
}

/// What meeting one page costs a release step's budget, against one unit per entry given up:
/// a step frees at most `budget / RELEASE_PAGE_COST + 1` pages, however few entries they
/// hold, and that must stay well inside the open window a checkpoint's pair-state list allows.
pub const RELEASE_PAGE_COST: u64 = 32;

/// `MapTree::referenced` below one slot at `level`, `pos`.
fn referenced_below<I: TreeIo>(
    pool: &mut PagePool<Page>,
    io: &mut I,
    slot: ChildSlot,
    level: u8,
    pos: u64,
    memo: &mut std::collections::HashMap<u32, u64>,
    bytes: &mut impl FnMut(&mut PagePool<Page>, &mut I, &MapEntry) -> Result<u64>,
) -> Result<u64> {
    let ChildSlot::Page(id) = slot else {
        return Ok(0);
    };
    if let Some(&sum) = memo.get(&id) {
        return Ok(sum);
    }
    let mut sum = 0;
    if level == 0 {
        for i in 0..MAP_ENTRIES_PER_PAGE {
            let e = read(pool, io, id, 0, pos)?.entry(i)?;
            if matches!(e.state, BlockState::Data | BlockState::Shared) {
                sum += bytes(pool, io, &e)?;
            }
        }
    } else {
        for i in 0..MAP_INTERIOR_SLOTS {
            let child = read(pool, io, id, level, pos)?.slot(i);
            let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
            sum += referenced_below(pool, io, child, level - 1, cpos, memo, bytes)?;
        }
    }
    memo.insert(id, sum);
    Ok(sum)
}

/// Reads, ids and frees for a tree: the engine's implementation reads a page's current slot
/// (pair state), allocates from the pair allocator and records frees in the pair-state list.
pub trait TreeIo {
    /// Page `at` as its current slot holds it, checked against its address. The pool is for
    /// what finding that slot needs (a pair-state page), never for `at` itself.
    fn read(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Result<Page>;
    /// An id for `page`, about to be created (the default device's map leaf at a region-0
    /// position takes its fixed id; every other page an allocated one).
    fn allocate(&mut self, page: &Page) -> Result<u32>;
    /// Page `id` left the tree (its subtree became a summary).
    fn free(&mut self, id: u32);
    /// Leaf `at` had no intact copy and stands in as a leaf of damaged entries
    /// ([`fault_at`]): noted for counters and reports. Returns the slot its pair's durable
    /// copy is in, which the stand-in's frame records as a read page's does.
    fn lost(&mut self, _pool: &mut PagePool<Page>, _at: &PageAddress) -> Option<PairSlot> {
        None
    }
}

/// A run of blocks a range change replaced: `count` blocks from `first` all had `entry`, which
/// differs from the range's new entry (one block for a leaf entry, a whole subtree for a
/// summary). Every block whose entry changes is in exactly one run, unmapped blocks a zeroing
/// reaches included, so a caller keeps counters exact from the runs alone: `entry` loses
/// `count` blocks and the new entry gains them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replaced {
    pub first: u64,
    pub count: u64,
    pub entry: MapEntry,
}

/// One device's map tree: its root slot and depth (the device row holds both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapTree {
    /// The device whose map it is: the creator its new pages carry (only the default
    /// device's leaves take region 0's fixed ids).
    device: u32,
    /// The device's epoch (its row's): pages it made at this epoch are its own alone.
    epoch: u32,
    root: ChildSlot,
    depth: u8,
    /// The device's size: blocks at and past it are refused, and ranges stop there, so the
    /// room up to the tree's reach stays unmapped for a later grow.
    blocks: u64,
}

/// Makes page `id` resident (read through `io` when it is not). A resident frame must be the
/// page the walk expects there: a slot naming a page of another place or kind (a crafted or
/// stale slot) is damage, never another page's entries.
fn fault<I: TreeIo>(
    pool: &mut PagePool<Page>,
    io: &mut I,
    id: u32,
    level: u8,
    position: u64,
) -> Result<()> {
    fault_at(
        pool,
        io,
        &PageAddress {
            id,
            kind: kind_at(level),
            level,
            position,
        },
    )
}

/// Makes the page at `at` resident, whatever its kind: [`fault`]'s rule for every tree of
/// pages (map trees, the SBT and the PCT).
pub(crate) fn fault_at<I: TreeIo>(
    pool: &mut PagePool<Page>,
    io: &mut I,
    at: &PageAddress,
) -> Result<()> {
    let (id, kind, level, position) = (at.id, at.kind, at.level, at.position);
    if pool.contains(id) {
        let page = pool.peek(id).expect("resident");
        if pool.kind_of(id) != Some(kind) || page.level != level || page.position != position {
            return Err(Error::CorruptMetadata(format!(
                "{kind:?} page {id} named at level {level} position {position} is a {:?} page \
                 at level {} position {}",
                page.kind, page.level, page.position
            )));
        }
        return Ok(());
    }
    let page = match io.read(pool, at) {
        // A leaf with no intact copy stands in as a leaf of damaged entries, as v2's lost map
        // page does: its blocks read as errors, a write under it is taken (and writes the
        // leaf again), and replay applies records to it. Only for damage: an I/O error is
        // returned, never made into damage. Its creator is the default device, the only
        // one whose leaves a single-device volume has.
        Err(Error::CorruptMetadata(_)) if kind == PageKind::MapLeaf => {
            let slot = io.lost(pool, at);
            let damaged = MapEntry {
                state: BlockState::Corrupt,
                ..MapEntry::UNMAPPED
            };
            Page {
                creator: DEFAULT_DEVICE,
                slot,
                ..Page::new(
                    kind,
                    0,
                    position,
                    encode_map_leaf(&[damaged; MAP_ENTRIES_PER_PAGE]),
                )
            }
        }
        r => r?,
    };
    if page.level != level || page.position != position {
        return Err(Error::CorruptMetadata(format!(
            "{kind:?} page {id} read at level {level} position {position} holds level {} \
             position {}",
            page.level, page.position
        )));
    }
    pool.install(id, kind, page, false, 0)?;
    Ok(())
}

/// Page `id`, resident, to change (dirty from now on).
fn change<'p, I: TreeIo>(
    pool: &'p mut PagePool<Page>,
    io: &mut I,
    id: u32,
    level: u8,
    position: u64,
) -> Result<&'p mut Page> {
    fault(pool, io, id, level, position)?;
    Ok(pool.change(id, kind_at(level)).expect("faulted in"))
}

/// Page `id`, resident, to read.
fn read<'p, I: TreeIo>(
    pool: &'p mut PagePool<Page>,
    io: &mut I,
    id: u32,
    level: u8,
    position: u64,
) -> Result<&'p Page> {
    fault(pool, io, id, level, position)?;
    Ok(pool.get(id, kind_at(level)).expect("faulted in"))
}

/// A new page in the tree: an id for it and a dirty frame. A clean frame resident under the new
/// id is stale (a region-0 leaf dropped by a trim keeps its id, and a hint read before the
/// trim may have installed its old content: R15-A1 with R5-A1) and goes; a dirty one is a
/// broken allocator.
pub(crate) fn create<I: TreeIo>(pool: &mut PagePool<Page>, io: &mut I, page: Page) -> Result<u32> {
    let id = io.allocate(&page)?;
    if id >= PAGE_ID_ALL_UNMAPPED {
        return Err(Error::CorruptMetadata(format!(
            "page id {id:#x} handed out is a summary value"
        )));
    }
    if pool.contains(id) && !pool.is_dirty(id) {
        pool.remove(id);
    }
    let kind = page.kind;
    match pool.install(id, kind, page, true, 0)? {
        Install::Installed => Ok(id),
        Install::AlreadyResident => Err(Error::CorruptMetadata(format!(
            "new {kind:?} page {id} is already in the page pool"
        ))),
    }
}

impl MapTree {
    /// The map of a device of `blocks` blocks, all unmapped: no page.
    pub fn new(blocks: u64) -> MapTree {
        MapTree {
            device: DEFAULT_DEVICE,
            epoch: 0,
            root: ChildSlot::AllUnmapped,
            depth: depth_for(blocks),
            blocks,
        }
    }

    /// A tree as its device row names it; a depth that cannot reach `blocks` (or no depth at
    /// all) is damage.
    pub fn from_root(root: ChildSlot, depth: u8, blocks: u64) -> Result<MapTree> {
        if depth == 0 || depth > DEPTH_MAX || depth < depth_for(blocks) {
            return Err(Error::CorruptMetadata(format!(
                "a map tree of depth {depth} cannot hold a device of {blocks} blocks"
            )));
        }
        Ok(MapTree {
            device: DEFAULT_DEVICE,
            epoch: 0,
            root,
            depth,
            blocks,
        })
    }

    /// The same tree as the map of `device` (the default device's when not said).
    pub fn with_device(self, device: u32) -> MapTree {
        MapTree { device, ..self }
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    /// The same tree at `epoch` (its device's row's).
    pub fn with_epoch(self, epoch: u32) -> MapTree {
        MapTree { epoch, ..self }
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn root(&self) -> ChildSlot {
        self.root
    }

    /// Levels, leaves included.
    pub fn depth(&self) -> u8 {
        self.depth
    }

    /// The device's size in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    fn check(&self, lba: u64) -> Result<()> {
        if lba >= self.blocks {
            return Err(Error::Invalid(format!(
                "block {lba} is past the device's {} blocks",
                self.blocks
            )));
        }
        Ok(())
    }

    /// The entry of `lba`.
    pub fn get<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        lba: u64,
    ) -> Result<MapEntry> {
        self.check(lba)?;
        let mut slot = self.root;
        for level in (0..self.depth).rev() {
            let ChildSlot::Page(id) = slot else {
                return Ok(summary_entry(slot).expect("a summary"));
            };
            let page = read(pool, io, id, level, position(lba, level))?;
            if level == 0 {
                return page.entry(entry_index(lba));
            }
            slot = page.slot(child_slot(lba, level));
        }
        unreachable!("a walk ends at a leaf or a summary")
    }

    /// The page id of the leaf holding `lba`'s entry; `None` when a summary stands for it.
    pub fn leaf_id<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        lba: u64,
    ) -> Result<Option<u32>> {
        self.check(lba)?;
        let mut slot = self.root;
        for level in (1..self.depth).rev() {
            let ChildSlot::Page(id) = slot else {
                return Ok(None);
            };
            slot = read(pool, io, id, level, position(lba, level))?.slot(child_slot(lba, level));
        }
        Ok(match slot {
            ChildSlot::Page(id) => Some(id),
            _ => None,
        })
    }

    /// Visits blocks `first .. first + count` in ascending order, changing nothing:
    /// `f(lba, n, entry)` for each run of `n` blocks from `lba` that one entry stands for (the
    /// range's part of a summary subtree as one run, read without a page; leaf entries one by
    /// one). A range past the device is refused, like a block past it.
    pub fn scan<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        first: u64,
        count: u64,
        f: &mut impl FnMut(u64, u64, MapEntry),
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let end = first
            .checked_add(count)
            .filter(|&end| end <= self.blocks)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "blocks {first} + {count} pass the device's {} blocks",
                    self.blocks
                ))
            })?;
        self.scan_below(pool, io, None, self.root, self.depth - 1, 0, first, end, f)
    }

    /// `scan` of blocks `lo .. hi` (non-empty, inside the subtree) below one slot at `level`,
    /// `pos`; with `seen`, pages in it are skipped and the others added (`visit`).
    #[allow(clippy::too_many_arguments)]
    fn scan_below<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        mut seen: Option<&mut std::collections::HashSet<u32>>,
        slot: ChildSlot,
        level: u8,
        pos: u64,
        lo: u64,
        hi: u64,
        f: &mut impl FnMut(u64, u64, MapEntry),
    ) -> Result<()> {
        let ChildSlot::Page(id) = slot else {
            f(lo, hi - lo, summary_entry(slot).expect("a summary"));
            return Ok(());
        };
        if seen.as_mut().is_some_and(|seen| !seen.insert(id)) {
            return Ok(());
        }
        if level == 0 {
            let start = pos * blocks_under(0);
            let leaf = read(pool, io, id, 0, pos)?;
            for lba in lo..hi {
                f(lba, 1, leaf.entry((lba - start) as usize)?);
            }
            return Ok(());
        }
        for (i, c, c_lo, c_hi) in children(level, lo, hi) {
            let child = read(pool, io, id, level, pos)?.slot(i);
            let seen = seen.as_deref_mut();
            self.scan_below(pool, io, seen, child, level - 1, c, c_lo, c_hi, f)?;
        }
        Ok(())
    }

    /// The first block in `first .. first + count` that is not unmapped, or `None`. A summary
    /// of unmapped blocks is passed without a page and the walk stops at the first block
    /// found, so a trim over a thin device's whole range costs its pages, not its size.
    pub fn first_mapped<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        first: u64,
        count: u64,
    ) -> Result<Option<u64>> {
        let end = first.saturating_add(count).min(self.blocks);
        if first >= end {
            return Ok(None);
        }
        self.first_mapped_below(pool, io, self.root, self.depth - 1, 0, first, end)
    }

    #[allow(clippy::too_many_arguments)]
    fn first_mapped_below<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        slot: ChildSlot,
        level: u8,
        pos: u64,
        lo: u64,
        hi: u64,
    ) -> Result<Option<u64>> {
        let id = match slot {
            ChildSlot::AllUnmapped => return Ok(None),
            ChildSlot::AllZero => return Ok(Some(lo)),
            ChildSlot::Page(id) => id,
        };
        if level == 0 {
            let start = pos * blocks_under(0);
            let leaf = read(pool, io, id, 0, pos)?;
            for lba in lo..hi {
                if leaf.entry((lba - start) as usize)?.state != BlockState::Unmapped {
                    return Ok(Some(lba));
                }
            }
            return Ok(None);
        }
        for (i, c, c_lo, c_hi) in children(level, lo, hi) {
            let child = read(pool, io, id, level, pos)?.slot(i);
            if let Some(lba) = self.first_mapped_below(pool, io, child, level - 1, c, c_lo, c_hi)? {
                return Ok(Some(lba));
            }
        }
        Ok(None)
    }

    /// `scan` of the whole device, skipping every page already in `seen` (reached through
    /// another tree that shares it) and adding the pages it reads: over the trees of all
    /// devices, each live page's blocks are visited once, the way the volume counters and
    /// the SBT counts count them. A summary root counts for its device.
    pub fn visit<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        seen: &mut std::collections::HashSet<u32>,
        f: &mut impl FnMut(u64, u64, MapEntry),
    ) -> Result<()> {
        if self.blocks == 0 {
            return Ok(());
        }
        let (root, top) = (self.root, self.depth - 1);
        self.scan_below(pool, io, Some(seen), root, top, 0, 0, self.blocks, f)
    }

    /// Calls `f(level, pos, id)` for every link to a page: the root's (from the device row),
    /// and each slot of the interior pages not yet in `seen` (added as they are read): over
    /// every device's tree, `count(page)` is the number of calls naming it.
    pub fn links<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        seen: &mut std::collections::HashSet<u32>,
        f: &mut impl FnMut(u8, u64, u32),
    ) -> Result<()> {
        let ChildSlot::Page(root) = self.root else {
            return Ok(());
        };
        f(self.depth - 1, 0, root);
        let mut todo = vec![(self.depth - 1, 0u64, root)];
        while let Some((level, pos, id)) = todo.pop() {
            if level == 0 || !seen.insert(id) {
                continue;
            }
            for i in 0..MAP_INTERIOR_SLOTS {
                if let ChildSlot::Page(c) = read(pool, io, id, level, pos)?.slot(i) {
                    let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
                    f(level - 1, cpos, c);
                    todo.push((level - 1, cpos, c));
                }
            }
        }
        Ok(())
    }

    /// The sum of `bytes(entry)` over every mapped entry of the tree (data and shared; zero
    /// and unmapped blocks store nothing): the stored bytes a device references (design.md,
    /// "Stat"). Each page's sum is kept in `memo` by page id, so a page several trees share is
    /// read once over a walk of them all (leaves too: with 1,000 snapshots sharing a volume's
    /// leaves, each leaf was decoded once per tree, a second per `zbd snapshot delete`).
    pub fn referenced<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        memo: &mut std::collections::HashMap<u32, u64>,
        bytes: &mut impl FnMut(&mut PagePool<Page>, &mut I, &MapEntry) -> Result<u64>,
    ) -> Result<u64> {
        referenced_below(pool, io, self.root, self.depth - 1, 0, memo, bytes)
    }

    /// Calls `f(entry)` for every mapped entry of the pages only this tree names: those
    /// reached from its root through pages whose `count` is 1 (design.md, "Stat": a direct
    /// item there, or a shared item all of whose references are there, is what deleting the
    /// device frees). Pages other trees share are not read.
    pub fn unique<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        count: &mut impl FnMut(&mut PagePool<Page>, &mut I, u8, u64, u32) -> Result<u32>,
        f: &mut impl FnMut(&MapEntry),
    ) -> Result<()> {
        let ChildSlot::Page(root) = self.root else {
            return Ok(());
        };
        let mut todo = vec![(self.depth - 1, 0u64, root)];
        while let Some((level, pos, id)) = todo.pop() {
            if count(pool, io, level, pos, id)? != 1 {
                continue;
            }
            let page = read(pool, io, id, level, pos)?;
            if level == 0 {
                for i in 0..MAP_ENTRIES_PER_PAGE {
                    let e = page.entry(i)?;
                    if matches!(e.state, BlockState::Data | BlockState::Shared) {
                        f(&e);
                    }
                }
                continue;
            }
            for i in 0..MAP_INTERIOR_SLOTS {
                if let ChildSlot::Page(c) = page.slot(i) {
                    todo.push((level - 1, pos * MAP_INTERIOR_SLOTS as u64 + i as u64, c));
                }
            }
        }
        Ok(())
    }

    /// Calls `f` with the address of every page of the tree whose range starts in `first ..
    /// first + count`, so that ranges side by side name each page once (a scrub of the pages'
    /// copies). Interior pages are read to find their children; leaves are not.
    pub fn pages_in<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        first: u64,
        count: u64,
        f: &mut impl FnMut(PageAddress),
    ) -> Result<()> {
        let end = first.saturating_add(count).min(self.blocks);
        if first >= end {
            return Ok(());
        }
        self.pages_below(pool, io, self.root, self.depth - 1, 0, first, end, f)
    }

    /// `pages_in` of blocks `lo .. hi` below one slot at `level`, `pos`.
    #[allow(clippy::too_many_arguments)]
    fn pages_below<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        slot: ChildSlot,
        level: u8,
        pos: u64,
        lo: u64,
        hi: u64,
        f: &mut impl FnMut(PageAddress),
    ) -> Result<()> {
        let ChildSlot::Page(id) = slot else {
            return Ok(());
        };
        if pos * blocks_under(level) >= lo {
            f(PageAddress {
                id,
                kind: kind_at(level),
                level,
                position: pos,
            });
        }
        if level == 0 {
            return Ok(());
        }
        for (i, c, c_lo, c_hi) in children(level, lo, hi) {
            let child = read(pool, io, id, level, pos)?.slot(i);
            self.pages_below(pool, io, child, level - 1, c, c_lo, c_hi, f)?;
        }
        Ok(())
    }

    /// At most how many pages `set` of one block (`to` None: a data entry) or `set_range` of
    /// blocks `first .. end` to summary `to` creates: on the paths of the first and the last
    /// block, one page per level from a summary slot the change splits down to the leaf. A
    /// path of pages only, or one reaching a summary the change keeps (the same summary, or a
    /// subtree the range covers whole), creates none: such a trim or zeroing always works on
    /// a volume with no page id to spare.
    pub fn pages_needed<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        first: u64,
        end: u64,
        to: Option<ChildSlot>,
    ) -> Result<usize> {
        let end = end.min(self.blocks);
        if first >= end {
            return Ok(0);
        }
        let mut needed = 0;
        let ends = [first, end - 1];
        for &lba in &ends[..if end - 1 == first { 1 } else { 2 }] {
            let mut slot = self.root;
            for level in (0..self.depth).rev() {
                match slot {
                    ChildSlot::Page(_) if level == 0 => break,
                    ChildSlot::Page(id) => {
                        let page = read(pool, io, id, level, position(lba, level))?;
                        slot = page.slot(child_slot(lba, level));
                    }
                    summary => {
                        let span = blocks_under(level);
                        let start = position(lba, level) * span;
                        let whole = to.is_some() && first <= start && start + span <= end;
                        if Some(summary) != to && !whole {
                            needed += usize::from(level) + 1;
                        }
                        break;
                    }
                }
            }
        }
        Ok(needed)
    }

    /// A host change of the entry of `lba` (design.md, "Copy on write"): every page on its
    /// path becomes this device's own first ([`MapTree::own`]), then as [`MapTree::set`].
    /// Returns the old entry.
    pub fn write<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        lba: u64,
        entry: MapEntry,
    ) -> Result<MapEntry> {
        if !share.active() {
            return self.set(pool, io, lba, entry);
        }
        self.check(lba)?;
        let old = self.get(pool, io, lba)?;
        if old == entry {
            // Nothing changes, so nothing is copied.
            return Ok(old);
        }
        let mut parent: Option<(u32, u8)> = None;
        let mut slot = self.root;
        for level in (0..self.depth).rev() {
            let ChildSlot::Page(id) = slot else {
                // The rest of the path is made by `set`, this device's own.
                break;
            };
            let pos = position(lba, level);
            let own = self.own(pool, io, share, id, level, pos)?;
            if own != id {
                self.link(pool, io, parent, lba, ChildSlot::Page(own))?;
            }
            if level == 0 {
                break;
            }
            slot = read(pool, io, own, level, pos)?.slot(child_slot(lba, level));
            parent = Some((own, level));
        }
        self.set(pool, io, lba, entry)
    }

    /// Page `id` at `level`, `pos` on this tree's path, made this device's own before a host
    /// change: a page it made since its last snapshot is (nobody else can reach it); one that
    /// no other parent names is claimed (its header takes this device and epoch); a shared one
    /// is shadowed: copied under a new id at the same place, one count less for the original
    /// and one more for each child of an interior copy; a leaf's direct items are made shared
    /// first, in place (what every sharer reads stays the same), and each shared slot of the
    /// copy is one reference more. Returns the id to change (the caller links a new one).
    fn own<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        id: u32,
        level: u8,
        pos: u64,
    ) -> Result<u32> {
        let page = read(pool, io, id, level, pos)?;
        if page.creator == self.device && page.epoch == self.epoch {
            return Ok(id);
        }
        let count = share.count(pool, io, level, pos, id)?;
        if count <= 1 {
            let page = change(pool, io, id, level, pos)?;
            (page.creator, page.epoch) = (self.device, self.epoch);
            return Ok(id);
        }
        // Items promoted here count the copy's slots already (one SBT change each, not two).
        let promoted = if level == 0 {
            self.promote_leaf(pool, io, share, id, pos, true)?
        } else {
            Vec::new()
        };
        let mut copy = read(pool, io, id, level, pos)?.clone();
        (copy.creator, copy.epoch, copy.slot) = (self.device, self.epoch, None);
        let children: Vec<ChildSlot> = if level > 0 {
            (0..MAP_INTERIOR_SLOTS).map(|i| copy.slot(i)).collect()
        } else {
            Vec::new()
        };
        let entries: Vec<MapEntry> = if level == 0 {
            (0..MAP_ENTRIES_PER_PAGE)
                .map(|i| copy.entry(i))
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let new = create(pool, io, copy)?;
        share.set_count(pool, io, level, pos, id, count - 1)?;
        for (i, &c) in children.iter().enumerate() {
            match c {
                ChildSlot::Page(c) => {
                    let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
                    let n = share.count(pool, io, level - 1, cpos, c)?;
                    share.set_count(pool, io, level - 1, cpos, c, n + 1)?;
                }
                ChildSlot::AllZero => share.copied(&MapEntry::ZERO, blocks_under(level - 1)),
                ChildSlot::AllUnmapped => {}
            }
        }
        for e in &entries {
            let key = e.sbt_key();
            if key.is_some_and(|k| !promoted.contains(&k)) {
                share.add_ref(pool, io, e)?;
            }
            share.copied(e, 1);
        }
        Ok(new)
    }

    /// Makes every direct item with a block in leaf `id` (at `pos`) shared, in place: its
    /// blocks named in this tree become shared entries (a unit of an older writer may have
    /// blocks in a neighbouring leaf too), and the SBT counts them, and with `copy` the slots
    /// a copy of the leaf is about to add too. Returns the items' keys.
    fn promote_leaf<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        id: u32,
        pos: u64,
        copy: bool,
    ) -> Result<Vec<crate::format::SbtKey>> {
        let mut keys = Vec::new();
        let start = pos * MAP_ENTRIES_PER_PAGE as u64;
        let mut i = 0;
        while i < MAP_ENTRIES_PER_PAGE {
            let at = read(pool, io, id, 0, pos)?.entry(i)?;
            i += 1;
            if at.state != BlockState::Data {
                continue;
            }
            let lba = start + i as u64 - 1;
            let Some(birth) = lba.checked_sub(u64::from(at.unit_index)) else {
                continue;
            };
            let end = (birth + u64::from(at.unit_blocks.max(1))).min(self.blocks);
            let mut blocks = Vec::new();
            for l in birth..end {
                let e = if (start..start + MAP_ENTRIES_PER_PAGE as u64).contains(&l) {
                    read(pool, io, id, 0, pos)?.entry((l - start) as usize)?
                } else {
                    self.get(pool, io, l)?
                };
                if e.state == BlockState::Data
                    && (e.extent, e.offset) == (at.extent, at.offset)
                    && u64::from(e.unit_index) == l - birth
                {
                    blocks.push((l, e));
                }
            }
            let leaf = start..start + MAP_ENTRIES_PER_PAGE as u64;
            let here = blocks.iter().filter(|(l, _)| leaf.contains(l)).count() as u32;
            let key =
                share.share_item(pool, io, birth, &at, &blocks, if copy { here } else { 0 })?;
            keys.push(key);
            for &(l, e) in &blocks {
                let shared = MapEntry::shared(key, e.unit_index);
                if (start..start + MAP_ENTRIES_PER_PAGE as u64).contains(&l) {
                    change(pool, io, id, 0, pos)?.set_entry((l - start) as usize, &shared);
                } else {
                    self.set(pool, io, l, shared)?;
                }
            }
        }
        Ok(keys)
    }

    /// Sets the entry of `lba` in place, creating the pages on its path that a summary stood
    /// for: what a content-preserving change (a cleaner move, a promotion, a damage mark) and
    /// a volume without shared pages use; a host change of a shared page goes through
    /// [`MapTree::write`]. Returns the old entry.
    pub fn set<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        lba: u64,
        entry: MapEntry,
    ) -> Result<MapEntry> {
        self.check(lba)?;
        // (parent id and its level) of the slot being followed; None: the root slot.
        let mut parent: Option<(u32, u8)> = None;
        let mut slot = self.root;
        for level in (0..self.depth).rev() {
            let pos = position(lba, level);
            let id = match slot {
                ChildSlot::Page(id) => id,
                summary => {
                    let had = summary_entry(summary).expect("a summary");
                    if had == entry {
                        return Ok(had);
                    }
                    let id = create(
                        pool,
                        io,
                        Page::filled(self.device, self.epoch, level, pos, summary),
                    )?;
                    self.link(pool, io, parent, lba, ChildSlot::Page(id))?;
                    id
                }
            };
            if level == 0 {
                let i = entry_index(lba);
                let old = read(pool, io, id, 0, pos)?.entry(i)?;
                // An unchanged entry dirties nothing (no counted page for it).
                if old != entry {
                    change(pool, io, id, 0, pos)?.set_entry(i, &entry);
                }
                return Ok(old);
            }
            slot = read(pool, io, id, level, pos)?.slot(child_slot(lba, level));
            parent = Some((id, level));
        }
        unreachable!("a walk ends at a leaf")
    }

    /// Points the slot on `lba`'s path in `parent` (or the root) at `to`.
    fn link<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        parent: Option<(u32, u8)>,
        lba: u64,
        to: ChildSlot,
    ) -> Result<()> {
        match parent {
            None => self.root = to,
            Some((id, level)) => {
                let page = change(pool, io, id, level, position(lba, level))?;
                page.set_slot(child_slot(lba, level), to);
            }
        }
        Ok(())
    }

    /// Makes blocks `first .. first + count` all unmapped (`to` = all unmapped) or all zero:
    /// whole subtrees become one summary slot and their pages are freed, partial leaves change
    /// entry by entry. Every block whose entry changes is reported to `replaced` (the caller's
    /// accounting), once, in ascending order: a leaf entry with its old entry, a whole summary
    /// subtree the other summary replaces as one run (an unmapped one only by a zeroing, and
    /// only whole inside the range, which stops at the device's end). Blocks that already
    /// held the new entry are not reported.
    ///
    /// With shared pages (`share` active), the pages the change writes are made this device's
    /// own first, as a write's ([`MapTree::own`]), and a shared subtree the range covers whole
    /// is only given up: one count less, after its direct items are made shared in place when
    /// this device made it (invariant P: design.md, "Settling dropped pages"). Its blocks
    /// are not reported: the pages stay, named by their other parents.
    #[allow(clippy::too_many_arguments)]
    pub fn set_range<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        first: u64,
        count: u64,
        to: ChildSlot,
        replaced: &mut impl FnMut(Replaced),
    ) -> Result<()> {
        assert!(summary_entry(to).is_some(), "set_range takes a summary");
        let end = first.saturating_add(count).min(self.blocks);
        if first >= end {
            return Ok(());
        }
        self.root = self.range(
            pool,
            io,
            share,
            self.root,
            self.depth - 1,
            0,
            first,
            end,
            to,
            replaced,
        )?;
        Ok(())
    }

    /// `set_range` below one slot at `level`, `pos`; returns the slot's new value.
    #[allow(clippy::too_many_arguments)]
    fn range<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        slot: ChildSlot,
        level: u8,
        pos: u64,
        first: u64,
        end: u64,
        to: ChildSlot,
        replaced: &mut impl FnMut(Replaced),
    ) -> Result<ChildSlot> {
        let span = blocks_under(level);
        let start = pos * span;
        let stop = start.saturating_add(span);
        if slot == to {
            return Ok(to);
        }
        if let (ChildSlot::Page(id), true) = (slot, share.active()) {
            let page = read(pool, io, id, level, pos)?;
            let mine = page.creator == self.device && page.epoch == self.epoch;
            let made = page.creator == self.device;
            let count = if mine {
                1
            } else {
                share.count(pool, io, level, pos, id)?
            };
            if count > 1 && first <= start && stop <= end {
                if made {
                    self.promote_walk(pool, io, share, id, level, pos)?;
                }
                share.set_count(pool, io, level, pos, id, count - 1)?;
                // The page stays for its other parents (its blocks still count there); the
                // summary that takes its place here is new, and a zero one counts its blocks.
                if to == ChildSlot::AllZero {
                    share.copied(&MapEntry::ZERO, stop.min(self.blocks) - start);
                }
                return Ok(to);
            }
        }
        if first <= start && stop <= end {
            // The whole subtree becomes `to`. A summary or a leaf goes at once (one page at
            // most: nothing half done). An interior page is walked child by child below, each
            // child's slot set as it goes, and leaves the tree when all are `to`: a read that
            // fails part-way leaves a prefix done and never a freed page its parent still
            // names.
            match slot {
                ChildSlot::Page(id) if level == 0 => {
                    let new = summary_entry(to).expect("a summary");
                    let leaf = read(pool, io, id, 0, pos)?;
                    let mut runs = Vec::new();
                    for i in 0..MAP_ENTRIES_PER_PAGE {
                        let e = leaf.entry(i)?;
                        if e != new {
                            runs.push(Replaced {
                                first: start + i as u64,
                                count: 1,
                                entry: e,
                            });
                        }
                    }
                    runs.into_iter().for_each(&mut *replaced);
                    pool.remove(id);
                    io.free(id);
                    return Ok(to);
                }
                ChildSlot::Page(_) => {}
                summary => {
                    replaced(Replaced {
                        first: start,
                        count: span,
                        entry: summary_entry(summary).expect("a summary"),
                    });
                    return Ok(to);
                }
            }
        }
        // Part of this subtree changes (or all of an interior page's): it needs a page, this
        // device's own.
        let id = match slot {
            ChildSlot::Page(id) if share.active() => self.own(pool, io, share, id, level, pos)?,
            ChildSlot::Page(id) => id,
            summary => create(
                pool,
                io,
                Page::filled(self.device, self.epoch, level, pos, summary),
            )?,
        };
        let lo = first.max(start);
        let hi = end.min(stop);
        if level == 0 {
            let new = summary_entry(to).expect("a summary");
            let mut differ = Vec::new();
            let leaf = read(pool, io, id, 0, pos)?;
            for lba in lo..hi {
                let e = leaf.entry((lba - start) as usize)?;
                if e != new {
                    differ.push(lba);
                    replaced(Replaced {
                        first: lba,
                        count: 1,
                        entry: e,
                    });
                }
            }
            // A leaf the range leaves as it was dirties nothing.
            if !differ.is_empty() {
                let leaf = change(pool, io, id, 0, pos)?;
                for lba in differ {
                    leaf.set_entry((lba - start) as usize, &new);
                }
            }
            let leaf = read(pool, io, id, 0, pos)?;
            let mut uniform = true;
            for i in 0..MAP_ENTRIES_PER_PAGE {
                uniform &= leaf.entry(i)? == new;
            }
            return Ok(self.collapse(pool, io, id, uniform, to));
        }
        let child_span = blocks_under(level - 1);
        let (c_lo, c_hi) = (lo / child_span, (hi - 1) / child_span);
        for c in c_lo..=c_hi {
            let i = (c % MAP_INTERIOR_SLOTS as u64) as usize;
            let old = read(pool, io, id, level, pos)?.slot(i);
            let new = self.range(pool, io, share, old, level - 1, c, first, end, to, replaced)?;
            if new != old {
                change(pool, io, id, level, pos)?.set_slot(i, new);
            }
        }
        let page = read(pool, io, id, level, pos)?;
        let uniform = (0..MAP_INTERIOR_SLOTS).all(|i| page.slot(i) == to);
        Ok(self.collapse(pool, io, id, uniform, to))
    }

    /// Makes the direct items in the pages of this device below page `id` shared, in place:
    /// before the device gives up a page another parent keeps (invariant P). Pages another
    /// device made hold none of this device's items, and are not read.
    fn promote_walk<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        id: u32,
        level: u8,
        pos: u64,
    ) -> Result<()> {
        if read(pool, io, id, level, pos)?.creator != self.device {
            return Ok(());
        }
        if level == 0 {
            return self.promote_leaf(pool, io, share, id, pos, false).map(drop);
        }
        for i in 0..MAP_INTERIOR_SLOTS {
            if let ChildSlot::Page(c) = read(pool, io, id, level, pos)?.slot(i) {
                let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
                self.promote_walk(pool, io, share, c, level - 1, cpos)?;
            }
        }
        Ok(())
    }

    /// Gives up this tree (a snapshot or device deleted): its root loses one count, and every
    /// page that no parent names then is freed, its children given up in turn. `replaced`
    /// hears every entry of the leaves freed (each a block the device held: a direct item
    /// dies, a shared entry is one reference less), as `set_range` reports them. Pages other
    /// parents keep are not read.
    pub fn release<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        replaced: &mut impl FnMut(Replaced),
    ) -> Result<()> {
        let mut budget = u64::MAX;
        let done = self.release_step(pool, io, share, &mut budget, replaced)?;
        debug_assert!(done, "an unbounded release finishes");
        Ok(())
    }

    /// `release` of a part of the tree: it stops once `budget` ([`RELEASE_PAGE_COST`] units per
    /// page met, one per mapped entry given up) is spent, leaving a tree whose given-up subtrees are unmapped
    /// slots and whose pages are the rest, unchanged, so each step can be made durable on its
    /// own. Only pages of count 1 change (in place): no other device reaches them. Whether
    /// the whole tree is given up.
    pub fn release_step<I: TreeIo, S: Sharing<I>>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        budget: &mut u64,
        replaced: &mut impl FnMut(Replaced),
    ) -> Result<bool> {
        let root = match self.root {
            ChildSlot::Page(_) => self.root,
            // A summary root's blocks are the caller's to count (it knows the device's end).
            _ => ChildSlot::AllUnmapped,
        };
        self.root =
            self.release_below(pool, io, share, root, self.depth - 1, 0, budget, replaced)?;
        Ok(self.root == ChildSlot::AllUnmapped)
    }

    /// `release_step` below one slot at `level`, `pos`: what the slot names afterwards.
    #[allow(clippy::too_many_arguments)]
    fn release_below<I: TreeIo, S: Sharing<I>>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        share: &mut S,
        slot: ChildSlot,
        level: u8,
        pos: u64,
        budget: &mut u64,
        replaced: &mut impl FnMut(Replaced),
    ) -> Result<ChildSlot> {
        let ChildSlot::Page(id) = slot else {
            return Ok(ChildSlot::AllUnmapped);
        };
        if *budget == 0 {
            return Ok(slot);
        }
        *budget = budget.saturating_sub(RELEASE_PAGE_COST);
        let count = share.count(pool, io, level, pos, id)?;
        if count > 1 {
            share.set_count(pool, io, level, pos, id, count - 1)?;
            return Ok(ChildSlot::AllUnmapped);
        }
        if level == 0 {
            let start = pos * MAP_ENTRIES_PER_PAGE as u64;
            let leaf = read(pool, io, id, 0, pos)?;
            let mut runs = Vec::new();
            for i in 0..MAP_ENTRIES_PER_PAGE {
                let e = leaf.entry(i)?;
                if e != MapEntry::UNMAPPED {
                    runs.push(Replaced {
                        first: start + i as u64,
                        count: 1,
                        entry: e,
                    });
                }
            }
            *budget = budget.saturating_sub(runs.len() as u64);
            runs.into_iter().for_each(&mut *replaced);
        } else {
            // The page is made dirty (so resident, pinned) before anything below it is
            // given up, and each slot given up is written into it at once: a step that ends
            // inside it, or an error below it (a page or a count that cannot be read), leaves
            // a page naming exactly what is not given up yet. Were the slots kept aside and
            // the error returned, the page would still name freed pages and pages whose count
            // was already dropped, which deleting again would give up a second time (a page
            // the origin shares freed under it). A page given up whole is freed.
            change(pool, io, id, level, pos)?;
            for i in 0..MAP_INTERIOR_SLOTS {
                let child = read(pool, io, id, level, pos)?.slot(i);
                if child == ChildSlot::AllUnmapped {
                    continue;
                }
                if *budget == 0 {
                    return Ok(slot);
                }
                let cpos = pos * MAP_INTERIOR_SLOTS as u64 + i as u64;
                if child == ChildSlot::AllZero {
                    replaced(Replaced {
                        first: cpos * blocks_under(level - 1),
                        count: blocks_under(level - 1),
                        entry: MapEntry::ZERO,
                    });
                }
                let left =
                    self.release_below(pool, io, share, child, level - 1, cpos, budget, replaced)?;
                if left != child {
                    change(pool, io, id, level, pos)?.set_slot(i, left);
                }
                if left != ChildSlot::AllUnmapped {
                    return Ok(slot);
                }
            }
        }
        pool.remove(id);
        io.free(id);
        Ok(ChildSlot::AllUnmapped)
    }

    /// A page whose every block is now what summary `to` says leaves the tree for it (a
    /// discard of a whole device frees every page, the part past its end included).
    fn collapse<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        uniform: bool,
        to: ChildSlot,
    ) -> ChildSlot {
        if !uniform {
            return ChildSlot::Page(id);
        }
        pool.remove(id);
        io.free(id);
        to
    }

    /// Grows the tree to address `blocks`: each new level is a root whose child 0 is the old
    /// root and whose other slots are all unmapped (an all-zero root gets a page, or the new
    /// room would read as zeros).
    pub fn grow<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        blocks: u64,
    ) -> Result<()> {
        self.blocks = self.blocks.max(blocks);
        while depth_for(blocks) > self.depth {
            if self.root != ChildSlot::AllUnmapped {
                let mut page = Page::filled(
                    self.device,
                    self.epoch,
                    self.depth,
                    0,
                    ChildSlot::AllUnmapped,
                );
                page.set_slot(0, self.root);
                self.root = ChildSlot::Page(create(pool, io, page)?);
            }
            self.depth += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{open_page, seal_page, BlockState, FrameStamp};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap, HashSet};

    const UUID: [u8; 16] = *b"zbd map tree tst";
    /// Leaves below this position take their fixed id (region 0).
    const PAIRS0: u64 = 3;

    /// Pages on a "disk" as sealed frames (CRC seeded with their address), ids handed out
    /// once, frees checked; a freed page is gone, so a dangling slot fails its read.
    #[derive(Default)]
    struct MemIo {
        disk: HashMap<u32, Vec<u8>>,
        in_use: HashSet<u32>,
        next: u32,
        reads: u64,
        allocations: u64,
        /// Pages whose reads fail with an I/O error (not damage: no stand-in).
        failing: HashSet<u32>,
    }

    impl MemIo {
        fn new() -> MemIo {
            MemIo {
                next: PAIRS0 as u32,
                ..MemIo::default()
            }
        }

        /// A checkpoint: every dirty page written, clean from then on.
        fn checkpoint(&mut self, pool: &mut PagePool<Page>) {
            for id in pool.snapshot() {
                let page = pool.peek(id).expect("dirty is resident");
                let at = page.address(id);
                let frame = seal_page(&UUID, &at, &FrameStamp::map(1, 0, 1), &page.body).to_vec();
                self.disk.insert(id, frame);
            }
            pool.commit();
        }
    }

    impl TreeIo for MemIo {
        fn read(&mut self, _: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
            self.reads += 1;
            if self.failing.contains(&at.id) {
                return Err(Error::Io(std::io::Error::other("injected read error")));
            }
            let frame = self.disk.get(&at.id).ok_or_else(|| {
                Error::CorruptMetadata(format!("page {} was never written", at.id))
            })?;
            let (_, body) = open_page(frame, &UUID, at)?;
            Page::decode(at, &FrameStamp::map(1, 0, 1), body)
        }

        fn allocate(&mut self, page: &Page) -> Result<u32> {
            self.allocations += 1;
            let id = if page.kind == PageKind::MapLeaf && page.position < PAIRS0 {
                page.position as u32
            } else {
                self.next += 1;
                self.next - 1
            };
            assert!(self.in_use.insert(id), "id {id} handed out while in use");
            Ok(id)
        }

        fn free(&mut self, id: u32) {
            assert!(self.in_use.remove(&id), "id {id} freed twice");
            self.disk.remove(&id);
        }
    }

    fn pool(frames: u64) -> PagePool<Page> {
        PagePool::new(frames * super::super::pool::FRAME_BYTES, 0).expect("pool")
    }

    fn data(extent: u32) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            len: 100,
            extent,
            offset: 512,
            crc: extent ^ 0x5a5a,
            ..MapEntry::UNMAPPED
        }
    }

    /// Page ids reachable from the root (each once: one device, no sharing).
    fn reachable(t: &MapTree, pool: &mut PagePool<Page>, io: &mut MemIo) -> HashSet<u32> {
        let mut out = HashSet::new();
        let mut todo = vec![(t.root(), t.depth() - 1, 0u64)];
        while let Some((slot, level, pos)) = todo.pop() {
            let ChildSlot::Page(id) = slot else { continue };
            assert!(out.insert(id), "page {id} reached twice");
            if level > 0 {
                let page = read(pool, io, id, level, pos).expect("read");
                let slots: Vec<ChildSlot> = (0..MAP_INTERIOR_SLOTS).map(|i| page.slot(i)).collect();
                for (i, s) in slots.into_iter().enumerate() {
                    todo.push((s, level - 1, pos * MAP_INTERIOR_SLOTS as u64 + i as u64));
                }
            }
        }
        out
    }

    #[test]
    fn a_created_map_is_one_summary_and_reads_nothing() {
        let t = MapTree::new((16u64 << 40) / 4096);
        let (mut p, mut io) = (pool(16), MemIo::new());
        assert_eq!(t.depth(), 4);
        for lba in [0, 1 << 20, (16u64 << 40) / 4096 - 1] {
            assert_eq!(
                t.get(&mut p, &mut io, lba).expect("tree"),
                MapEntry::UNMAPPED
            );
        }
        assert_eq!(io.reads, 0);
    }

    /// A write reaching a summary at level L creates L + 1 pages (design, R14-B3).
    #[test]
    fn a_first_write_creates_one_page_per_level_below_the_summary() {
        let mut t = MapTree::new((16u64 << 40) / 4096);
        let (mut p, mut io) = (pool(16), MemIo::new());
        let lba = 5 << 28;
        t.set(&mut p, &mut io, lba, data(7)).expect("tree");
        assert_eq!(io.allocations, 4, "root at level 3: four new pages");
        assert_eq!(t.get(&mut p, &mut io, lba).expect("tree"), data(7));
        assert_eq!(
            t.get(&mut p, &mut io, lba + 1).expect("tree"),
            MapEntry::UNMAPPED
        );
        // A neighbour in the same leaf adds nothing; one 255 blocks on adds a leaf only.
        t.set(&mut p, &mut io, lba + 1, data(8)).expect("tree");
        assert_eq!(io.allocations, 4);
        t.set(&mut p, &mut io, lba + 255, data(9)).expect("tree");
        assert_eq!(io.allocations, 5);
        // Writing what a summary already says creates nothing.
        t.set(&mut p, &mut io, 1 << 30, MapEntry::UNMAPPED)
            .expect("tree");
        assert_eq!(io.allocations, 5);
        assert_eq!(p.stats().dirty, 5);
    }

    #[test]
    fn a_whole_range_becomes_summaries_reports_what_it_held_and_frees_every_page() {
        let blocks = 3 * 260_100 + 500;
        let mut t = MapTree::new(blocks);
        let (mut p, mut io) = (pool(64), MemIo::new());
        for lba in [0u64, 1, 254, 255, 260_100, 780_799] {
            t.set(&mut p, &mut io, lba, data(lba as u32)).expect("tree");
        }
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            300,
            10,
            ChildSlot::AllZero,
            &mut |_| {},
        )
        .expect("tree");
        io.checkpoint(&mut p);
        let mut got = Vec::new();
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            blocks,
            ChildSlot::AllUnmapped,
            &mut |r| got.push(r),
        )
        .expect("tree");
        let data_lbas: Vec<u64> = got
            .iter()
            .filter(|r| r.entry.state == BlockState::Data)
            .map(|r| r.first)
            .collect();
        assert_eq!(data_lbas, vec![0, 1, 254, 255, 260_100, 780_799]);
        let zeros: u64 = got
            .iter()
            .filter(|r| r.entry == MapEntry::ZERO)
            .map(|r| r.count)
            .sum();
        assert_eq!(zeros, 10);
        assert_eq!(t.root(), ChildSlot::AllUnmapped);
        assert!(io.in_use.is_empty(), "pages left: {:?}", io.in_use);
        assert_eq!(p.resident(), 0);
    }

    /// A zeroing reports every block it changes, unmapped ones too: a leaf's unmapped entries
    /// one by one, an unmapped summary whole inside the range as one run (here a whole level-1
    /// subtree and whole leaves), and nothing for blocks already zero.
    #[test]
    fn a_zeroing_reports_the_unmapped_blocks_it_reaches() {
        let span = blocks_under(1);
        let blocks = 2 * span + 600;
        let mut t = MapTree::new(blocks);
        let (mut p, mut io) = (pool(64), MemIo::new());
        t.set(&mut p, &mut io, 5, data(1)).expect("tree");
        t.set(&mut p, &mut io, 6, MapEntry::ZERO).expect("tree");
        let mut got = Vec::new();
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            blocks,
            ChildSlot::AllZero,
            &mut |r| got.push(r),
        )
        .expect("tree");
        // Ascending, each changed block once, and only those.
        let mut next = 0;
        for r in &got {
            if next == 6 {
                next = 7;
            }
            assert_eq!(r.first, next, "{r:?}");
            next = r.first + r.count;
        }
        assert_eq!(next, blocks);
        assert_eq!(
            got[5],
            Replaced {
                first: 5,
                count: 1,
                entry: data(1)
            }
        );
        assert!(got
            .iter()
            .all(|r| r.first == 5 || r.entry == MapEntry::UNMAPPED));
        assert!(got.contains(&Replaced {
            first: span,
            count: span,
            entry: MapEntry::UNMAPPED
        }));
        assert!(got.contains(&Replaced {
            first: 255,
            count: 255,
            entry: MapEntry::UNMAPPED
        }));
        // The tail past the last whole leaf is a partial leaf: entry by entry.
        assert!(got.contains(&Replaced {
            first: blocks - 1,
            count: 1,
            entry: MapEntry::UNMAPPED
        }));
        // Zeroing it again changes nothing and reports nothing.
        got.clear();
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            blocks,
            ChildSlot::AllZero,
            &mut |r| got.push(r),
        )
        .expect("tree");
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn growing_keeps_the_content_and_the_new_room_is_unmapped() {
        let (mut p, mut io) = (pool(64), MemIo::new());
        // A one-leaf device zeroed whole: its root is the all-zero summary.
        let mut t = MapTree::new(255);
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            255,
            ChildSlot::AllZero,
            &mut |_| {},
        )
        .expect("tree");
        assert_eq!(t.root(), ChildSlot::AllZero);
        t.grow(&mut p, &mut io, 1 << 30).expect("tree");
        assert_eq!(t.depth(), depth_for(1 << 30));
        assert_eq!(t.get(&mut p, &mut io, 254).expect("tree"), MapEntry::ZERO);
        for lba in [255, 260_100, (1 << 30) - 1] {
            assert_eq!(
                t.get(&mut p, &mut io, lba).expect("tree"),
                MapEntry::UNMAPPED,
                "grown room at {lba} is not zero"
            );
        }
        // A zero "to the end" stops at the device's end, not the tree's reach (review 15's
        // adversarial pass, F9): a grow within the same depth finds its room unmapped.
        let mut t = MapTree::new(1000);
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            u64::MAX,
            ChildSlot::AllZero,
            &mut |_| {},
        )
        .expect("zero");
        t.grow(&mut p, &mut io, 2000).expect("grow");
        assert_eq!(t.get(&mut p, &mut io, 999).expect("tree"), MapEntry::ZERO);
        assert_eq!(
            t.get(&mut p, &mut io, 1500).expect("tree"),
            MapEntry::UNMAPPED
        );
        let mut u = MapTree::new(1000);
        u.grow(&mut p, &mut io, 1 << 30).expect("tree");
        assert_eq!(
            u.root(),
            ChildSlot::AllUnmapped,
            "an unmapped root needs no page"
        );
    }

    fn craft_root(io: &mut MemIo, id: u32, slots: &[ChildSlot]) {
        let page = Page::new(PageKind::MapInterior, 1, 0, encode_map_interior(slots));
        let frame = seal_page(
            &UUID,
            &page.address(id),
            &FrameStamp::map(1, 0, 1),
            &page.body,
        );
        io.disk.insert(id, frame.to_vec());
    }

    /// A slot naming a resident page of another place or kind is damage, never that page's
    /// entries (review 15's adversarial pass, F3).
    #[test]
    fn a_slot_naming_a_resident_page_of_another_place_or_kind_is_an_error() {
        let mut t = MapTree::new(1000);
        let (mut p, mut io) = (pool(64), MemIo::new());
        t.set(&mut p, &mut io, 0, data(1)).expect("tree");
        t.set(&mut p, &mut io, 255, data(2)).expect("tree");
        io.checkpoint(&mut p);
        let ChildSlot::Page(root) = t.root() else {
            panic!("a root page")
        };
        // Slot 1 names leaf 0 (position 0), slot 2 the root itself (an interior page).
        craft_root(
            &mut io,
            root,
            &[
                ChildSlot::Page(0),
                ChildSlot::Page(0),
                ChildSlot::Page(root),
            ],
        );
        let mut p = pool(64);
        assert_eq!(t.get(&mut p, &mut io, 0).expect("tree"), data(1));
        assert!(
            t.get(&mut p, &mut io, 255).is_err(),
            "leaf 0 read as position 1"
        );
        assert!(
            t.get(&mut p, &mut io, 510).is_err(),
            "the root read as a leaf"
        );
    }

    /// F4, F7: a block past the device and a depth that cannot hold the device are errors.
    #[test]
    fn blocks_past_the_device_and_impossible_depths_are_refused() {
        let mut t = MapTree::new(1000);
        let (mut p, mut io) = (pool(64), MemIo::new());
        assert!(t.set(&mut p, &mut io, 1000, data(9)).is_err());
        assert!(t.get(&mut p, &mut io, t.blocks() + 5).is_err());
        assert_eq!(t.get(&mut p, &mut io, 5).expect("tree"), MapEntry::UNMAPPED);
        assert_eq!(io.allocations, 0, "nothing was created for it");
        for depth in [0, DEPTH_MAX + 1] {
            assert!(MapTree::from_root(ChildSlot::AllUnmapped, depth, 10).is_err());
        }
        assert!(MapTree::from_root(ChildSlot::AllUnmapped, 1, 256).is_err());
        assert!(MapTree::from_root(ChildSlot::AllUnmapped, 2, 256).is_ok());
    }

    #[test]
    fn a_damaged_page_is_an_error_not_unmapped() {
        let mut t = MapTree::new(100_000);
        let (mut p, mut io) = (pool(64), MemIo::new());
        t.set(&mut p, &mut io, 70_000, data(3)).expect("tree");
        io.checkpoint(&mut p);
        let mut p = pool(64);
        for frame in io.disk.values_mut() {
            frame[100] ^= 1;
        }
        let e = t.get(&mut p, &mut io, 70_000).expect_err("damaged");
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    /// A trim over a whole subtree whose second leaf cannot be read (an I/O error) fails
    /// part-way with a consistent prefix done: the first leaf is trimmed (and reported, and
    /// freed with its parent's slot set), the unreadable one stays named and reads as an
    /// error, and no page is freed while its parent still names it (found by the helper
    /// building `map/tree.rs`).
    #[test]
    fn a_subtree_drop_that_meets_an_unreadable_page_leaves_a_consistent_prefix() {
        let blocks = 3 * 260_100;
        let mut t = MapTree::new(blocks);
        let (mut p, mut io) = (pool(64), MemIo::new());
        t.set(&mut p, &mut io, 0, data(1)).expect("tree");
        t.set(&mut p, &mut io, 255, data(2)).expect("tree");
        t.set(&mut p, &mut io, 260_100, data(3)).expect("tree");
        io.checkpoint(&mut p);
        let mut p = pool(64);
        // Leaf 1 (region 0: id 1) cannot be read.
        io.failing.insert(1);
        let mut reports = Vec::new();
        let e = t
            .set_range(
                &mut p,
                &mut io,
                &mut NoSharing,
                0,
                260_100,
                ChildSlot::AllUnmapped,
                &mut |r| reports.push(r),
            )
            .expect_err("an unreadable leaf in the subtree");
        assert!(e.to_string().contains("injected"), "{e}");
        assert_eq!(
            reports,
            vec![Replaced {
                first: 0,
                count: 1,
                entry: data(1)
            }]
        );
        assert_eq!(t.get(&mut p, &mut io, 0).expect("tree"), MapEntry::UNMAPPED);
        assert!(
            t.get(&mut p, &mut io, 255).is_err(),
            "still named, still unreadable"
        );
        assert_eq!(t.get(&mut p, &mut io, 260_100).expect("tree"), data(3));
        let live = reachable(&t, &mut p, &mut io);
        assert_eq!(live, io.in_use, "no page freed while named, none leaked");
    }

    /// A leaf with no intact copy stands in as a leaf of damaged entries: a read of one of
    /// its blocks gives a damaged entry (never unmapped, never another block's), a write under
    /// it is taken, and a trim over its subtree reports its blocks as damaged runs and drops it.
    #[test]
    fn a_leaf_with_no_intact_copy_stands_in_as_damaged_entries() {
        let blocks = 3 * 260_100;
        let mut t = MapTree::new(blocks);
        let (mut p, mut io) = (pool(64), MemIo::new());
        t.set(&mut p, &mut io, 0, data(1)).expect("tree");
        t.set(&mut p, &mut io, 255, data(2)).expect("tree");
        io.checkpoint(&mut p);
        let mut p = pool(64);
        io.disk.get_mut(&1).expect("written")[100] ^= 1;
        let damaged = MapEntry {
            state: BlockState::Corrupt,
            ..MapEntry::UNMAPPED
        };
        assert_eq!(t.get(&mut p, &mut io, 255).expect("a stand-in"), damaged);
        assert_eq!(t.get(&mut p, &mut io, 300).expect("a stand-in"), damaged);
        assert_eq!(
            t.set(&mut p, &mut io, 256, data(4)).expect("taken"),
            damaged
        );
        assert_eq!(t.get(&mut p, &mut io, 256).expect("tree"), data(4));
        let mut reports = Vec::new();
        t.set_range(
            &mut p,
            &mut io,
            &mut NoSharing,
            0,
            260_100,
            ChildSlot::AllUnmapped,
            &mut |r| reports.push(r),
        )
        .expect("the subtree dropped");
        let damaged_blocks: u64 = (reports.iter())
            .filter(|r| r.entry == damaged)
            .map(|r| r.count)
            .sum();
        assert_eq!(damaged_blocks, 254, "{reports:?}");
        assert_eq!(
            t.get(&mut p, &mut io, 300).expect("tree"),
            MapEntry::UNMAPPED
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, u8),
        Get(u64),
        Range(u64, u64, bool),
        Scan(u64, u64),
        Checkpoint,
        /// A checkpoint, then a cold pool: everything is read back from the "disk".
        Cold,
    }

    /// 3 level-1 subtrees and a bit: depth 3. Blocks cluster around page and subtree
    /// boundaries and the end, where summaries and region-0 leaves meet.
    const BLOCKS: u64 = 3 * 260_100 + 500;
    fn lba() -> impl Strategy<Value = u64> {
        (
            prop::sample::select(vec![0u64, 250, 259_900, 520_150, BLOCKS - 400]),
            0u64..400,
        )
            .prop_map(|(b, o)| (b + o).min(BLOCKS - 1))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (lba(), 0u8..4).prop_map(|(l, v)| Op::Set(l, v)),
            3 => lba().prop_map(Op::Get),
            1 => (lba(), prop_oneof![1u64..600, Just(BLOCKS)]).prop_map(|(l, n)| Op::Scan(l, n)),
            // Large ranges only trim: the model holds zeros block by block.
            1 => (lba(), 1u64..600, any::<bool>()).prop_map(|(l, n, z)| Op::Range(l, n, z)),
            1 => (lba(), prop_oneof![Just(BLOCKS), 260_000u64..270_000])
                .prop_map(|(l, n)| Op::Range(l, n, false)),
            1 => Just(Op::Checkpoint),
            1 => Just(Op::Cold),
        ]
    }

    fn entry_of(v: u8, lba: u64) -> MapEntry {
        match v {
            0 => MapEntry::UNMAPPED,
            1 => MapEntry::ZERO,
            _ => data(lba as u32 ^ u32::from(v) << 24),
        }
    }

    fn run(ops: Vec<Op>, frames: u64) -> std::result::Result<(), TestCaseError> {
        let mut t = MapTree::new(BLOCKS);
        let mut p = pool(frames);
        let mut io = MemIo::new();
        let mut model: BTreeMap<u64, MapEntry> = BTreeMap::new();
        let at = |m: &BTreeMap<u64, MapEntry>, l: u64| *m.get(&l).unwrap_or(&MapEntry::UNMAPPED);
        for op in ops {
            // The engine checkpoints before pinned pages fill the pool; so does the test.
            if p.stats().pinned * 2 > frames {
                io.checkpoint(&mut p);
            }
            match op {
                Op::Set(l, v) => {
                    let e = entry_of(v, l);
                    let to = summary_slot(e);
                    let bound = t.pages_needed(&mut p, &mut io, l, l + 1, to).expect("tree");
                    let made = io.allocations;
                    let old = t.set(&mut p, &mut io, l, e).expect("tree");
                    // `pages_needed` bounds what a change creates (the engine's id check).
                    prop_assert!(io.allocations - made <= bound as u64, "set {} made more", l);
                    prop_assert_eq!(old, at(&model, l));
                    model.insert(l, e);
                }
                Op::Get(l) => {
                    prop_assert_eq!(t.get(&mut p, &mut io, l).expect("tree"), at(&model, l))
                }
                Op::Range(first, count, zero) => {
                    let to = if zero {
                        ChildSlot::AllZero
                    } else {
                        ChildSlot::AllUnmapped
                    };
                    let new = summary_entry(to).expect("tree");
                    // The engine bounds requests by the device's size, not the tree's reach.
                    let end = (first + count).min(BLOCKS);
                    let mut got = Vec::new();
                    let bound = t.pages_needed(&mut p, &mut io, first, end, Some(to));
                    let made = io.allocations;
                    t.set_range(
                        &mut p,
                        &mut io,
                        &mut NoSharing,
                        first,
                        end - first,
                        to,
                        &mut |r| got.push(r),
                    )
                    .expect("tree");
                    let bound = bound.expect("tree") as u64;
                    prop_assert!(
                        io.allocations - made <= bound,
                        "range {} {} made more",
                        first,
                        end
                    );
                    // What was reported is what the model held there that differs, expanded.
                    let mut reported: BTreeMap<u64, MapEntry> = BTreeMap::new();
                    for r in got {
                        for b in r.first..r.first + r.count {
                            prop_assert!(
                                reported.insert(b, r.entry).is_none(),
                                "block {} twice",
                                b
                            );
                        }
                    }
                    // Unmapped blocks a zeroing reaches change too (absent from the model:
                    // unmapped); only zeroings are small enough to walk block by block.
                    let want: BTreeMap<u64, MapEntry> = if zero {
                        (first..end)
                            .map(|b| (b, at(&model, b)))
                            .filter(|(_, e)| *e != new)
                            .collect()
                    } else {
                        model
                            .range(first..end)
                            .filter(|(_, e)| **e != new)
                            .map(|(&b, &e)| (b, e))
                            .collect()
                    };
                    prop_assert_eq!(&reported, &want);
                    if zero {
                        model.extend((first..end).map(|b| (b, new)));
                    } else {
                        let gone: Vec<u64> = model.range(first..end).map(|(&b, _)| b).collect();
                        for b in gone {
                            model.remove(&b);
                        }
                    }
                }
                Op::Scan(first, count) => {
                    let end = (first + count).min(BLOCKS);
                    let mut next = first;
                    let mut got: BTreeMap<u64, MapEntry> = BTreeMap::new();
                    t.scan(&mut p, &mut io, first, end - first, &mut |l, n, e| {
                        assert_eq!(l, next, "runs in order, none missing");
                        next = l + n;
                        if e != MapEntry::UNMAPPED {
                            got.extend((l..l + n).map(|b| (b, e)));
                        }
                    })
                    .expect("tree");
                    prop_assert_eq!(next, end);
                    let want: BTreeMap<u64, MapEntry> = model
                        .range(first..end)
                        .filter(|(_, e)| **e != MapEntry::UNMAPPED)
                        .map(|(&b, &e)| (b, e))
                        .collect();
                    // `first_mapped` names the first block the scan found not unmapped.
                    let first_found = want.keys().next().copied();
                    prop_assert_eq!(got, want);
                    let found = t.first_mapped(&mut p, &mut io, first, end - first);
                    prop_assert_eq!(found.expect("tree"), first_found);
                    let past = t.scan(
                        &mut p,
                        &mut io,
                        first,
                        BLOCKS - first + 1,
                        &mut |_, _, _| {},
                    );
                    prop_assert!(past.is_err(), "a range past the device");
                }
                Op::Checkpoint => io.checkpoint(&mut p),
                Op::Cold => {
                    io.checkpoint(&mut p);
                    p = pool(frames);
                }
            }
            prop_assert!(p.resident() as u64 <= frames);
        }
        // Every block the model knows reads back, cold too; no page leaked or dangling.
        for (&l, &e) in &model {
            prop_assert_eq!(t.get(&mut p, &mut io, l).expect("tree"), e);
        }
        let live = reachable(&t, &mut p, &mut io);
        prop_assert_eq!(&live, &io.in_use);
        io.checkpoint(&mut p);
        let mut cold = pool(frames);
        for (&l, &e) in &model {
            prop_assert_eq!(t.get(&mut cold, &mut io, l).expect("tree"), e);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn the_tree_reads_back_what_a_flat_map_holds(ops in proptest::collection::vec(op(), 1..120)) {
            run(ops, 256)?;
        }

        /// A pool of 12 frames evicts mid-walk: pages are read again, never lost.
        #[test]
        fn a_small_pool_evicts_mid_walk_and_loses_nothing(ops in proptest::collection::vec(op(), 1..80)) {
            run(ops, 12)?;
        }
    }
}
