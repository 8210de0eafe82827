//! Review 14 (commit b8de1150, bit 11's segment forms): adversarial tests.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, SimStorage, Volume};

/// Options of a 1 MiB bit-11 volume of 8 KiB extents, and a simulated disk of its size.
fn bit11_8k_extents() -> (CreateOptions, Arc<SimStorage>) {
    let opts = with_metadata_pages(&CreateOptions {
        extent_bytes: 8 << 10,
        codec: Codec::Lz4,
        ..CreateOptions::new(1 << 20)
    });
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    (opts, disk)
}

/// A bit-11 volume of 8 KiB extents on a 4 KiB-sector device. In the 4 KiB form one
/// incompressible block (4 KiB payload, one 64-byte record) needs 12 KiB, and its write
/// panicked at the seal (review 14); such extents now keep the 512-byte form. The write must
/// not panic or fail for lack of an extent that could ever hold it.
#[test]
fn review14_incompressible_block_on_8k_extents_in_4k_form() {
    let (opts, disk) = bit11_8k_extents();
    let vol =
        Volume::create_with(Box::new(FourKn::new(&disk)), &opts, open_opts_sync()).expect("create");
    let data = fill(&mut SmallRng::seed_from_u64(1), Fill::Random, BS);
    let vol = write_and_flush_or_fail(vol, 0, &data, "one incompressible block");
    let mut back = vec![0u8; BS];
    vol.read(0, &mut back).expect("read");
    assert!(back == data);
}

/// Writes `data` at `at` and flushes; a failure or a panic fails the test (a panicked volume
/// is leaked: its drop would seal the same segment again and abort the test binary).
fn write_and_flush_or_fail(vol: Volume, at: u64, data: &[u8], what: &str) -> Volume {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        vol.write(at, data, false)?;
        vol.flush()
    }));
    match r {
        Err(_) => {
            std::mem::forget(vol);
            panic!("writing {what} panicked")
        }
        Ok(Err(e)) => panic!("writing {what} failed: {e}"),
        Ok(Ok(())) => vol,
    }
}

/// Fills a default-capacity volume (`CreateOptions::new`: 32 KiB extents, the capacity
/// `default_extent_count` gives) with incompressible data, in 64 KiB writes, on storage `dev`.
fn fill_default_capacity(four_k: bool, bit11: bool) -> zbd_core::Result<()> {
    const SIZE: u64 = 16 << 20;
    let plain = CreateOptions {
        codec: Codec::Lz4,
        ..CreateOptions::new(SIZE)
    };
    let opts = if bit11 {
        with_metadata_pages(&plain)
    } else {
        plain
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = if four_k {
        Volume::create_with(Box::new(FourKn::new(&disk)), &opts, open_opts())
    } else {
        Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts())
    }
    .expect("create");
    let data = fill(&mut SmallRng::seed_from_u64(2), Fill::Random, SIZE as usize);
    for (i, chunk) in data.chunks(64 << 10).enumerate() {
        vol.write((i * (64 << 10)) as u64, chunk, false)?;
    }
    vol.flush()?;
    let mut back = vec![0u8; SIZE as usize];
    vol.read(0, &mut back)?;
    assert!(back == data);
    vol.close()
}

/// The default capacity is sized for the incompressible worst case (`raw_blocks_per_extent`).
/// In the 4 KiB form a 32 KiB extent holds 6 incompressible blocks, not 7, even in one
/// segment: sized with the plain form's 4.5 KiB a block, a bit-11 volume of default capacity
/// on a 4 KiB device could not hold its own logical size of incompressible data (NoSpace,
/// review 14). (On a 512-byte device it can,
/// and so can a volume without bit 11 on the 4 KiB device: the controls.)
#[test]
fn review14_default_capacity_holds_incompressible_data_in_4k_form() {
    fill_default_capacity(false, true).expect("bit 11, 512-byte device (control)");
    fill_default_capacity(true, false).expect("no bit 11, 4 KiB device (control)");
    fill_default_capacity(true, true).expect("bit 11, 4 KiB device");
}

