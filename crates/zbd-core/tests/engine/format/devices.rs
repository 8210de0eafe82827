//! Devices beside the default one (design.md, "Devices"; build order step 3, first form):
//! each reads what was written to it and nothing of another's, through flushes, power cuts,
//! the cleaner and closes; a delete frees its blocks and no other device's; dedup shares
//! blocks across devices; and bad requests are refused by name.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::CKPT_FLAG_DEVICES;
use zbd_core::{Codec, CreateOptions, SimStorage, Volume};

const SIZE: u64 = 4 << 20;
const SMALL: u64 = 1 << 20;

fn opts(dedup: bool) -> CreateOptions {
    CreateOptions {
        dedup,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::Lz4, 3, 6))
    }
}

fn read_dev(vol: &Volume, device: u32, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    vol.read_in(device, 0, &mut got).expect("read");
    got
}

fn assert_dev(vol: &Volume, device: u32, model: &[u8], ctx: &str) {
    let got = read_dev(vol, device, model.len());
    for (i, (g, m)) in got.chunks(BS).zip(model.chunks(BS)).enumerate() {
        assert!(
            g == m,
            "{ctx}: device {device} block {i} differs from its model"
        );
    }
}

/// Incompressible blocks: the rounds below write more than the data area holds.
fn data(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    fill(rng, Fill::Random, len)
}

/// The flags of the newest checkpoint on `disk`.
fn flags(disk: &SimStorage) -> u32 {
    newest_checkpoint(&disk.current_image()).1.flags
}

/// Two devices and the default one, written at the same LBAs with different bytes: each reads
/// its own through flushes, overwrites that make the cleaner move blocks of all three, a power
/// cut with unflushed writes after a flush, and a close.
fn devices_read_their_own_blocks(dedup: bool) {
    let (disk, vol) = sim_volume(&opts(dedup));
    assert_eq!(flags(&disk) & CKPT_FLAG_DEVICES, 0, "one device: no bit 13");
    let a = vol.create_device("a", SIZE).expect("create a");
    let b = vol.create_device("b", SMALL).expect("create b");
    assert_ne!(
        flags(&disk) & CKPT_FLAG_DEVICES,
        0,
        "bit 13 with the second row"
    );
    let names: Vec<_> = vol.devices().into_iter().map(|d| (d.id, d.name)).collect();
    assert_eq!(
        names,
        [(1, "default".into()), (a, "a".into()), (b, "b".into())]
    );
    let mut rng = SmallRng::seed_from_u64(3);
    let mut models = [
        (1, vec![0u8; SIZE as usize]),
        (a, vec![0u8; SIZE as usize]),
        (b, vec![0u8; SMALL as usize]),
    ];
    // Every device filled, then rounds of scattered single blocks over all three: extents
    // die in part, and the cleaner has to move blocks of every device to make room.
    for (dev, model) in models.iter_mut() {
        let bytes = data(&mut rng, model.len());
        vol.write_in(*dev, 0, &bytes, false).expect("fill");
        model.copy_from_slice(&bytes);
    }
    for round in 0..16 {
        for (dev, model) in models.iter_mut() {
            let blocks = model.len() / BS;
            for _ in 0..blocks / 6 {
                let i = rng.random_range(0..blocks);
                let bytes = if dedup && *dev == b && round % 2 == 1 {
                    // A copy of a default-device block: shared across devices.
                    read_dev(&vol, 1, (i + 1) * BS)[i * BS..].to_vec()
                } else {
                    data(&mut rng, BS)
                };
                vol.write_in(*dev, (i * BS) as u64, &bytes, false)
                    .expect("write");
                model[i * BS..(i + 1) * BS].copy_from_slice(&bytes);
            }
        }
    }
    vol.flush().expect("flush");
    let s = vol.stats();
    assert!(s.counters.extents_reclaimed > 0, "the cleaner ran: {s:?}");
    if dedup {
        assert!(
            s.dedup_ratio > 1.0,
            "copies across devices were shared: {s:?}"
        );
    }
    for (dev, model) in &models {
        assert_dev(&vol, *dev, model, "after the rounds");
    }
    assert_clean(&vol, "after the rounds");

    // Unflushed writes to each after the flush, then a power cut: every device reads its
    // flushed value or the later one, block by block.
    let flushed = models.clone();
    for (dev, model) in models.iter_mut() {
        let bytes = data(&mut rng, 8 * BS);
        vol.write_in(*dev, 0, &bytes, false).expect("write");
        model[..bytes.len()].copy_from_slice(&bytes);
    }
    let image = disk.crash_image(&mut rng);
    vol.abandon();
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = reopen(&disk);
    for ((dev, now), (_, before)) in models.iter().zip(&flushed) {
        let got = read_dev(&vol, *dev, now.len());
        for (i, g) in got.chunks(BS).enumerate() {
            let ok = g == &now[i * BS..(i + 1) * BS] || g == &before[i * BS..(i + 1) * BS];
            assert!(
                ok,
                "after a power cut: device {dev} block {i} reads another value"
            );
        }
    }
    assert_clean(&vol, "after a power cut");
    vol.close().expect("close");
    let vol = reopen(&disk);
    assert_eq!(vol.devices().len(), 3);
    assert_clean(&vol, "after a close");
}

