//! Post-process deduplication (`zbd dedup`; docs/design.md, build order 2a): every mapped
//! block is read through the read path (checksums checked) and keyed by its xxh3-128; a block
//! whose fingerprint an earlier block has is compared with it byte for byte and, when equal,
//! becomes a reference to that block's stored copy (`State::share_block`: the item is promoted
//! into the shared-block table, no record is written, the next checkpoint makes it durable).
//!
//! The fingerprint table is this pass's own, in RAM (about 40 bytes per distinct block): an
//! offline tool's; inline deduplication (inline.rs) keeps a bounded index instead.

use std::collections::hash_map::{Entry, HashMap};

use crate::dedup::Fingerprint;
use crate::engine::Inner;
use crate::error::{Error, Result};
use crate::format::{BLOCK_BYTES, MAP_ENTRIES_PER_PAGE};
use crate::state::StoredCopy;

/// Blocks read per map lookup and read: 16 leaves' worth (~16 MiB).
const CHUNK_BLOCKS: u64 = 16 * MAP_ENTRIES_PER_PAGE as u64;

/// What a dedup pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupReport {
    /// Blocks that named stored bytes, read and fingerprinted.
    pub blocks: u64,
    /// Distinct contents among them.
    pub distinct: u64,
    /// Blocks this pass turned into references to another block's copy.
    pub shared: u64,
    /// Equal fingerprints whose bytes differed (a hash collision; each costs a read).
    pub collisions: u64,
    /// Stored bytes of live data before and after (the volume counters).
    pub stored_before: u64,
    pub stored_after: u64,
}

impl Inner {
    /// One dedup pass over the whole volume; `progress(done, total)` in blocks. The volume
    /// must not be written meanwhile (the CLI opens it offline): each step re-checks that both
    /// blocks still name the stored copies whose bytes were compared, and skips otherwise.
    pub(crate) fn dedup(&self, progress: &dyn Fn(u64, u64)) -> Result<DedupReport> {
        self.check_writable()?;
        {
            let st = self.state.lock();
            if !matches!(st.map, crate::map::VolumeMap::Tree(_)) {
                return Err(Error::Invalid(
                    "deduplication needs a volume with metadata pages (format bits 10 and 11: \
                     zbd create --metadata-pages)"
                        .into(),
                ));
            }
        }
        let total = self.sb.logical_blocks;
        let mut report = DedupReport {
            stored_before: self.state.lock().map.counters().live_bytes,
            ..DedupReport::default()
        };
        // Fingerprint -> the first block with it and the stored copy it was read from.
        let mut first_seen: HashMap<u128, (u64, StoredCopy)> = HashMap::new();
        let mut buf = Vec::new();
        let mut pair = vec![0u8; 2 * BLOCK_BYTES];
        let mut first = 0;
        while first < total {
            let n = CHUNK_BLOCKS.min(total - first);
            let lbas: Vec<u64> = (first..first + n).collect();
            buf.resize(n as usize * BLOCK_BYTES, 0);
            let (copies, _) = self.read_copies(&lbas, &mut buf);
            for (i, copy) in copies.into_iter().enumerate() {
                let Some(copy) = copy else { continue };
                report.blocks += 1;
                let lba = first + i as u64;
                let block = &buf[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES];
                let (src, src_copy) = match first_seen.entry(Fingerprint::of(block).0) {
                    Entry::Vacant(v) => {
                        v.insert((lba, copy));
                        report.distinct += 1;
                        continue;
                    }
                    Entry::Occupied(o) => *o.get(),
                };
                if src_copy == copy {
                    continue;
                }
                // Both blocks read again, from the copies they name now (the earlier one was
                // read long ago; a reuse since the chunk was read voids its bytes too).
                let (now, r) = self.read_copies(&[lba, src], &mut pair);
                if now[0] != Some(copy) || now[1] != Some(src_copy) {
                    // Changed, or damaged since it was read: not shared.
                    continue;
                }
                if pair[..BLOCK_BYTES] != pair[BLOCK_BYTES..] {
                    report.collisions += 1;
                    continue;
                }
                if self.share(lba, copy, src, src_copy, r)? {
                    report.shared += 1;
                }
            }
            first += n;
            progress(first, total);
        }
        let mut st = self.state.lock();
        st.checkpoint(&self.ctx())?;
        report.stored_after = st.map.counters().live_bytes;
        Ok(report)
    }

    /// Makes `lba` a reference to what `src` names, in one lock hold, if both still name the
    /// copies whose bytes were compared and no extent was reused since they were read
    /// (`reuses`); false otherwise (or when `lba` names it already).
    fn share(
        &self,
        lba: u64,
        copy: StoredCopy,
        src: u64,
        src_copy: StoredCopy,
        reuses: u64,
    ) -> Result<bool> {
        let cx = self.ctx();
        let mut st = self.lock_for_write();
        let (want, src_want) = (st.map.get(lba)?, st.map.get(src)?);
        if st.reuses != reuses
            || StoredCopy::of(&st.map.resolve(want)?) != copy
            || StoredCopy::of(&st.map.resolve(src_want)?) != src_copy
        {
            return Ok(false);
        }
        st.share_block(&cx, lba, want, src, src_want)
    }
}
