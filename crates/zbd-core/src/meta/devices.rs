//! The device table: the block devices one volume holds, the default device and, with steps 3
//! and 4, other devices, snapshots and clones (docs/design.md, "Devices"; docs/format.md,
//! "Device row").
//!
//! Rows (128 bytes) are resident, by id; ids only grow and are never reused, so a request names
//! its device by id for good. On disk the rows, in id order, fill device-table pages of 31,
//! named in order by one list page; the checkpoint's extension carries the list page's id, the
//! row count, the CRC32C of all rows and the next id, so a lost or stale page is an error that
//! names it, never a device silently gone. The pages are ordinary metadata pages: written by a
//! checkpoint into the other slot of their pairs, so a crash before its commit leaves the table
//! the durable checkpoint names.

use std::collections::BTreeMap;

use super::map_tree::{create, fault_at, TreeIo};
use super::page::Page;
use super::pool::PagePool;
use crate::error::{Error, Result};
use crate::format::{
    decode_device_table, decode_list, encode_device_table, encode_list, ChildSlot, DeviceKind,
    DeviceRow, PageAddress, PageKind, DEVICE_ROWS_PER_PAGE, DEVICE_ROW_BYTES, LIST_IDS_PER_PAGE,
    PAGE_BODY_BYTES, PAGE_ID_NONE,
};

/// The id of a volume's first device, the default export.
pub const DEFAULT_DEVICE: u32 = 1;

/// Most rows one list page can name pages for: 1,020 pages of 31.
pub const DEVICES_MAX: usize = LIST_IDS_PER_PAGE * DEVICE_ROWS_PER_PAGE;

/// What the checkpoint's extension says of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceHeader {
    /// The list page naming the device-table pages.
    pub list: u32,
    pub rows: u32,
    /// CRC32C of all rows, encoded, in id order.
    pub crc: u32,
    pub next_device: u32,
}

/// The live devices of a volume.
#[derive(Debug)]
pub struct DeviceTable {
    rows: BTreeMap<u32, DeviceRow>,
    next_device: u32,
    /// Ids of the device-table pages, in list order, and of the list page: none before the
    /// first write.
    pages: Vec<u32>,
    list: Option<u32>,
    /// Rows changed since the pages were last encoded.
    changed: bool,
}

/// The default device's row for a volume of `blocks` blocks, made at `created_seq`: named
/// "default", writable, all unmapped (the catalog sets its root and depth).
pub fn default_row(blocks: u64, created_seq: u64) -> DeviceRow {
    DeviceRow {
        id: DEFAULT_DEVICE,
        parent: 0,
        kind: DeviceKind::Default,
        depth: 1,
        flags: 0,
        root: ChildSlot::AllUnmapped,
        name: "default".into(),
        blocks,
        created_seq,
        created_at: 0,
        bytes_used: 0,
        blocks_used: 0,
        epoch: 0,
        pages_max: 0,
    }
}

fn rows_crc<'a>(rows: impl Iterator<Item = &'a DeviceRow>) -> Result<u32> {
    let mut crc = 0;
    let mut b = [0u8; DEVICE_ROW_BYTES];
    for r in rows {
        r.encode(&mut b)?;
        crc = crc32c::crc32c_append(crc, &b);
    }
    Ok(crc)
}

fn address(kind: PageKind, id: u32, position: usize) -> PageAddress {
    PageAddress {
        id,
        kind,
        level: 0,
        position: position as u64,
    }
}

fn lost(what: String) -> Error {
    Error::CorruptMetadata(format!("device table: {what}"))
}

impl DeviceTable {
    /// The table of a new volume: its default device alone (id 1). Its pages are made by the
    /// first [`DeviceTable::write`].
    pub fn create(mut default: DeviceRow) -> Result<DeviceTable> {
        default.id = DEFAULT_DEVICE;
        default.kind = DeviceKind::Default;
        let mut t = DeviceTable {
            rows: BTreeMap::new(),
            next_device: DEFAULT_DEVICE + 1,
            pages: Vec::new(),
            list: None,
            changed: true,
        };
        t.check_name(&default.name, None)?;
        rows_crc(std::iter::once(&default))?;
        t.rows.insert(DEFAULT_DEVICE, default);
        Ok(t)
    }

