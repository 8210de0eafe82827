//! A metadata page as the pool holds it, whatever its kind: its address parts (kind, level,
//! position: the CRC seed every reader knows from the walk or directory that reached it) and
//! its 4 KiB body as stored, read and changed in place. One frame type for every kind, so the
//! pool counts every frame at the page's size (a decoded leaf would take a quarter more).

use crate::error::{Error, Result};
use crate::format::{
    decode_device_table, decode_directory, decode_list, decode_map_interior, decode_map_leaf,
    decode_pct, decode_sbt_interior, decode_sbt_leaf, FrameStamp, PageAddress, PageKind, PairSlot,
    PAGE_BODY_BYTES,
};

/// A page in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub kind: PageKind,
    /// 0 for a leaf and for kinds without levels.
    pub level: u8,
    /// Index among the pages of its kind and level (a map leaf's is its v2 map page index, a
    /// pair-state page's the index of the 16,320 ids it covers).
    pub position: u64,
    /// Map pages: the device that made the page and its epoch then (frame header; 0 for
    /// other kinds).
    pub creator: u32,
    pub epoch: u32,
    /// The slot that holds its pair's durable copy, as the store knew it when it read the page
    /// (and moved at each commit that wrote it), so a checkpoint picks the other slot without
    /// a pair-state lookup; `None` for a page created since its pair last held one.
    pub slot: Option<PairSlot>,
    pub body: Box<[u8; PAGE_BODY_BYTES]>,
}

impl Page {
    /// A page of `kind` made by no device (every kind but map pages).
    pub fn new(kind: PageKind, level: u8, position: u64, body: Box<[u8; PAGE_BODY_BYTES]>) -> Page {
        Page {
            kind,
            level,
            position,
            creator: 0,
            epoch: 0,
            slot: None,
            body,
        }
    }

    /// The stamp a checkpoint of sequence `seq` writes in its frame header.
    pub fn stamp(&self, seq: u64) -> FrameStamp {
        match self.kind {
            PageKind::MapLeaf | PageKind::MapInterior => {
                FrameStamp::map(self.creator, self.epoch, seq)
            }
            _ => FrameStamp::other(seq),
        }
    }

    /// Where the page sits, as its CRC seed names it.
    pub fn address(&self, id: u32) -> PageAddress {
        PageAddress {
            id,
            kind: self.kind,
            level: self.level,
            position: self.position,
        }
    }

    /// A page read for `at` (whose frame was already checked, its stamp `stamp`): its body
    /// must decode as that kind. Every 2-bit value is a pair state, so a pair-state body has
    /// nothing more to check.
    pub fn decode(at: &PageAddress, stamp: &FrameStamp, body: &[u8]) -> Result<Page> {
        let b: &[u8; PAGE_BODY_BYTES] = body.try_into().map_err(|_| {
            Error::CorruptMetadata(format!("page {} has a body of {} bytes", at.id, body.len()))
        })?;
        match at.kind {
            PageKind::MapLeaf => drop(decode_map_leaf(b)?),
            PageKind::MapInterior => drop(decode_map_interior(b)?),
            PageKind::PairState => {}
            PageKind::PairStateDirectory => drop(decode_directory(b)?),
            PageKind::SbtLeaf => drop(decode_sbt_leaf(b)?),
            PageKind::SbtInterior => drop(decode_sbt_interior(b)?),
            PageKind::PctLeaf | PageKind::PctInterior => drop(decode_pct(b)?),
            PageKind::DeviceTable => drop(decode_device_table(b)?),
            PageKind::List => drop(decode_list(b)?),
            other => {
                return Err(Error::CorruptMetadata(format!(
                    "page {} is a {other:?} page, which this build does not read yet",
                    at.id
                )))
            }
        }
        let mut page = Page::new(at.kind, at.level, at.position, Box::new(*b));
        if matches!(at.kind, PageKind::MapLeaf | PageKind::MapInterior) {
            (page.creator, page.epoch) = (stamp.creator, stamp.epoch);
        }
        Ok(page)
    }
}
