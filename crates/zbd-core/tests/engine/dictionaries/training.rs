//! Trained dictionaries in the engine (dicts.rs): a volume trains one from its first
//! compressible blocks, installs it crash-safely, names it in every block that uses it, keeps it
//! through the cleaner and reopen, and survives damage to one copy of it; damage to both turns
//! exactly the blocks that need it into read errors.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::path::PathBuf;
use std::sync::Arc;
use zbd_core::format::{Checkpoint, Superblock, CKPT_FLAG_DICTIONARIES};
use zbd_core::{Codec, CreateOptions, Error, OpenOptions, SimStorage, Volume};

/// 16 MiB: a 16 KiB dictionary region, so an 8 KiB dictionary trained on ~800 KiB of blocks.
const SIZE: u64 = 16 << 20;

/// Single 4 KiB blocks unless `unit` says otherwise: where a dictionary pays most (a volume
/// adopts one only if it saves >= 1 % on held-out units).
fn create_opts(codec: Codec) -> CreateOptions {
    create_opts_unit(codec, 4096)
}

fn create_opts_unit(codec: Codec, unit: u32) -> CreateOptions {
    CreateOptions {
        unit_bytes: Some(unit),
        ..small_volume(SIZE, 32768, codec, 2, 16)
    }
}

fn dict_opts(on: bool) -> OpenOptions {
    OpenOptions {
        dictionary: Some(on),
        ..open_opts()
    }
}

fn reopen(disk: &Arc<SimStorage>, vol: Volume, on: bool) -> Volume {
    vol.close().expect("close");
    drop(vol);
    Volume::open(Box::new(Arc::clone(disk)), dict_opts(on)).expect("reopen")
}

fn read_all(vol: &Volume, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    vol.read(0, &mut b).expect("read");
    b
}

/// Flags of the newest valid checkpoint on `disk`.
fn checkpoint(disk: &SimStorage) -> (Superblock, Checkpoint) {
    newest_checkpoint(&disk.current_image())
}

/// Writes `data` in 64 KiB requests; returns the byte offset where the first dictionary was
/// in use (every block written from there on may use it).
fn write_chunks(vol: &Volume, data: &[u8]) -> Option<usize> {
    let mut installed = None;
    for (i, c) in data.chunks(64 << 10).enumerate() {
        vol.write((i * (64 << 10)) as u64, c, false).expect("write");
        if installed.is_none() && !vol.stats().dictionaries.is_empty() {
            installed = Some((i + 1) * (64 << 10));
        }
    }
    installed
}

#[test]
fn dictionary_volumes_store_less_and_read_back_after_reopen() {
    let data = log_records(1, 4 << 20);
    let mut live = Vec::new();
    for codec in [Codec::Zstd(1), Codec::Lz4] {
        for on in [false, true] {
            let (disk, vol) = sim_volume_with(&create_opts(codec), dict_opts(on));
            let installed = write_chunks(&vol, &data);
            assert_eq!(installed.is_some(), on, "{codec} dict {on}");
            assert!(
                read_all(&vol, data.len()) == data,
                "{codec} {on}: data differs"
            );
            let s = vol.stats();
            assert_eq!(s.dictionaries.len(), usize::from(on));
            assert!(s.dictionaries.iter().all(|d| d.active && d.loaded));
            // `zbd stat`: blocks with and without a dictionary (those before the install).
            assert!(s.savings_known);
            assert_eq!(s.dict_blocks > 0, on, "{codec} {on}: {s:?}");
            assert!(s.nodict_blocks > 0 && s.nodict_ratio > 1.0, "{s:?}");
            assert_eq!(
                s.dict_blocks + s.nodict_blocks + s.raw_blocks,
                s.data_blocks
            );
            if on {
                assert!(
                    s.dict_ratio > s.nodict_ratio,
                    "{codec}: with {} without {}",
                    s.dict_ratio,
                    s.nodict_ratio
                );
            }
            live.push((codec, on, s.physical_bytes_live));
            let flag = checkpoint(&disk).1.flags & CKPT_FLAG_DICTIONARIES != 0;
            assert_eq!(
                flag, on,
                "{codec}: flag bit 9 only once a dictionary is stored"
            );
            // Reopened with dictionaries off: stored ones still read, none is added.
            let vol = reopen(&disk, vol, false);
            assert!(
                read_all(&vol, data.len()) == data,
                "{codec} {on}: after reopen"
            );
            let s2 = vol.stats();
            assert_eq!(s2.dictionaries.len(), usize::from(on));
            assert_eq!(
                (s2.dict_blocks, s2.dict_ratio, s2.nodict_blocks),
                (s.dict_blocks, s.dict_ratio, s.nodict_blocks),
                "persisted with the checkpoint"
            );
            assert!(vol.check(&|_, _| {}).is_clean());
        }
    }
    for pair in live.chunks(2) {
        let ((c, _, off), (_, _, on)) = (pair[0], pair[1]);
        assert!(
            on < off,
            "{c}: with a dictionary {on} bytes live, without {off}"
        );
    }
}

