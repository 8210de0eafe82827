//! A bounded cache of stored (compressed) block bytes recently read from extents, keyed by their
//! place (extent, offset). An extent is append-only between two reuses, so bytes at a place never
//! change until the extent is reused; reuse forgets them (`forget`, called with the reuse gate
//! held exclusively, so no reader that looked the old extent up can insert after it). Cached
//! bytes are verified (CRC) and decoded on every read like bytes from the device, so a cache hit
//! never skips integrity checks.
//!
//! Decoded compression units are cached too (`get_unit`/`put_unit`, under their stored place
//! with a marker bit: offsets are below 1 MiB): a 4 KiB read of a unit whose other blocks were
//! read recently then skips the unit's decode. They were decoded from bytes that passed their
//! CRC, and reuse forgets them with the stored bytes; check and scrub bypass the cache.
//!
//! Eviction is by two generations (a cheap approximation of LRU): entries go into `hot`; when
//! `hot` holds half the budget it becomes `cold` (dropping the old `cold`); a hit in `cold` moves
//! the entry back to `hot`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

type Key = (u32, u32);

/// Marks the key of a decoded unit (stored offsets are below 1 MiB).
const UNIT_KEY: u32 = 1 << 31;

#[derive(Default)]
struct Gens {
    hot: HashMap<Key, Arc<[u8]>>,
    cold: HashMap<Key, Arc<[u8]>>,
    hot_bytes: usize,
    cold_bytes: usize,
}

/// What the read cache did (`zbd stat`, the metrics).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ReadCacheStats {
    /// Stored bytes found in the cache.
    pub hits: u64,
    /// Stored bytes looked up and not found (then read from the volume).
    pub misses: u64,
    /// Decoded units found (their decode skipped).
    pub unit_hits: u64,
    /// Decoded units looked up and not found.
    pub unit_misses: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Budget in bytes (0: the cache is off).
    pub budget_bytes: u64,
}

/// See the module doc.
pub struct ReadCache {
    gens: Mutex<Gens>,
    /// Bytes per generation; 0 disables the cache.
    half: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    unit_hits: AtomicU64,
    unit_misses: AtomicU64,
}

impl ReadCache {
    /// A cache holding at most about `budget` bytes of block data.
    pub fn new(budget: usize) -> Self {
        ReadCache {
            gens: Mutex::new(Gens::default()),
            half: budget / 2,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            unit_hits: AtomicU64::new(0),
            unit_misses: AtomicU64::new(0),
        }
    }

