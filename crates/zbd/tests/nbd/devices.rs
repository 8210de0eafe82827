//! A volume's devices over NBD (design.md, "Devices"): `zbd device create` adds one, `zbd serve`
//! offers it by name beside the default export, each export keeps its own bytes through a
//! restart, and `zbd device delete` removes it.

use crate::nbd_support::*;
use std::process::Command;
use zbd_testkit::nbd::Client;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    pseudo_random(seed, len)
}

fn device_names(volume: &std::path::Path) -> Vec<String> {
    let out = stdout(&run(Command::new(ZBD)
        .args(["device", "list", "--json"])
        .arg(volume)));
    let list: serde_json::Value = serde_json::from_str(&out).expect("json");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|d| d["name"].as_str().expect("name").to_owned())
        .collect()
}

/// A volume file made by `zbd create --size SIZE --capacity 96M --metadata-pages`.
fn create_with_room(volume: &std::path::Path, size: &str) {
    run(Command::new(ZBD).arg("create").arg(volume).args([
        "--size",
        size,
        "--capacity",
        "96M",
        "--metadata-pages",
    ]));
}

/// A volume image opened on simulated storage, where power cuts can be placed.
fn sim_open(image: Vec<u8>) -> (std::sync::Arc<zbd_core::SimStorage>, zbd_core::Volume) {
    let disk = std::sync::Arc::new(zbd_core::SimStorage::from_image(image));
    let storage = Box::new(std::sync::Arc::clone(&disk));
    let vol = zbd_core::Volume::open(storage, zbd_core::OpenOptions::default()).expect("open");
    (disk, vol)
}

/// `len` bytes whose blocks compress about 3:1 (several versions fit a small data area).
fn compressible(seed: u64, len: usize) -> Vec<u8> {
    let mut b = bytes(seed, len);
    b.chunks_mut(4096).for_each(|block| block[1200..].fill(0));
    b
}

/// The image a power loss part way through `op` on `image` leaves: at the first eighth of
/// its storage operations after which `stopped` holds for the volume reopened.
fn stopped_image(
    image: &[u8],
    op: impl Fn(&zbd_core::Volume) -> zbd_core::Result<()>,
    stopped: impl Fn(&zbd_core::Volume) -> bool,
) -> Vec<u8> {
    use rand::SeedableRng;
    let ops = {
        let (disk, vol) = sim_open(image.to_vec());
        let ops0 = disk.ops();
        op(&vol).expect("the operation without a power loss");
        disk.ops() - ops0
    };
    (1..8)
        .find_map(|eighth| {
            let (disk, vol) = sim_open(image.to_vec());
            disk.set_power_loss_at(disk.ops() + ops * eighth / 8);
            assert!(op(&vol).is_err(), "the power loss stops it");
            let crashed = disk.crash_image(&mut rand::rngs::SmallRng::seed_from_u64(eighth));
            vol.abandon();
            let (_, vol) = sim_open(crashed.clone());
            let found = stopped(&vol);
            vol.close().expect("close");
            found.then_some(crashed)
        })
        .expect("a cut that leaves the operation stopped")
}

/// The kind `zbd device list` would show for device `name`.
fn kind_of(vol: &zbd_core::Volume, name: &str) -> Option<&'static str> {
    vol.devices()
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| d.kind)
}