/// Up to `max` bytes of 4 KiB blocks of real files (docs and binaries of this machine).
fn real_files(max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = ["/usr/share/doc", "/usr/bin"]
        .iter()
        .map(PathBuf::from)
        .collect();
    while let Some(p) = stack.pop() {
        if out.len() >= max {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                let mut e: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
                e.sort();
                stack.extend(e.into_iter().rev());
            }
        } else if meta.is_file() && meta.len() >= 4096 && meta.len() < 16 << 20 {
            if let Ok(d) = std::fs::read(&p) {
                out.extend_from_slice(&d[..(d.len() / 4096 * 4096).min(64 << 10)]);
            }
        }
    }
    out.truncate(out.len().min(max) / 4096 * 4096);
    out
}

#[test]
fn real_files_round_trip_with_a_dictionary() {
    let data = real_files(6 << 20);
    if data.len() < 2 << 20 {
        eprintln!("skipped: only {} bytes of real files found", data.len());
        return;
    }
    let (disk, vol) = sim_volume_with(&create_opts(Codec::Zstd(1)), dict_opts(true));
    write_chunks(&vol, &data);
    assert!(read_all(&vol, data.len()) == data);
    let vol = reopen(&disk, vol, true);
    assert!(read_all(&vol, data.len()) == data);
    // Written again after reopen, with the stored dictionary.
    let again = log_records(5, 1 << 20);
    vol.write(8 << 20, &again, false).expect("write");
    let mut b = vec![0u8; again.len()];
    vol.read(8 << 20, &mut b).expect("read");
    assert!(b == again);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// One run: writes `data` in 64 KiB requests with a flush after every fourth, until the disk
/// loses power at storage operation `crash_at`; then recovers and checks every block: flushed
/// ones read back exactly, the others read back as written or as zeros, never an error.
fn crash_run(data: &[u8], crash_at: u64, seed: u64) {
    let (disk, vol) = sim_volume_with(&create_opts(Codec::Zstd(1)), dict_opts(true));
    disk.set_power_loss_at(disk.ops() + crash_at);
    let chunk = 64 << 10;
    let mut flushed = 0usize;
    let mut written = 0usize;
    for (i, c) in data.chunks(chunk).enumerate() {
        if vol.write((i * chunk) as u64, c, false).is_err() {
            break;
        }
        written = (i + 1) * chunk;
        if i % 4 == 3 {
            if vol.flush().is_err() {
                break;
            }
            flushed = written;
        }
    }
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
    drop(vol);
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_opts(true))
        .unwrap_or_else(|e| panic!("crash at {crash_at}: open: {e}"));
    for lba in 0..(written.min(data.len()) / BS) {
        let got = read_block(&vol, lba as u64)
            .unwrap_or_else(|e| panic!("crash at {crash_at}: block {lba}: {e}"));
        let want = &data[lba * BS..(lba + 1) * BS];
        if lba * BS < flushed {
            assert!(
                got == want,
                "crash at {crash_at}: flushed block {lba} differs"
            );
        } else {
            assert!(
                got == want || got.iter().all(|&b| b == 0),
                "crash at {crash_at}: block {lba}"
            );
        }
    }
    // The recovered volume goes on writing (and trains or uses its dictionary).
    let more = log_records(seed + 7, 1 << 20);
    vol.write(4 << 20, &more, false)
        .expect("write after recovery");
    vol.flush().expect("flush");
    let mut b = vec![0u8; more.len()];
    vol.read(4 << 20, &mut b).expect("read");
    assert!(b == more, "crash at {crash_at}: written after recovery");
}

#[test]
fn crash_at_every_storage_operation_of_a_dictionary_install() {
    let data = log_records(3, 2 << 20);
    // Find the storage operations of the install: the write request during which it happened.
    let (disk, vol) = sim_volume_with(&create_opts(Codec::Zstd(1)), dict_opts(true));
    let base = disk.ops();
    let chunk = 64 << 10;
    let mut window = None;
    for (i, c) in data.chunks(chunk).enumerate() {
        let before = disk.ops() - base;
        vol.write((i * chunk) as u64, c, false).expect("write");
        if i % 4 == 3 {
            vol.flush().expect("flush");
        }
        if window.is_none() && !vol.stats().dictionaries.is_empty() {
            window = Some((before, disk.ops() - base));
        }
    }
    let total = disk.ops() - base;
    let (lo, hi) = window.expect("a dictionary was installed");
    drop(vol);
    let mut points: Vec<u64> = (lo..=hi).collect();
    points.extend((0..total).step_by(7));
    points.sort_unstable();
    points.dedup();
    for (n, at) in points.into_iter().enumerate() {
        crash_run(&data, at, n as u64);
    }
}

/// A closed volume whose first `split` bytes were written before its dictionary was in use.
fn closed_dictionary_volume(opts: &CreateOptions) -> (Arc<SimStorage>, Vec<u8>, usize) {
    let data = log_records(9, 3 << 20);
    let (disk, vol) = sim_volume_with(opts, dict_opts(true));
    let split = write_chunks(&vol, &data).expect("installed");
    vol.close().expect("close");
    (disk, data, split)
}

