//! Where metadata pages lie and the sizes that follow from a volume's shape (docs/format.md,
//! "Bit 10: metadata pages": "Ids and where their pairs lie", "Slot size"; docs/design.md,
//! "Pair-state list": "Room", "Small lists"). Pure arithmetic over the superblock's geometry.

use crate::error::{Error, Result};
use crate::format::{
    align_up, Extension, PairSlot, Superblock, CHECKPOINT_V2_HEADER_BYTES, DEVICE_ROWS_PER_PAGE,
    DIRECTORY_ENTRIES_PER_PAGE, EXTENSION_HEADER_BYTES, LIST_IDS_PER_PAGE, MAP_PAGE_BYTES,
    PAGE_BODY_BYTES, PAGE_ID_ALL_UNMAPPED, PAIR_LIST_ENTRY_BYTES, PAIR_STATE_IDS_PER_PAGE,
    QUEUE_ENTRY_BYTES, RELEASE_ENTRIES_PER_PAGE,
};

/// Bytes of one pair (two 4 KiB slots) in a metadata extent.
const PAIR_BYTES: u64 = 2 * MAP_PAGE_BYTES as u64;
/// Pages a window counts at most (dirtied, allocated or freed), the `4,096` of `M`.
pub const WINDOW_PAGES_MAX: u32 = 4096;
/// Release-queue entries at most.
pub const RELEASE_ENTRIES_MAX: u32 = 4096;
/// List pages the fixed kinds take (device table, release queue, summaries, hooks).
const FIXED_LIST_PAGES: u32 = 4;
/// Bounds of the pair-state list capacity `C` on a volume created with bit 10. The floor sets
/// how many pages a checkpoint may gather: a window may count `(C - 256) / 2` and one is asked
/// for at half that, while the list still holds the last one's flips, so at 4,096 a random
/// writer's checkpoints closed every ~1,000 pages and most pages were written once per write.
/// At 16,384 (128 KiB of list per slot copy) the pool's own bound (2,048 dirty pages) asks
/// first: with the writers' wait of `VolumeMap::checkpoint_pressed`, such a writer gained ~14 %
/// (docs/benchmarks.md, "Checkpoint size"). Still below `4M`: small.
const LIST_CAPACITY_MIN: u32 = 16_384;
pub(crate) const LIST_CAPACITY_MAX: u32 = 65_536;

/// Where a page id's pair of slots lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairHome {
    /// In the fixed map region every v2 and v3 volume has (v2 map page `page` is id `page`).
    Region0 {
        /// The map page index.
        page: u32,
    },
    /// Pair `pair` of metadata extent `extent` (copy 0 there, copy 1 in `extent + H`).
    Extent {
        /// The extent holding copy 0.
        extent: u32,
        /// Index of the pair in the extent.
        pair: u32,
    },
}

/// The id space of a bit-10 volume: `pairs0` ids in region 0, then `P` ids per metadata extent
/// `e < H`, whose copy 1 is extent `e + H`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaGeometry {
    /// Ids below this lie in region 0: the map pages the superblock's map region has room for.
    pub pairs0: u32,
    /// Pairs per extent (`P`: extent bytes / 8 KiB).
    pub pairs_per_extent: u32,
    /// Extents that may hold copy 0 of metadata (`H`); fixed when bit 10 is set.
    pub h: u32,
}

impl MetaGeometry {
    /// The geometry bit 10 fixes for a volume of `extent_count` extents (`H = min(N / 2,
    /// (2^32 - 2 - pairs0) / P)`), so that every id stays below the two summary values.
    pub fn new(pairs0: u32, extent_bytes: u32, extent_count: u32) -> Result<MetaGeometry> {
        let p = u64::from(extent_bytes) / PAIR_BYTES;
        if p == 0 {
            return Err(Error::Invalid(format!(
                "metadata pages need extents of at least {PAIR_BYTES} bytes"
            )));
        }
        let room = u64::from(PAGE_ID_ALL_UNMAPPED).saturating_sub(u64::from(pairs0)) / p;
        let h = (u64::from(extent_count) / 2).min(room) as u32;
        Ok(MetaGeometry {
            pairs0,
            pairs_per_extent: p as u32,
            h,
        })
    }