#[test]
fn devices_are_served_by_name_and_keep_their_own_bytes() {
    if tools(&["nbdinfo", "nbdcopy"]).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    run(Command::new(ZBD)
        .arg("create")
        .arg(&volume)
        .args(["--size", "16M", "--metadata-pages"]));
    run(Command::new(ZBD)
        .args(["device", "create"])
        .arg(&volume)
        .args(["vm1", "--size", "8M"]));
    assert_eq!(device_names(&volume), ["default", "vm1"]);

    let default_data = bytes(1, 4 << 20);
    let vm1_data = bytes(2, 8 << 20);
    let (in_default, in_vm1) = (dir.path().join("default.in"), dir.path().join("vm1.in"));
    std::fs::write(&in_default, &default_data).expect("write");
    std::fs::write(&in_vm1, &vm1_data).expect("write");
    let uri = |served: &Served, name: &str| {
        format!("nbd+unix:///{name}?socket={}", served.socket.display())
    };
    let mut served = Served::start(&volume, dir.path());
    let listed = stdout(&run(Command::new("nbdinfo")
        .arg("--list")
        .arg(served.uri())));
    assert!(listed.contains("export=\"vm1\""), "{listed}");
    assert_eq!(
        stdout(&run(Command::new("nbdinfo")
            .arg("--size")
            .arg(uri(&served, "vm1"))))
        .trim(),
        (8u64 << 20).to_string()
    );
    run(Command::new("nbdcopy")
        .arg(&in_default)
        .arg(uri(&served, "")));
    run(Command::new("nbdcopy")
        .arg(&in_vm1)
        .arg(uri(&served, "vm1")));
    assert!(served.stop(), "zbd serve exits 0 on SIGTERM");

    // After a restart each export reads its own bytes.
    let served = Served::start(&volume, dir.path());
    let out = dir.path().join("out");
    run(Command::new("nbdcopy").arg(uri(&served, "vm1")).arg(&out));
    assert!(
        std::fs::read(&out).expect("read") == vm1_data,
        "vm1 reads its bytes"
    );
    run(Command::new("nbdcopy").arg(uri(&served, "")).arg(&out));
    let got = std::fs::read(&out).expect("read");
    assert!(
        got[..default_data.len()] == default_data[..],
        "default reads its bytes"
    );
    let missing = Command::new("nbdinfo")
        .arg(uri(&served, "nobody"))
        .output()
        .expect("nbdinfo");
    assert!(!missing.status.success(), "no export named nobody");

    // On the served volume, through its control socket: a new device is served at once, and
    // one a client has open is not deleted until the client goes.
    run(Command::new(ZBD)
        .args(["device", "create"])
        .arg(&volume)
        .args(["vm2", "--size", "4M"]));
    assert_eq!(device_names(&volume), ["default", "vm1", "vm2"]);
    let mut client = Client::connect_to(&served.socket, "vm2").expect("connect to vm2");
    assert_eq!(client.size, 4 << 20);
    client.write(0, &bytes(3, 64 << 10), false).expect("write");
    client.flush().expect("flush");
    let refused = Command::new(ZBD)
        .args(["device", "delete"])
        .arg(&volume)
        .arg("vm2")
        .output()
        .expect("zbd device delete");
    assert!(!refused.status.success(), "deleted under a client");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("open by 1 NBD connection"), "{said}");
    drop(client);
    wait_until("the delete once the client is gone", || {
        Command::new(ZBD)
            .args(["device", "delete"])
            .arg(&volume)
            .arg("vm2")
            .output()
            .expect("zbd device delete")
            .status
            .success()
    });
    assert_eq!(device_names(&volume), ["default", "vm1"]);
    drop(served);

    run(Command::new(ZBD).arg("check").arg(&volume));
    let stat: serde_json::Value = serde_json::from_str(&stdout(&run(Command::new(ZBD)
        .arg("stat")
        .arg(&volume)
        .arg("--json"))))
    .expect("json");
    assert_eq!(stat["devices"][1]["name"], "vm1", "{stat}");
    run(Command::new(ZBD)
        .args(["device", "delete"])
        .arg(&volume)
        .arg("vm1"));
    assert_eq!(device_names(&volume), ["default"]);
    run(Command::new(ZBD).arg("check").arg(&volume));
}

fn fingerprints_under(
    root: &std::path::Path,
) -> std::collections::BTreeMap<std::path::PathBuf, (u64, u64)> {
    tree(root)
        .into_iter()
        .map(|relative| {
            let print = fingerprint(&root.join(&relative));
            (relative, print)
        })
        .collect()
}

