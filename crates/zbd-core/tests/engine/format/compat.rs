//! Format compatibility: the committed volumes of every format version (made by `make_fixture`,
//! gzip'd) must keep opening and reading back their known content, and damage to them must be
//! reported, not returned. A format change bumps FORMAT_VERSION and adds a new fixture next to
//! these. Version-1 volumes stay writable under their own rules.

use flate2::read::GzDecoder;
use rand::SeedableRng;
use std::io::Read;
use std::sync::Arc;
use zbd_core::format::{CKPT_FLAGS_INCOMPAT, CKPT_FLAGS_INCOMPAT_KNOWN};
use zbd_core::{Codec, CreateOptions, Error, OpenOptions, SimStorage, Volume};

const FIXTURES: [(u32, &str); 3] = [
    (
        1,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v1-small.zbd.gz"
        ),
    ),
    (
        2,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v2-small.zbd.gz"
        ),
    ),
    (
        3,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v3-small.zbd.gz"
        ),
    ),
];
const SIZE: u64 = 256 * 1024;

/// Content of block `lba`: text-like for even blocks, a zero block every 5th, bytes otherwise.
fn expected_block(lba: u64) -> Vec<u8> {
    if lba % 5 == 4 {
        return vec![0; 4096];
    }
    (0..4096u64)
        .map(|i| {
            if lba.is_multiple_of(2) {
                b"v1 block text "[(i % 14) as usize]
            } else {
                (i * 7 + lba * 13) as u8
            }
        })
        .collect()
}

fn load(path: &str) -> Vec<u8> {
    let mut gz = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut gz))
        .expect("fixture");
    let mut img = Vec::new();
    GzDecoder::new(&gz[..])
        .read_to_end(&mut img)
        .expect("gunzip");
    img
}

fn opts() -> OpenOptions {
    OpenOptions {
        background_cleaner: false,
        ..OpenOptions::default()
    }
}

#[test]
fn fixtures_open_and_read_back() {
    for (version, path) in FIXTURES {
        let vol = Volume::open_read_only(Box::new(SimStorage::from_image(load(path))))
            .unwrap_or_else(|e| panic!("open v{version}: {e}"));
        assert_eq!(vol.stats().format_version, version);
        for lba in 0..SIZE / 4096 {
            let mut b = vec![0u8; 4096];
            vol.read(lba * 4096, &mut b).expect("read");
            assert!(b == expected_block(lba), "v{version} block {lba}");
        }
        assert!(vol.check(&|_, _| {}).is_clean());
        // The tail of the fixture was written after its last checkpoint: recovery replays it.
        assert!(vol.stats().recovery_records_replayed > 0);
    }
}

#[test]
fn fixture_damage_is_reported() {
    for (version, path) in FIXTURES {
        let mut img = load(path);
        let disk = SimStorage::from_image(img.clone());
        let data_offset = Volume::open_read_only(Box::new(disk))
            .expect("open")
            .superblock()
            .data_offset as usize;
        img[data_offset + 100] ^= 0x10;
        let vol = Volume::open(Box::new(Arc::new(SimStorage::from_image(img))), opts())
            .expect("open damaged");
        let report = vol.check(&|_, _| {});
        assert_eq!(report.damaged_blocks.len(), 1, "v{version}: {report:?}");
        let mut b = vec![0u8; 4096];
        let lba = report.damaged_blocks[0];
        assert!(matches!(
            vol.read(lba * 4096, &mut b),
            Err(Error::Corrupt { .. })
        ));
    }
}

/// A version-1 volume stays writable, keeps version 1 (its own segment and checkpoint rules),
/// and survives a crash like any other.
#[test]
fn v1_volume_stays_writable_under_its_own_rules() {
    let disk = Arc::new(SimStorage::from_image(load(FIXTURES[0].1)));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts()).expect("open v1 writable");
    let fresh = vec![0x5a; 4096];
    vol.write(3 * 4096, &fresh, false).expect("write");
    vol.flush().expect("flush");
    vol.abandon();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let vol = Volume::open(
        Box::new(SimStorage::from_image(disk.crash_image(&mut rng))),
        opts(),
    )
    .expect("reopen after crash");
    assert_eq!(vol.stats().format_version, 1);
    let mut b = vec![0u8; 4096];
    vol.read(3 * 4096, &mut b).expect("read");
    assert_eq!(b, fresh);
    for lba in (0..SIZE / 4096).filter(|&l| l != 3) {
        vol.read(lba * 4096, &mut b).expect("read");
        assert!(b == expected_block(lba), "block {lba}");
    }
}

