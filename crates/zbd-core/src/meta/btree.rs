//! A B+-tree of fixed-size entries in metadata pages: the one mechanism under the shared-block
//! table (SBT, dedup and snapshots' shared items) and the page count table (PCT, snapshots'
//! shared pages) (docs/design.md, "The shared-block table (SBT)", "Counts and accounting").
//!
//! Nodes are pool frames like map pages: read through [`TreeIo`] from their pair's current
//! slot, changed only through the pool (dirty, pinned until a checkpoint writes them into the
//! other slot), so a crash before a commit leaves the durable tree whole. A node is decoded to
//! a short vector when visited and encoded back only when it changed.
//!
//! Shape: an interior slot `(k, child)` covers keys from `k` to the next slot's key. The first
//! slot of every interior node holds the smallest key there is ([`NodeFormat::KEY_MIN`]) and
//! takes every key below the second: separators live only in slots after the first, so a
//! split's separator (its right node's first key) always sorts between its neighbours, and
//! dropping a node's first child needs no key from below.
//! A leaf that overflows splits in the middle, or keeps [`NodeFormat::APPEND_KEEP`] entries when
//! the new key is its last (keys arriving in ascending order, as promotions and a file's dedup
//! targets do, fill leaves to that mark instead of half). Nodes are not merged when they thin
//! out: a node is freed when its last entry goes, and a root with one child gives way to it.
//! So no delete ever allocates a page, and fill after deletes costs pages, never answers.

use std::fmt::Debug;
use std::marker::PhantomData;

use super::map_tree::{create, fault_at, TreeIo};
use super::page::Page;
use super::pool::PagePool;
use crate::error::{Error, Result};
use crate::format::{
    child_in_sbt_interior, decode_pct, decode_sbt_interior, decode_sbt_leaf, encode_pct,
    encode_sbt_interior, encode_sbt_leaf, find_in_sbt_leaf, insert_in_sbt_leaf,
    replace_in_sbt_leaf, sbt_leaf_len, PageAddress, PageKind, PctEntry, SbtKey, SbtValue,
    PAGE_BODY_BYTES, PCT_ENTRIES_PER_PAGE, SBT_INTERIOR_ENTRIES, SBT_LEAF_ENTRIES,
};

