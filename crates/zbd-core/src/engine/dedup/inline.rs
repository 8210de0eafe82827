//! Inline deduplication (`--dedup on`; docs/design.md, "Deduplication", build order 2b): before a
//! write's blocks are compressed, each is fingerprinted and looked up in the bounded index
//! (`crate::dedup::Index`); a candidate is read from the medium (or its open extent), and only
//! a block equal to it byte for byte becomes a *hit*. Under the state lock a hit becomes a
//! reference with a ref record (`State::put_ref`) if its candidate still names the bytes that
//! were compared; otherwise, and for every other block, the block is stored as before.
//!
//! The index names a candidate by the LBA whose block had those bytes (a hint that may be
//! stale: the comparison settles it). Hooks name extents: their manifests, the fingerprints
//! their data records carry, are read from the medium when a hook matches.

use crate::backend::Storage;
use crate::dedup::{Candidate, Fingerprint, Index};
use crate::engine::Inner;
use crate::format::BLOCK_BYTES;
use crate::state::Hit;

/// What a write's blocks found in the index: a verified hit per block, or none.
pub(crate) struct Lookups {
    /// Each block's fingerprint (`None`: a zero block, or dedup is off).
    pub fingerprints: Vec<Option<Fingerprint>>,
    /// Each block's verified hit.
    pub hits: Vec<Option<Hit>>,
    /// Each block without a hit that equals an earlier block of the same request: the earlier
    /// block's index. It becomes a reference to whatever that block is once placed (blocks
    /// are placed in LBA order).
    pub earlier: Vec<Option<usize>>,
}

/// The index of an open with `--dedup on`, and what it found.
pub(crate) struct InlineDedup {
    index: parking_lot::Mutex<Index>,
    /// Fingerprint bits kept (128; tests keep fewer to make different blocks collide).
    fingerprint_bits: u32,
}

impl InlineDedup {
    pub fn new(budget: u64, fingerprint_bits: u32) -> InlineDedup {
        InlineDedup {
            index: parking_lot::Mutex::new(Index::new(budget)),
            fingerprint_bits: fingerprint_bits.clamp(1, 128),
        }
    }

    /// The fingerprint of `block` as this index keys it.
    pub fn fingerprint(&self, block: &[u8]) -> Fingerprint {
        let f = Fingerprint::of(block).0;
        match u128::MAX.checked_shr(self.fingerprint_bits) {
            Some(dropped) => Fingerprint(f & !dropped),
            None => Fingerprint(f),
        }
    }

    /// The index's tables as bytes ([`Index::image`]), naming volume `uuid`.
    pub fn image(&self, uuid: &[u8; 16]) -> Vec<u8> {
        self.index.lock().image(uuid)
    }

    /// Replaces the index with the one `image` holds ([`Index::restore`]); the hooks it holds.
    pub fn restore(&self, image: &[u8], uuid: &[u8; 16]) -> Result<u64, String> {
        let mut ix = self.index.lock();
        let restored = Index::restore(image, uuid, ix.budget())?;
        *ix = restored;
        Ok(ix.stats().hooks)
    }

    /// The index's budget and counters (`zbd stat`).
    pub fn stats(&self) -> crate::stats::DedupIndexStat {
        let ix = self.index.lock();
        let index = ix.stats();
        crate::stats::DedupIndexStat {
            budget_bytes: ix.budget(),
            hit_rate: index.verified as f64 / index.lookups.max(1) as f64,
            index,
        }
    }
}

impl Inner {
    /// `Volume::dedup_index_image`.
    pub(crate) fn dedup_index_image(&self) -> Option<Vec<u8>> {
        self.dedup.as_ref().map(|d| d.image(&self.sb.uuid))
    }

    /// `Volume::restore_dedup_index`.
    pub(crate) fn restore_dedup_index(&self, image: &[u8]) -> Result<u64, String> {
        match &self.dedup {
            Some(d) => d.restore(image, &self.sb.uuid),
            None => Err("dedup is off in this open".into()),
        }
    }

