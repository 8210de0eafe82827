//! Trained dictionaries in the engine (docs/savings.md, "Trained dictionaries"): a sample of the
//! first compressible blocks written is trained into a dictionary (codec/dict.rs), stored in
//! both copies of the dictionary region, listed in the checkpoint's directory, and only then
//! used for new blocks. Each block names its dictionary (map entry and record); a block whose
//! dictionary cannot be loaded reads as an error, never as data.
//!
//! Install order (crash safe at every point):
//! 1. the encoded dictionary is written to both region copies at a place no directory entry
//!    uses, and synced (a crash here leaves an unreferenced region: harmless, reused later);
//! 2. two checkpoints list it, so both checkpoint slots do (recovery that falls back to the
//!    older slot still knows it);
//! 3. only then is it used: every record naming it is newer than both checkpoints.
//!
//! Retirement order (the reverse, crash safe at every point):
//! 1. every map change keeps a live-block count per id (`MapCounters::by_dict`, persisted in
//!    the directory entries); the cleaner recompresses the blocks it moves that name an older
//!    dictionary with the current one, so old ids die;
//! 2. the snapshot of a checkpoint drops from the directory each loaded dictionary whose count
//!    is 0 and that new blocks do not use (`State::retire_dicts`), nor the block being placed
//!    (`State::placing_dict`: a checkpoint written while it opens an extent); from then on no
//!    block may name it (`State::lists_dict`: a writer that compressed with it before
//!    compresses again);
//! 3. only once a later checkpoint has committed, so neither checkpoint slot lists it, are its
//!    id and region bytes free (`State::free_retired`): until then recovery may start from a
//!    checkpoint that lists it, and its bytes stay intact.
//!
//! A crash anywhere leaves every block that recovery maps naming a dictionary that the
//! checkpoint it starts from lists and whose bytes are intact. When the directory or the
//! region is full, training waits until a retirement frees room; the newest dictionary stays
//! in use meanwhile.

use crate::backend::Storage;
use crate::codec::dict::{self, Dictionary};
use crate::codec::Codec;
use crate::error::Result;
use crate::format::{DictEntry, Superblock, BLOCK_BYTES, DICT_ENTRIES};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest dictionary id a map entry can name (7 bits).
pub const DICT_ID_MAX: u16 = 127;
/// Content size of a trained dictionary (capped by the region: two fit in it).
pub const CONTENT_BYTES: usize = 32 * 1024;
/// Most bytes of compressible blocks sampled before training (zstd wants ~100x the dictionary).
pub const SAMPLE_BYTES: usize = 4 << 20;
/// Blocks per window of the drift check (after activation).
const DRIFT_WINDOW_BLOCKS: u64 = 4096;
/// Retrain when a window compresses this much worse (stored bytes up by 1/DRIFT_DIV).
const DRIFT_DIV: u64 = 8;

/// Dictionaries of an open volume: those listed in the directory (by id) and the one new
/// blocks use.
pub struct Dicts {
    /// Whether new blocks may use a dictionary (option and codec).
    pub enabled: bool,
    by_id: RwLock<Vec<Option<Arc<Dictionary>>>>,
    active: RwLock<Option<Arc<Dictionary>>>,
    /// Sampling for the next training (no dictionary yet, or the ratio drifted).
    sampling: AtomicBool,
    samples: Mutex<(Vec<Vec<u8>>, usize)>,
    sample_bytes: usize,
    /// Training or installing now; or stopped (a dictionary did not pay: until reopen; or the
    /// directory or region is full, `no_room`: until a retirement frees room).
    busy: AtomicBool,
    stopped: AtomicBool,
    no_room: AtomicBool,
    /// Drift check: raw and stored bytes of the current window, and the first window's stored
    /// bytes per raw byte (x 2^16; 0 = first window not complete).
    win_raw: AtomicU64,
    win_stored: AtomicU64,
    win_blocks: AtomicU64,
    baseline: AtomicU64,
}