    /// The table a durable checkpoint names: its list page, then each device-table page, read
    /// through `io`. An error names what does not match the header (a page lost, a row count
    /// or CRC that differs, ids out of order or past the next id).
    pub fn open<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        header: &DeviceHeader,
    ) -> Result<DeviceTable> {
        let list_at = address(PageKind::List, header.list, 0);
        fault_at(pool, io, &list_at)
            .map_err(|e| lost(format!("its list page {} cannot be read: {e}", header.list)))?;
        let pages = decode_list(&pool.get(header.list, PageKind::List).expect("faulted").body[..])?;
        let mut rows = BTreeMap::new();
        for (k, &id) in pages.iter().enumerate() {
            let at = address(PageKind::DeviceTable, id, k);
            fault_at(pool, io, &at)
                .map_err(|e| lost(format!("page {k} (id {id}) cannot be read: {e}")))?;
            let body = &pool.get(id, PageKind::DeviceTable).expect("faulted").body;
            for r in decode_device_table(&body[..])? {
                let last = rows.keys().next_back().copied().unwrap_or(0);
                if r.id <= last || r.id >= header.next_device {
                    return Err(lost(format!(
                        "row id {} out of order or past the next id {}",
                        r.id, header.next_device
                    )));
                }
                rows.insert(r.id, r);
            }
        }
        if rows.len() as u32 != header.rows || rows_crc(rows.values())? != header.crc {
            return Err(lost(format!(
                "{} rows read where the checkpoint names {} (or their CRC differs): a \
                 device-table page is stale or lost",
                rows.len(),
                header.rows
            )));
        }
        if !rows.contains_key(&DEFAULT_DEVICE) {
            return Err(lost("the default device's row is missing".into()));
        }
        let mut t = DeviceTable {
            rows: BTreeMap::new(),
            next_device: header.next_device,
            pages,
            list: Some(header.list),
            changed: false,
        };
        for (id, r) in rows {
            t.check_name(&r.name, None)?;
            t.rows.insert(id, r);
        }
        Ok(t)
    }

    fn check_name(&self, name: &str, except: Option<u32>) -> Result<()> {
        match self.by_name(name) {
            Some(r) if Some(r.id) != except => Err(Error::Invalid(format!(
                "a device named {name:?} exists already (id {})",
                r.id
            ))),
            _ => Ok(()),
        }
    }

    /// The list page's and the device-table pages' addresses (none before the first write),
    /// for the scrub.
    pub fn page_addresses(&self) -> Vec<PageAddress> {
        let list = self.list.map(|id| address(PageKind::List, id, 0));
        let pages =
            (self.pages.iter().enumerate()).map(|(k, &id)| address(PageKind::DeviceTable, id, k));
        list.into_iter().chain(pages).collect()
    }

    /// Live rows in id order.
    pub fn rows(&self) -> impl Iterator<Item = &DeviceRow> {
        self.rows.values()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn get(&self, id: u32) -> Option<&DeviceRow> {
        self.rows.get(&id)
    }

    pub fn by_name(&self, name: &str) -> Option<&DeviceRow> {
        self.rows.values().find(|r| r.name == name)
    }

    /// Adds `row` under the next id (never used before); returns it. Refused for a name in
    /// use, a name that does not encode, or a table at [`DEVICES_MAX`].
    pub fn add(&mut self, mut row: DeviceRow) -> Result<u32> {
        if self.rows.len() >= DEVICES_MAX {
            return Err(Error::Invalid(format!(
                "a volume holds at most {DEVICES_MAX} devices"
            )));
        }
        if row.kind == DeviceKind::Default {
            return Err(Error::Invalid("a volume has one default device".into()));
        }
        check_new_name(&row.name)?;
        self.check_name(&row.name, None)?;
        row.id = self.next_device;
        let next = self
            .next_device
            .checked_add(1)
            .ok_or_else(|| Error::Invalid("device ids are used up".into()))?;
        rows_crc(std::iter::once(&row))?;
        self.next_device = next;
        self.rows.insert(row.id, row);
        self.changed = true;
        Ok(self.next_device - 1)
    }

    /// Changes row `id` through `f` (its root, counters, name); the id and kind stay.
    pub fn update(&mut self, id: u32, f: impl FnOnce(&mut DeviceRow)) -> Result<()> {
        let mut row = self
            .rows
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no device with id {id}")))?;
        let (kind, name) = (row.kind, row.name.clone());
        f(&mut row);
        row.id = id;
        row.kind = kind;
        if row.name != name {
            self.check_name(&row.name, Some(id))?;
        }
        rows_crc(std::iter::once(&row))?;
        if self.rows.get(&id) != Some(&row) {
            self.rows.insert(id, row);
            self.changed = true;
        }
        Ok(())
    }

    /// Removes row `id`; the default device stays.
    pub fn remove(&mut self, id: u32) -> Result<DeviceRow> {
        if id == DEFAULT_DEVICE {
            return Err(Error::Invalid(
                "the default device cannot be removed".into(),
            ));
        }
        let row = self
            .rows
            .remove(&id)
            .ok_or_else(|| Error::Invalid(format!("no device with id {id}")))?;
        self.changed = true;
        Ok(row)
    }

    /// Phase 1's part: encodes the rows into device-table pages and the list page in the pool
    /// (dirty, for the checkpoint to write) when they changed, taking ids for new pages and
    /// freeing those no longer needed; returns what the extension carries.
    pub fn write<I: TreeIo>(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
    ) -> Result<DeviceHeader> {
        if self.changed {
            let rows: Vec<DeviceRow> = self.rows.values().cloned().collect();
            let chunks: Vec<&[DeviceRow]> = rows.chunks(DEVICE_ROWS_PER_PAGE).collect();
            while self.pages.len() > chunks.len() {
                let id = self.pages.pop().expect("longer");
                pool.remove(id);
                io.free(id);
            }
            for (k, chunk) in chunks.iter().enumerate() {
                let body = encode_device_table(chunk)?;
                match self.pages.get(k) {
                    Some(&id) => Self::put(pool, io, address(PageKind::DeviceTable, id, k), body)?,
                    None => {
                        let page = Page::new(PageKind::DeviceTable, 0, k as u64, body);
                        self.pages.push(create(pool, io, page)?);
                    }
                }
            }
            let body = encode_list(&self.pages);
            match self.list {
                Some(id) => Self::put(pool, io, address(PageKind::List, id, 0), body)?,
                None => {
                    let page = Page::new(PageKind::List, 0, 0, body);
                    self.list = Some(create(pool, io, page)?);
                }
            }
            self.changed = false;
        }
        Ok(DeviceHeader {
            list: self.list.unwrap_or(PAGE_ID_NONE),
            rows: self.rows.len() as u32,
            crc: rows_crc(self.rows.values())?,
            next_device: self.next_device,
        })
    }

    fn put<I: TreeIo>(
        pool: &mut PagePool<Page>,
        io: &mut I,
        at: PageAddress,
        body: Box<[u8; PAGE_BODY_BYTES]>,
    ) -> Result<()> {
        fault_at(pool, io, &at)?;
        // A page whose rows did not change is not written again.
        if pool.peek(at.id).expect("faulted in").body != body {
            pool.change(at.id, at.kind).expect("faulted in").body = body;
        }
        Ok(())
    }
}