/// A bit-11 volume moved between a 4 KiB device and a 512-byte one with power cuts between:
/// queued extents hold 4 KiB-form segments at one recovery and 512-byte-form ones at the next.
/// Every reopen reads the flushed state; `check` is clean at the end.
#[test]
fn review14_alternating_write_alignment_with_crashes() {
    const SIZE: u64 = 2 << 20;
    for seed in 0..6u64 {
        let opts = with_metadata_pages(&small_volume(SIZE, 32768, Codec::Lz4, 2, 16));
        let sb = zbd_core::layout::plan(&opts).expect("plan");
        let mut disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let storage = |disk: &Arc<SimStorage>, round: u64| -> Box<dyn zbd_core::Storage> {
            if round.is_multiple_of(2) {
                Box::new(FourKn::new(disk))
            } else {
                Box::new(Arc::clone(disk))
            }
        };
        let vol = Volume::create_with(storage(&disk, 0), &opts, open_opts()).expect("create");
        let mut model = vec![0u8; SIZE as usize];
        let mut flushed = model.clone();
        let mut vol = Some(vol);
        for round in 0..6u64 {
            let v = vol.take().expect("volume");
            for op in workload(seed * 1000 + round, SIZE, 1500) {
                apply_volume(&v, &op)
                    .unwrap_or_else(|e| panic!("seed {seed} round {round}: {op:?}: {e}"));
                apply_model(&mut model, &op);
            }
            v.flush().expect("flush");
            flushed.clone_from(&model);
            // Unflushed writes the power cut may tear: their bytes may read either way.
            let mut touched = vec![false; SIZE as usize];
            for op in workload(seed * 1000 + round + 500, SIZE, 40) {
                if matches!(op, Op::Flush) {
                    continue;
                }
                apply_volume(&v, &op).expect("unflushed write");
                let (Op::Write { offset, .. } | Op::Zero { offset, .. } | Op::Trim { offset, .. }) =
                    &op
                else {
                    unreachable!()
                };
                let len = match &op {
                    Op::Write { data, .. } => data.len() as u64,
                    Op::Zero { len, .. } | Op::Trim { len, .. } => *len,
                    Op::Flush => 0,
                };
                // Whole blocks: a partial-block write rewrites its block.
                let (a, b) = (
                    offset / BS as u64 * BS as u64,
                    (offset + len).div_ceil(BS as u64) * BS as u64,
                );
                touched[a as usize..b as usize].fill(true);
            }
            v.abandon();
            let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed * 77 + round));
            disk = Arc::new(SimStorage::from_image(image));
            let v = Volume::open(storage(&disk, round + 1), open_opts())
                .unwrap_or_else(|e| panic!("seed {seed} round {round}: reopen: {e}"));
            let mut back = vec![0u8; SIZE as usize];
            v.read(0, &mut back).expect("read");
            let bad = (0..SIZE as usize)
                .step_by(BS)
                .find(|&at| !touched[at] && back[at..at + BS] != flushed[at..at + BS]);
            assert!(
                bad.is_none(),
                "seed {seed} round {round}: flushed block at {bad:?} lost"
            );
            model.clone_from(&back);
            vol = Some(v);
        }
        vol.take().expect("volume").close().expect("close");
        assert!(
            Volume::open_read_only(Box::new(disk))
                .expect("open")
                .check(&|_, _| {})
                .is_clean(),
            "seed {seed}: check"
        );
    }
}

/// The same volume created and filled on a 512-byte device (where an incompressible block fits
/// an 8 KiB extent), then opened on a 4 KiB device: the open picked the 4 KiB form whatever the
/// extent size, and the next incompressible write panicked (review 14). A check at create
/// alone would not cover this.
#[test]
fn review14_8k_extent_volume_moved_to_a_4k_device() {
    let (opts, disk) = bit11_8k_extents();
    let mut rng = SmallRng::seed_from_u64(3);
    let data = fill(&mut rng, Fill::Random, 8 * BS);
    let vol =
        Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts_sync()).expect("create");
    vol.write(0, &data, false)
        .expect("write on the 512-byte device");
    vol.close().expect("close");
    let vol = Volume::open(Box::new(FourKn::new(&disk)), open_opts_sync()).expect("open on 4K");
    let more = fill(&mut rng, Fill::Random, BS);
    let vol = write_and_flush_or_fail(
        vol,
        16 * BS as u64,
        &more,
        "an incompressible block after the move",
    );
    let mut back = vec![0u8; 8 * BS];
    vol.read(0, &mut back).expect("read");
    assert!(back == data);
    vol.close().expect("close");
}