/// How one tree kind lays its entries out in leaf and interior bodies.
pub trait NodeFormat {
    type Key: Copy + Ord + Debug;
    type Value: Copy + Debug + PartialEq;
    /// The smallest key there is: the key of every interior node's first slot.
    const KEY_MIN: Self::Key;
    const LEAF: PageKind;
    const INTERIOR: PageKind;
    /// Entries a leaf holds.
    const LEAF_MAX: usize;
    /// Child slots an interior page holds.
    const INTERIOR_MAX: usize;
    /// Entries a leaf keeps when a key appended at its end splits it.
    const APPEND_KEEP: usize;
    fn decode_leaf(body: &[u8]) -> Result<Vec<(Self::Key, Self::Value)>>;
    fn encode_leaf(entries: &[(Self::Key, Self::Value)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>>;
    fn decode_interior(body: &[u8]) -> Result<Vec<(Self::Key, u32)>>;
    fn encode_interior(slots: &[(Self::Key, u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>>;
    /// The child of an interior page's body that covers `key` (`get`'s descent).
    fn child_of(body: &[u8], key: &Self::Key) -> Result<u32> {
        let slots = Self::decode_interior(body)?;
        if slots.is_empty() {
            return Err(Error::CorruptMetadata(
                "a tree interior page has no child".into(),
            ));
        }
        Ok(slots[child_index(&slots, key)].1)
    }
    /// Sets the value of `key`, which the leaf's body holds, in place; false (body unchanged)
    /// if it does not hold it (`update` of a present key).
    fn replace_in_leaf(body: &mut [u8], key: &Self::Key, value: Self::Value) -> Result<bool> {
        let mut entries = Self::decode_leaf(body)?;
        let Ok(i) = entries.binary_search_by(|(k, _)| k.cmp(key)) else {
            return Ok(false);
        };
        entries[i].1 = value;
        body.copy_from_slice(&Self::encode_leaf(&entries)?[..]);
        Ok(true)
    }
    /// Entries a leaf's body holds.
    fn leaf_len(body: &[u8]) -> Result<usize> {
        Ok(Self::decode_leaf(body)?.len())
    }
    /// Inserts `key`, which the leaf's body lacks and has room for, in place.
    fn insert_in_leaf(body: &mut [u8], key: &Self::Key, value: Self::Value) -> Result<()> {
        let mut entries = Self::decode_leaf(body)?;
        let i = entries.partition_point(|(k, _)| k < key);
        entries.insert(i, (*key, value));
        body.copy_from_slice(&Self::encode_leaf(&entries)?[..]);
        Ok(())
    }
    /// The value of `key` in a leaf's body (`get`).
    fn value_in_leaf(body: &[u8], key: &Self::Key) -> Result<Option<Self::Value>> {
        let entries = Self::decode_leaf(body)?;
        Ok(entries
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| entries[i].1))
    }
}

/// The shared-block table: (birth LBA, serial) -> where the shared item is and its count.
/// 127 entries a leaf, 254 children an interior page; ascending runs fill leaves to 89 (70 %).
pub struct Sbt;

impl NodeFormat for Sbt {
    type Key = SbtKey;
    type Value = SbtValue;
    const KEY_MIN: SbtKey = SbtKey {
        birth: 0,
        serial: 0,
    };
    const LEAF: PageKind = PageKind::SbtLeaf;
    const INTERIOR: PageKind = PageKind::SbtInterior;
    const LEAF_MAX: usize = SBT_LEAF_ENTRIES;
    const INTERIOR_MAX: usize = SBT_INTERIOR_ENTRIES;
    const APPEND_KEEP: usize = 89;
    fn decode_leaf(body: &[u8]) -> Result<Vec<(SbtKey, SbtValue)>> {
        decode_sbt_leaf(body)
    }
    fn encode_leaf(entries: &[(SbtKey, SbtValue)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
        encode_sbt_leaf(entries)
    }
    fn decode_interior(body: &[u8]) -> Result<Vec<(SbtKey, u32)>> {
        decode_sbt_interior(body)
    }
    fn encode_interior(slots: &[(SbtKey, u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
        encode_sbt_interior(slots)
    }
    // Lookups search the encoded page: every dedup hit resolves and counts an item, and
    // decoding whole pages for it was a fifth of the server's time (review of 2b's speed).
    fn child_of(body: &[u8], key: &SbtKey) -> Result<u32> {
        child_in_sbt_interior(body, key)
    }
    fn value_in_leaf(body: &[u8], key: &SbtKey) -> Result<Option<SbtValue>> {
        find_in_sbt_leaf(body, key)
    }
    // A hit's count changes in place: decoding and encoding the leaf for it was a sixth of
    // the server's time on sequential writes with duplicates.
    fn replace_in_leaf(body: &mut [u8], key: &SbtKey, value: SbtValue) -> Result<bool> {
        replace_in_sbt_leaf(body, key, &value)
    }
    fn leaf_len(body: &[u8]) -> Result<usize> {
        sbt_leaf_len(body)
    }
    fn insert_in_leaf(body: &mut [u8], key: &SbtKey, value: SbtValue) -> Result<()> {
        insert_in_sbt_leaf(body, key, &value)
    }
}

/// The page count table: (level and position key, page id) -> count, for counts other than 1.
/// 254 entries a page, leaf or interior; runs of a shadow's children arrive in ascending order
/// and fill leaves to 178 (70 %).
pub struct Pct;

impl NodeFormat for Pct {
    type Key = (u64, u32);
    type Value = u32;
    const KEY_MIN: (u64, u32) = (0, 0);
    const LEAF: PageKind = PageKind::PctLeaf;
    const INTERIOR: PageKind = PageKind::PctInterior;
    const LEAF_MAX: usize = PCT_ENTRIES_PER_PAGE;
    const INTERIOR_MAX: usize = PCT_ENTRIES_PER_PAGE;
    const APPEND_KEEP: usize = 178;
    fn decode_leaf(body: &[u8]) -> Result<Vec<((u64, u32), u32)>> {
        Ok(decode_pct(body)?
            .into_iter()
            .map(|e| ((e.key, e.page), e.value))
            .collect())
    }
    fn encode_leaf(entries: &[((u64, u32), u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
        let e: Vec<PctEntry> = entries
            .iter()
            .map(|&((key, page), value)| PctEntry { key, page, value })
            .collect();
        encode_pct(&e)
    }
    fn decode_interior(body: &[u8]) -> Result<Vec<((u64, u32), u32)>> {
        Self::decode_leaf(body)
    }
    fn encode_interior(slots: &[((u64, u32), u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
        Self::encode_leaf(slots)
    }
}

/// One B+-tree: its root, height and entry count (the checkpoint's extension holds all three).
pub struct BTree<F: NodeFormat> {
    root: Option<u32>,
    /// Levels, leaves included; 0 when empty.
    height: u8,
    entries: u64,
    _format: PhantomData<F>,
}

impl<F: NodeFormat> Clone for BTree<F> {
    fn clone(&self) -> Self {
        BTree {
            root: self.root,
            height: self.height,
            entries: self.entries,
            _format: PhantomData,
        }
    }
}

impl<F: NodeFormat> Debug for BTree<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BTree")
            .field("root", &self.root)
            .field("height", &self.height)
            .field("entries", &self.entries)
            .finish()
    }
}

/// Most levels a tree may claim: 254^8 entries is past any volume.
const HEIGHT_MAX: u8 = 8;

fn address<F: NodeFormat>(id: u32, level: u8) -> PageAddress {
    PageAddress {
        id,
        kind: if level == 0 { F::LEAF } else { F::INTERIOR },
        level,
        position: 0,
    }
}

/// Where a key goes among interior slots: the last slot whose key is at most it, else the first.
fn child_index<K: Ord>(slots: &[(K, u32)], key: &K) -> usize {
    slots.partition_point(|(k, _)| k <= key).saturating_sub(1)
}

/// What an insert below a node reports up: the value it replaced, and the node split off to
/// the right (its separator and id) for the parent to take.
type Inserted<F> = (
    Option<<F as NodeFormat>::Value>,
    Option<(<F as NodeFormat>::Key, u32)>,
);

/// A tree's entries in key order.
type Entries<F> = Vec<(<F as NodeFormat>::Key, <F as NodeFormat>::Value)>;

impl<F: NodeFormat> BTree<F> {
    /// An empty tree: no page.
    pub fn new() -> BTree<F> {
        BTree {
            root: None,
            height: 0,
            entries: 0,
            _format: PhantomData,
        }
    }

    /// The tree a checkpoint names: its root (`None` for an empty tree), height and entries.
    pub fn from_root(root: Option<u32>, height: u8, entries: u64) -> Result<BTree<F>> {
        let fits = match root {
            None => height == 0 && entries == 0,
            Some(_) => (1..=HEIGHT_MAX).contains(&height),
        };
        if !fits {
            return Err(Error::CorruptMetadata(format!(
                "{:?} tree root {root:?} at height {height} with {entries} entries",
                F::LEAF
            )));
        }
        Ok(BTree {
            root,
            height,
            entries,
            _format: PhantomData,
        })
    }

    pub fn root(&self) -> Option<u32> {
        self.root
    }

    pub fn height(&self) -> u8 {
        self.height
    }

    /// Entries in the tree.
    pub fn len(&self) -> u64 {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    fn leaf<I: TreeIo>(pool: &mut PagePool<Page>, io: &mut I, id: u32) -> Result<Entries<F>> {
        let at = address::<F>(id, 0);
        fault_at(pool, io, &at)?;
        F::decode_leaf(&pool.get(id, at.kind).expect("faulted in").body[..])
    }

    fn interior<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        level: u8,
    ) -> Result<Vec<(F::Key, u32)>> {
        let at = address::<F>(id, level);
        fault_at(pool, io, &at)?;
        let slots = F::decode_interior(&pool.get(id, at.kind).expect("faulted in").body[..])?;
        if slots.is_empty() {
            return Err(Error::CorruptMetadata(format!(
                "{:?} page {id} has no child",
                at.kind
            )));
        }
        Ok(slots)
    }

    /// Writes `body` into page `id` (dirty from now on), faulting it back first when the
    /// pool evicted it since it was read (a split's new page or a child's read can).
    fn put<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        level: u8,
        body: Box<[u8; PAGE_BODY_BYTES]>,
    ) -> Result<()> {
        let at = address::<F>(id, level);
        fault_at(pool, io, &at)?;
        pool.change(id, at.kind).expect("faulted in").body = body;
        Ok(())
    }

    fn new_page<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        level: u8,
        body: Box<[u8; PAGE_BODY_BYTES]>,
    ) -> Result<u32> {
        let kind = address::<F>(0, level).kind;
        create(pool, io, Page::new(kind, level, 0, body))
    }

    /// The value of `key`, if the tree holds it.
    pub fn get<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        key: F::Key,
    ) -> Result<Option<F::Value>> {
        let Some(root) = self.root else {
            return Ok(None);
        };
        let (id, at) = self.leaf_of(pool, io, root, &key)?;
        F::value_in_leaf(&pool.get(id, at.kind).expect("faulted in").body[..], &key)
    }

    /// The leaf under `root` that covers `key`, faulted in (the path read without decoding
    /// a page).
    fn leaf_of<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        root: u32,
        key: &F::Key,
    ) -> Result<(u32, PageAddress)> {
        let mut id = root;
        for level in (1..self.height).rev() {
            let at = address::<F>(id, level);
            fault_at(pool, io, &at)?;
            id = F::child_of(&pool.get(id, at.kind).expect("faulted in").body[..], key)?;
        }
        let at = address::<F>(id, 0);
        fault_at(pool, io, &at)?;
        Ok((id, at))
    }

    /// Sets `key` to `value`; returns the value it replaced. An unchanged value dirties nothing.
    pub fn insert<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        key: F::Key,
        value: F::Value,
    ) -> Result<Option<F::Value>> {
        let Some(root) = self.root else {
            let id = Self::new_page(pool, io, 0, F::encode_leaf(&[(key, value)])?)?;
            (self.root, self.height, self.entries) = (Some(id), 1, 1);
            return Ok(None);
        };
        // A leaf that holds the key or has room changes alone, in place: no page to make, no
        // separator above it to change (the key lies within its slot's range already).
        let (id, at) = self.leaf_of(pool, io, root, &key)?;
        let body = &pool.get(id, at.kind).expect("faulted in").body[..];
        match F::value_in_leaf(body, &key)? {
            Some(old) => {
                self.replace(pool, io, key, value)?;
                return Ok(Some(old));
            }
            None if F::leaf_len(body)? < F::LEAF_MAX => {
                let page = pool.change(id, at.kind).expect("faulted in");
                F::insert_in_leaf(&mut page.body[..], &key, value)?;
                self.entries += 1;
                return Ok(None);
            }
            None => {}
        }
        // Every read and every new page the insert needs comes first, its path held resident:
        // an error (no id, a read) leaves the tree as it was, never a split half taken.
        let mut held = Vec::new();
        let mut spare = Vec::new();
        let done = self
            .prepare(pool, io, root, key, &mut held, &mut spare)
            .and_then(|()| self.insert_prepared(pool, io, root, key, value, &mut spare));
        for id in held {
            pool.release(id);
        }
        for id in spare {
            pool.remove(id);
            io.free(id);
        }
        done
    }

    fn insert_prepared<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        root: u32,
        key: F::Key,
        value: F::Value,
        spare: &mut Vec<u32>,
    ) -> Result<Option<F::Value>> {
        let (old, split) = self.insert_at(pool, io, root, self.height - 1, key, value, spare)?;
        if let Some((k, right)) = split {
            let body = F::encode_interior(&[(F::KEY_MIN, root), (k, right)])?;
            let id = Self::spare_page(pool, io, spare, self.height, body)?;
            self.root = Some(id);
            self.height += 1;
        }
        if old.is_none() {
            self.entries += 1;
        }
        Ok(old)
    }

    /// Reads the path to `key`'s leaf, holding each node, and makes the pages its splits will
    /// take (in `spare`, the last one first taken: leaf level up to a new root).
    fn prepare<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        root: u32,
        key: F::Key,
        held: &mut Vec<u32>,
        spare: &mut Vec<u32>,
    ) -> Result<()> {
        let mut fill = Vec::new();
        let mut id = root;
        for level in (1..self.height).rev() {
            let slots = Self::interior(pool, io, id, level)?;
            if pool.hold(id) {
                held.push(id);
            }
            fill.push(slots.len());
            id = slots[child_index(&slots, &key)].1;
        }
        let entries = Self::leaf(pool, io, id)?;
        if pool.hold(id) {
            held.push(id);
        }
        if entries.binary_search_by(|(k, _)| k.cmp(&key)).is_ok() || entries.len() < F::LEAF_MAX {
            return Ok(());
        }
        // Levels that split: the leaf, then each full interior node above it.
        let mut levels = vec![0u8];
        for (level, &n) in (1..self.height).zip(fill.iter().rev()) {
            if n < F::INTERIOR_MAX {
                break;
            }
            levels.push(level);
        }
        if levels.len() == usize::from(self.height) {
            if self.height >= HEIGHT_MAX {
                return Err(Error::CorruptMetadata(format!(
                    "{:?} tree passes {HEIGHT_MAX} levels",
                    F::LEAF
                )));
            }
            levels.push(self.height);
        }
        for &level in levels.iter().rev() {
            let body = if level == 0 {
                F::encode_leaf(&[])?
            } else {
                F::encode_interior(&[])?
            };
            spare.push(Self::new_page(pool, io, level, body)?);
        }
        Ok(())
    }

    /// A page for a split at `level`: the one [`BTree::prepare`] made, else a new one.
    fn spare_page<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        spare: &mut Vec<u32>,
        level: u8,
        body: Box<[u8; PAGE_BODY_BYTES]>,
    ) -> Result<u32> {
        match spare.pop() {
            Some(id) => {
                Self::put(pool, io, id, level, body)?;
                Ok(id)
            }
            None => Self::new_page(pool, io, level, body),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_at<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        level: u8,
        key: F::Key,
        value: F::Value,
        spare: &mut Vec<u32>,
    ) -> Result<Inserted<F>> {
        if level == 0 {
            let mut entries = Self::leaf(pool, io, id)?;
            let i = match entries.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => {
                    let old = entries[i].1;
                    if old != value {
                        entries[i].1 = value;
                        Self::put(pool, io, id, 0, F::encode_leaf(&entries)?)?;
                    }
                    return Ok((Some(old), None));
                }
                Err(i) => i,
            };
            entries.insert(i, (key, value));
            if entries.len() <= F::LEAF_MAX {
                Self::put(pool, io, id, 0, F::encode_leaf(&entries)?)?;
                return Ok((None, None));
            }
            let keep = if i == entries.len() - 1 {
                F::APPEND_KEEP
            } else {
                entries.len() / 2
            };
            let right = entries.split_off(keep);
            let right_id = Self::spare_page(pool, io, spare, 0, F::encode_leaf(&right)?)?;
            Self::put(pool, io, id, 0, F::encode_leaf(&entries)?)?;
            return Ok((None, Some((right[0].0, right_id))));
        }
        let mut slots = Self::interior(pool, io, id, level)?;
        let c = child_index(&slots, &key);
        let (old, split) = self.insert_at(pool, io, slots[c].1, level - 1, key, value, spare)?;
        let Some(new_slot) = split else {
            return Ok((old, None));
        };
        slots.insert(c + 1, new_slot);
        if slots.len() <= F::INTERIOR_MAX {
            Self::put(pool, io, id, level, F::encode_interior(&slots)?)?;
            return Ok((old, None));
        }
        let mut right = slots.split_off(slots.len() / 2);
        let separator = std::mem::replace(&mut right[0].0, F::KEY_MIN);
        let right_id = Self::spare_page(pool, io, spare, level, F::encode_interior(&right)?)?;
        Self::put(pool, io, id, level, F::encode_interior(&slots)?)?;
        Ok((old, Some((separator, right_id))))
    }

    /// Changes the entry of `key` through `f`, given its value if any: `Some(v)` sets it,
    /// `None` removes it, so a count that reaches 0 dies in the same call ("Counts and
    /// accounting", death at 0). Returns the value held now. Removing never allocates.
    pub fn update<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        key: F::Key,
        f: impl FnOnce(Option<F::Value>) -> Option<F::Value>,
    ) -> Result<Option<F::Value>> {
        let old = self.get(pool, io, key)?;
        let new = f(old);
        match (old, new) {
            (Some(_), Some(v)) => self.replace(pool, io, key, v)?,
            (None, Some(v)) => drop(self.insert(pool, io, key, v)?),
            (Some(_), None) => drop(self.remove(pool, io, key)?),
            (None, None) => {}
        }
        Ok(new)
    }