#[test]
fn devices_read_their_own_blocks_through_crashes_and_the_cleaner() {
    devices_read_their_own_blocks(false);
}

#[test]
fn devices_share_copies_with_dedup_on() {
    devices_read_their_own_blocks(true);
}

/// A delete frees the device's space and leaves the others whole, even the blocks another
/// device shares with it (dedup); after a power cut at any storage operation of the delete,
/// the volume opens with the device either whole or gone, and the others intact.
#[test]
fn deleting_a_device_frees_it_and_keeps_the_others() {
    let (disk, vol) = sim_volume(&opts(true));
    let mut rng = SmallRng::seed_from_u64(8);
    let base = data(&mut rng, SMALL as usize);
    vol.write(0, &base, false).expect("write");
    let a = vol.create_device("a", SMALL).expect("create");
    let mut in_a = data(&mut rng, SMALL as usize);
    in_a[..SMALL as usize / 2].copy_from_slice(&base[..SMALL as usize / 2]);
    vol.write_in(a, 0, &in_a, false).expect("write");
    vol.flush().expect("flush");
    vol.close().expect("close");
    let image = disk.current_image();

    let run = |cut: Option<u64>| -> u64 {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        let vol = reopen(&disk);
        let live_before = vol.stats().physical_bytes_live;
        let ops0 = disk.ops();
        if let Some(c) = cut {
            disk.set_power_loss_at(ops0 + c);
        }
        let deleted = vol.delete_device("a");
        let ops = disk.ops() - ops0;
        if cut.is_none() {
            deleted.expect("delete");
            assert_eq!(vol.devices().len(), 1);
            assert!(
                vol.stats().physical_bytes_live < live_before,
                "the delete freed the device's own blocks"
            );
            assert!(vol.read_in(a, 0, &mut [0u8; BS]).is_err(), "a is gone");
            assert_eq!(flags(&disk) & CKPT_FLAG_DEVICES, 0, "one row: no bit 13");
        }
        let mut rng = SmallRng::seed_from_u64(cut.unwrap_or(0));
        let crashed = disk.crash_image(&mut rng);
        vol.abandon();
        let vol = reopen(&Arc::new(SimStorage::from_image(crashed)));
        let ctx = format!("cut at {cut:?}");
        assert_dev(&vol, 1, &base, &ctx);
        if let Some(d) = vol
            .devices()
            .iter()
            .find(|d| d.name == "a" && d.kind != "deleting")
        {
            // Not deleted yet: whole, or trimmed in part by the steps that ran.
            let got = read_dev(&vol, d.id, SMALL as usize);
            for (i, g) in got.chunks(BS).enumerate() {
                let ok = g == &in_a[i * BS..(i + 1) * BS] || g.iter().all(|&x| x == 0);
                assert!(
                    ok,
                    "{ctx}: block {i} of a reads neither its value nor zeros"
                );
            }
            vol.delete_device("a").expect("deleting again finishes");
        }
        // Marked as being deleted (its tree given up in part): it takes no request, and
        // deleting again finishes.
        finish_deletes(&vol, &ctx);
        assert_eq!(vol.devices().len(), 1, "{ctx}");
        assert_dev(&vol, 1, &base, &ctx);
        assert_clean(&vol, &ctx);
        ops
    };
    let total = run(None);
    let step = (total / full_or_light(60, 15)).max(1);
    for cut in (0..total).step_by(step as usize) {
        run(Some(cut));
    }
}