/// Issue 28's real-filesystem test: ext4 on the default device, a writer running, a snapshot
/// taken after the writer has flushed (`sync`), through the control socket. The snapshot, read
/// through its own read-only export, is a filesystem whose journal replays and which
/// `fsck.ext4 -fn` then finds clean, and every file synced before the snapshot is there with
/// its bytes; a clone of it takes writes while the origin goes on.
#[test]
fn an_ext4_snapshot_is_crash_consistent_and_served_read_only() {
    if tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "nbdcopy",
    ])
    .is_none()
        || !can_mount()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    run(Command::new(ZBD)
        .arg("create")
        .arg(&volume)
        .args(["--size", "256M", "--metadata-pages"]));
    let served = Served::start(&volume, dir.path());
    let attached = Attached::new(&served.socket, &dir.path().join("state"));
    run(Command::new("mkfs.ext4")
        .args(["-F", "-q"])
        .arg(&attached.device));
    let mnt = dir.path().join("mnt");
    let mut mounted = Mounted::new(&attached.device, &mnt);
    run(Command::new("cp")
        .arg("-a")
        .arg("/usr/share/common-licenses")
        .arg(mnt.join("synced")));
    run(Command::new("sync").arg("-f").arg(mnt.join("synced")));
    let expected = fingerprints_under(&mnt.join("synced"));
    assert!(expected.len() > 10, "too few files");

    // A writer goes on while the snapshot is taken.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (std::sync::Arc::clone(&stop), mnt.join("busy"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = std::fs::write(dir.join(format!("f{}", i % 64)), bytes(i, 64 << 10));
                i += 1;
            }
            i
        })
    };
    run(Command::new(ZBD)
        .args(["snapshot", "create"])
        .arg(format!("{}@s1", volume.display())));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(writer.join().expect("writer") > 0);
    let listed = stdout(&run(Command::new("nbdinfo")
        .arg("--list")
        .arg(served.uri())));
    assert!(listed.contains("export=\"s1\""), "{listed}");

    // The snapshot's export refuses writes, and reads as a filesystem.
    let uri = format!("nbd+unix:///s1?socket={}", served.socket.display());
    let image = dir.path().join("s1.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&image));
    let refused = Command::new("nbdcopy")
        .arg(&image)
        .arg(&uri)
        .output()
        .expect("nbdcopy");
    assert!(!refused.status.success(), "a snapshot took writes");
    // Its journal replays as after a power cut (on a copy), then fsck finds it clean.
    let copy_mnt = dir.path().join("copy");
    let mut copy = Mounted::new(&image, &copy_mnt);
    let found = fingerprints_under(&copy_mnt.join("synced"));
    copy.unmount();
    run(Command::new("fsck.ext4").arg("-fn").arg(&image));
    let missing: Vec<_> = expected
        .iter()
        .filter(|(p, print)| found.get(*p) != Some(print))
        .map(|(p, _)| p)
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "synced files differ in the snapshot: {missing:?}"
    );
    eprintln!(
        "snapshot s1: {} synced files equal, {} in it",
        expected.len(),
        found.len()
    );

    // The origin goes on; a clone of the snapshot diverges from both.
    run(Command::new("rm").arg("-rf").arg(mnt.join("synced")));
    mounted.unmount();
    run(Command::new(ZBD)
        .arg("clone")
        .arg(format!("{}@s1", volume.display()))
        .arg("c1"));
    // `zbd flatten` on the served volume (its control socket): the clone stops listing s1;
    // a snapshot has no origin to flatten away.
    let origin_of_c1 = || {
        let out = stdout(&run(Command::new(ZBD)
            .args(["device", "list", "--json"])
            .arg(&volume)));
        let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
        rows.as_array()
            .and_then(|r| r.iter().find(|d| d["name"] == "c1"))
            .unwrap_or_else(|| panic!("no c1 in {out}"))["origin"]
            .clone()
    };
    assert_eq!(origin_of_c1(), "s1");
    run(Command::new(ZBD)
        .arg("flatten")
        .arg(format!("{}@c1", volume.display())));
    assert!(origin_of_c1().is_null(), "c1 still lists its origin");
    let refused = Command::new(ZBD)
        .arg("flatten")
        .arg(format!("{}@s1", volume.display()))
        .output()
        .expect("zbd flatten");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("not a clone"),
        "{said}"
    );
    // A clone is no snapshot: neither deleted nor rolled back to as one (the served
    // volume's list without space answers both).
    for verb in [&["snapshot", "delete"][..], &["rollback"]] {
        let refused = Command::new(ZBD)
            .args(verb)
            .arg(format!("{}@c1", volume.display()))
            .output()
            .expect("zbd");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && said.contains("no snapshot named \"c1\""),
            "{verb:?}: {said}"
        );
    }
    let diff = stdout(&run(Command::new(ZBD)
        .arg("diff")
        .arg(format!("{}@default", volume.display()))
        .arg("s1")));
    let ranges: serde_json::Value = serde_json::from_str(&diff).expect("json");
    assert!(
        !ranges.as_array().expect("a list").is_empty(),
        "the origin changed since s1: {diff}"
    );
    drop(attached);
    drop(served);
    let check = stdout(&run(Command::new(ZBD).arg("check").arg(&volume)));
    assert!(check.contains("clean"), "{check}");
    let snaps = stdout(&run(Command::new(ZBD)
        .args(["snapshot", "list", "--json"])
        .arg(&volume)));
    let rows: serde_json::Value = serde_json::from_str(&snaps).expect("json");
    let s1 = rows
        .as_array()
        .and_then(|r| r.iter().find(|d| d["name"] == "s1"))
        .unwrap_or_else(|| panic!("no s1 in {snaps}"));
    // The clone names every page of s1: s1 alone holds nothing, and its delete frees nothing.
    assert!(s1["referenced_bytes"].as_u64() > Some(0), "{snaps}");
    assert_eq!(s1["unique_bytes"].as_u64(), Some(0), "{snaps}");
    let live = || {
        let stat = stdout(&run(Command::new(ZBD)
            .args(["stat", "--json"])
            .arg(&volume)));
        let v: serde_json::Value = serde_json::from_str(&stat).expect("json");
        v["physical_bytes_live"]
            .as_u64()
            .expect("physical_bytes_live")
    };
    let before = live();
    run(Command::new(ZBD)
        .args(["snapshot", "delete"])
        .arg(format!("{}@s1", volume.display())));
    assert_eq!(live(), before, "deleting s1 freed blocks its clone names");
    assert_eq!(device_names(&volume), ["default", "c1"]);
    let check = stdout(&run(Command::new(ZBD).arg("check").arg(&volume)));
    assert!(check.contains("clean"), "{check}");
}

