//! The read path: look each block up in the map (under the state lock), fetch its stored
//! bytes outside it (open extent, read cache or device), check the CRC, decode.

use super::*;
use crate::backend::Storage;
use crate::codec::{self, unit};
use crate::error::{Error, Result};
use crate::format::{BlockState, MapEntry, BLOCK_BYTES};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Inner {
    /// Reads `buf.len()` bytes at byte `offset`. Whole-block reads are decoded straight into
    /// `buf`; only a read with a partial first or last block goes through a scratch buffer.
    pub fn read(&self, device: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let base = self.check_range(device, offset, buf.len() as u64, false)?;
        if buf.is_empty() {
            return Ok(());
        }
        let _busy = crate::par::busy();
        let bs = BLOCK_BYTES as u64;
        let first = offset / bs;
        let count = (offset + buf.len() as u64 - 1) / bs - first + 1;
        let first = base + first;
        if offset.is_multiple_of(bs) && buf.len().is_multiple_of(BLOCK_BYTES) {
            self.read_into(first, count, true, buf)?
                .into_iter()
                .collect::<Result<()>>()?;
        } else {
            let mut blocks = vec![0u8; count as usize * BLOCK_BYTES];
            self.read_into(first, count, true, &mut blocks)?
                .into_iter()
                .collect::<Result<()>>()?;
            let start = (offset % bs) as usize;
            buf.copy_from_slice(&blocks[start..start + buf.len()]);
        }
        self.host_bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Looks up `count` blocks from `first` and decodes them into `out` (`count` x 4 KiB);
    /// returns one result per block (a damaged block is an error, and its bytes in `out` are
    /// not data). `use_cache: false` reads every stored byte from the device (check must see
    /// the medium).
    pub(super) fn read_into(
        &self,
        first: u64,
        count: u64,
        use_cache: bool,
        out: &mut [u8],
    ) -> Result<Vec<Result<()>>> {
        debug_assert_eq!(out.len() as u64, count * BLOCK_BYTES as u64);
        let (mut sources, _gate) = self.lookup(first, count, !use_cache)?;
        if use_cache {
            for src in sources.iter_mut() {
                if let Source::Disk { entry } = *src {
                    let len = usize::from(entry.unit_blocks) * BLOCK_BYTES;
                    if let Some(unit) = (entry.unit_blocks > 1)
                        .then(|| self.cache.get_unit(entry.extent, entry.offset, len))
                        .flatten()
                    {
                        *src = Source::Decoded { entry, unit };
                    }
                }
            }
        }
        let keep = use_cache && count < STREAMING_BLOCKS_MIN;
        let fetched = self.fetch(&sources, use_cache, keep);
        // Consecutive blocks of one compression unit are decoded together, once; each group
        // gets its own part of `out`, so groups decode in parallel without copies.
        let mut groups: Vec<(usize, usize, Fetched)> = Vec::new();
        for (i, stored) in fetched.into_iter().enumerate() {
            if let Some((start, end, _)) = groups.last_mut() {
                let same = match (unit_entry(&sources[*start]), unit_entry(&sources[i])) {
                    (Some(a), Some(b)) => {
                        (a.extent, a.offset, a.crc, a.len) == (b.extent, b.offset, b.crc, b.len)
                    }
                    _ => false,
                };
                if same {
                    *end = i + 1;
                    continue;
                }
            }
            groups.push((i, i + 1, stored));
        }
        let mut work = Vec::with_capacity(groups.len());
        let mut rest = out;
        for group in groups {
            let (part, tail) =
                std::mem::take(&mut rest).split_at_mut((group.1 - group.0) * BLOCK_BYTES);
            work.push((group, part));
            rest = tail;
        }
        let decode = |((start, end, stored), out): ((usize, usize, Fetched), &mut [u8])| {
            let lba = first + start as u64;
            let corrupt = |i: usize| {
                Err(Error::Corrupt {
                    lba: first + i as u64,
                })
            };
            let stored = match stored {
                Ok(s) => s,
                Err(e) => {
                    let mut res = vec![Err(e)];
                    res.extend((start + 1..end).map(corrupt));
                    return res;
                }
            };
            // The blocks of the group, in order, from their decoded unit.
            let blocks_of = |unit: &[u8], out: &mut [u8]| -> Vec<Result<()>> {
                for (s, block) in sources[start..end]
                    .iter()
                    .zip(out.chunks_exact_mut(BLOCK_BYTES))
                {
                    let i = usize::from(unit_entry(s).map_or(0, |e| e.unit_index));
                    block.copy_from_slice(&unit[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]);
                }
                (start..end).map(|_| Ok(())).collect()
            };
            let damaged = || {
                self.note_damaged_read(lba, (end - start) as u64);
                (start..end).map(corrupt).collect()
            };
            match (&sources[start], stored) {
                (Source::Zeros, _) => {
                    out.fill(0);
                    vec![Ok(())]
                }
                (Source::Damaged, _) => vec![corrupt(start)],
                (Source::Decoded { unit, .. }, _) => blocks_of(unit, out),
                // From the device: decode the whole unit once and keep it for its other blocks
                // (the CRC of what was decoded has just been checked).
                (Source::Disk { entry }, Some(bytes)) if keep && entry.unit_blocks > 1 => {
                    let mut unit = vec![0u8; usize::from(entry.unit_blocks) * BLOCK_BYTES];
                    match self.decode_unit(entry, &bytes, &mut unit) {
                        Some(()) => {
                            let unit: Arc<[u8]> = Arc::from(unit);
                            self.cache
                                .put_unit(entry.extent, entry.offset, Arc::clone(&unit));
                            blocks_of(&unit, out)
                        }
                        None => damaged(),
                    }
                }
                (Source::Bytes { entry, .. } | Source::Disk { entry }, Some(bytes))
                    if end - start > 1 =>
                {
                    // The whole unit, in order: decode in place.
                    let whole = end - start == usize::from(entry.unit_blocks)
                        && entry.unit_index == 0
                        && sources[start..end].iter().enumerate().all(|(k, s)| {
                            unit_entry(s).is_some_and(|e| usize::from(e.unit_index) == k)
                        });
                    if whole {
                        return match self.decode_unit(entry, &bytes, out) {
                            Some(()) => (start..end).map(|_| Ok(())).collect(),
                            None => damaged(),
                        };
                    }
                    let mut unit = vec![0u8; usize::from(entry.unit_blocks) * BLOCK_BYTES];
                    match self.decode_unit(entry, &bytes, &mut unit) {
                        Some(()) => blocks_of(&unit, out),
                        None => damaged(),
                    }
                }
                (Source::Bytes { entry, .. } | Source::Disk { entry }, Some(bytes)) => {
                    vec![self.decode_block(lba, entry, &bytes, out)]
                }
                (_, None) => vec![corrupt(start)],
            }
        };
        Ok(crate::par::map(work, PARALLEL_ITEMS_MIN, decode)
            .into_iter()
            .flatten()
            .collect())
    }

    /// Map lookup under the state lock; returns with the reuse gate held shared so the extents
    /// named cannot be reused before the caller has read them.
    /// `medium`: blocks of open extents already written to storage are read from it too, not
    /// from the extent's buffer in RAM (check and scrub must see what is on the medium).
    pub(super) fn lookup(
        &self,
        first: u64,
        count: u64,
        medium: bool,
    ) -> Result<(Vec<Source>, parking_lot::RwLockReadGuard<'_, ()>)> {
        self.readers_waiting.fetch_add(1, Ordering::SeqCst);
        let mut st = self.state.lock();
        self.readers_waiting.fetch_sub(1, Ordering::SeqCst);
        let mut entries = Vec::with_capacity(count as usize);
        st.map.get_run(first, count, &mut entries)?;
        // A shared block reads as its item's block (bit 12), found through the SBT.
        for (lba, e) in (first..).zip(entries.iter_mut()) {
            if e.state == BlockState::Shared {
                *e = st.map.resolve(*e).map_err(|err| match err {
                    Error::CorruptMetadata(_) => Error::Corrupt { lba },
                    err => err,
                })?;
            }
        }
        let out = self.sources(&st, entries, medium);
        let gate = self.gate.read();
        drop(st);
        Ok((out, gate))
    }

    /// Where the stored bytes of each of `entries` (resolved: no shared entry) are now, seen
    /// under the state lock `st` (the caller takes the reuse gate before letting it go):
    /// bytes copied from an open extent or the outbox, or a place on the device.
    pub(super) fn sources(&self, st: &State, entries: Vec<MapEntry>, medium: bool) -> Vec<Source> {
        let mut out = Vec::with_capacity(entries.len());
        // Blocks of closed extents whose last segment is not issued yet are read from it.
        let outbox = !self.outbox.is_empty();
        // The open extent of the previous block: the blocks of one request mostly share
        // extents, and the buffer can hold hundreds of open extents (16 MiB of 32 KiB ones).
        let mut last: Option<(u32, Option<usize>)> = None;
        for entry in entries {
            let open = match last {
                Some((extent, i)) if extent == entry.extent => i,
                _ if entry.state != BlockState::Data => None,
                _ => {
                    let i = st.buffer.position(entry.extent);
                    last = Some((entry.extent, i));
                    i
                }
            };
            out.push(match entry.state {
                BlockState::Unmapped | BlockState::Zero => Source::Zeros,
                // Shared entries were resolved above.
                BlockState::Corrupt | BlockState::Shared => Source::Damaged,
                BlockState::Data => match open.map(|i| st.buffer.get(i)) {
                    Some(o)
                        if !medium
                            || entry.offset as usize + entry.len as usize > o.durable_end =>
                    {
                        let s = entry.offset as usize;
                        Source::Bytes {
                            entry,
                            bytes: Bytes::copy_from_slice(&o.buf[s..s + entry.len as usize]),
                        }
                    }
                    _ => match outbox
                        .then(|| {
                            self.outbox
                                .find(entry.extent, entry.offset, entry.len.into())
                        })
                        .flatten()
                    {
                        Some(bytes) => Source::Bytes {
                            entry,
                            bytes: Bytes::from(bytes),
                        },
                        None => Source::Disk { entry },
                    },
                },
            });
        }
        out
    }

    /// Reads the stored bytes of every `Disk` source, one storage read per run of blocks in the
    /// same extent, all in one `Storage::read_many` (a network store has them in flight at
    /// once).
    /// `keep`: put what was read into the read cache. The blocks of one unit after its first
    /// get `None`: `read_blocks` decodes a unit once, from its first block's bytes.
    pub(super) fn fetch(&self, sources: &[Source], use_cache: bool, keep: bool) -> Vec<Fetched> {
        // Runs of `Disk` sources (start, end, extent, lo, hi) that need a device read.
        let mut runs: Vec<(usize, usize, u32, u32, u32)> = Vec::new();
        let mut out: Vec<Option<Fetched>> = Vec::with_capacity(sources.len());
        let mut i = 0;
        while i < sources.len() {
            let Source::Disk { entry } = &sources[i] else {
                out.push(Some(Ok(match &sources[i] {
                    Source::Bytes { bytes, .. } => Some(bytes.clone()),
                    _ => None,
                })));
                i += 1;
                continue;
            };
            // Extend the run while the next block sits in the same extent, close by.
            let mut j = i + 1;
            let (mut lo, mut hi) = (entry.offset, entry.offset + u32::from(entry.len));
            while j < sources.len() {
                match &sources[j] {
                    Source::Disk { entry: e } if e.extent == entry.extent => {
                        lo = lo.min(e.offset);
                        hi = hi.max(e.offset + u32::from(e.len));
                        j += 1;
                    }
                    _ => break,
                }
            }
            // Every block of the run cached: no device read.
            let cached: Vec<Arc<[u8]>> = sources[i..j]
                .iter()
                .map_while(|src| match src {
                    Source::Disk { entry: e } if use_cache => {
                        self.cache.get(e.extent, e.offset, usize::from(e.len))
                    }
                    _ => None,
                })
                .collect();
            if cached.len() == j - i {
                out.extend(
                    cached
                        .into_iter()
                        .map(|b| Some(Ok(Some(Bytes::from_owner(b))))),
                );
            } else {
                runs.push((i, j, entry.extent, lo, hi));
                out.extend((i..j).map(|_| None));
            }
            i = j;
        }
        // One buffer for every run, all handed to the storage at once (a network store has them
        // in flight together); each block's bytes are then a slice of it, not a copy. Runs whose
        // device ranges follow each other within `READ_GAP_MAX` go out as one request, the gap
        // read and dropped: the blocks of one file often end one extent and start the next,
        // and on a disk that charges per request one larger read costs less than two. Joined
        // requests stay below `READ_JOIN_BYTES_MAX`, so a large read still has several in
        // flight on a storage that serves a batch concurrently (RADOS).
        let at: Vec<(u64, u64)> = runs
            .iter()
            .map(|&(_, _, extent, lo, hi)| {
                (
                    self.sb.extent_offset(extent) + u64::from(lo),
                    u64::from(hi - lo),
                )
            })
            .collect();
        let (requests, placed) = join_runs(&at);
        let mut total: usize = requests.iter().map(|r| r.1 as usize).sum();
        let mut all = vec![0u8; total];
        let results = {
            let mut reads = Vec::with_capacity(requests.len());
            let mut rest = all.as_mut_slice();
            for &(at, n, _) in &requests {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(n as usize);
                reads.push((at, part));
                rest = tail;
            }
            self.storage.read_many(&mut reads)
        };
        // A joined request that failed: each of its runs is read alone, so an error in a gap
        // (bytes nobody asked for) fails no block.
        let results: Vec<std::result::Result<(), String>> = at
            .iter()
            .zip(&placed)
            .map(|(&(start, n), &(req, place))| match &results[req] {
                Ok(()) => Ok(()),
                Err(_) if requests[req].2 > 1 => {
                    total += n as usize;
                    self.storage
                        .read_at(start, &mut all[place..place + n as usize])
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            })
            .collect();
        self.storage_bytes_read
            .fetch_add(total as u64, Ordering::Relaxed);
        let all = Bytes::from(all);
        let spans = at
            .iter()
            .zip(&placed)
            .zip(results)
            .map(|((&(_, n), &(_, place)), res)| {
                res.map(|()| all.slice(place..place + n as usize))
            });
        for (&(i, j, _, lo, _), res) in runs.iter().zip(spans) {
            let mut prev: Option<&MapEntry> = None;
            for (k, src) in sources.iter().enumerate().take(j).skip(i) {
                let Source::Disk { entry: e } = src else {
                    continue;
                };
                let same_unit = prev.is_some_and(|p| {
                    e.unit_blocks > 1
                        && p.unit_blocks > 1
                        && (p.offset, p.len, p.crc) == (e.offset, e.len, e.crc)
                });
                prev = Some(e);
                out[k] = Some(match &res {
                    Ok(_) if same_unit => Ok(None),
                    Ok(span) => {
                        let s = (e.offset - lo) as usize;
                        let bytes = span.slice(s..s + e.len as usize);
                        if keep {
                            // Under the reuse gate (held by our caller): see readcache.rs.
                            self.cache.put(e.extent, e.offset, &bytes);
                        }
                        Ok(Some(bytes))
                    }
                    Err(err) => Err(Error::Io(std::io::Error::other(err.to_string()))),
                });
            }
        }
        out.into_iter()
            .map(|f| f.expect("every source is fetched"))
            .collect()
    }

    /// Decodes one block from its stored bytes (of its unit: decoding no more than the unit)
    /// into `out` (4 KiB).
    pub(super) fn decode_block(
        &self,
        lba: u64,
        entry: &MapEntry,
        stored: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        // A block whose dictionary is not loaded (both copies damaged) is an error, never data.
        let dict = (entry.dict != 0).then(|| self.dicts.get(entry.dict));
        let id = dict.clone().flatten().map(|d| d.identity());
        let ok = !matches!(dict, Some(None))
            && entry.checksum_matches(&self.sb.uuid, id.as_ref(), stored)
            && if entry.unit_blocks > 1 {
                unit::read_stored_block(
                    entry.codec,
                    dict.clone().flatten().as_deref(),
                    stored,
                    usize::from(entry.unit_blocks),
                    usize::from(entry.unit_index),
                    &mut Vec::new(),
                    out,
                )
                .is_some()
            } else {
                match dict.flatten() {
                    Some(d) => d.decompress(entry.codec, stored, out).is_some(),
                    None => codec::decompress(entry.codec, stored, out).is_some(),
                }
            };
        if !ok {
            self.note_damaged_read(lba, 1);
            return Err(Error::Corrupt { lba });
        }
        Ok(())
    }

    /// Counts `blocks` damaged blocks read from `lba` on, and says so in the log: the first ten
    /// such reads since open, then the 16th, 32nd, 64th... (a filesystem retrying a bad block
    /// must not flood the log, and a person must still learn that it goes on).
    pub(super) fn note_damaged_read(&self, lba: u64, blocks: u64) {
        let total = self.corrupt_reads.fetch_add(blocks, Ordering::Relaxed) + blocks;
        let before = self
            .damaged_reads_since_open
            .fetch_add(blocks, Ordering::Relaxed);
        if before < 10 || (before + 1..=before + blocks).any(u64::is_power_of_two) {
            tracing::warn!(
                "damaged data: block {lba} fails its checksum and reads as an I/O error \
                 ({total} damaged block reads in all; `zbd check` lists the blocks)"
            );
        }
    }

    /// Decodes a whole unit into `out` (`unit_blocks` x 4 KiB) after checking its CRC; `None`
    /// if damaged.
    pub(super) fn decode_unit(
        &self,
        entry: &MapEntry,
        stored: &[u8],
        out: &mut [u8],
    ) -> Option<()> {
        if entry.dict != 0 {
            let d = self.dicts.get(entry.dict)?;
            entry
                .checksum_matches(&self.sb.uuid, Some(&d.identity()), stored)
                .then_some(())?;
            d.decompress(entry.codec, stored, out)?;
        } else {
            entry
                .checksum_matches(&self.sb.uuid, None, stored)
                .then_some(())?;
            codec::decompress(entry.codec, stored, out)?;
        }
        Some(())
    }
}

/// A device read request: offset, bytes, runs joined in it.
type Request = (u64, u64, usize);

/// Device requests for runs at (device offset, bytes), in the order given: a run that starts
/// within `READ_GAP_MAX` after the previous request ends joins it, while the request stays
/// within `READ_JOIN_BYTES_MAX`. Returns the requests (offset, bytes, runs joined) and, per
/// run, its request and its place in the requests' buffers laid end to end.
fn join_runs(runs: &[(u64, u64)]) -> (Vec<Request>, Vec<(usize, usize)>) {
    let mut requests: Vec<Request> = Vec::new();
    let mut placed = Vec::with_capacity(runs.len());
    let mut total = 0usize;
    for &(start, len) in runs {
        let last = requests.len().wrapping_sub(1);
        match requests.last_mut() {
            Some((at, n, count))
                if (0..=READ_GAP_MAX).contains(&start.wrapping_sub(*at + *n))
                    && start + len - *at <= READ_JOIN_BYTES_MAX =>
            {
                let gap = start - (*at + *n);
                placed.push((last, total + gap as usize));
                total += (gap + len) as usize;
                *n += gap + len;
                *count += 1;
            }
            _ => {
                placed.push((requests.len(), total));
                requests.push((start, len, 1));
                total += len as usize;
            }
        }
    }
    (requests, placed)
}

#[cfg(test)]
mod join_tests {
    use super::*;

    #[test]
    fn neighbours_join_within_the_gap_and_the_cap_and_nothing_else_does() {
        let k = 1024u64;
        let runs = [
            (0, 8 * k),          // request 0
            (8 * k + 32 * k, k), // gap of 32 KiB: joins
            (200 * k, 8 * k),    // gap of 151 KiB: new request
            (100 * k, 4 * k),    // behind the previous one: new request
            (104 * k, 300 * k),  // adjacent but past the cap: new request
        ];
        let (requests, placed) = join_runs(&runs);
        assert_eq!(
            requests,
            [
                (0, 41 * k, 2),
                (200 * k, 8 * k, 1),
                (100 * k, 4 * k, 1),
                (104 * k, 300 * k, 1)
            ]
        );
        let k = k as usize;
        assert_eq!(
            placed,
            [(0, 0), (0, 40 * k), (1, 41 * k), (2, 49 * k), (3, 53 * k)]
        );
    }
}