/// A trim over a thin device's whole range steps over the blocks that were never written, and
/// so does a delete, which empties a writable device that way: a 64 TiB device holding four
/// blocks is trimmed and deleted with a few records and checkpoints. Each step of a trim
/// covers at most 64 map leaves (64 MiB of blocks), so stepping over the unwritten range took
/// a million logged steps for this device, and a delete of a 1,024 TiB one about 50 minutes.
#[test]
fn trims_and_deletes_of_a_huge_thin_device_cost_its_blocks_not_its_size() {
    const HUGE: u64 = 64 << 40;
    let (disk, vol) = sim_volume(&opts(false));
    let base = vec![5u8; SMALL as usize];
    vol.write(0, &base, false).expect("write");
    let a = vol.create_device("huge", HUGE).expect("create");
    let blocks = [0, HUGE / 2, HUGE / 2 + 40 * BS as u64, HUGE - BS as u64];
    for (i, &at) in blocks.iter().enumerate() {
        vol.write_in(a, at, &[i as u8 + 1; BS], false)
            .expect("write");
    }
    // A zeroed range is trimmed too (it is no unmapped summary).
    vol.write_zeroes_in(a, HUGE / 4, 1 << 30).expect("zeroes");
    vol.flush().expect("flush");
    let cost = |vol: &Volume, before: &zbd_core::Stats| {
        let now = vol.stats();
        (
            now.counters.checkpoints - before.counters.checkpoints,
            now.counters.data_bytes_written - before.counters.data_bytes_written,
        )
    };

    // All but the last block, and the zeroed range between.
    let before = vol.stats();
    vol.trim_in(a, 0, HUGE - BS as u64).expect("trim");
    let (checkpoints, written) = cost(&vol, &before);
    assert!(
        checkpoints <= 4 && written <= 64 << 10,
        "a trim of 64 TiB holding 4 blocks: {checkpoints} checkpoints, {written} B written"
    );
    let mut got = vec![0u8; BS];
    for &at in &blocks[..3] {
        vol.read_in(a, at, &mut got).expect("read");
        assert!(got.iter().all(|&b| b == 0), "block at {at} trimmed");
    }
    vol.read_in(a, HUGE / 4, &mut got).expect("read");
    assert!(got.iter().all(|&b| b == 0));
    vol.read_in(a, HUGE - BS as u64, &mut got).expect("read");
    assert_eq!(got, [4u8; BS], "the block past the trim stays");

    let before = vol.stats();
    vol.delete_device("huge").expect("delete");
    let (checkpoints, _) = cost(&vol, &before);
    assert!(
        checkpoints <= 8,
        "a delete of 64 TiB holding a block: {checkpoints} checkpoints"
    );
    assert_eq!(vol.devices().len(), 1);
    assert_dev(&vol, 1, &base, "after the delete");
    assert_clean(&vol, "after the delete");
    vol.close().expect("close");
    assert_dev(&reopen(&disk), 1, &base, "reopened");
}