    /// Hits, misses and size so far.
    pub fn stats(&self) -> ReadCacheStats {
        let g = self.gens.lock();
        ReadCacheStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            unit_hits: self.unit_hits.load(Relaxed),
            unit_misses: self.unit_misses.load(Relaxed),
            bytes: (g.hot_bytes + g.cold_bytes) as u64,
            budget_bytes: 2 * self.half as u64,
        }
    }

    /// The bytes stored at (extent, offset), if cached with length `len`.
    pub fn get(&self, extent: u32, offset: u32, len: usize) -> Option<Arc<[u8]>> {
        let found = self.lookup((extent, offset), len);
        count(found.is_some(), &self.hits, &self.misses, self.half);
        found
    }

    fn lookup(&self, key: Key, len: usize) -> Option<Arc<[u8]>> {
        if self.half == 0 {
            return None;
        }
        let mut g = self.gens.lock();
        if let Some(b) = g.hot.get(&key) {
            return (b.len() == len).then(|| Arc::clone(b));
        }
        let b = g.cold.remove(&key)?;
        g.cold_bytes -= b.len();
        if b.len() != len {
            return None;
        }
        Self::insert(&mut g, self.half, key, Arc::clone(&b));
        Some(b)
    }

    /// The decoded unit stored at (extent, offset), if cached with `len` bytes.
    pub fn get_unit(&self, extent: u32, offset: u32, len: usize) -> Option<Arc<[u8]>> {
        let found = self.lookup((extent, offset | UNIT_KEY), len);
        count(
            found.is_some(),
            &self.unit_hits,
            &self.unit_misses,
            self.half,
        );
        found
    }

    /// Remembers the decoded form of the unit stored at (extent, offset).
    pub fn put_unit(&self, extent: u32, offset: u32, decoded: Arc<[u8]>) {
        if self.half == 0 {
            return;
        }
        let mut g = self.gens.lock();
        Self::insert(&mut g, self.half, (extent, offset | UNIT_KEY), decoded);
    }

    /// Remembers the bytes stored at (extent, offset).
    pub fn put(&self, extent: u32, offset: u32, bytes: &[u8]) {
        if self.half == 0 {
            return;
        }
        let mut g = self.gens.lock();
        Self::insert(&mut g, self.half, (extent, offset), Arc::from(bytes));
    }

    fn insert(g: &mut Gens, half: usize, key: Key, bytes: Arc<[u8]>) {
        let n = bytes.len();
        if let Some(old) = g.hot.insert(key, bytes) {
            g.hot_bytes -= old.len();
        }
        g.hot_bytes += n;
        if g.hot_bytes >= half {
            g.cold = std::mem::take(&mut g.hot);
            g.cold_bytes = std::mem::take(&mut g.hot_bytes);
        }
    }

    /// Forgets everything cached from `extents` (sorted): they are about to be reused.
    pub fn forget(&self, extents: &[u32]) {
        if self.half == 0 || extents.is_empty() {
            return;
        }
        debug_assert!(extents.windows(2).all(|w| w[0] < w[1]));
        let mut g = self.gens.lock();
        let gone = |k: &Key| extents.binary_search(&k.0).is_ok();
        let mut freed = 0;
        g.hot.retain(|k, v| {
            let keep = !gone(k);
            if !keep {
                freed += v.len();
            }
            keep
        });
        g.hot_bytes -= freed;
        let mut freed = 0;
        g.cold.retain(|k, v| {
            let keep = !gone(k);
            if !keep {
                freed += v.len();
            }
            keep
        });
        g.cold_bytes -= freed;
    }

    /// Bytes cached now (both generations).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        let g = self.gens.lock();
        g.hot.values().chain(g.cold.values()).map(|b| b.len()).sum()
    }
}

/// Counts a lookup of an enabled cache.
fn count(hit: bool, hits: &AtomicU64, misses: &AtomicU64, half: usize) {
    if half > 0 {
        (if hit { hits } else { misses }).fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_hits_and_forgets_reused_extents() {
        let c = ReadCache::new(64 * 1024);
        for i in 0..1000u32 {
            c.put(i % 50, i * 100, &[i as u8; 1000]);
            assert!(c.bytes() <= 64 * 1024, "cache grew past its budget");
        }
        assert_eq!(c.get(49, 99_900, 1000).as_deref(), Some(&[231u8; 1000][..]));
        assert!(c.get(49, 99_900, 999).is_none(), "length not checked");
        c.forget(&[3, 49]);
        assert!(
            c.get(49, 99_900, 1000).is_none(),
            "reused extent still cached"
        );
        assert!(c.get(48, 99_800, 1000).is_some());
        // Decoded units live beside the stored bytes of the same place, and go with them.
        c.put(7, 512, &[1; 100]);
        c.put_unit(7, 512, Arc::from(&[2u8; 16384][..]));
        assert_eq!(c.get(7, 512, 100).as_deref(), Some(&[1u8; 100][..]));
        assert_eq!(
            c.get_unit(7, 512, 16384).as_deref(),
            Some(&[2u8; 16384][..])
        );
        assert!(c.get_unit(7, 512, 8192).is_none(), "length not checked");
        c.forget(&[7]);
        assert!(
            c.get_unit(7, 512, 16384).is_none(),
            "reused extent's unit still cached"
        );
        let off = ReadCache::new(0);
        off.put(1, 1, &[1]);
        assert!(off.get(1, 1, 1).is_none());
        assert_eq!(off.stats().misses, 0, "a cache that is off counts nothing");
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (3, 2), "{s:?}");
        assert_eq!((s.unit_hits, s.unit_misses), (1, 2), "{s:?}");
        assert_eq!(s.bytes as usize, c.bytes(), "{s:?}");
        assert!(s.bytes <= s.budget_bytes, "{s:?}");
    }
}