#[test]
fn a_damaged_dictionary_copy_is_survived_and_both_are_errors_never_data() {
    // One copy damaged (each in turn): every block reads; check says it was repaired.
    for copy in 0..2 {
        let (disk, data, _) = closed_dictionary_volume(&create_opts(Codec::Zstd(1)));
        let (sb, ck) = checkpoint(&disk);
        let e = ck.dicts.iter().find(|d| d.id != 0).expect("entry");
        disk.flip_bit(sb.dict_offset[copy] + u64::from(e.region_offset) + 100, 3);
        let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_opts(true)).expect("open");
        assert!(read_all(&vol, data.len()) == data, "copy {copy} damaged");
        let r = vol.check(&|_, _| {});
        assert!(r.is_clean(), "{:?}", r.metadata_problems);
        assert!(
            r.repaired.iter().any(|l| l.contains("dictionary")),
            "{:?}",
            r.repaired
        );
        // The open rewrote the damaged copy from the other: the other can go now.
        vol.close().expect("close");
        drop(vol);
        disk.flip_bit(
            sb.dict_offset[1 - copy] + u64::from(e.region_offset) + 100,
            3,
        );
        let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_opts(true)).expect("open");
        assert!(
            read_all(&vol, data.len()) == data,
            "copy {copy} repaired, then the other"
        );
    }
    // Both damaged: blocks that need it are errors, never data; the others read.
    let (disk, data, split) = closed_dictionary_volume(&create_opts(Codec::Zstd(1)));
    let (sb, ck) = checkpoint(&disk);
    let e = ck.dicts.iter().find(|d| d.id != 0).expect("entry");
    for copy in 0..2 {
        disk.flip_bit(sb.dict_offset[copy] + u64::from(e.region_offset) + 100, 3);
    }
    let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_opts(true)).expect("open");
    let mut errors = 0;
    for lba in 0..data.len() / BS {
        match read_block(&vol, lba as u64) {
            Ok(b) => assert!(
                b == data[lba * BS..(lba + 1) * BS],
                "block {lba}: wrong data"
            ),
            Err(Error::Corrupt { .. }) => {
                assert!(
                    lba * BS >= split - (64 << 10),
                    "block {lba} written before the install"
                );
                errors += 1;
            }
            Err(e) => panic!("block {lba}: {e}"),
        }
    }
    assert!(errors > 0, "no block used the dictionary");
    let r = vol.check(&|_, _| {});
    assert!(r.metadata_problems.iter().any(|l| l.contains("dictionary")));
    assert_eq!(r.damaged_blocks.len(), errors);
    assert!(vol.stats().dictionaries.iter().any(|d| !d.loaded));
}

#[test]
fn the_cleaner_keeps_dictionary_ids() {
    // lz4 in 16 KiB units: the cleaner copies units at least half live verbatim (dictionary id
    // kept) and recompresses the others, decoding them with their dictionary.
    let (disk, data, _) = closed_dictionary_volume(&create_opts_unit(Codec::Lz4, 16384));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_opts(true)).expect("open");
    // Overwrite three blocks of every other unit: those units mostly dead, the others whole.
    let mut model = data.clone();
    let patch = log_records(11, 12288);
    for at in (0..data.len()).step_by(32768) {
        vol.write(at as u64, &patch, false).expect("write");
        model[at..at + 12288].copy_from_slice(&patch);
    }
    let moved = vol.compact(&|_, _| {}).expect("compact");
    assert!(moved.victims > 0, "the cleaner did nothing");
    assert!(read_all(&vol, model.len()) == model);
    let vol = reopen(&disk, vol, true);
    assert!(read_all(&vol, model.len()) == model);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// `zbd create --dict on` stores the setting in the superblock: an open that does not say
/// (`OpenOptions::dictionary: None`, what `zbd serve` passes without `--dict`) trains and uses
/// dictionaries; one that says `off` does not; volumes created without it stay off.
#[test]
fn the_volume_setting_decides_unless_the_open_says() {
    let data = log_records(3, 2 << 20);
    for (setting, open, trains) in [
        (true, None, true),
        (true, Some(false), false),
        (false, None, false),
        (false, Some(true), true),
    ] {
        let create = CreateOptions {
            dictionary: setting,
            ..create_opts(Codec::Lz4)
        };
        let opts = OpenOptions {
            dictionary: open,
            ..open_opts()
        };
        let (disk, vol) = sim_volume_with(&create, opts.clone());
        let s = vol.stats();
        assert_eq!(
            (s.dictionary, s.dictionary_setting),
            (trains, setting),
            "{setting} {open:?}"
        );
        assert_eq!(
            write_chunks(&vol, &data).is_some(),
            trains,
            "{setting} {open:?}"
        );
        vol.close().expect("close");
        drop(vol);
        // The setting survives a reopen (it is in the superblock, not the open).
        let vol = Volume::open(Box::new(Arc::clone(&disk)), opts).expect("reopen");
        assert_eq!(vol.stats().dictionary, trains);
        assert!(read_all(&vol, data.len()) == data, "data differs");
    }
}