/// A snapshot delete cut by a power loss between its steps leaves the row "deleting"
/// (design.md, "Deletes in steps"), which `zbd snapshot list` shows as such. `zbd serve`
/// finishes such a delete by itself, beside I/O: the row goes, the space is freed, the origin
/// keeps its bytes, and `zbd check` is clean.
#[test]
fn a_served_volume_finishes_a_delete_a_power_loss_stopped() {
    if tools(&["nbdcopy"]).is_none() {
        return;
    }
    const SIZE: usize = 32 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    create_with_room(&volume, "32M");
    // The snapshot alone holds the old bytes: the origin rewrote them all.
    let (disk, vol) = sim_open(std::fs::read(&volume).expect("read the volume"));
    vol.write(0, &compressible(10, SIZE), false).expect("write");
    vol.snapshot("default", "s").expect("snapshot");
    let now = compressible(11, SIZE);
    vol.write(0, &now, false).expect("write");
    vol.close().expect("close");
    let image = disk.current_image();
    drop(vol);
    // A power loss part way through the delete, at the first cut that leaves it stopped.
    let stopped = stopped_image(
        &image,
        |vol| vol.delete_device("s"),
        |vol| kind_of(vol, "s") == Some("deleting"),
    );
    std::fs::write(&volume, stopped).expect("write the volume");
    let listed = stdout(&run(Command::new(ZBD)
        .args(["device", "list"])
        .arg(&volume)));
    assert!(listed.contains("deleting"), "{listed}");
    // Its space is not free yet: `zbd snapshot list` still shows it, as being deleted.
    let snaps = stdout(&run(Command::new(ZBD)
        .args(["snapshot", "list", "--json"])
        .arg(&volume)));
    let rows: serde_json::Value = serde_json::from_str(&snaps).expect("json");
    let kinds: Vec<(&str, &str)> = rows
        .as_array()
        .expect("a list")
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or(""),
                d["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(kinds, [("s", "deleting")], "{snaps}");

    let mut served = Served::start(&volume, dir.path());
    wait_until("the stopped delete finished by the server", || {
        device_names(&volume) == ["default"]
    });
    let out = dir.path().join("out");
    run(Command::new("nbdcopy").arg(served.uri()).arg(&out));
    assert!(
        std::fs::read(&out).expect("read") == now,
        "the origin keeps its bytes"
    );
    assert!(served.stop(), "zbd serve exits 0 on SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("serve.log")).expect("log");
    assert!(log.contains("zbd: deleted \"s\""), "{log}");
    run(Command::new(ZBD).arg("check").arg(&volume));
    let (_, vol) = sim_open(std::fs::read(&volume).expect("read"));
    let space = vol.device_space().expect("space");
    assert_eq!(space.len(), 1);
    assert_eq!(
        space[0].unique_bytes,
        vol.stats().physical_bytes_live,
        "the snapshot's blocks were all freed"
    );
}

/// Rollbacks a power loss stopped part way (design.md, "Devices": the target's row flag):
/// `zbd serve` finishes the default device's before it is ready, since that export is always
/// offered, and refuses a read-only start while it is part emptied; a clone's finishes beside
/// the server, which does not offer the clone until then. Each then reads as its snapshot.
#[test]
fn a_served_volume_finishes_rollbacks_a_power_loss_stopped() {
    if tools(&["nbdcopy"]).is_none() {
        return;
    }
    const SIZE: usize = 16 << 20;
    let compressible = |seed: u64| compressible(seed, SIZE);
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    create_with_room(&volume, "16M");
    // default: s (seed 10), then seed 11; clone c of s: cs (seed 12), then seed 13.
    let (disk, vol) = sim_open(std::fs::read(&volume).expect("read the volume"));
    vol.write(0, &compressible(10), false).expect("write");
    vol.snapshot("default", "s").expect("snapshot");
    let c = vol.clone_snapshot("s", "c").expect("clone");
    vol.write_in(c, 0, &compressible(12), false).expect("write");
    vol.snapshot("c", "cs").expect("snapshot");
    vol.write_in(c, 0, &compressible(13), false).expect("write");
    vol.write(0, &compressible(11), false).expect("write");
    vol.close().expect("close");
    let image = disk.current_image();
    drop(vol);
    // The image a power loss part way through a rollback of `device` to `snapshot` leaves.
    let stopped = |device: &str, snapshot: &str| {
        stopped_image(
            &image,
            |vol| vol.rollback(device, snapshot),
            |vol| kind_of(vol, device) == Some("rolling back"),
        )
    };
    let read = |served: &Served, export: &str| {
        let out = dir.path().join("out");
        run(Command::new("nbdcopy")
            .arg(format!(
                "nbd+unix:///{export}?socket={}",
                served.socket.display()
            ))
            .arg(&out));
        std::fs::read(&out).expect("read")
    };

    // The clone: the server starts, then finishes it; c is offered once it reads as cs.
    std::fs::write(&volume, stopped("c", "cs")).expect("write the volume");
    let mut served = Served::start(&volume, dir.path());
    wait_until("the clone's rollback finished by the server", || {
        let listed = stdout(&run(Command::new(ZBD)
            .args(["device", "list"])
            .arg(&volume)));
        !listed.contains("rolling back")
    });
    assert!(read(&served, "c") == compressible(12), "c reads as cs");
    assert!(
        read(&served, "") == compressible(11),
        "default keeps its bytes"
    );
    assert!(served.stop(), "zbd serve exits 0 on SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("serve.log")).expect("log");
    assert!(log.contains("zbd: rolled \"c\" back to \"cs\""), "{log}");

    // The default device: a read-only serve refuses to start, naming the command that
    // finishes it; a read-write one finishes it before it is ready.
    std::fs::write(&volume, stopped("default", "s")).expect("write the volume");
    let mut refused = Command::new(ZBD)
        .arg("serve")
        .arg(&volume)
        .arg("--read-only")
        .arg("--socket")
        .arg(dir.path().join("ro.sock"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start zbd serve");
    let status =
        zbd_testkit::process::wait_or_kill(&mut refused, std::time::Duration::from_secs(60));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(
        status.is_some_and(|s| s.code() == Some(1))
            && err.contains("zbd rollback")
            && err.contains("@s"),
        "{status:?}: {err}"
    );
    let mut served = Served::start(&volume, dir.path());
    assert!(
        read(&served, "") == compressible(10),
        "default reads as s once served"
    );
    assert!(read(&served, "c") == compressible(13), "c keeps its bytes");
    assert!(served.stop(), "zbd serve exits 0 on SIGTERM");
    let check = stdout(&run(Command::new(ZBD).arg("check").arg(&volume)));
    assert!(check.contains("clean"), "{check}");
}