    /// The geometry bit 10 fixes when it is set on the volume `sb` describes (`zbd create` or
    /// `zbd enable`): region 0 is its map room. Only then: `H` is stored in the checkpoint's
    /// extension header and a later `zbd grow --capacity` must not move copy 1 of any pair, so
    /// an open reads it back with [`from_extension`](Self::from_extension).
    pub fn at_enable(sb: &Superblock) -> Result<MetaGeometry> {
        MetaGeometry::new(
            sb.map_pages.max(sb.map_pages_room),
            sb.extent_bytes,
            sb.extent_count,
        )
    }

    /// The geometry a bit-10 checkpoint recorded, checked against the volume: its pairs must lie
    /// inside the data area and its ids below the summaries.
    pub fn from_extension(ext: &Extension, sb: &Superblock) -> Result<MetaGeometry> {
        let g = MetaGeometry {
            pairs0: ext.pairs0,
            pairs_per_extent: (u64::from(sb.extent_bytes) / PAIR_BYTES) as u32,
            h: ext.h,
        };
        let bad = |what: &str| Error::CorruptMetadata(format!("checkpoint extension: {what}"));
        if g.pairs_per_extent == 0 || g.h == 0 || u64::from(g.h) * 2 > u64::from(sb.extent_count) {
            return Err(bad("metadata extent pairs missing or past the data area"));
        }
        // Region 0 is the map room `at_enable` took, which no later grow changes.
        if g.pairs0 != sb.map_pages.max(sb.map_pages_room)
            || g.ids_max() > u64::from(PAGE_ID_ALL_UNMAPPED)
        {
            return Err(bad("page ids outside their room"));
        }
        Ok(g)
    }

    /// One past the highest id (`pairs0 + H x P`); below `0xFFFF_FFFE` by construction.
    pub fn ids_max(&self) -> u64 {
        u64::from(self.pairs0) + u64::from(self.h) * u64::from(self.pairs_per_extent)
    }

    /// Where id `id` lies; `None` past the id space.
    pub fn home(&self, id: u32) -> Option<PairHome> {
        if id < self.pairs0 {
            return Some(PairHome::Region0 { page: id });
        }
        if u64::from(id) >= self.ids_max() {
            return None;
        }
        let i = id - self.pairs0;
        Some(PairHome::Extent {
            extent: i / self.pairs_per_extent,
            pair: i % self.pairs_per_extent,
        })
    }

    /// The id of pair `pair` of metadata extent `extent`; `None` outside `[0, H) x [0, P)`.
    pub fn id_in_extent(&self, extent: u32, pair: u32) -> Option<u32> {
        (extent < self.h && pair < self.pairs_per_extent)
            .then(|| self.pairs0 + extent * self.pairs_per_extent + pair)
    }

    /// The extent holding copy 1 of a metadata extent pair whose copy 0 is `extent`.
    pub fn partner(&self, extent: u32) -> Option<u32> {
        (extent < self.h).then(|| extent + self.h)
    }

    /// Byte offset of slot `slot` of copy `copy` (0 or 1) of id `id`; `None` past the id space.
    pub fn slot_offset(&self, sb: &Superblock, id: u32, slot: PairSlot, copy: u8) -> Option<u64> {
        let s = match slot {
            PairSlot::A => 0u8,
            PairSlot::B => 1,
        };
        match self.home(id)? {
            PairHome::Region0 { page } => Some(sb.map_page_offset(page, s, copy)),
            PairHome::Extent { extent, pair } => {
                let e = if copy == 0 { extent } else { extent + self.h };
                let within = (2 * u64::from(pair) + u64::from(s)) * MAP_PAGE_BYTES as u64;
                Some(sb.extent_offset(e) + within)
            }
        }
    }

