//! A simulated disk for crash and fault tests: it forgets unflushed writes, tears writes at
//! 512-byte sector granularity, reorders them, fails syncs the way Linux does (the unsynced
//! writes are dropped, some or all, the error is reported once and the next sync succeeds), and
//! flips bits, all driven by a caller's seeded RNG so any failure replays from its seed.

use crate::backend::Storage;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::io;

/// Sector size at which the simulated medium tears writes.
pub const SIM_SECTOR_BYTES: usize = 512;

#[derive(Debug, Default)]
struct SimState {
    /// What reads see: durable image plus every pending write, in order.
    current: Vec<u8>,
    /// What survives a crash for sure.
    durable: Vec<u8>,
    /// Writes (and discards, as zero writes) since the last sync, in issue order.
    pending: Vec<(u64, Vec<u8>)>,
    /// Storage operations performed (writes, discards, syncs).
    ops: u64,
    /// Operation number at which power is lost.
    power_loss_at: Option<u64>,
    powered_off: bool,
    /// The first sync at or after this operation number fails (and drops pending writes).
    fail_sync_at: Option<u64>,
    /// Decides which dropped writes reach the medium anyway (seeded).
    sync_fail_rng: Option<SmallRng>,
    sync_failures: u64,
    bytes_written: u64,
    bytes_read: u64,
    syncs: u64,
}

/// In-memory storage with explicit durability (see module doc).
#[derive(Debug, Default)]
pub struct SimStorage {
    state: Mutex<SimState>,
}

fn power_lost() -> Error {
    Error::Io(io::Error::other("simulated power loss"))
}

impl SimStorage {
    /// A zero-filled disk of `len` bytes.
    pub fn new(len: usize) -> Self {
        Self::from_image(vec![0; len])
    }

    /// A disk whose durable content is `image`.
    pub fn from_image(image: Vec<u8>) -> Self {
        let state = SimState {
            current: image.clone(),
            durable: image,
            ..SimState::default()
        };
        SimStorage {
            state: Mutex::new(state),
        }
    }

    /// Loses power when the `op`-th storage operation (0-based, counting writes, discards and
    /// syncs) starts: a write in flight at that moment joins the pending set (so it may survive,
    /// torn or whole), and every later operation fails.
    pub fn set_power_loss_at(&self, op: u64) {
        self.state.lock().power_loss_at = Some(op);
    }

    /// Makes the first sync at or after storage operation `op` fail like a Linux fsync that hit a
    /// writeback error: each write since the last sync reaches the medium whole, torn or not at
    /// all (chosen by an RNG seeded with `seed`), the pages count as clean (reads still see the
    /// written data), the sync reports EIO, and the next sync succeeds.
    pub fn fail_sync_at(&self, op: u64, seed: u64) {
        let mut st = self.state.lock();
        st.fail_sync_at = Some(op);
        st.sync_fail_rng = Some(SmallRng::seed_from_u64(seed));
    }

    /// Syncs that failed so far.
    pub fn sync_failures(&self) -> u64 {
        self.state.lock().sync_failures
    }

    /// Whether power was lost.
    pub fn powered_off(&self) -> bool {
        self.state.lock().powered_off
    }

    /// Storage operations so far.
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// Bytes written so far (writes and discards).
    pub fn bytes_written(&self) -> u64 {
        self.state.lock().bytes_written
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.state.lock().bytes_read
    }

    /// Syncs so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// The disk as it would be after a crash now: the durable image plus any subset of the pending
    /// writes, applied in a random order, each possibly torn to a random subset of its sectors.
    pub fn crash_image(&self, rng: &mut impl Rng) -> Vec<u8> {
        let st = self.state.lock();
        let mut image = st.durable.clone();
        let mut order: Vec<usize> = (0..st.pending.len()).collect();
        order.shuffle(rng);
        for i in order {
            let (offset, data) = &st.pending[i];
            match rng.random_range(0..3) {
                0 => {}
                1 => apply(&mut image, *offset, data, None),
                _ => apply(&mut image, *offset, data, Some(rng)),
            }
        }
        image
    }

