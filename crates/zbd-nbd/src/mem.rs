//! An in-memory, sparse export for tests and demos: memory is allocated one chunk at a time on
//! first write, trimmed chunks are freed and show up as holes in block status.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::export::{Export, ExportError, ExportResult, Extent};

/// Allocation granularity; also the granularity of holes in block status.
pub const MEM_CHUNK_BYTES: u64 = 4096;

/// Sparse RAM-backed export. Each chunk has its own lock, so requests to different chunks from
/// different connections run in parallel. Nothing is volatile, so `flush` only counts calls.
pub struct MemExport {
    size: u64,
    read_only: bool,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
    flushes: AtomicU64,
}

impl MemExport {
    /// A zero-filled export of `size` bytes (rounded up to nothing: the last chunk may be short).
    pub fn new(size: u64) -> Self {
        let count = size.div_ceil(MEM_CHUNK_BYTES);
        let chunks = (0..count).map(|_| RwLock::new(None)).collect();
        MemExport {
            size,
            read_only: false,
            chunks,
            flushes: AtomicU64::new(0),
        }
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Number of `flush` calls so far (tests check that FLUSH and FUA reach the export).
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Number of chunks holding memory.
    pub fn allocated_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|chunk| chunk.read().map(|c| c.is_some()).unwrap_or(true))
            .count()
    }

    fn chunk(&self, index: u64) -> ExportResult<&RwLock<Option<Box<[u8]>>>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.chunks.get(i))
            .ok_or_else(|| ExportError::invalid(format!("chunk {index} past the end")))
    }

    fn check(&self, offset: u64, length: u64) -> ExportResult<()> {
        match offset.checked_add(length) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::invalid(format!(
                "range {offset}+{length} past the end ({})",
                self.size
            ))),
        }
    }

    fn check_writable(&self) -> ExportResult<()> {
        if self.read_only {
            return Err(ExportError::permission("export is read-only"));
        }
        Ok(())
    }

    /// Calls `visit(chunk_index, offset_in_chunk, range_in_request)` for each chunk the range
    /// touches.
    fn for_each_piece(
        offset: u64,
        length: u64,
        mut visit: impl FnMut(u64, usize, std::ops::Range<usize>) -> ExportResult<()>,
    ) -> ExportResult<()> {
        let mut done = 0u64;
        while done < length {
            let position = offset + done;
            let index = position / MEM_CHUNK_BYTES;
            let within = position % MEM_CHUNK_BYTES;
            let take = (MEM_CHUNK_BYTES - within).min(length - done);
            let start = usize::try_from(done).map_err(|_| ExportError::invalid("too long"))?;
            let end =
                start + usize::try_from(take).map_err(|_| ExportError::invalid("too long"))?;
            visit(index, within as usize, start..end)?;
            done += take;
        }
        Ok(())
    }

    fn chunk_len(&self, index: u64) -> usize {
        let start = index * MEM_CHUNK_BYTES;
        (self.size - start).min(MEM_CHUNK_BYTES) as usize
    }

    /// Zeroes (and frees, when whole and allowed) the chunks of a range.
    fn zero_range(&self, offset: u64, length: u64, may_free: bool) -> ExportResult<()> {
        Self::for_each_piece(offset, length, |index, within, range| {
            let whole = within == 0 && range.len() == self.chunk_len(index);
            let mut slot = self
                .chunk(index)?
                .write()
                .map_err(|_| ExportError::io("chunk lock poisoned"))?;
            if whole && may_free {
                *slot = None;
            } else if let Some(data) = slot.as_mut() {
                data[within..within + range.len()].fill(0);
            } else if !may_free {
                *slot = Some(vec![0u8; self.chunk_len(index)].into_boxed_slice());
            }
            Ok(())
        })
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        self.check(offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |index, within, range| {
            let slot = self
                .chunk(index)?
                .read()
                .map_err(|_| ExportError::io("chunk lock poisoned"))?;
            let target = &mut buf[range.clone()];
            match slot.as_ref() {
                Some(data) => target.copy_from_slice(&data[within..within + range.len()]),
                None => target.fill(0),
            }
            Ok(())
        })
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> ExportResult<()> {
        self.check_writable()?;
        self.check(offset, data.len() as u64)?;
        Self::for_each_piece(offset, data.len() as u64, |index, within, range| {
            let chunk_len = self.chunk_len(index);
            let mut slot = self
                .chunk(index)?
                .write()
                .map_err(|_| ExportError::io("chunk lock poisoned"))?;
            let stored = slot.get_or_insert_with(|| vec![0u8; chunk_len].into_boxed_slice());
            stored[within..within + range.len()].copy_from_slice(&data[range]);
            Ok(())
        })
    }

    fn flush(&self) -> ExportResult<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64, _fua: bool) -> ExportResult<()> {
        self.check_writable()?;
        self.check(offset, length)?;
        self.zero_range(offset, length, true)
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_trim: bool,
        _fua: bool,
    ) -> ExportResult<()> {
        self.check_writable()?;
        self.check(offset, length)?;
        self.zero_range(offset, length, may_trim)
    }

    fn block_status(&self, offset: u64, length: u64) -> ExportResult<Vec<Extent>> {
        self.check(offset, length)?;
        let mut extents: Vec<Extent> = Vec::new();
        Self::for_each_piece(offset, length, |index, _within, range| {
            let allocated = self
                .chunk(index)?
                .read()
                .map_err(|_| ExportError::io("chunk lock poisoned"))?
                .is_some();
            let piece = range.len() as u64;
            let hole = !allocated;
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.length += piece,
                _ if hole => extents.push(Extent::hole(piece)),
                _ => extents.push(Extent::data(piece)),
            }
            Ok(())
        })?;
        Ok(extents)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_writes_across_chunks() {
        let export = MemExport::new(3 * MEM_CHUNK_BYTES + 100);
        let data: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8).collect();
        export.write_at(4000, &data, false).unwrap();
        let mut back = vec![0u8; 6000];
        export.read_at(4000, &mut back).unwrap();
        assert_eq!(back, data);
        let mut before = vec![1u8; 10];
        export.read_at(3990, &mut before).unwrap();
        assert_eq!(before, vec![0u8; 10]);
    }

    #[test]
    fn trim_frees_whole_chunks_and_zeroes_partial_ones() {
        let export = MemExport::new(4 * MEM_CHUNK_BYTES);
        export
            .write_at(0, &vec![7u8; 4 * MEM_CHUNK_BYTES as usize], false)
            .unwrap();
        assert_eq!(export.allocated_chunks(), 4);
        export.trim(100, 2 * MEM_CHUNK_BYTES, false).unwrap();
        assert_eq!(export.allocated_chunks(), 3);
        let mut back = vec![9u8; 4 * MEM_CHUNK_BYTES as usize];
        export.read_at(0, &mut back).unwrap();
        assert!(back[..100].iter().all(|&b| b == 7));
        assert!(back[100..100 + 2 * MEM_CHUNK_BYTES as usize]
            .iter()
            .all(|&b| b == 0));
        let status = export.block_status(0, 4 * MEM_CHUNK_BYTES).unwrap();
        assert_eq!(
            status,
            vec![
                Extent::data(MEM_CHUNK_BYTES),
                Extent::hole(MEM_CHUNK_BYTES),
                Extent::data(2 * MEM_CHUNK_BYTES)
            ]
        );
    }

    #[test]
    fn write_zeroes_without_trim_stays_allocated() {
        let export = MemExport::new(2 * MEM_CHUNK_BYTES);
        export
            .write_zeroes(0, 2 * MEM_CHUNK_BYTES, false, false)
            .unwrap();
        assert_eq!(export.allocated_chunks(), 2);
        export
            .write_zeroes(0, 2 * MEM_CHUNK_BYTES, true, false)
            .unwrap();
        assert_eq!(export.allocated_chunks(), 0);
    }

    #[test]
    fn rejects_out_of_range_and_read_only() {
        let export = MemExport::new(MEM_CHUNK_BYTES);
        let mut buf = [0u8; 2];
        assert!(export.read_at(MEM_CHUNK_BYTES - 1, &mut buf).is_err());
        assert!(export.read_at(u64::MAX, &mut buf).is_err());
        let ro = MemExport::new(MEM_CHUNK_BYTES).read_only();
        let error = ro.write_at(0, &[1], false).unwrap_err();
        assert_eq!(error.kind, crate::export::ErrorKind::Permission);
    }
}
