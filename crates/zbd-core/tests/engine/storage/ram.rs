//! `MemStorage` (what `zbd bench engine --ram` measures): the engine reopens on the same RAM
//! with everything, and the storage matches a byte vector across its stripes.

use crate::common::*;
use crate::write::extent_buffer::mixed;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, Volume};

/// The engine on `MemStorage` (what `zbd bench engine --ram` measures): after a close, a reopen
/// on the same RAM reads everything back, and the volume checks clean. (Extents are aligned to
/// their size, at most 1 MiB: the engine's segments never cross a stripe; the next test does.)
#[test]
fn engine_on_ram_storage_reads_back_across_reopen() {
    let opts = CreateOptions {
        extent_bytes: 128 << 10,
        codec: Codec::Lz4,
        queue_len: Some(16),
        ..CreateOptions::new(6 << 20)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let ram = Arc::new(zbd_core::MemStorage::new(sb.total_bytes()));
    let vol = Volume::create_with(Box::new(Arc::clone(&ram)), &opts, open_opts()).expect("create");
    let mut rng = SmallRng::seed_from_u64(40);
    let mut model = vec![0u8; opts.logical_bytes as usize];
    for _ in 0..300 {
        let offset = rng.random_range(0..model.len() as u64 - 1);
        let len = rng.random_range(1..=(100 << 10).min(model.len() as u64 - offset));
        let data = mixed(&mut rng, len as usize);
        vol.write(offset, &data, false).expect("write");
        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
    }
    vol.close().expect("close");
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&ram)), open_opts()).expect("reopen");
    let mut back = vec![0u8; model.len()];
    vol.read(0, &mut back).expect("read");
    assert!(back == model, "read back differs");
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// `MemStorage` against a byte vector: random reads and writes of up to 3 MiB at any offset
/// (most cross one or more of its 1 MiB stripes, some end exactly at its end), and ranges past
/// the end refused without a change.
#[test]
fn ram_storage_matches_a_byte_vector() {
    use zbd_core::Storage;
    let len = (5 << 20) + 777;
    let ram = zbd_core::MemStorage::new(len as u64);
    let mut model = vec![0u8; len];
    let mut rng = SmallRng::seed_from_u64(41);
    for _ in 0..200 {
        let at = if rng.random_bool(0.1) {
            len - rng.random_range(0..=4096)
        } else {
            rng.random_range(0..len)
        };
        let n = rng.random_range(0..=(3 << 20)).min(len - at);
        if rng.random_bool(0.5) {
            let data = fill(&mut rng, Fill::Random, n);
            ram.write_at(at as u64, &data).expect("write");
            model[at..at + n].copy_from_slice(&data);
        } else {
            let mut b = vec![0u8; n];
            ram.read_at(at as u64, &mut b).expect("read");
            assert!(b == model[at..at + n], "{n} bytes at {at} differ");
        }
        let past = rng.random_range(1..=4096);
        assert!(ram
            .write_at((len - past + 1) as u64, &vec![1; past])
            .is_err());
        assert!(ram.read_at(len as u64 + 1, &mut []).is_err());
    }
    let mut all = vec![0u8; len];
    ram.read_at(0, &mut all).expect("read all");
    assert!(all == model, "contents differ");
}
