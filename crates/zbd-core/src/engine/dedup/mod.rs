//! Deduplication in the engine (docs/design.md, "Deduplication"): the offline pass over a
//! whole volume (`pass.rs`, `zbd dedup`) and inline deduplication on the write path
//! (`inline.rs`, `--dedup on`). Both share a block only after comparing its bytes with the
//! candidate's, read from the medium or its open extent, never from the read cache.

mod inline;
mod pass;

pub(crate) use inline::InlineDedup;
pub use pass::DedupReport;

use crate::engine::Inner;
use crate::format::{MapEntry, BLOCK_BYTES};
use crate::state::StoredCopy;

impl Inner {
    /// The stored copy each of `lbas` names now, and that copy's block decoded into `out`
    /// (`lbas.len()` x 4 KiB), with the volume's reuse count when the copies were noted.
    /// `None` for a block with no stored bytes or whose copy does not read or fails its
    /// checksum (damaged: never shared nor shared with).
    ///
    /// The bytes are those of the copy noted, fetched from where that copy was seen in the
    /// same lock hold (its open extent, the outbox, or the device under the reuse gate, never
    /// the read cache, which could vouch for a copy that has rotted since): never whatever the
    /// LBA names when the read runs. An LBA may be rewritten and come back to the very same
    /// shared copy in between (reviews of 2b, finding 1 of each), so bytes read through it
    /// could belong to a write in between. Bytes at a location change only when its extent is
    /// reused, which an unchanged reuse count rules out from the noting on.
    pub(super) fn read_copies(
        &self,
        lbas: &[u64],
        out: &mut [u8],
    ) -> (Vec<Option<StoredCopy>>, u64) {
        // (position, LBA, its copy resolved).
        let mut picked: Vec<(usize, u64, MapEntry)> = Vec::new();
        let (sources, reuses, gate) = {
            let mut st = self.state.lock();
            for (k, &lba) in lbas.iter().enumerate() {
                // A block whose map or SBT page does not read is left out.
                if let Ok(Some(e)) = st.stored_entry(lba) {
                    picked.push((k, lba, e));
                }
            }
            let entries = picked.iter().map(|p| p.2).collect();
            let sources = self.sources(&st, entries, true);
            (sources, st.reuses, self.gate.read())
        };
        // Consecutive blocks in one extent are read in one request; the later blocks of a
        // unit come back empty (`fetch`) and take the unit's bytes from its first.
        let fetched = self.fetch(&sources, false, false);
        drop(gate);
        let mut copies = vec![None; lbas.len()];
        let same =
            |u: &MapEntry, e: &MapEntry| (u.extent, u.offset, u.crc) == (e.extent, e.offset, e.crc);
        let mut unit: Option<(MapEntry, bytes::Bytes)> = None;
        // The last unit decoded whole (its entry, its blocks; empty if it failed its check):
        // candidates in one unit cost one decode, not one prefix decode each.
        let mut decoded: Option<(MapEntry, Vec<u8>)> = None;
        for ((k, lba, e), f) in picked.into_iter().zip(fetched) {
            let stored = match f {
                Ok(Some(b)) => b,
                Ok(None) => match &unit {
                    Some((u, b)) if same(u, &e) => b.clone(),
                    _ => continue,
                },
                Err(_) => continue,
            };
            unit = Some((e, stored.clone()));
            let block = &mut out[k * BLOCK_BYTES..(k + 1) * BLOCK_BYTES];
            let ok = if e.unit_blocks > 1 {
                if !decoded.as_ref().is_some_and(|(u, _)| same(u, &e)) {
                    let mut whole = vec![0u8; usize::from(e.unit_blocks) * BLOCK_BYTES];
                    if self.decode_unit(&e, &stored, &mut whole).is_none() {
                        whole.clear();
                    }
                    decoded = Some((e, whole));
                }
                let whole = decoded.as_ref().map_or(&[][..], |(_, w)| &w[..]);
                let at = usize::from(e.unit_index) * BLOCK_BYTES;
                match whole.get(at..at + BLOCK_BYTES) {
                    Some(b) => {
                        block.copy_from_slice(b);
                        true
                    }
                    None => {
                        self.note_damaged_read(lba, 1);
                        false
                    }
                }
            } else {
                self.decode_block(lba, &e, &stored, block).is_ok()
            };
            if ok {
                copies[k] = Some(StoredCopy::of(&e));
            }
        }
        (copies, reuses)
    }
}