impl Dicts {
    /// No dictionary loaded; `enabled` says whether new blocks may use one.
    pub fn new(enabled: bool, sb: &Superblock) -> Dicts {
        Dicts {
            enabled,
            by_id: RwLock::new(vec![None; usize::from(DICT_ID_MAX) + 1]),
            active: RwLock::new(None),
            sampling: AtomicBool::new(false),
            samples: Mutex::new((Vec::new(), 0)),
            // ~100x the dictionary, within bounds: small volumes train early on less.
            sample_bytes: (content_bytes(sb) * 100).clamp(256 << 10, SAMPLE_BYTES),
            busy: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            no_room: AtomicBool::new(false),
            win_raw: AtomicU64::new(0),
            win_stored: AtomicU64::new(0),
            win_blocks: AtomicU64::new(0),
            baseline: AtomicU64::new(0),
        }
    }

    /// Whether `codec` can be used with dictionaries by the engine.
    pub fn supports(codec: Codec) -> bool {
        Dictionary::supports(codec)
    }

    /// The dictionary with `id`, if loaded.
    pub fn get(&self, id: u8) -> Option<Arc<Dictionary>> {
        self.by_id.read().get(usize::from(id)).cloned().flatten()
    }

    /// The dictionary new blocks use.
    pub fn active(&self) -> Option<Arc<Dictionary>> {
        if !self.enabled {
            return None;
        }
        self.active.read().clone()
    }

    /// Id of the dictionary new blocks use when dictionaries are on (the newest; never retired).
    pub fn current_id(&self) -> Option<u16> {
        self.active.read().as_ref().map(|d| d.id())
    }

    /// Forgets a retired dictionary (no block names it; neither checkpoint slot lists it).
    pub fn remove(&self, id: u8) {
        let mut by_id = self.by_id.write();
        if let Some(d) = by_id.get_mut(usize::from(id)) {
            *d = None;
        }
    }

    /// A retirement freed room: training stopped for lack of it may run again (on the next
    /// drift, or now if no dictionary is in use).
    pub fn resume(&self) {
        if self.no_room.swap(false, Ordering::SeqCst) {
            self.stopped.store(false, Ordering::Relaxed);
            self.start_sampling_if_needed();
        }
    }

