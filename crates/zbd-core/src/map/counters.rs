//! The volume counters the map keeps exact on every change (data, zero, raw, damaged blocks,
//! live bytes, savings by unit size and dictionary), persisted with the checkpoint: `stats()`
//! reads them and open needs no scan.

use crate::format::*;

/// Counters kept exact on every map change (persisted as the checkpoint's volume counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapCounters {
    /// Blocks in state `Data` or `Shared` (blocks that name stored bytes).
    pub data_blocks: u64,
    /// Blocks in state `Zero`.
    pub zero_blocks: u64,
    /// Data blocks stored raw.
    pub raw_blocks: u64,
    /// Blocks in state `Corrupt`.
    pub damaged_blocks: u64,
    /// Sum of the stored lengths of data blocks (a block of a unit: its share, `units::share`).
    pub live_bytes: u64,
    /// Data blocks stored in multi-block compression units.
    pub unit_blocks: u64,
    /// Their part of `live_bytes`.
    pub unit_bytes: u64,
    /// Data blocks stored with a trained dictionary.
    pub dict_blocks: u64,
    /// Their part of `live_bytes`.
    pub dict_bytes: u64,
    /// Blocks in units by unit size ([`UNIT_SIZE_CLASSES`]: 2, 3..4, 5..16 blocks) and their
    /// part of `live_bytes`; the classes add up to `unit_blocks` and `unit_bytes`.
    pub by_unit: [(u64, u64); 3],
    /// Data blocks by the dictionary id they name (index 0: none), persisted in the
    /// directory entries (`DictEntry::live_blocks`): a dictionary whose count is 0 and that new
    /// blocks do not use can be retired (state/checkpoint.rs).
    pub by_dict: [u64; DICT_IDS],
    /// Whether `dict_*`, `by_unit` and `by_dict` are known: a checkpoint written by a build
    /// that did not keep them lacks `CKPT_FLAG_SAVINGS_COUNTERS` or `CKPT_FLAG_DICT_COUNTS`
    /// (then a writable open recounts).
    pub savings_known: bool,
}

/// Dictionary ids a map entry can carry (7 bits: 0 none, 1..127).
pub const DICT_IDS: usize = 128;

impl Default for MapCounters {
    fn default() -> MapCounters {
        MapCounters {
            data_blocks: 0,
            zero_blocks: 0,
            raw_blocks: 0,
            damaged_blocks: 0,
            live_bytes: 0,
            unit_blocks: 0,
            unit_bytes: 0,
            dict_blocks: 0,
            dict_bytes: 0,
            by_unit: [(0, 0); 3],
            by_dict: [0; DICT_IDS],
            savings_known: false,
        }
    }
}

/// Unit size classes of [`MapCounters::by_unit`]: most blocks per unit in each.
pub const UNIT_SIZE_CLASSES: [u8; 3] = [2, 4, 16];

fn unit_class(blocks: u8) -> usize {
    UNIT_SIZE_CLASSES
        .iter()
        .position(|&m| blocks <= m)
        .unwrap_or(UNIT_SIZE_CLASSES.len() - 1)
}

impl MapCounters {
    pub(crate) fn add(&mut self, e: &MapEntry, n: u64) {
        match e.state {
            BlockState::Data => {
                let share = n * u64::from(crate::units::share(e));
                self.data_blocks += n;
                self.live_bytes += share;
                if e.codec == crate::codec::id::RAW {
                    self.raw_blocks += n;
                }
                if e.unit_blocks > 1 {
                    self.unit_blocks += n;
                    self.unit_bytes += share;
                    let c = &mut self.by_unit[unit_class(e.unit_blocks)];
                    c.0 += n;
                    c.1 += share;
                }
                if e.dict != 0 {
                    self.dict_blocks += n;
                    self.dict_bytes += share;
                }
                self.by_dict[usize::from(e.dict) % DICT_IDS] += n;
            }
            BlockState::Zero => self.zero_blocks += n,
            BlockState::Corrupt => self.damaged_blocks += n,
            // Its stored bytes count once, at its SBT entry (`add_item`). No shared item names
            // a dictionary (`State::share_block`), so it counts under "none".
            BlockState::Shared => {
                self.data_blocks += n;
                self.by_dict[0] += n;
            }
            BlockState::Unmapped => {}
        }
    }

    /// A shared item's stored bytes, counted once at its SBT entry: its whole length, and its
    /// blocks in the raw and unit counts. Its referring entries count as blocks in use (and
    /// under "no dictionary": a shared item never names one), so the dictionary counts still
    /// add up to the blocks in use.
    pub fn add_item(&mut self, v: &SbtValue) {
        self.item(v, true)
    }

    /// The item `add_item` counted is gone (its count reached 0).
    pub fn sub_item(&mut self, v: &SbtValue) {
        self.item(v, false)
    }