    /// Sets `key`, which the tree holds (an error if not), to `value` in its leaf: no split, no
    /// other page, no decode of the path. An unchanged value dirties nothing.
    pub fn replace<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        key: F::Key,
        value: F::Value,
    ) -> Result<()> {
        let Some(root) = self.root else {
            return Err(Error::CorruptMetadata(format!(
                "{:?} tree is empty, a key was to be replaced",
                F::LEAF
            )));
        };
        let (id, at) = self.leaf_of(pool, io, root, &key)?;
        let lost = || {
            Error::CorruptMetadata(format!(
                "{:?} page {id} lacks a key it should hold",
                F::LEAF
            ))
        };
        let body = &pool.get(id, at.kind).expect("faulted in").body[..];
        match F::value_in_leaf(body, &key)? {
            None => return Err(lost()),
            // An unchanged value dirties nothing, as `insert`.
            Some(v) if v == value => return Ok(()),
            Some(_) => {}
        }
        let page = pool.change(id, at.kind).expect("faulted in");
        if !F::replace_in_leaf(&mut page.body[..], &key, value)? {
            return Err(lost());
        }
        Ok(())
    }

    /// Removes `key`; returns its value. A node left empty is freed, and a root left with one
    /// child gives way to it.
    pub fn remove<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        key: F::Key,
    ) -> Result<Option<F::Value>> {
        let Some(root) = self.root else {
            return Ok(None);
        };
        if self.entries == 0 {
            return Err(Error::CorruptMetadata(format!(
                "{:?} tree has root {root} but counts no entry",
                F::LEAF
            )));
        }
        let (old, empty) = self.remove_at(pool, io, root, self.height - 1, key)?;
        if old.is_some() {
            self.entries -= 1;
        }
        if empty {
            pool.remove(root);
            io.free(root);
            (self.root, self.height) = (None, 0);
            return Ok(old);
        }
        while self.height > 1 {
            let root = self.root.expect("a root");
            let slots = Self::interior(pool, io, root, self.height - 1)?;
            if slots.len() > 1 {
                break;
            }
            pool.remove(root);
            io.free(root);
            self.root = Some(slots[0].1);
            self.height -= 1;
        }
        Ok(old)
    }

    fn remove_at<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        level: u8,
        key: F::Key,
    ) -> Result<(Option<F::Value>, bool)> {
        if level == 0 {
            let mut entries = Self::leaf(pool, io, id)?;
            let Ok(i) = entries.binary_search_by(|(k, _)| k.cmp(&key)) else {
                return Ok((None, false));
            };
            let (_, old) = entries.remove(i);
            if !entries.is_empty() {
                Self::put(pool, io, id, 0, F::encode_leaf(&entries)?)?;
            }
            return Ok((Some(old), entries.is_empty()));
        }
        let mut slots = Self::interior(pool, io, id, level)?;
        let c = child_index(&slots, &key);
        let child = slots[c].1;
        let (old, empty) = self.remove_at(pool, io, child, level - 1, key)?;
        if !empty {
            return Ok((old, false));
        }
        // The parent drops the slot before the child's id is freed: no slot names a free id.
        slots.remove(c);
        if let Some(first) = slots.first_mut() {
            first.0 = F::KEY_MIN;
        }
        if !slots.is_empty() {
            Self::put(pool, io, id, level, F::encode_interior(&slots)?)?;
        }
        pool.remove(child);
        io.free(child);
        Ok((old, slots.is_empty()))
    }

    /// Calls `f` with every entry whose key is at least `from`, in key order, until it returns
    /// false.
    pub fn scan<I: TreeIo>(
        &self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        from: F::Key,
        f: &mut impl FnMut(F::Key, F::Value) -> bool,
    ) -> Result<()> {
        if let Some(root) = self.root {
            Self::scan_at(pool, io, root, self.height - 1, from, f)?;
        }
        Ok(())
    }

    /// Returns false once `f` has asked to stop.
    fn scan_at<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        id: u32,
        level: u8,
        from: F::Key,
        f: &mut impl FnMut(F::Key, F::Value) -> bool,
    ) -> Result<bool> {
        if level == 0 {
            for (k, v) in Self::leaf(pool, io, id)? {
                if k >= from && !f(k, v) {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        let slots = Self::interior(pool, io, id, level)?;
        for &(_, child) in &slots[child_index(&slots, &from)..] {
            if !Self::scan_at(pool, io, child, level - 1, from, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl<F: NodeFormat> Default for BTree<F> {
    fn default() -> Self {
        BTree::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::pool::FRAME_BYTES;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    /// The PCT's layout with nodes of 4 entries and 3 children, so a few hundred keys make a
    /// tree of four and five levels.
    struct Tiny;

    impl NodeFormat for Tiny {
        type Key = (u64, u32);
        type Value = u32;
        const KEY_MIN: (u64, u32) = (0, 0);
        const LEAF: PageKind = PageKind::PctLeaf;
        const INTERIOR: PageKind = PageKind::PctInterior;
        const LEAF_MAX: usize = 4;
        const INTERIOR_MAX: usize = 3;
        const APPEND_KEEP: usize = 3;
        fn decode_leaf(body: &[u8]) -> Result<Vec<((u64, u32), u32)>> {
            Pct::decode_leaf(body)
        }
        fn encode_leaf(entries: &[((u64, u32), u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
            assert!(entries.len() <= Self::LEAF_MAX, "a leaf past its size");
            Pct::encode_leaf(entries)
        }
        fn decode_interior(body: &[u8]) -> Result<Vec<((u64, u32), u32)>> {
            Pct::decode_interior(body)
        }
        fn encode_interior(slots: &[((u64, u32), u32)]) -> Result<Box<[u8; PAGE_BODY_BYTES]>> {
            assert!(
                slots.len() <= Self::INTERIOR_MAX,
                "an interior page past its size"
            );
            Pct::encode_interior(slots)
        }
    }

    /// Pages on a "disk" that a checkpoint copies the pool's dirty frames to, with the ids in
    /// use checked at every allocation and free.
    #[derive(Default)]
    struct MemIo {
        disk: HashMap<u32, Page>,
        in_use: BTreeSet<u32>,
        next: u32,
    }

    impl TreeIo for MemIo {
        fn read(&mut self, _: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
            let p = self
                .disk
                .get(&at.id)
                .ok_or_else(|| Error::CorruptMetadata(format!("page {} never written", at.id)))?;
            assert_eq!((p.kind, p.level), (at.kind, at.level), "page {}", at.id);
            Ok(p.clone())
        }

        fn allocate(&mut self, page: &Page) -> Result<u32> {
            assert!(matches!(
                page.kind,
                PageKind::PctLeaf
                    | PageKind::PctInterior
                    | PageKind::SbtLeaf
                    | PageKind::SbtInterior
            ));
            self.next += 1;
            assert!(self.in_use.insert(self.next), "id handed out twice");
            Ok(self.next)
        }

        fn free(&mut self, id: u32) {
            assert!(self.in_use.remove(&id), "id {id} freed while not in use");
        }
    }

    impl MemIo {
        fn checkpoint(&mut self, pool: &mut PagePool<Page>) {
            for id in pool.snapshot() {
                self.disk.insert(id, pool.peek(id).expect("dirty").clone());
            }
            pool.commit();
        }
    }

    fn pool(frames: u64) -> PagePool<Page> {
        PagePool::new(frames * FRAME_BYTES, 0).expect("pool")
    }

    /// Walks the whole tree: keys ascending across leaves, every leaf at the bottom level, no
    /// empty node, no root with one child, every slot's key at most its subtree's smallest key
    /// but the first; returns the entries and the ids it visited.
    fn check<F: NodeFormat>(
        t: &BTree<F>,
        pool: &mut PagePool<Page>,
        io: &mut MemIo,
    ) -> (Entries<F>, BTreeSet<u32>) {
        fn walk<F: NodeFormat>(
            pool: &mut PagePool<Page>,
            io: &mut MemIo,
            id: u32,
            level: u8,
            low: Option<F::Key>,
            out: &mut Vec<(F::Key, F::Value)>,
            ids: &mut BTreeSet<u32>,
        ) {
            assert!(ids.insert(id), "page {id} reached twice");
            if level == 0 {
                let entries = BTree::<F>::leaf(pool, io, id).expect("leaf");
                assert!(!entries.is_empty(), "empty leaf {id}");
                if let Some(low) = low {
                    assert!(entries[0].0 >= low, "leaf {id} below its slot's key");
                }
                out.extend(entries);
                return;
            }
            let slots = BTree::<F>::interior(pool, io, id, level).expect("interior");
            assert_eq!(slots[0].0, F::KEY_MIN, "page {id}'s first slot");
            for (i, &(k, child)) in slots.iter().enumerate() {
                let low = if i == 0 { low } else { Some(k) };
                walk::<F>(pool, io, child, level - 1, low, out, ids);
            }
        }
        let mut out = Vec::new();
        let mut ids = BTreeSet::new();
        if let Some(root) = t.root() {
            walk::<F>(pool, io, root, t.height() - 1, None, &mut out, &mut ids);
            if t.height() > 1 {
                let slots = BTree::<F>::interior(pool, io, root, t.height() - 1).expect("root");
                assert!(slots.len() > 1, "a root with one child stays");
            }
        }
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "keys out of order");
        assert_eq!(out.len() as u64, t.len());
        (out, ids)
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32),
        /// Keys `from ..` in ascending order, as a shadow's promotions arrive.
        Run(u64, u8),
        Remove(u64),
        /// A count moved by `delta`: it dies at 0.
        Adjust(u64, i8),
        /// A present key's value set in place (an error for an absent key, changing nothing).
        Replace(u64, u32),
        Scan(u64, u8),
        Checkpoint,
        /// A cold open from the last checkpoint (whose state the model kept).
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u64..300;
        prop_oneof![
            6 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            2 => (key.clone(), 1u8..40).prop_map(|(k, n)| Op::Run(k, n)),
            5 => key.clone().prop_map(Op::Remove),
            3 => (key.clone(), -2i8..=2).prop_map(|(k, d)| Op::Adjust(k, d)),
            2 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Replace(k, v)),
            1 => (key, 1u8..20).prop_map(|(k, n)| Op::Scan(k, n)),
            1 => Just(Op::Checkpoint),
            1 => Just(Op::Reopen),
        ]
    }

    fn k(n: u64) -> (u64, u32) {
        (n / 3, (n % 3) as u32)
    }

    fn run(ops: Vec<Op>, frames: u64) -> std::result::Result<(), TestCaseError> {
        let mut io = MemIo::default();
        let mut p = pool(frames);
        let mut t = BTree::<Tiny>::new();
        let mut model: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        let mut durable = (t.clone(), model.clone(), io.disk.clone(), io.in_use.clone());
        for op in ops {
            match op {
                Op::Insert(n, v) => {
                    let got = t.insert(&mut p, &mut io, k(n), v).expect("insert");
                    prop_assert_eq!(got, model.insert(k(n), v));
                }
                Op::Run(from, len) => {
                    for n in from..from + u64::from(len) {
                        let got = t.insert(&mut p, &mut io, k(n), n as u32).expect("insert");
                        prop_assert_eq!(got, model.insert(k(n), n as u32));
                        if p.stats().dirty * 2 >= frames {
                            io.checkpoint(&mut p);
                        }
                    }
                }
                Op::Remove(n) => {
                    let got = t.remove(&mut p, &mut io, k(n)).expect("remove");
                    prop_assert_eq!(got, model.remove(&k(n)));
                }
                Op::Adjust(n, d) => {
                    let step = |v: Option<u32>| {
                        let c = i64::from(v.unwrap_or(0)) + i64::from(d);
                        (c > 0).then_some(c as u32)
                    };
                    let got = t.update(&mut p, &mut io, k(n), step).expect("update");
                    let want = step(model.get(&k(n)).copied());
                    match want {
                        Some(c) => model.insert(k(n), c),
                        None => model.remove(&k(n)),
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Replace(n, v) => {
                    let got = t.replace(&mut p, &mut io, k(n), v);
                    match model.get_mut(&k(n)) {
                        Some(held) => {
                            prop_assert!(got.is_ok(), "{:?}", got);
                            *held = v;
                        }
                        None => prop_assert!(got.is_err(), "an absent key was replaced"),
                    }
                }
                Op::Scan(from, n) => {
                    let mut got = Vec::new();
                    t.scan(&mut p, &mut io, k(from), &mut |key, v| {
                        got.push((key, v));
                        got.len() < usize::from(n)
                    })
                    .expect("scan");
                    let want: Vec<_> = model
                        .range(k(from)..)
                        .take(usize::from(n))
                        .map(|(&a, &b)| (a, b))
                        .collect();
                    prop_assert_eq!(got, want);
                }
                Op::Checkpoint => {
                    io.checkpoint(&mut p);
                    durable = (t.clone(), model.clone(), io.disk.clone(), io.in_use.clone());
                }
                Op::Reopen => {
                    let (dt, dm, disk, in_use) = durable.clone();
                    t = BTree::from_root(dt.root(), dt.height(), dt.len()).expect("root");
                    model = dm;
                    (io.disk, io.in_use) = (disk, in_use);
                    p = pool(frames);
                }
            }
            // A small pool fills with dirty frames: checkpoint when half are pinned (one insert
            // dirties at most two pages a level).
            if p.stats().dirty * 2 >= frames {
                io.checkpoint(&mut p);
            }
            let (entries, ids) = check(&t, &mut p, &mut io);
            let want: Vec<_> = model.iter().map(|(&a, &b)| (a, b)).collect();
            prop_assert_eq!(entries, want);
            prop_assert_eq!(ids, io.in_use.clone(), "pages reachable = ids in use");
        }
        for (&key, &v) in &model {
            prop_assert_eq!(t.get(&mut p, &mut io, key).expect("get"), Some(v));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(160))]
        /// Inserts, ascending runs, removes and scans against a sorted map, with checkpoints,
        /// cold reopens and a pool small enough to evict between a node's read and its write;
        /// after every op the whole tree is walked for order, depth and leaks.
        #[test]
        fn a_tree_answers_as_a_sorted_map_does(
            ops in proptest::collection::vec(op(), 1..150),
            frames in prop_oneof![Just(24u64), Just(64)],
        ) {
            run(ops, frames)?;
        }
    }

    /// The real SBT format (its in-place `insert_in_sbt_leaf` / `replace_in_sbt_leaf` fast
    /// paths) against a sorted map (second review of the in-place edits): random, descending and ascending inserts (keys below
    /// the leftmost leaf's first key included), replaces, updates and removes, with a pool small
    /// enough to evict between descent and change, checkpoints and cold reopens; the whole tree
    /// is walked for order, separators, entry count and leaks after every op.
    #[test]
    fn the_sbt_in_place_edits_answer_as_a_sorted_map() {
        let key = |n: u64| SbtKey {
            birth: n / 4,
            serial: n % 4,
        };
        let val = |n: u64, c: u32| SbtValue {
            extent: n as u32,
            location: (n as u32) & 0xfffff,
            stored_len: 100,
            codec: 1,
            flags: 0,
            crc: n as u32 ^ 0x5a5a,
            count: c,
        };
        for seed in 0..12u64 {
            let mut rng = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut next = |m: u64| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (rng >> 33) % m
            };
            let frames = [24u64, 64][seed as usize % 2];
            let mut io = MemIo::default();
            let mut p = pool(frames);
            let mut t = BTree::<Sbt>::new();
            let mut model: BTreeMap<SbtKey, SbtValue> = BTreeMap::new();
            let mut durable = (t.clone(), model.clone(), io.disk.clone(), io.in_use.clone());
            let space = 6000u64;
            let mut down = space;
            for step in 0..3000u32 {
                match next(10) {
                    0..=2 => {
                        let n = next(space);
                        let v = val(n, 1 + next(5) as u32);
                        let got = t.insert(&mut p, &mut io, key(n), v).expect("insert");
                        assert_eq!(got, model.insert(key(n), v), "seed {seed} step {step}");
                    }
                    3 => {
                        // Descending: every key goes below the leftmost leaf's first key.
                        for _ in 0..next(60) {
                            down = down.saturating_sub(1);
                            let v = val(down, 1);
                            let got = t.insert(&mut p, &mut io, key(down), v).expect("insert");
                            assert_eq!(got, model.insert(key(down), v));
                            if p.stats().dirty * 2 >= frames {
                                io.checkpoint(&mut p);
                            }
                        }
                    }
                    4 => {
                        let n = next(space);
                        let v = val(n, 7 + next(100) as u32);
                        let got = t.replace(&mut p, &mut io, key(n), v);
                        match model.get_mut(&key(n)) {
                            Some(h) => {
                                got.expect("replace");
                                *h = v;
                            }
                            None => assert!(got.is_err()),
                        }
                    }
                    5 => {
                        let n = next(space);
                        let d = next(5) as i64 - 2;
                        let step = |v: Option<SbtValue>| {
                            let c = i64::from(v.map_or(0, |v| v.count)) + d;
                            (c > 0).then(|| SbtValue {
                                count: c as u32,
                                ..v.unwrap_or(val(n, 0))
                            })
                        };
                        let want = step(model.get(&key(n)).copied());
                        let got = t.update(&mut p, &mut io, key(n), step).expect("update");
                        match want {
                            Some(v) => model.insert(key(n), v),
                            None => model.remove(&key(n)),
                        };
                        assert_eq!(got, want);
                    }
                    6 | 7 => {
                        let n = next(space);
                        let got = t.remove(&mut p, &mut io, key(n)).expect("remove");
                        assert_eq!(got, model.remove(&key(n)));
                    }
                    8 => {
                        io.checkpoint(&mut p);
                        durable = (t.clone(), model.clone(), io.disk.clone(), io.in_use.clone());
                    }
                    _ => {
                        if next(4) == 0 {
                            let (dt, dm, disk, in_use) = durable.clone();
                            t = BTree::from_root(dt.root(), dt.height(), dt.len()).expect("root");
                            model = dm;
                            (io.disk, io.in_use) = (disk, in_use);
                            p = pool(frames);
                        }
                    }
                }
                if p.stats().dirty * 2 >= frames {
                    io.checkpoint(&mut p);
                }
                if step % 25 == 0 {
                    let (entries, ids) = check(&t, &mut p, &mut io);
                    let want: Vec<_> = model.iter().map(|(&a, &b)| (a, b)).collect();
                    assert_eq!(entries, want, "seed {seed} step {step}");
                    assert_eq!(ids, io.in_use.clone(), "pages reachable = ids in use");
                }
            }
            for (&k, &v) in &model {
                assert_eq!(t.get(&mut p, &mut io, k).expect("get"), Some(v));
            }
        }
    }

    /// Keys in ascending order fill leaves to the append mark, not half: 70 % for the SBT.
    #[test]
    fn ascending_keys_fill_leaves_to_the_append_mark() {
        let mut io = MemIo::default();
        let mut p = pool(4096);
        let mut t = BTree::<Pct>::new();
        for n in 0..10_000u64 {
            t.insert(&mut p, &mut io, (n, 0), 1).expect("insert");
        }
        let (_, ids) = check(&t, &mut p, &mut io);
        let leaves = ids
            .iter()
            .filter(|&&id| p.kind_of(id) == Some(PageKind::PctLeaf))
            .count();
        let fill = 10_000.0 / (leaves as f64 * Pct::LEAF_MAX as f64);
        assert!(
            (0.65..0.75).contains(&fill),
            "fill {fill} over {leaves} leaves"
        );
        // Removing everything frees every page.
        for n in 0..10_000u64 {
            assert_eq!(t.remove(&mut p, &mut io, (n, 0)).expect("remove"), Some(1));
        }
        assert_eq!((t.root(), t.height(), t.len()), (None, 0, 0));
        assert!(io.in_use.is_empty());
    }

    /// A [`MemIo`] that runs out of ids after `left` more allocations (the metadata area full:
    /// `NoSpace`, an error a later try may not meet).
    struct Budget<'a> {
        io: &'a mut MemIo,
        left: u32,
    }

    impl TreeIo for Budget<'_> {
        fn read(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
            self.io.read(pool, at)
        }

        fn allocate(&mut self, page: &Page) -> Result<u32> {
            if self.left == 0 {
                return Err(Error::NoSpace);
            }
            self.left -= 1;
            self.io.allocate(page)
        }

        fn free(&mut self, id: u32) {
            self.io.free(id)
        }
    }

    /// An insert that splits a leaf and then finds no id for its parent's split fails, and the
    /// tree is the one before it: no entry of the split leaf gone, no page left unnamed.
    #[test]
    fn an_insert_that_runs_out_of_ids_midway_changes_nothing() {
        let mut io = MemIo::default();
        let mut p = pool(64);
        let mut t = BTree::<Tiny>::new();
        // Ascending keys: leaves [1 2 3] [4 5 6] [7 8 9 10] under a full root of 3 children.
        for n in 1..=10u64 {
            t.insert(&mut p, &mut io, (n, 0), n as u32).expect("insert");
        }
        assert_eq!(t.height(), 2);
        let (before, ids) = check(&t, &mut p, &mut io);
        // Key 11 splits the last leaf (one id) and then the root (two more): one id is left.
        let mut short = Budget {
            io: &mut io,
            left: 1,
        };
        assert!(t.insert(&mut p, &mut short, (11, 0), 11).is_err());
        assert_eq!(t.get(&mut p, &mut io, (10, 0)).expect("get"), Some(10));
        let (after, after_ids) = check(&t, &mut p, &mut io);
        assert_eq!(after, before, "a failed insert lost or added entries");
        assert_eq!(after_ids, ids);
        assert_eq!(io.in_use, ids, "a failed insert left a page no slot names");
        // With ids again the same insert goes through.
        assert_eq!(
            t.insert(&mut p, &mut io, (11, 0), 11).expect("insert"),
            None
        );
        check(&t, &mut p, &mut io);
    }

    /// An SBT key field past 48 bits does not fit the page: refused, never stored as another key.
    #[test]
    fn an_sbt_key_past_48_bits_is_refused_not_truncated() {
        use crate::meta::store::MetaCheckpoint;
        use crate::meta::testing::TestVolume;

        let v = TestVolume::new(64 << 20);
        let mut store = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(64);
        let mut t = BTree::<Sbt>::new();
        let value = SbtValue {
            extent: 1,
            location: 0,
            stored_len: 900,
            codec: 1,
            flags: 0,
            crc: 7,
            count: 2,
        };
        let low = SbtKey {
            birth: 0,
            serial: 1,
        };
        let high = SbtKey {
            birth: 1 << 48,
            serial: 1,
        };
        t.insert(&mut p, &mut store, low, value).expect("insert");
        let got = t.insert(&mut p, &mut store, high, SbtValue { count: 9, ..value });
        assert!(got.is_err(), "a key past 48 bits was taken: {got:?}");
        assert_eq!(
            t.get(&mut p, &mut store, low).expect("get"),
            Some(value),
            "another key's value changed"
        );
        assert_eq!(t.len(), 1);
    }

    /// A checkpoint whose entry count is short of the tree's (damage the CRC did not catch):
    /// an error, never an overflow.
    #[test]
    fn an_entry_count_short_of_the_tree_is_an_error_not_a_panic() {
        let mut io = MemIo::default();
        let mut p = pool(64);
        let mut t = BTree::<Tiny>::new();
        for n in 0..6u64 {
            t.insert(&mut p, &mut io, (n, 0), 1).expect("insert");
        }
        io.checkpoint(&mut p);
        let mut t = BTree::<Tiny>::from_root(t.root(), t.height(), 1).expect("root");
        let first = t.remove(&mut p, &mut io, (0, 0));
        let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.remove(&mut p, &mut io, (1, 0))
        }));
        assert!(first.is_ok());
        assert!(
            matches!(second, Ok(Err(_))),
            "a count below the tree's entries: {second:?}"
        );
    }

    #[test]
    fn a_root_that_does_not_fit_its_height_is_refused() {
        assert!(BTree::<Sbt>::from_root(None, 1, 0).is_err());
        assert!(BTree::<Sbt>::from_root(Some(4), 0, 10).is_err());
        assert!(BTree::<Sbt>::from_root(Some(4), HEIGHT_MAX + 1, 10).is_err());
        assert!(BTree::<Sbt>::from_root(Some(4), 2, 10).is_ok());
    }

    /// The SBT on the medium: a tree of a few thousand entries committed, then changed, its next
    /// checkpoint cut by a power failure: an open from the durable root reads the committed
    /// entries and nothing of the cut.
    #[test]
    fn an_sbt_reopens_from_its_durable_root_after_a_cut_checkpoint() {
        use crate::meta::store::MetaCheckpoint;
        use crate::meta::testing::TestVolume;

        let v = TestVolume::new(64 << 20);
        let value = |n: u64| SbtValue {
            extent: n as u32,
            location: 0,
            stored_len: 900,
            codec: 1,
            flags: 0,
            crc: n as u32 ^ 0x5a5a,
            count: 2,
        };
        let key = |n: u64| SbtKey {
            birth: n.wrapping_mul(2_654_435_761) % 1_000_000,
            serial: n,
        };
        let mut store = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(256);
        let mut t = BTree::<Sbt>::new();
        let mut model = BTreeMap::new();
        for n in 0..3000 {
            t.insert(&mut p, &mut store, key(n), value(n))
                .expect("insert");
            model.insert(key(n), value(n));
        }
        let meta = store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        let durable = (t.clone(), meta, model.clone());
        for n in 0..1500 {
            t.remove(&mut p, &mut store, key(2 * n)).expect("remove");
        }
        for n in 3000..4000 {
            t.insert(&mut p, &mut store, key(n), value(n))
                .expect("insert");
        }
        let _cut = store.checkpoint(&mut p).expect("checkpoint");
        let (dt, meta, model) = durable;
        let mut store = v.open(&meta, 2);
        let mut p = pool(16);
        let t = BTree::<Sbt>::from_root(dt.root(), dt.height(), dt.len()).expect("root");
        let mut got = Vec::new();
        t.scan(&mut p, &mut store, Sbt::KEY_MIN, &mut |k, v| {
            got.push((k, v));
            true
        })
        .expect("scan");
        assert_eq!(got, model.into_iter().collect::<Vec<_>>());
        assert_eq!(t.get(&mut p, &mut store, key(3500)).expect("get"), None);
    }
}