/// Requests a device cannot take are refused by name, and change nothing.
#[test]
fn bad_device_requests_are_refused() {
    let (_disk, vol) = sim_volume(&opts(false));
    let a = vol.create_device("a", SMALL).expect("create");
    let err = |r: zbd_core::Result<u32>| r.expect_err("refused").to_string();
    assert!(
        err(vol.create_device("a", SMALL)).contains("a"),
        "a name twice"
    );
    assert!(err(vol.create_device("b", 1000)).contains("4096"));
    assert!(err(vol.create_device("b", 0)).contains("4096"));
    // Names a shell, an export name or VOL@NAME would carry with doubt, for every way a
    // device is made; the longest allowed name and its punctuation pass.
    vol.snapshot("a", "s").expect("snapshot");
    for bad in [
        "",
        "a b",
        "new\nline",
        "-rf",
        ".hidden",
        "..",
        "a@b",
        "a/b",
        "é",
    ] {
        for e in [
            err(vol.create_device(bad, SMALL)),
            err(vol.snapshot("a", bad)),
            err(vol.clone_snapshot("s", bad)),
        ] {
            assert!(e.contains("device name"), "{bad:?}: {e}");
        }
    }
    let long = "n".repeat(64);
    assert!(err(vol.create_device(&format!("{long}x"), SMALL)).contains("device name"));
    vol.create_device(&long, SMALL).expect("64 bytes");
    vol.snapshot("a", "_a.b+c:d-2").expect("punctuation");
    assert_eq!(vol.devices().len(), 5);
    for name in [long.as_str(), "_a.b+c:d-2", "s"] {
        vol.delete_device(name).expect("delete");
    }
    assert!(vol.delete_device("default").is_err());
    assert!(vol.delete_device("nobody").is_err());
    let past = vol
        .write_in(a, SMALL, &[1u8; BS], false)
        .expect_err("past the end");
    assert!(matches!(past, zbd_core::Error::OutOfRange { .. }), "{past}");
    assert!(vol.read_in(99, 0, &mut [0u8; BS]).is_err(), "no device 99");
    assert_eq!(vol.devices().len(), 2);

    // A volume without metadata pages keeps its one device.
    let (_disk, v2) = sim_volume_v2_map(&small_volume(SIZE, 65536, Codec::Lz4, 3, 6), open_opts());
    let e = v2.create_device("a", SMALL).expect_err("v2 map");
    assert!(e.to_string().contains("metadata pages"), "{e}");
}

/// Issue 28: bit flips in the metadata that lists devices. Forty devices and the default one
/// fill two device-table pages, each row holding its device's name. Every copy of a row
/// found on disk (current or stale) is damaged in turn: each time the volume opens with
/// every device, named and reading its bytes (the other copy serves). With every copy of one
/// row damaged, the open fails with an error naming the device table: a device is never
/// silently lost.
#[test]
fn damaged_device_rows_are_served_from_their_other_copy_or_refused() {
    let (disk, vol) = sim_volume(&opts(false));
    let mut rng = SmallRng::seed_from_u64(28);
    let mut models = Vec::new();
    for i in 0..40 {
        let name = format!("probe-device-{i:02}");
        let id = vol.create_device(&name, 64 << 10).expect("create");
        let bytes = data(&mut rng, 64 << 10);
        vol.write_in(id, 0, &bytes, false).expect("write");
        models.push((name, id, bytes));
    }
    vol.close().expect("close");
    drop(vol);
    let image = disk.current_image();
    let needle = b"probe-device-33";
    let copies: Vec<usize> = image
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert!(copies.len() >= 2, "row 33 on disk {} times", copies.len());
    let opens = |image: Vec<u8>| {
        Volume::open(
            Box::new(Arc::new(SimStorage::from_image(image))),
            open_opts(),
        )
    };
    for (k, &at) in copies.iter().enumerate() {
        let mut damaged = image.clone();
        damaged[at + 3] ^= 0x10;
        let ctx = format!("copy {k} of {} damaged", copies.len());
        let vol = opens(damaged).unwrap_or_else(|e| panic!("{ctx}: the open failed: {e}"));
        let names: Vec<String> = vol.devices().into_iter().map(|d| d.name).collect();
        assert_eq!(names.len(), 41, "{ctx}: {names:?}");
        for (name, id, model) in &models {
            assert!(names.contains(name), "{ctx}: {name} lost");
            assert_dev(&vol, *id, model, &ctx);
        }
        assert_clean(&vol, &ctx);
        vol.close().expect("close");
    }
    let mut damaged = image.clone();
    for &at in &copies {
        damaged[at + 3] ^= 0x10;
    }
    match opens(damaged) {
        Ok(vol) => panic!(
            "every copy of row 33 damaged, yet the volume opened with {:?}",
            vol.devices()
                .into_iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
        ),
        Err(e) => assert!(e.to_string().contains("device"), "unclear error: {e}"),
    }
}