    /// Metadata extents (copy 0) a volume created with bit 10 carves for its default device
    /// of `blocks` blocks before the carver (step 1b.5) takes pairs as they are needed: room
    /// for every interior page of its tree, the pair-state pages of region 0's ids and of the
    /// carved ids, the directory, the device table of one device and its list page, and the
    /// pages of four map changes, twice over (a freed id waits an interval before it is taken
    /// again), and the carver's high watermark. At least one, at most `H`.
    pub fn stock_extents(&self, blocks: u64) -> u32 {
        let depth = super::tree::depth_for(blocks);
        let interior: u64 = (1..depth)
            .map(|level| blocks.div_ceil(super::tree::blocks_under(level)))
            .sum();
        let per_state_page = PAIR_STATE_IDS_PER_PAGE as u64;
        // And room for the pages of a few map changes at once (two root-to-leaf paths each):
        // the engine checkpoints when fewer ids than one change needs are left.
        let pages = interior
            + u64::from(self.pairs0).div_ceil(per_state_page)
            + u64::from(self.directory_pages())
            + 2
            + 8 * u64::from(super::tree::DEPTH_MAX);
        // And the carver's high watermark on top, so that an open does not carve at once
        // (nor take that room from the data a default capacity was sized for).
        let (_, high) = super::pairs::PairAllocator::new(*self).watermarks();
        // The carved ids' own pair-state pages: one per 16,320 of them, and one more where
        // they straddle a page boundary.
        let ids = 2 * pages + high as u64;
        let need = ids + ids.div_ceil(per_state_page) + 1;
        (need.div_ceil(u64::from(self.pairs_per_extent)) as u32).clamp(1, self.h)
    }

    /// Pair-state pages the id space needs.
    pub fn pair_state_pages(&self) -> u64 {
        self.ids_max().div_ceil(PAIR_STATE_IDS_PER_PAGE as u64)
    }

    /// Pair-state directory pages the id space needs (`S_max`).
    pub fn directory_pages(&self) -> u32 {
        self.pair_state_pages()
            .div_ceil(DIRECTORY_ENTRIES_PER_PAGE as u64) as u32
    }
}

/// How many entries the pair-state list may hold and what admission derives from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListBounds {
    /// Capacity `C`: entries a checkpoint slot has room for.
    pub capacity: u32,
    /// `F`: pages of the fixed kinds a checkpoint may write.
    pub fixed_pages: u32,
    /// `M = 4,096 + F`: entries one window and the checkpoint that closes it add at most.
    pub window: u32,
}

impl ListBounds {
    /// The bounds for a list of capacity `capacity` on a volume with `extent_table_pages`
    /// extent-table pages and room for `devices` device rows.
    pub fn new(capacity: u32, extent_table_pages: u32, devices: u32) -> ListBounds {
        let fixed_pages = devices.div_ceil(DEVICE_ROWS_PER_PAGE as u32)
            + RELEASE_ENTRIES_MAX.div_ceil(RELEASE_ENTRIES_PER_PAGE as u32)
            + FIXED_LIST_PAGES
            + summary_pages(extent_table_pages);
        ListBounds {
            capacity,
            fixed_pages,
            window: WINDOW_PAGES_MAX + fixed_pages,
        }
    }

    /// `C` of a volume created with bit 10: `min(65,536, max(16,384, N / 16))`.
    pub fn created_capacity(extent_count: u32) -> u32 {
        (extent_count / 16).clamp(LIST_CAPACITY_MIN, LIST_CAPACITY_MAX)
    }

    /// A small list (`C < 4M`): its pair-state pages stay resident and phase 1 folds it whole,
    /// so its checkpoints carry no entries and admission does not wait on it.
    pub fn small(&self) -> bool {
        u64::from(self.capacity) < 4 * u64::from(self.window)
    }

