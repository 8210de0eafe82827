//! Storage in RAM (what `zbd bench engine` measures the engine on).

use super::Storage;
use crate::error::{Error, Result};
use std::io;

/// A volume in RAM, gone when dropped: what `zbd bench engine` measures the engine on, so that
/// its figures are the engine's own cost (no system call, page cache or device below it).
/// Stripes of 1 MiB, each behind its own lock, so that I/O threads and readers rarely meet.
pub struct MemStorage {
    stripes: Vec<parking_lot::RwLock<Box<[u8]>>>,
    len: u64,
}

const MEM_STRIPE_BYTES: u64 = 1 << 20;

impl MemStorage {
    /// `len` zeroed bytes.
    pub fn new(len: u64) -> Self {
        let stripes = (0..len.div_ceil(MEM_STRIPE_BYTES))
            .map(|i| {
                let n = (len - i * MEM_STRIPE_BYTES).min(MEM_STRIPE_BYTES) as usize;
                let mut stripe = vec![0u8; n].into_boxed_slice();
                // Touched now, so that no write pays the page faults of first use.
                stripe.fill(0);
                parking_lot::RwLock::new(stripe)
            })
            .collect();
        MemStorage { stripes, len }
    }

    /// Calls `f(stripe, offset in it, range of the caller's buffer)` for every stripe that
    /// `offset..offset + len` covers; refuses a range past the end.
    fn each(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&parking_lot::RwLock<Box<[u8]>>, usize, std::ops::Range<usize>),
    ) -> Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{len} bytes at {offset}: past the end of {} bytes in RAM",
                    self.len
                ),
            )));
        }
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let within = (at % MEM_STRIPE_BYTES) as usize;
            let n = (MEM_STRIPE_BYTES as usize - within).min(len - done);
            f(
                &self.stripes[(at / MEM_STRIPE_BYTES) as usize],
                within,
                done..done + n,
            );
            done += n;
        }
        Ok(())
    }
}

impl Storage for MemStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.each(offset, buf.len(), |s, at, r| {
            let n = r.len();
            buf[r].copy_from_slice(&s.read()[at..at + n]);
        })
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.each(offset, data.len(), |s, at, r| {
            s.write()[at..at + r.len()].copy_from_slice(&data[r]);
        })
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
        // Best effort, like a device without discard: the bytes stay.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_storage_reads_back_writes_across_stripes_and_refuses_the_end() {
        let len = 3 * MEM_STRIPE_BYTES + 1000;
        let s = MemStorage::new(len);
        assert_eq!(s.len_bytes().expect("len"), len);
        // Spans the first two stripe boundaries.
        let data: Vec<u8> = (0..2 * MEM_STRIPE_BYTES + 2000)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        let at = MEM_STRIPE_BYTES - 2500;
        s.write_at(at, &data).expect("write");
        let mut back = vec![0u8; data.len() + 2];
        s.read_at(at - 1, &mut back).expect("read");
        assert_eq!(back[0], 0, "byte before the write changed");
        assert_eq!(
            &back[1..=data.len()],
            &data[..],
            "bytes differ across stripes"
        );
        assert_eq!(back[data.len() + 1], 0, "byte after the write changed");
        // The last, short stripe and the end.
        s.write_at(len - 10, &[9; 10]).expect("write at the end");
        let mut tail = [0u8; 10];
        s.read_at(len - 10, &mut tail).expect("read at the end");
        assert_eq!(tail, [9; 10]);
        assert!(s.write_at(len - 9, &[1; 10]).is_err(), "write past the end");
        assert!(s.read_at(len, &mut [0u8; 1]).is_err(), "read past the end");
        assert!(
            s.read_at(u64::MAX, &mut [0u8; 2]).is_err(),
            "offset overflow"
        );
        s.sync().expect("sync");
    }
}