    fn item(&mut self, v: &SbtValue, add: bool) {
        debug_assert_eq!(v.block(0).dict, 0, "a shared item names no dictionary");
        let blocks = u64::from(v.unit_blocks());
        let bytes = u64::from(v.stored_len);
        let f = |a: &mut u64, b: u64| {
            *a = if add { *a + b } else { a.saturating_sub(b) };
        };
        f(&mut self.live_bytes, bytes);
        if v.codec == crate::codec::id::RAW {
            f(&mut self.raw_blocks, blocks);
        }
        if blocks > 1 {
            f(&mut self.unit_blocks, blocks);
            f(&mut self.unit_bytes, bytes);
            let c = &mut self.by_unit[unit_class(blocks as u8)];
            f(&mut c.0, blocks);
            f(&mut c.1, bytes);
        }
    }

    /// `n` blocks leave entry `old` for entry `new`.
    pub(crate) fn replace(&mut self, old: &MapEntry, new: &MapEntry, n: u64) {
        self.sub(old, n);
        self.add(new, n);
    }

    pub(crate) fn sub(&mut self, e: &MapEntry, n: u64) {
        // Saturating: a map page found damaged after open loses what its entries counted.
        match e.state {
            BlockState::Data => {
                let share = n * u64::from(crate::units::share(e));
                self.data_blocks = self.data_blocks.saturating_sub(n);
                self.live_bytes = self.live_bytes.saturating_sub(share);
                if e.codec == crate::codec::id::RAW {
                    self.raw_blocks = self.raw_blocks.saturating_sub(n);
                }
                if e.unit_blocks > 1 {
                    self.unit_blocks = self.unit_blocks.saturating_sub(n);
                    self.unit_bytes = self.unit_bytes.saturating_sub(share);
                    let c = &mut self.by_unit[unit_class(e.unit_blocks)];
                    c.0 = c.0.saturating_sub(n);
                    c.1 = c.1.saturating_sub(share);
                }
                if e.dict != 0 {
                    self.dict_blocks = self.dict_blocks.saturating_sub(n);
                    self.dict_bytes = self.dict_bytes.saturating_sub(share);
                }
                let d = &mut self.by_dict[usize::from(e.dict) % DICT_IDS];
                *d = d.saturating_sub(n);
            }
            BlockState::Zero => self.zero_blocks = self.zero_blocks.saturating_sub(n),
            BlockState::Corrupt => self.damaged_blocks = self.damaged_blocks.saturating_sub(n),
            BlockState::Shared => {
                self.data_blocks = self.data_blocks.saturating_sub(n);
                self.by_dict[0] = self.by_dict[0].saturating_sub(n);
            }
            BlockState::Unmapped => {}
        }
    }

    /// The checkpoint's volume counter array (docs/format.md).
    pub fn to_array(self) -> [u64; VOLUME_COUNTERS] {
        let mut a = [0u64; VOLUME_COUNTERS];
        a[0] = self.data_blocks;
        a[1] = self.zero_blocks;
        a[2] = self.raw_blocks;
        a[3] = self.damaged_blocks;
        a[4] = self.live_bytes;
        a[5] = (self.data_blocks + self.zero_blocks) * BLOCK_BYTES as u64;
        a[6] = self.unit_blocks;
        a[7] = self.unit_bytes;
        a[8] = self.dict_blocks;
        a[9] = self.dict_bytes;
        for (i, c) in self.by_unit.iter().enumerate() {
            a[10 + 2 * i] = c.0;
            a[11 + 2 * i] = c.1;
        }
        a
    }

    /// The counters checkpoint `ck` carries, as far as its flags say they are valid; none
    /// (all zero, savings unknown) when it carries none, and the open recounts.
    pub(super) fn of_checkpoint(ck: &Checkpoint) -> MapCounters {
        if ck.flags & CKPT_FLAG_VOLUME_COUNTERS == 0 {
            return MapCounters::default();
        }
        MapCounters::from_array(
            &ck.volume_counters,
            ck.flags & CKPT_FLAG_SAVINGS_COUNTERS != 0,
            (ck.flags & CKPT_FLAG_DICT_COUNTS != 0).then_some(&ck.dicts[..]),
        )
    }

    /// From a checkpoint's array; `savings`: whether slots 8..16 are valid; `dicts`: the
    /// directory, when its live-block counts are valid too (else all of these are recounted).
    pub(super) fn from_array(
        a: &[u64; VOLUME_COUNTERS],
        savings: bool,
        dicts: Option<&[DictEntry]>,
    ) -> MapCounters {
        let mut c = MapCounters {
            data_blocks: a[0],
            zero_blocks: a[1],
            raw_blocks: a[2],
            damaged_blocks: a[3],
            live_bytes: a[4],
            unit_blocks: a[6],
            unit_bytes: a[7],
            ..MapCounters::default()
        };
        if let (true, Some(dicts)) = (savings, dicts) {
            let mut listed = 0;
            for d in dicts.iter().filter(|d| d.id != 0) {
                c.by_dict[usize::from(d.id) % DICT_IDS] = d.live_blocks;
                listed += d.live_blocks;
            }
            // Data blocks without a dictionary: the rest.
            c.by_dict[0] = a[0].saturating_sub(listed);
            c.dict_blocks = a[8];
            c.dict_bytes = a[9];
            for (i, u) in c.by_unit.iter_mut().enumerate() {
                *u = (a[10 + 2 * i], a[11 + 2 * i]);
            }
            c.savings_known = true;
        }
        c
    }
}