    /// Steps wait while the live list holds more than this (`C - 2M`); `None` on small lists.
    pub fn admit_max(&self) -> Option<u32> {
        (!self.small()).then(|| self.capacity - 2 * self.window)
    }

    /// The folder runs from this many entries (`C / 4`); `None` on small lists (it never runs).
    pub fn fold_from(&self) -> Option<u32> {
        (!self.small()).then_some(self.capacity / 4)
    }
}

/// Extent-table summary pages: one 16-byte entry per extent-table page, 255 a page.
fn summary_pages(extent_table_pages: u32) -> u32 {
    extent_table_pages.div_ceil((PAGE_BODY_BYTES / 16) as u32)
}

/// Bytes of a checkpoint slot of a volume created with bit 10 (format.md, "Slot size"): v2's
/// header, queue and extent-table slots, then the extension header and its three lists at
/// their largest. Depends on the data area and the queue, never on pages or devices.
pub fn bit10_slot_bytes(
    geometry: &MetaGeometry,
    queue_len: u32,
    extent_table_pages: u32,
    list_capacity: u32,
) -> u64 {
    let u_max = summary_pages(extent_table_pages).div_ceil(LIST_IDS_PER_PAGE as u32);
    let fixed = CHECKPOINT_V2_HEADER_BYTES as u64
        + QUEUE_ENTRY_BYTES as u64 * u64::from(queue_len)
        + u64::from(extent_table_pages).div_ceil(4);
    let lists = EXTENSION_HEADER_BYTES as u64
        + 8 * u64::from(geometry.directory_pages())
        + 4 * u64::from(u_max)
        + PAIR_LIST_ENTRY_BYTES as u64 * u64::from(list_capacity);
    align_up(align_up(fixed, 8) + lists, MAP_PAGE_BYTES as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIB: u64 = 1 << 40;

    /// 16 TiB logical at 128 KiB extents as `zbd create` lays it out: the design's worked
    /// example (~161 M extents: the data area holds the logical size incompressible, plus room).
    fn sixteen_tib() -> (MetaGeometry, u32, u32) {
        let mut o = crate::layout::CreateOptions::new(16 * TIB);
        o.extent_bytes = 128 * 1024;
        let sb = crate::layout::plan(&o).expect("layout");
        let g = MetaGeometry::at_enable(&sb).expect("geometry");
        (g, sb.extent_count, sb.extent_table_pages)
    }

    #[test]
    fn the_design_numbers_at_16_tib_follow_from_the_rules() {
        let (g, extents, table_pages) = sixteen_tib();
        assert_eq!(g.pairs0, 16_843_010);
        assert_eq!(g.pairs_per_extent, 16);
        assert_eq!(
            g.h,
            extents / 2,
            "H is half the extents: the id space has room"
        );
        // "ids_max ~ 1.31 G", "S_max ... 157 at 16 TiB"
        assert_eq!(g.ids_max() / 10_000_000, 130);
        assert!(g.ids_max() < u64::from(PAGE_ID_ALL_UNMAPPED));
        assert_eq!(g.directory_pages(), 157);
        // "C ... 65,536 at 16 TiB", "F = 33 + 33 + 4 + 1,239 = 1,309", "M ... 5,405",
        // "steps wait above 54,726 entries and the folder starts at 16,384".
        let c = ListBounds::created_capacity(extents);
        let b = ListBounds::new(c, table_pages, 1000);
        assert_eq!(extents, 161_061_274);
        assert_eq!((c, b.fixed_pages, b.window), (65_536, 1_309, 5_405));
        assert!(!b.small());
        assert_eq!((b.admit_max(), b.fold_from()), (Some(54_726), Some(16_384)));
    }

    #[test]
    fn small_lists_fold_whole_and_never_make_admission_wait() {
        // A 10 GiB volume created at 128 KiB extents gets the floor, 16,384 (N / 16 = 5,120),
        // below 4M: a small list.
        let extents = 81_920u32;
        let table_pages = extents.div_ceil(crate::format::EXTENT_TABLE_ENTRIES_PER_PAGE as u32);
        let c = ListBounds::created_capacity(extents);
        let b = ListBounds::new(c, table_pages, 1);
        assert_eq!((c, b.fixed_pages, b.window), (16_384, 39, 4_135));
        assert!(b.small());
        assert_eq!((b.admit_max(), b.fold_from()), (None, None));
        // A list below 2M (a volume enabled in place: C ~ map pages / 16) is small too, so
        // `C - 2M` < 0 never makes admission wait (R5-B3).
        let b = ListBounds::new(5_120, table_pages, 1);
        assert!(b.small() && 5_120 < 2 * b.window);
        assert_eq!((b.admit_max(), b.fold_from()), (None, None));
        // The threshold "fewer than ~266 K extents": C = N / 16 reaches 4M there.
        let large = (258_000..300_000u32)
            .step_by(100)
            .find(|&n| {
                let b = ListBounds::new(
                    ListBounds::created_capacity(n),
                    n.div_ceil(crate::format::EXTENT_TABLE_ENTRIES_PER_PAGE as u32),
                    1,
                );
                !b.small()
            })
            .expect("a large list below 300 K extents");
        assert!((260_000..270_000).contains(&large), "{large}");
    }

    #[test]
    fn every_id_has_one_home_and_homes_do_not_overlap() {
        let g = MetaGeometry::new(10, 32 * 1024, 9).expect("geometry");
        assert_eq!((g.pairs_per_extent, g.h, g.ids_max()), (4, 4, 26));
        assert_eq!(g.home(9), Some(PairHome::Region0 { page: 9 }));
        assert_eq!(g.home(10), Some(PairHome::Extent { extent: 0, pair: 0 }));
        assert_eq!(g.home(25), Some(PairHome::Extent { extent: 3, pair: 3 }));
        assert_eq!(g.home(26), None);
        assert_eq!(g.partner(3), Some(7));
        assert_eq!(g.partner(4), None);
        for id in 10..26 {
            let Some(PairHome::Extent { extent, pair }) = g.home(id) else {
                panic!("id {id} has no extent home");
            };
            assert_eq!(g.id_in_extent(extent, pair), Some(id));
        }
        assert_eq!(g.id_in_extent(4, 0), None);
        assert_eq!(g.id_in_extent(0, 4), None);

        // Slot offsets: distinct for every (id, slot, copy), inside the right extent, on a
        // volume laid out as `zbd create` lays it out (10 map pages, 9 extents of 32 KiB).
        let mut opts = crate::layout::CreateOptions::new(10 * 255 * 4096);
        opts.extent_bytes = 32 * 1024;
        opts.capacity_bytes = Some(9 * 32 * 1024);
        let sb = crate::layout::plan(&opts).expect("layout");
        assert_eq!(
            (sb.map_pages.max(sb.map_pages_room), sb.extent_count),
            (10, 9)
        );
        assert_eq!(MetaGeometry::at_enable(&sb).expect("geometry"), g);
        let mut seen = std::collections::HashSet::new();
        for id in 0..26 {
            for slot in [PairSlot::A, PairSlot::B] {
                for copy in [0u8, 1] {
                    let o = g.slot_offset(&sb, id, slot, copy).expect("in the id space");
                    assert!(seen.insert(o), "id {id} {slot:?} copy {copy} overlaps");
                    if let Some(PairHome::Extent { extent, .. }) = g.home(id) {
                        let e = if copy == 0 { extent } else { extent + g.h };
                        let start = sb.extent_offset(e);
                        assert!(o >= start && o + 4096 <= start + 32 * 1024);
                    }
                }
            }
        }
        assert_eq!(g.slot_offset(&sb, 26, PairSlot::A, 0), None);
    }

    #[test]
    fn a_grown_data_area_keeps_the_geometry_its_extension_recorded() {
        let mut opts = crate::layout::CreateOptions::new(64 << 20);
        opts.extent_bytes = 32 * 1024;
        opts.max_capacity_bytes = Some(1 << 30);
        let mut sb = crate::layout::plan(&opts).expect("layout");
        let g = MetaGeometry::at_enable(&sb).expect("geometry");
        let ext = Extension {
            h: g.h,
            pairs0: g.pairs0,
            ..Extension::default()
        };
        sb.extent_count *= 2;
        let reopened = MetaGeometry::from_extension(&ext, &sb).expect("recorded geometry");
        assert_eq!(
            reopened, g,
            "copy 1 of every pair stays where it was written"
        );
        assert_ne!(MetaGeometry::at_enable(&sb).expect("geometry").h, g.h);
        let past_region0 = sb.map_pages.max(sb.map_pages_room) + 1;
        let damaged = [
            (sb.extent_count / 2 + 1, g.pairs0),
            (0, g.pairs0),
            (g.h, past_region0),
            (g.h, g.pairs0 - 1),
        ];
        for (h, pairs0) in damaged {
            let damaged = Extension { h, pairs0, ..ext };
            assert!(
                MetaGeometry::from_extension(&damaged, &sb).is_err(),
                "{h} {pairs0}"
            );
        }
    }

    #[test]
    fn the_id_space_stays_below_the_summaries_however_large_the_volume() {
        // 1 MiB extents, the most extents a u32 counts: H is cut by the id space, not N / 2.
        let g = MetaGeometry::new(1 << 30, 1 << 20, u32::MAX).expect("geometry");
        assert!(g.h < u32::MAX / 2);

        assert!(g.ids_max() <= u64::from(PAGE_ID_ALL_UNMAPPED));
        assert!(MetaGeometry::new(0, 4096, 100).is_err());
    }

    #[test]
    fn a_bit10_slot_grows_with_the_data_area_not_with_pages() {
        let (g, extents, table_pages) = sixteen_tib();
        let c = ListBounds::created_capacity(extents);
        let slot = bit10_slot_bytes(&g, 256, table_pages, c);
        assert_eq!(slot % 4096, 0);
        // 896 + 4 KiB of queue + 77 KiB of table slots + 256 + 1.2 KiB of directory + 512 KiB
        // of list: the list is most of it, and none of it depends on pages or devices.
        assert!((550 * 1024..650 * 1024).contains(&slot), "{slot}");
        let small = MetaGeometry::new(257, 128 * 1024, 8192).expect("geometry");
        assert!(bit10_slot_bytes(&small, 64, 17, 4096) <= 40 * 1024);
    }

    /// The slot holds the extension at its largest: every directory page, every summary list
    /// page and a full pair-state list, after v2's header, queue and table slots.
    #[test]
    fn a_full_extension_fits_the_bit10_slot() {
        use crate::format::{Extension, ExtensionBody, PairListEntry, PairSlot, PairState};
        let (g, extents, table_pages) = sixteen_tib();
        let c = ListBounds::created_capacity(extents);
        let queue = 256u32;
        let u_max = summary_pages(table_pages).div_ceil(LIST_IDS_PER_PAGE as u32);
        let body = ExtensionBody {
            header: Extension {
                list_capacity: c,
                device_rows: 1,
                next_device: 2,
                ..Extension::default()
            },
            directory: vec![(7, PairSlot::A); g.directory_pages() as usize],
            summary_lists: vec![9; u_max as usize],
            pair_list: (0..c)
                .map(|id| PairListEntry {
                    id,
                    state: PairState::SlotB,
                })
                .collect(),
        };
        let bytes = body.encode().expect("encode").len() as u64;
        let before = align_up(
            CHECKPOINT_V2_HEADER_BYTES as u64
                + QUEUE_ENTRY_BYTES as u64 * u64::from(queue)
                + u64::from(table_pages).div_ceil(4),
            8,
        );
        assert!(before + bytes <= bit10_slot_bytes(&g, queue, table_pages, c));
    }
}
