//! O_DIRECT backing files: a volume written, closed and reopened through direct I/O reads back
//! exactly (unaligned reads widened, aligned writes only), and the storage refuses an
//! unaligned write with an error instead of issuing it.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use zbd_core::{CreateOptions, Error, FileStorage, OpenOptions, Storage, Volume};

/// A temp directory on a real file system (the target dir; /tmp may be tmpfs elsewhere).
fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn direct(path: &std::path::Path, len: u64) -> Option<FileStorage> {
    let s = FileStorage::create(path, len).expect("create file");
    match s.into_direct(path) {
        Ok(s) => Some(s),
        Err(Error::Invalid(why)) => {
            eprintln!("SKIPPED: no O_DIRECT here: {why}");
            None
        }
        Err(e) => panic!("into_direct: {e}"),
    }
}

#[test]
fn direct_storage_reads_unaligned_and_refuses_unaligned_writes() {
    let d = dir();
    let path = d.path().join("raw");
    let Some(s) = direct(&path, 1 << 20) else {
        return;
    };
    assert!(s.is_direct());
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    s.write_at(4096, &data).expect("aligned write");
    let mut b = vec![0u8; 1000];
    s.read_at(4096 + 777, &mut b).expect("unaligned read");
    assert_eq!(b, data[777..1777]);
    assert!(s.write_at(4096 + 100, &data[..512]).is_err());
    assert!(s.write_at(4096, &data[..100]).is_err());
}

#[test]
fn volume_on_direct_storage_round_trips() {
    let d = dir();
    let path = d.path().join("vol");
    let opts = CreateOptions::new(4 << 20);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let Some(s) = direct(&path, sb.total_bytes()) else {
        return;
    };
    let mut rng = SmallRng::seed_from_u64(13);
    let data = fill(&mut rng, Fill::Text, 3 << 20);
    let vol = Volume::create(Box::new(s), &opts).expect("create");
    vol.write(12345, &data, false).expect("write");
    let guard = super::fork_guard();
    vol.close().expect("close");
    drop(vol);
    let s = FileStorage::open(&path, true)
        .expect("open")
        .into_direct(&path)
        .expect("direct again");
    drop(guard);
    let vol = Volume::open(Box::new(s), OpenOptions::default()).expect("reopen");
    let mut back = vec![0u8; data.len()];
    vol.read(12345, &mut back).expect("read");
    assert!(back == data, "data read back through O_DIRECT differs");
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// With O_DIRECT the ranges of one batch are read concurrently (`read_many`): every range gets
/// its own bytes, unaligned ones included, and a range past the end fails alone.
#[test]
fn direct_storage_reads_a_batch_of_ranges() {
    let d = dir();
    let path = d.path().join("batch");
    let Some(s) = direct(&path, 1 << 20) else {
        return;
    };
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    s.write_at(0, &data).expect("write");
    let at = [
        (0u64, 4096usize),
        (8192 + 17, 3000),
        (1 << 19, 65536),
        (900_000, 100),
    ];
    let mut bufs: Vec<Vec<u8>> = at.iter().map(|&(_, n)| vec![0u8; n]).collect();
    let mut past_end = vec![0u8; 512];
    let mut reads: Vec<(u64, &mut [u8])> = at
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(o, _), b)| (o, b.as_mut_slice()))
        .collect();
    reads.push((1 << 20, past_end.as_mut_slice()));
    let results = s.read_many(&mut reads);
    drop(reads);
    assert!(results[..4].iter().all(|r| r.is_ok()), "{results:?}");
    assert!(results[4].is_err(), "a read past the end succeeded");
    for (&(o, n), b) in at.iter().zip(&bufs) {
        assert!(
            b[..] == data[o as usize..o as usize + n],
            "range at {o} misread"
        );
    }
}