    /// Training stopped because `place` found no room (see [`Dicts::resume`]).
    pub fn no_room(&self) {
        self.no_room.store(true, Ordering::SeqCst);
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Makes `d` known (and, when `activate`, the one new blocks use).
    pub fn add(&self, d: Arc<Dictionary>, activate: bool) {
        self.by_id.write()[usize::from(d.id())] = Some(Arc::clone(&d));
        if activate {
            *self.active.write() = Some(d);
            self.win_raw.store(0, Ordering::Relaxed);
            self.win_stored.store(0, Ordering::Relaxed);
            self.win_blocks.store(0, Ordering::Relaxed);
            self.baseline.store(0, Ordering::Relaxed);
        }
    }

    /// Starts sampling for a first dictionary (when enabled and none is active).
    pub fn start_sampling_if_needed(&self) {
        if self.enabled && self.active.read().is_none() && !self.stopped.load(Ordering::Relaxed) {
            self.sampling.store(true, Ordering::Relaxed);
        }
    }

    /// Offers a compressible block (or unit) to the sample; cheap when not sampling.
    pub fn sample(&self, data: &[u8]) {
        if !self.sampling.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.samples.lock();
        if s.1 >= self.sample_bytes {
            return;
        }
        for b in data.chunks(BLOCK_BYTES) {
            s.0.push(b.to_vec());
            s.1 += b.len();
        }
    }

    /// Notes a block stored with the active dictionary: `raw` bytes became `stored` ones. When
    /// a window compresses clearly worse than the first window after training, sampling for a
    /// new dictionary starts again.
    pub fn note(&self, raw: usize, stored: usize) {
        self.win_raw.fetch_add(raw as u64, Ordering::Relaxed);
        self.win_stored.fetch_add(stored as u64, Ordering::Relaxed);
        if self.win_blocks.fetch_add(1, Ordering::Relaxed) + 1 < DRIFT_WINDOW_BLOCKS {
            return;
        }
        let raw = self.win_raw.swap(0, Ordering::Relaxed).max(1);
        let stored = self.win_stored.swap(0, Ordering::Relaxed);
        self.win_blocks.store(0, Ordering::Relaxed);
        let per = (stored << 16) / raw;
        let base = self.baseline.load(Ordering::Relaxed);
        if base == 0 {
            self.baseline.store(per.max(1), Ordering::Relaxed);
        } else if per > base + base / DRIFT_DIV && !self.stopped.load(Ordering::Relaxed) {
            self.sampling.store(true, Ordering::Relaxed);
        }
    }

    /// The sample, when it is complete and nobody trains yet (the caller then trains and calls
    /// [`Dicts::done`]).
    pub fn take_sample(&self) -> Option<Vec<Vec<u8>>> {
        if !self.sampling.load(Ordering::Relaxed) || self.samples.lock().1 < self.sample_bytes {
            return None;
        }
        if self.busy.swap(true, Ordering::SeqCst) {
            return None;
        }
        self.sampling.store(false, Ordering::Relaxed);
        let mut s = self.samples.lock();
        s.1 = 0;
        Some(std::mem::take(&mut s.0))
    }

    /// Takes the training turn without a sample (a forced retrain); `false` when dictionaries
    /// are off, training stopped for good, or someone trains now.
    pub fn begin_forced(&self) -> bool {
        self.enabled
            && !self.stopped.load(Ordering::Relaxed)
            && !self.busy.swap(true, Ordering::SeqCst)
    }

    /// Training finished; `stop` when no further dictionary can be installed.
    pub fn done(&self, stop: bool) {
        if stop {
            self.stopped.store(true, Ordering::Relaxed);
        }
        self.busy.store(false, Ordering::SeqCst);
    }
}

/// Trains dictionary content from `samples` sized for the volume's region.
pub fn train(sb: &Superblock, samples: &[Vec<u8>]) -> Result<Vec<u8>> {
    dict::train(samples, content_bytes(sb))
}

/// Dictionary content size for a volume: [`CONTENT_BYTES`], or less so two fit in its region.
pub fn content_bytes(sb: &Superblock) -> usize {
    let page = BLOCK_BYTES;
    let half = (sb.dict_bytes as usize / 2) / page * page;
    CONTENT_BYTES.min(half.saturating_sub(dict::HEADER_BYTES))
}

/// Where the next dictionary goes: (directory slot, id, region offset). `None` when the
/// directory, the ids or the region are used up (training waits for a retirement). `retiring`:
/// dictionaries dropped from the directory whose id and bytes are not free yet. The id is the
/// next one after the newest listed dictionary's, wrapping within 1..=127, that is neither
/// listed nor retiring (so an id comes back as late as possible); the bytes go in the first
/// 4 KiB-aligned hole that fits.
pub fn place(
    sb: &Superblock,
    dir: &[DictEntry; DICT_ENTRIES],
    retiring: &[DictEntry],
    len: usize,
) -> Option<(usize, u16, u32)> {
    let slot = dir.iter().position(|d| d.id == 0)?;
    let used: Vec<&DictEntry> = dir
        .iter()
        .chain(retiring.iter())
        .filter(|d| d.id != 0)
        .collect();
    let newest = dir
        .iter()
        .filter(|d| d.id != 0)
        .max_by_key(|d| (d.created_seq, d.id))
        .map_or(0, |d| d.id);
    let id = (1..=DICT_ID_MAX)
        .map(|k| (newest + k - 1) % DICT_ID_MAX + 1)
        .find(|&id| used.iter().all(|d| d.id != id))?;
    let mut taken: Vec<(u64, u64)> = used
        .iter()
        .map(|d| {
            let at = u64::from(d.region_offset);
            (at, at + u64::from(d.len))
        })
        .collect();
    taken.sort_unstable();
    let page = BLOCK_BYTES as u64;
    let mut at = 0u64;
    for (lo, hi) in taken {
        if at + len as u64 <= lo {
            break;
        }
        at = at.max(hi.div_ceil(page) * page);
    }
    (at + len as u64 <= u64::from(sb.dict_bytes)).then_some((slot, id, at as u32))
}

/// Writes `encoded` at `region_offset` of both region copies (padded to whole pages) and syncs.
pub fn write_region(
    storage: &dyn Storage,
    sb: &Superblock,
    region_offset: u32,
    encoded: &[u8],
) -> Result<()> {
    let mut padded = encoded.to_vec();
    padded.resize(encoded.len().div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
    for copy in 0..2 {
        storage.write_at(sb.dict_offset[copy] + u64::from(region_offset), &padded)?;
    }
    storage.sync()
}

/// What loading the directory found.
pub struct Loaded {
    /// Dictionaries read intact (from copy 0, else copy 1).
    pub dicts: Vec<Arc<Dictionary>>,
    /// Dictionaries lost (both copies damaged): blocks using them read as errors.
    pub problems: Vec<String>,
    /// Damaged copies whose other copy is intact (rewritten by a writable open).
    pub repaired: Vec<String>,
    /// (copy, region offset, good bytes) to rewrite.
    pub rewrite: Vec<(usize, u32, Vec<u8>)>,
}

/// Reads every dictionary the directory lists; each copy is checked on its own.
pub fn load(storage: &dyn Storage, sb: &Superblock, dir: &[DictEntry; DICT_ENTRIES]) -> Loaded {
    let mut out = Loaded {
        dicts: Vec::new(),
        problems: Vec::new(),
        repaired: Vec::new(),
        rewrite: Vec::new(),
    };
    for e in dir.iter().filter(|e| e.id != 0) {
        let read = |copy: usize| -> Option<(Vec<u8>, Dictionary)> {
            let len = e.len as usize;
            if u64::from(e.region_offset) + len as u64 > u64::from(sb.dict_bytes)
                || e.id > DICT_ID_MAX
            {
                return None;
            }
            let mut b = vec![0u8; len];
            storage
                .read_at(sb.dict_offset[copy] + u64::from(e.region_offset), &mut b)
                .ok()?;
            if crc32c::crc32c(&b) != e.crc {
                return None;
            }
            let d = Dictionary::decode(&b).ok()?;
            (d.id() == e.id).then_some((b, d))
        };
        let (a, b) = (read(0), read(1));
        let (good, bad) = match (a, b) {
            (Some((_, d)), Some(_)) => (Some((d, Vec::new())), None),
            (Some((bytes, d)), None) => (Some((d, bytes)), Some(1)),
            (None, Some((bytes, d))) => (Some((d, bytes)), Some(0)),
            (None, None) => (None, None),
        };
        match (good, bad) {
            (Some((d, bytes)), Some(bad)) => {
                out.repaired.push(format!(
                    "dictionary {} copy {bad} is damaged (copy {} is intact)",
                    e.id,
                    1 - bad
                ));
                out.rewrite.push((bad, e.region_offset, bytes));
                out.dicts.push(Arc::new(d));
            }
            (Some((d, _)), None) => out.dicts.push(Arc::new(d)),
            (None, _) => out.problems.push(format!(
                "dictionary {}: both copies are damaged; the blocks that use it cannot be read",
                e.id
            )),
        }
    }
    out
}

/// Rewrites damaged copies from their intact twin (writable open), then syncs.
pub fn repair(
    storage: &dyn Storage,
    sb: &Superblock,
    rewrite: &[(usize, u32, Vec<u8>)],
) -> Result<()> {
    if rewrite.is_empty() {
        return Ok(());
    }
    for (copy, at, bytes) in rewrite {
        storage.write_at(sb.dict_offset[*copy] + u64::from(*at), bytes)?;
    }
    storage.sync()
}