    /// The blocks of `data` (whole blocks from `first`; `nonzero` says which hold data) that
    /// equal a block already stored, each with the candidate it was compared with. Nothing
    /// when dedup is off. Reads candidates outside the state lock; never fails a write for a
    /// candidate it cannot read (that block is simply stored).
    pub(crate) fn find_hits(&self, data: &[u8], nonzero: &[bool]) -> Lookups {
        let n = nonzero.len();
        let mut out = Lookups {
            fingerprints: vec![None; n],
            hits: vec![None; n],
            earlier: vec![None; n],
        };
        let Some(dd) = &self.dedup else {
            return out;
        };
        for (i, block) in data.chunks(BLOCK_BYTES).enumerate() {
            if nonzero[i] {
                out.fingerprints[i] = Some(dd.fingerprint(block));
            }
        }
        let candidates = self.candidates(dd, &out.fingerprints);
        if candidates.iter().any(Option::is_some) {
            self.verify_candidates(dd, data, &candidates, &mut out.hits);
        }
        // Copies within the request, compared in its own buffer.
        let mut first_with: std::collections::HashMap<u128, usize, foldhash::fast::RandomState> =
            Default::default();
        let block = |i: usize| &data[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES];
        for i in 0..n {
            let Some(fp) = out.fingerprints[i] else {
                continue;
            };
            match first_with.entry(fp.0) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(i);
                }
                std::collections::hash_map::Entry::Occupied(o) => {
                    let j = *o.get();
                    if out.hits[i].is_none() && block(j) == block(i) {
                        out.earlier[i] = Some(j);
                    }
                }
            }
        }
        out
    }

    /// Reads the stored copy each candidate names (`read_copies`) and keeps, in `hits`, those
    /// equal to their block of `data`.
    fn verify_candidates(
        &self,
        dd: &InlineDedup,
        data: &[u8],
        candidates: &[Option<u64>],
        hits: &mut [Option<Hit>],
    ) {
        let lbas: Vec<u64> = candidates.iter().flatten().copied().collect();
        let mut read = vec![0u8; lbas.len() * BLOCK_BYTES];
        let (copies, reuses) = self.read_copies(&lbas, &mut read);
        let mut got = read.chunks(BLOCK_BYTES).zip(copies);
        let mut rejected = 0;
        for (i, c) in candidates.iter().enumerate() {
            let Some(src) = *c else { continue };
            let Some((other, Some(copy))) = got.next() else {
                continue;
            };
            if other != &data[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES] {
                rejected += 1;
                continue;
            }
            hits[i] = Some(Hit { src, copy, reuses });
        }
        if rejected > 0 {
            let mut ix = dd.index.lock();
            (0..rejected).for_each(|_| ix.rejected());
        }
    }

    /// The index's candidate for each fingerprint (an LBA inside the volume), loading the
    /// manifests of the extents whose hooks match, each once per request.
    fn candidates(&self, dd: &InlineDedup, fps: &[Option<Fingerprint>]) -> Vec<Option<u64>> {
        let blocks = self.sb.logical_blocks;
        let mut out = vec![None; fps.len()];
        // One hold of the index for the request, let go only to read manifests.
        let mut ix = dd.index.lock();
        for (i, fp) in fps.iter().enumerate() {
            let Some(fp) = *fp else { continue };
            let found = match ix.lookup(fp) {
                Some(Candidate::Extents(extents)) => {
                    drop(ix);
                    let manifests: Vec<_> =
                        extents.iter().map(|&e| (e, self.manifest(e))).collect();
                    ix = dd.index.lock();
                    for (e, manifest) in manifests {
                        ix.add_manifest(e, manifest);
                    }
                    ix.lookup_cached(fp)
                }
                other => other,
            };
            if let Some(Candidate::Block(lba)) = found {
                // A block of another device is checked where it is read (a deleted device's
                // blocks read as unmapped, a miss).
                let inside =
                    crate::format::key_device(lba) != crate::format::DEFAULT_DEVICE || lba < blocks;
                out[i] = inside.then_some(lba);
            }
        }
        out
    }

    /// What extent `extent`'s record tables say it holds: each data or move record's
    /// fingerprint and LBA. Read from the medium without the reuse gate: the extent may be
    /// rewritten meanwhile, and then names other blocks, which only costs comparisons that
    /// fail. Empty when it cannot be read.
    fn manifest(&self, extent: u32) -> Vec<(u32, u64)> {
        if extent >= self.sb.extent_count {
            return Vec::new();
        }
        let mut ext = vec![0u8; self.sb.extent_bytes as usize];
        if self
            .storage
            .read_at(self.sb.extent_offset(extent), &mut ext)
            .is_err()
        {
            return Vec::new();
        }
        crate::recovery::manifest_in(&self.sb, extent, &ext)
    }

    /// After a write's blocks are in the map: its stored blocks (`stored`: LBA, extent) become
    /// candidates for later writes, and the blocks that became references (`referenced`: LBA,
    /// the LBA whose copy it names) are counted and their copies kept recent.
    pub(crate) fn remember(
        &self,
        first: u64,
        lookups: &Lookups,
        stored: &[(u64, u32)],
        referenced: &[(u64, u64)],
    ) {
        let Some(dd) = &self.dedup else { return };
        let fp = |lba: u64| lookups.fingerprints[(lba - first) as usize];
        let mut ix = dd.index.lock();
        for &(lba, extent) in stored {
            if let Some(fp) = fp(lba) {
                ix.insert(fp, lba, extent);
            }
        }
        for &(lba, src) in referenced {
            if let Some(fp) = fp(lba) {
                ix.verified(fp, src);
            }
        }
    }
}