/// The committed v2 volume upgrades in place (after replaying its log tail) and reads back
/// every block under v3, LBA 0 included; `check` is clean.
#[test]
fn v2_fixture_upgrades_and_reads_back() {
    let disk = Arc::new(SimStorage::from_image(load(FIXTURES[1].1)));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts()).expect("open v2 writable");
    assert_eq!(vol.close_upgraded().expect("upgrade").version, 3);
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts()).expect("open upgraded");
    assert_eq!(vol.stats().format_version, 3);
    for lba in 0..SIZE / 4096 {
        let mut b = vec![0u8; 4096];
        vol.read(lba * 4096, &mut b).expect("read");
        assert!(b == expected_block(lba), "upgraded block {lba}");
    }
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// Writes the fixture of the current format version (once per version; older fixtures are
/// never regenerated):
/// `ZBD_WRITE_FIXTURE=1 cargo test -p zbd-core --test engine -- --ignored make_fixture`
/// (the variable keeps `make bench`, which runs every ignored test, from rewriting it).
#[test]
#[ignore = "writes the committed fixture"]
fn make_fixture() {
    if std::env::var_os("ZBD_WRITE_FIXTURE").is_none() {
        eprintln!("not writing the fixture: set ZBD_WRITE_FIXTURE=1");
        return;
    }
    let opts = CreateOptions {
        extent_bytes: 8192,
        codec: Codec::Lz4,
        queue_len: Some(8),
        ..CreateOptions::new(SIZE)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, opts_for_fixture())
        .expect("create");
    let half = SIZE / 4096 / 2;
    for lba in 0..half {
        vol.write(lba * 4096, &expected_block(lba), false)
            .expect("write");
    }
    vol.checkpoint().expect("checkpoint");
    for lba in half..SIZE / 4096 {
        vol.write(lba * 4096, &expected_block(lba), false)
            .expect("write");
    }
    vol.flush().expect("flush");
    vol.abandon();
    let img = disk.current_image();
    let (_, path) = FIXTURES
        .iter()
        .find(|(v, _)| *v == zbd_core::format::FORMAT_VERSION)
        .expect("a fixture path for the current version");
    let f = std::fs::File::create(path).expect("create fixture");
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &img).expect("write");
    gz.finish().expect("finish");
}

fn opts_for_fixture() -> OpenOptions {
    OpenOptions {
        buffer_bytes: 16 << 10,
        ..opts()
    }
}

/// The newest checkpoint was written by a newer build: an incompatible flag this build lacks
/// (bit 10) and a layout it cannot judge (more bytes used), its checksum intact. The open
/// refuses by name; it must not take the checkpoint for damage and open the older one, which
/// would undo the newer build's work.
#[test]
fn a_checkpoint_of_a_newer_build_is_refused_by_name_not_passed_over() {
    let create = CreateOptions {
        extent_bytes: 8192,
        ..CreateOptions::new(SIZE)
    };
    let sb = zbd_core::layout::plan(&create).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), &create, opts_for_fixture())
        .expect("create");
    vol.write(0, &expected_block(0), false).expect("write");
    vol.checkpoint().expect("checkpoint");
    vol.close().expect("close");
    drop(vol);
    let mut image = disk.current_image();
    let sb = zbd_core::format::Superblock::decode(&image[..4096]).expect("superblock");
    let newest = (0..2u64)
        .filter_map(|slot| {
            let at = sb.checkpoint_slot_offset(slot, 0) as usize;
            zbd_core::format::Checkpoint::decode(
                &image[at..at + sb.checkpoint_slot_bytes as usize],
                &sb,
            )
            .ok()
        })
        .max_by_key(|c| c.seq)
        .expect("a checkpoint");
    let mut bytes = newest.encode(&sb).expect("encode");
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let used = u32_at(&bytes, 192) as usize + 16;
    bytes.resize(bytes.len().max(used), 0);
    // The lowest incompatible flag this build does not know (bit 12 once bit 11 landed).
    let unknown = CKPT_FLAGS_INCOMPAT & !CKPT_FLAGS_INCOMPAT_KNOWN;
    let newer = unknown & unknown.wrapping_neg();
    let flags = u32_at(&bytes, 196) | newer;
    bytes[196..200].copy_from_slice(&flags.to_le_bytes());
    bytes[192..196].copy_from_slice(&(used as u32).to_le_bytes());
    bytes[12..16].fill(0);
    let crc = crc32c::crc32c(&bytes[..used]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    for copy in 0..2 {
        let at = sb.checkpoint_slot_offset(newest.seq, copy) as usize;
        image[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    let e = Volume::open(Box::new(Arc::new(SimStorage::from_image(image))), opts())
        .err()
        .expect("a newer build's checkpoint is refused");
    assert!(
        matches!(&e, Error::NotAVolume(m)
            if m.contains("use a newer zbd") && m.contains(&format!("{newer:#x}"))),
        "{e}"
    );
}