/// The names a new device may take: what an export name, a shell word and `VOL@NAME` carry
/// without quoting or doubt (letters, digits and `_ . + : -`, never first a `.` or `-`, no
/// `@` or `/`). The format holds any UTF-8 name without NUL, so rows made before this rule
/// still open and serve.
pub fn check_new_name(name: &str) -> Result<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.+:-".contains(c);
    let ok = name.len() <= crate::format::DEVICE_NAME_BYTES
        && name.chars().all(allowed)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "device name {name:?}: 1 to {} letters, digits and _ . + : -, starting with a letter, \
         a digit or _",
        crate::format::DEVICE_NAME_BYTES
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::MAP_PAGE_BYTES;
    use crate::meta::store::MetaCheckpoint;
    use crate::meta::testing::{pool, TestVolume};

    fn row(name: &str, kind: DeviceKind) -> DeviceRow {
        DeviceRow {
            id: 0,
            parent: DEFAULT_DEVICE,
            kind,
            depth: 3,
            flags: 0,
            root: ChildSlot::AllUnmapped,
            name: name.to_string(),
            blocks: 1 << 20,
            created_seq: 7,
            created_at: 1_800_000_000,
            bytes_used: 0,
            blocks_used: 0,
            epoch: 0,
            pages_max: 0,
        }
    }

    /// A checkpoint of the table alone: its pages written and committed; returns what the
    /// checkpoint carries.
    fn commit(
        t: &mut DeviceTable,
        p: &mut PagePool<Page>,
        s: &mut crate::meta::store::MetaStore,
    ) -> (DeviceHeader, MetaCheckpoint) {
        let h = t.write(p, s).expect("write");
        let meta = s.checkpoint(p).expect("checkpoint");
        s.commit(p);
        (h, meta)
    }

    #[test]
    fn a_thousand_devices_reopen_and_a_cut_checkpoint_leaves_the_durable_table() {
        let v = TestVolume::new(64 << 20);
        let mut s = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(64);
        let mut t = DeviceTable::create(row("main", DeviceKind::Default)).expect("create");
        for i in 0..1000 {
            let id = t
                .add(row(&format!("snap-{i}"), DeviceKind::Snapshot))
                .expect("add");
            assert_eq!(id, i + 2, "ids in order, never reused");
        }
        assert!(
            t.add(row("snap-7", DeviceKind::Snapshot)).is_err(),
            "names unique"
        );
        let (h, meta) = commit(&mut t, &mut p, &mut s);
        assert_eq!((h.rows, h.next_device), (1001, 1002));
        let durable: Vec<DeviceRow> = t.rows().cloned().collect();
        // Changes after the commit: a delete, a rename, a new device; cut before its commit.
        t.remove(500).expect("remove");
        t.update(3, |r| r.name = "renamed".into()).expect("rename");
        t.add(row("late", DeviceKind::Clone)).expect("add");
        assert!(t.remove(500).is_err(), "gone");
        assert!(
            t.remove(DEFAULT_DEVICE).is_err(),
            "the default device stays"
        );
        t.write(&mut p, &mut s).expect("write");
        let _cut = s.checkpoint(&mut p).expect("checkpoint");
        let mut s = v.open(&meta, 2);
        let mut p = pool(8);
        let back = DeviceTable::open(&mut p, &mut s, &h).expect("open");
        assert_eq!(back.rows().cloned().collect::<Vec<_>>(), durable);
        assert_eq!(back.by_name("snap-998").map(|r| r.id), Some(1000));
        // The reopened table goes on from the next id, past every id ever handed out.
        let mut back = back;
        assert_eq!(
            back.add(row("after", DeviceKind::Other)).expect("add"),
            1002
        );
    }

    #[test]
    fn a_lost_or_stale_device_page_is_named_never_a_device_gone() {
        let v = TestVolume::new(64 << 20);
        let mut s = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(64);
        let mut t = DeviceTable::create(row("main", DeviceKind::Default)).expect("create");
        for i in 0..40 {
            t.add(row(&format!("d{i}"), DeviceKind::Other))
                .expect("add");
        }
        let (h, meta) = commit(&mut t, &mut p, &mut s);
        // A header that names fewer rows, or another CRC, than the pages hold.
        for bad in [
            DeviceHeader { rows: 40, ..h },
            DeviceHeader {
                crc: h.crc ^ 1,
                ..h
            },
            DeviceHeader {
                next_device: 30,
                ..h
            },
        ] {
            let mut s = v.open(&meta, 2);
            let err = DeviceTable::open(&mut pool(8), &mut s, &bad).expect_err("refused");
            assert!(err.to_string().contains("device table"), "{err}");
        }
        // Both copies of the second page damaged: an error that names it.
        let id = t.pages[1];
        let slot = crate::format::PairSlot::A;
        for copy in 0..2 {
            let off = v
                .geometry
                .slot_offset(&v.sb, id, slot, copy)
                .expect("offset");
            let mut b = vec![0u8; MAP_PAGE_BYTES];
            v.storage.read_at(off, &mut b).expect("read");
            b[300] ^= 4;
            v.storage.write_at(off, &b).expect("write");
        }
        let mut s = v.open(&meta, 2);
        let err = DeviceTable::open(&mut pool(8), &mut s, &h).expect_err("refused");
        assert!(
            err.to_string().contains(&format!("page 1 (id {id})")),
            "{err}"
        );
    }

    /// A next id at the end of the id space (a header the rows' CRC does not cover): an add is
    /// refused, never an overflow or an id handed out twice.
    #[test]
    fn a_next_id_at_the_end_of_the_id_space_refuses_an_add() {
        let v = TestVolume::new(64 << 20);
        let mut s = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(64);
        let mut t = DeviceTable::create(row("main", DeviceKind::Default)).expect("create");
        let (h, meta) = commit(&mut t, &mut p, &mut s);
        let mut s = v.open(&meta, 2);
        let header = DeviceHeader {
            next_device: u32::MAX,
            ..h
        };
        let mut back = DeviceTable::open(&mut pool(8), &mut s, &header).expect("open");
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let a = back.add(row("a", DeviceKind::Other));
            let b = back.add(row("b", DeviceKind::Other));
            (a, b)
        }));
        let (a, b) = got.expect("no overflow");
        assert!(
            a.is_err() || b.is_err(),
            "ids past the id space: {a:?} {b:?}"
        );
    }

    #[test]
    fn an_unchanged_table_writes_nothing_and_a_shrunk_one_frees_its_pages() {
        let v = TestVolume::new(64 << 20);
        let mut s = v.open(&MetaCheckpoint::default(), 1);
        let mut p = pool(64);
        let mut t = DeviceTable::create(row("main", DeviceKind::Default)).expect("create");
        for i in 0..100 {
            t.add(row(&format!("d{i}"), DeviceKind::Other))
                .expect("add");
        }
        commit(&mut t, &mut p, &mut s);
        assert_eq!(t.pages.len(), 4);
        t.write(&mut p, &mut s).expect("write");
        assert_eq!(p.stats().dirty, 0, "nothing changed, nothing to write");
        // A change in the last page rewrites it and the list only if the list changed.
        t.update(101, |r| r.bytes_used = 4096).expect("update");
        t.write(&mut p, &mut s).expect("write");
        assert_eq!(p.stats().dirty, 1);
        s.checkpoint(&mut p).expect("checkpoint");
        s.commit(&mut p);
        for id in 2..90 {
            t.remove(id).expect("remove");
        }
        let gone = t.pages[1..].to_vec();
        let (h, meta) = commit(&mut t, &mut p, &mut s);
        assert_eq!(t.pages.len(), 1);
        for id in gone {
            assert!(!p.contains(id));
        }
        let mut s = v.open(&meta, 3);
        let back = DeviceTable::open(&mut pool(8), &mut s, &h).expect("open");
        assert_eq!(back.len(), 13);
    }
}