/// Seal then parse, from header and footer, segments of every form at random offsets with
/// random payloads and records (data records at random places in the payload): what the fuzz
/// targets' re-seal property asks, over the forms' sizes. Also: the planned length is what
/// seal writes, and the segment ends inside the extent whenever `padded_len` says it fits.
#[test]
fn review14_every_form_seals_and_parses_back() {
    use rand::Rng;
    use zbd_core::format::*;
    let mut rng = SmallRng::seed_from_u64(14);
    let uuid = [7u8; 16];
    let forms = [
        (2u32, 0u16),
        (3, 0),
        (3, SEG_FLAG_WIDE_RECORDS),
        (3, SEG_FLAG_WIDE_RECORDS | SEG_FLAG_4K),
    ];
    for _ in 0..3000 {
        let (version, flags) = forms[rng.random_range(0..forms.len())];
        let form = SegmentForm { version, flags };
        let ext_bytes = 32768usize << rng.random_range(0..3);
        let n = rng.random_range(1..40usize);
        let payload = rng.random_range(0..20000usize);
        let len = form.padded_len(payload, n) as usize;
        if len > ext_bytes {
            continue;
        }
        let slots = (ext_bytes - len) / form.sector();
        let start = rng.random_range(0..=slots) * form.sector();
        let mut ext: Vec<u8> = (0..ext_bytes).map(|_| rng.random()).collect();
        let records: Vec<Record> = (0..n as u64)
            .map(|i| match rng.random_range(0..3) {
                0 if payload > 0 => {
                    let off = rng.random_range(0..payload);
                    let l = rng.random_range(0..=(payload - off).min(BS)) as u32;
                    Record {
                        codec: 1,
                        len: l,
                        offset: (start + SEGMENT_HEADER_BYTES + off) as u32,
                        crc: rng.random(),
                        seeded: version >= 3 && rng.random(),
                        fingerprint: if flags & SEG_FLAG_WIDE_RECORDS != 0 {
                            rng.random()
                        } else {
                            0
                        },
                        ..Record::new(RecordKind::Data, rng.random_range(0..1 << 40), 1, i + 1)
                    }
                }
                1 => Record::new(
                    RecordKind::Zero,
                    rng.random_range(0..1 << 40),
                    rng.random(),
                    i + 1,
                ),
                _ => Record::new(
                    RecordKind::Trim,
                    rng.random_range(0..1 << 40),
                    rng.random(),
                    i + 1,
                ),
            })
            .collect();
        let h = SegmentHeader {
            version,
            flags,
            alloc_seq: 9,
            extent: 4,
            seg_offset: start as u32,
            payload_len: payload as u32,
            record_count: n as u32,
            durable_seq: 3,
        };
        let after: Vec<u8> = ext[start + len..].to_vec();
        let before: Vec<u8> = ext[..start].to_vec();
        let total = seal_segment(&mut ext, &uuid, &h, &records);
        assert_eq!(total, len, "{form:?} payload {payload} records {n}");
        assert!(
            ext[start + len..] == after[..] && ext[..start] == before[..],
            "wrote outside"
        );
        let owner = SegmentOwner {
            uuid: &uuid,
            version: 3,
            extent: 4,
            alloc_seq: 9,
        };
        let want = (h, records.clone());
        assert_eq!(
            parse_segment(&ext, &owner, start).ok(),
            Some(want.clone()),
            "{form:?} header"
        );
        assert_eq!(
            parse_segment_footer(&ext, &owner, start + len).ok(),
            Some(want),
            "{form:?} footer"
        );
    }
}
