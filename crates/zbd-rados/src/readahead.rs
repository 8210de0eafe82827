//! Read-ahead for sequential reads. The engine reads a volume one extent (32 KiB by default) at a
//! time, so a sequential NBD read becomes a chain of small storage reads, each a RADOS round
//! trip. Once reads walk forward through the storage, the next chunks are read asynchronously
//! ahead of them and later reads are served from memory.
//!
//! Coherence: a write or discard drops the chunks it overlaps once it has been issued; a chunk
//! read issued after that sees the write, because RADOS applies one client's operations on an
//! object in the order they were sent. A read that finds a chunk dropped by then was concurrent
//! with the write, and may see either content, as with any storage.

use crate::client::Completion;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Storage bytes per chunk (aligned).
pub const CHUNK_BYTES: u64 = 256 << 10;
/// Chunks read ahead of a sequential reader.
const AHEAD: u64 = 8;
/// Chunks kept at most (oldest dropped first): 8 MiB.
const KEPT: usize = 32;
/// Chunks read most recently, to recognise a reader moving forward.
const RECENT: usize = 16;

/// One chunk's asynchronous reads: (offset in the chunk, length, read).
pub struct Chunk {
    start: u64,
    parts: Vec<(u64, u64, Completion)>,
}

impl Chunk {
    /// A chunk starting at storage offset `start`, read by `parts`.
    pub fn new(start: u64, parts: Vec<(u64, u64, Completion)>) -> Chunk {
        Chunk { start, parts }
    }

    /// Copies storage bytes `offset..offset + buf.len()` (within this chunk) into `buf`,
    /// waiting for the reads; `None` if one failed (the caller reads directly and reports it).
    fn copy_to(&self, offset: u64, buf: &mut [u8]) -> Option<()> {
        let end = offset + buf.len() as u64;
        for (at, n, read) in &self.parts {
            let (lo, hi) = (self.start + at, self.start + at + n);
            if hi <= offset || end <= lo {
                continue;
            }
            let got = read.read_result().ok()?;
            let (from, to) = (lo.max(offset), hi.min(end));
            let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
            let src = ((from - lo) as usize, (to - lo) as usize);
            // A short read: the object ends there, the rest reads as zeros.
            let have = got.len().clamp(src.0, src.1) - src.0;
            if have > 0 {
                dst[..have].copy_from_slice(&got[src.0..src.0 + have]);
            }
            dst[have..].fill(0);
        }
        Some(())
    }
}

#[derive(Default)]
struct State {
    chunks: BTreeMap<u64, Arc<Chunk>>,
    /// Chunk indexes in the order they were read ahead (for dropping the oldest).
    order: VecDeque<u64>,
    recent: VecDeque<u64>,
}

/// The chunks read ahead of one volume's readers.
#[derive(Default)]
pub struct ReadAhead {
    state: Mutex<State>,
}

impl ReadAhead {
    /// Serves storage bytes `offset..offset + buf.len()` from chunks read ahead, if every chunk
    /// of the range is there and was read without error.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> bool {
        let (first, last) = span(offset, buf.len() as u64);
        let chunks: Option<Vec<Arc<Chunk>>> = {
            let state = self.state.lock();
            (first..=last)
                .map(|i| state.chunks.get(&i).cloned())
                .collect()
        };
        let Some(chunks) = chunks else {
            return false;
        };
        let mut at = 0usize;
        for chunk in chunks {
            let lo = (offset + at as u64).max(chunk.start);
            let hi = (chunk.start + CHUNK_BYTES).min(offset + buf.len() as u64);
            let n = (hi - lo) as usize;
            if chunk.copy_to(lo, &mut buf[at..at + n]).is_none() {
                self.invalidate(chunk.start, CHUNK_BYTES);
                return false;
            }
            at += n;
        }
        true
    }

    /// Notes a read of `offset..offset + len`; if it continues one just before, starts reading
    /// the chunks after it that are not there yet (`start(chunk start)` issues the reads).
    pub fn after_read(&self, offset: u64, len: u64, start: impl Fn(u64) -> Option<Chunk>) {
        let (first, last) = span(offset, len);
        let mut state = self.state.lock();
        // Moving forward: the read was served from read-ahead chunks, or it entered the chunk
        // after one read just before.
        let forward =
            state.chunks.contains_key(&first) || (first > 0 && state.recent.contains(&(first - 1)));
        for i in first..=last {
            if !state.recent.contains(&i) {
                if state.recent.len() == RECENT {
                    state.recent.pop_front();
                }
                state.recent.push_back(i);
            }
        }
        if !forward {
            return;
        }
        for i in last + 1..=last + AHEAD {
            if state.chunks.contains_key(&i) {
                continue;
            }
            let Some(chunk) = start(i * CHUNK_BYTES) else {
                break; // past the end, or librados refused: no read-ahead this time
            };
            state.chunks.insert(i, Arc::new(chunk));
            state.order.push_back(i);
            while state.order.len() > KEPT {
                if let Some(old) = state.order.pop_front() {
                    state.chunks.remove(&old);
                }
            }
        }
    }

    /// Drops every chunk, waiting for reads still in flight (before the I/O context they were
    /// started on goes: an operation of a destroyed context never completes).
    pub fn clear(&self) {
        let chunks = std::mem::take(&mut *self.state.lock());
        drop(chunks);
    }

    /// Drops the chunks overlapping storage bytes `offset..offset + len` (call after issuing a
    /// write or discard there).
    pub fn invalidate(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (first, last) = span(offset, len);
        let mut state = self.state.lock();
        if state.chunks.is_empty() {
            return;
        }
        let doomed: Vec<u64> = state.chunks.range(first..=last).map(|(&i, _)| i).collect();
        for i in doomed {
            state.chunks.remove(&i);
            state.order.retain(|&o| o != i);
        }
    }
}

/// First and last chunk index of a non-empty range.
fn span(offset: u64, len: u64) -> (u64, u64) {
    (
        offset / CHUNK_BYTES,
        (offset + len.max(1) - 1) / CHUNK_BYTES,
    )
}