    /// The image with every write applied (a clean shutdown).
    pub fn current_image(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// Flips one bit in both the visible and the durable image.
    pub fn flip_bit(&self, byte: u64, bit: u8) {
        let mut st = self.state.lock();
        let i = byte as usize;
        if i < st.current.len() {
            st.current[i] ^= 1 << (bit % 8);
            st.durable[i] ^= 1 << (bit % 8);
        }
    }

    /// Counts one operation; returns true if power goes out at this operation.
    fn tick(st: &mut SimState) -> Result<bool> {
        if st.powered_off {
            return Err(power_lost());
        }
        let n = st.ops;
        st.ops += 1;
        if st.power_loss_at == Some(n) {
            st.powered_off = true;
            return Ok(true);
        }
        Ok(false)
    }

    fn record_write(st: &mut SimState, offset: u64, data: Vec<u8>) -> Result<()> {
        let end = offset as usize + data.len();
        if end > st.current.len() {
            return Err(Error::Io(io::Error::other(
                "write past the end of the simulated disk",
            )));
        }
        st.current[offset as usize..end].copy_from_slice(&data);
        st.bytes_written += data.len() as u64;
        st.pending.push((offset, data));
        Ok(())
    }
}

fn apply(image: &mut [u8], offset: u64, data: &[u8], torn: Option<&mut dyn rand::RngCore>) {
    let start = offset as usize;
    match torn {
        None => image[start..start + data.len()].copy_from_slice(data),
        Some(rng) => {
            // Sectors are aligned to the disk, not to the write.
            let mut pos = start;
            let end = start + data.len();
            while pos < end {
                let next = ((pos / SIM_SECTOR_BYTES) + 1) * SIM_SECTOR_BYTES;
                let next = next.min(end);
                if rng.random_bool(0.5) {
                    image[pos..next].copy_from_slice(&data[pos - start..next - start]);
                }
                pos = next;
            }
        }
    }
}

impl Storage for SimStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.state.lock().current.len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut st = self.state.lock();
        st.bytes_read += buf.len() as u64;
        if st.powered_off {
            return Err(power_lost());
        }
        let start = offset as usize;
        let end = start + buf.len();
        if end > st.current.len() {
            return Err(Error::CorruptMetadata(format!(
                "read past the end of the storage at byte {offset}"
            )));
        }
        buf.copy_from_slice(&st.current[start..end]);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut st = self.state.lock();
        let lost = Self::tick(&mut st)?;
        Self::record_write(&mut st, offset, data.to_vec())?;
        if lost {
            return Err(power_lost());
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let mut st = self.state.lock();
        let n = st.ops;
        if Self::tick(&mut st)? {
            return Err(power_lost());
        }
        let pending = std::mem::take(&mut st.pending);
        if st.fail_sync_at.is_some_and(|at| n >= at) {
            st.fail_sync_at = None;
            st.sync_failures += 1;
            let mut rng = st
                .sync_fail_rng
                .take()
                .unwrap_or_else(|| SmallRng::seed_from_u64(n));
            let SimState { durable, .. } = &mut *st;
            for (offset, data) in &pending {
                match rng.random_range(0..3) {
                    0 => {}
                    1 => apply(durable, *offset, data, None),
                    _ => apply(durable, *offset, data, Some(&mut rng)),
                }
            }
            return Err(Error::Io(io::Error::other(
                "simulated sync failure (EIO): unsynced writes dropped",
            )));
        }
        for (offset, data) in pending {
            let start = offset as usize;
            st.durable[start..start + data.len()].copy_from_slice(&data);
        }
        st.syncs += 1;
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let mut st = self.state.lock();
        let lost = Self::tick(&mut st)?;
        Self::record_write(&mut st, offset, vec![0; len as usize])?;
        if lost {
            return Err(power_lost());
        }
        Ok(())
    }
}
