//! A real filesystem on a served volume: `zbd serve` → `zbd attach` (nbdfuse + loop device) →
//! mkfs → mount → copy real trees → unmount → fsck → remount → every file matches; the volume
//! stores less than it holds; detach and stop leave a volume `zbd check` finds clean.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::nbd_support::{
    can_mount, control_socket, create_volume, fingerprint, run, stdout, tools, tree, Attached,
    Mounted, Served, ZBD,
};

/// Fingerprints of every file under each source, keyed by path relative to the copy's root.
fn fingerprints(sources: &[&Path], root: Option<&Path>) -> BTreeMap<PathBuf, (u64, u64)> {
    let mut out = BTreeMap::new();
    for source in sources {
        let name = PathBuf::from(source.file_name().expect("source name"));
        let base = match root {
            Some(root) => root.join(&name),
            None => source.to_path_buf(),
        };
        for relative in tree(&base) {
            out.insert(name.join(&relative), fingerprint(&base.join(&relative)));
        }
    }
    out
}

fn stat_json(volume: &Path) -> serde_json::Value {
    let output = run(Command::new(ZBD).arg("stat").arg("--json").arg(volume));
    serde_json::from_str(&stdout(&output)).expect("zbd stat --json")
}

fn filesystem_round_trip(mkfs: &[&str], fsck: &[&str], sources: &[&Path]) {
    if tools(&["nbdfuse", "fusermount3", "losetup", mkfs[0], fsck[0]]).is_none() || !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    create_volume(&volume, "1G", "lz4");
    let mut served = Served::start(&volume, dir.path());
    let mut attached = Attached::new(&served.socket, &dir.path().join("state"));
    run(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&attached.device));

    let mount_dir = dir.path().join("mnt");
    let mut mounted = Mounted::new(&attached.device, &mount_dir);
    for source in sources {
        run(Command::new("cp").arg("-a").arg(source).arg(&mount_dir));
    }
    let expected = fingerprints(sources, None);
    assert!(expected.len() > 100, "too few files to mean anything");
    mounted.unmount();

    run(Command::new(fsck[0]).args(&fsck[1..]).arg(&attached.device));

    let mounted_again = Mounted::new(&attached.device, &mount_dir);
    let found = fingerprints(sources, Some(&mount_dir));
    let differing: Vec<_> = expected
        .iter()
        .filter(|(path, print)| found.get(*path) != Some(print))
        .map(|(path, _)| path)
        .take(5)
        .collect();
    assert!(
        differing.is_empty(),
        "files differ after remount: {differing:?}"
    );
    assert_eq!(found.len(), expected.len());

    // While served, `zbd stat` asks the server; the copy compresses.
    let stats = stat_json(&volume);
    let logical = stats["logical_bytes_in_use"].as_u64().expect("logical");
    let physical = stats["physical_bytes_live"].as_u64().expect("physical");
    eprintln!(
        "{}: logical in use {logical}, physical live {physical}, savings {:.1} %",
        mkfs[0], stats["savings_pct"]
    );
    assert!(physical < logical, "no savings: {stats}");

    drop(mounted_again);
    let detached = attached.detach();
    assert!(detached.status.success(), "zbd detach: {detached:?}");
    let control = control_socket(&volume);
    assert!(
        control.exists(),
        "no control socket at {}",
        control.display()
    );
    assert!(served.stop(), "zbd serve did not exit cleanly on SIGTERM");
    assert!(!control.exists(), "a clean stop leaves no control socket");
    run(Command::new(ZBD).arg("check").arg(&volume));

    // A new server process on the closed volume: nothing may have lived only in a cache.
    let served = Served::start(&volume, dir.path());
    let attached = Attached::new(&served.socket, &dir.path().join("state"));
    run(Command::new(fsck[0]).args(&fsck[1..]).arg(&attached.device));
    let _mounted = Mounted::new(&attached.device, &mount_dir);
    assert!(
        fingerprints(sources, Some(&mount_dir)) == expected,
        "files differ after restart"
    );
}

#[test]
fn ext4_on_zbd_keeps_every_file() {
    let python = Path::new("/usr/lib/python3.11");
    let mut sources = vec![Path::new("/usr/share/doc")];
    if python.exists() {
        sources.push(python);
    }
    filesystem_round_trip(
        &["mkfs.ext4", "-q", "-F"],
        &["e2fsck", "-f", "-n"],
        &sources,
    );
}

#[test]
fn xfs_on_zbd_keeps_every_file() {
    filesystem_round_trip(
        &["mkfs.xfs", "-q", "-f"],
        &["xfs_repair", "-n"],
        &[Path::new("/usr/share/doc")],
    );
}

/// `zbd detach` refuses a mounted device, and never detaches a loop device that a stale or forged
/// record names but that is bound to somebody else's file.
#[test]
fn detach_refuses_mounted_and_foreign_devices() {
    if tools(&["nbdfuse", "fusermount3", "losetup", "mkfs.ext4"]).is_none() || !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state_dir = dir.path().join("state");
    let volume = dir.path().join("vol.zbd");
    create_volume(&volume, "64M", "lz4");
    let served = Served::start(&volume, dir.path());
    let mut attached = Attached::new(&served.socket, &state_dir);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&attached.device));
    let mut mounted = Mounted::new(&attached.device, &dir.path().join("mnt"));
    assert_detach_refused(&attached.device, &state_dir, "is mounted");
    mounted.unmount();
    let detached = attached.detach();
    assert!(detached.status.success(), "{detached:?}");

    // A loop device this test made, which a forged record says `zbd attach` made.
    let backing = dir.path().join("foreign.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(8 << 20))
        .expect("image");
    let foreign = Foreign::new(&backing);
    let record = serde_json::json!({
        "kind": "fuse",
        "device": foreign.0,
        "mountpoint": dir.path().join("nowhere"),
        "nbdfuse_pid": 1,
        "work_dir": dir.path().join("nowhere"),
    });
    let name = foreign
        .0
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    std::fs::write(
        state_dir.join(format!("attach-{name}.json")),
        record.to_string(),
    )
    .expect("record");
    assert_detach_refused(&foreign.0, &state_dir, "leaving it alone");
    let still = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .expect("foreign loop device must still be attached");
    assert_eq!(Path::new(still.trim()), backing);
}

fn assert_detach_refused(device: &Path, state_dir: &Path, reason: &str) {
    let refused = Command::new(ZBD)
        .arg("detach")
        .arg(device)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("run zbd detach");
    assert!(
        !refused.status.success(),
        "detach of {} succeeded",
        device.display()
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(reason), "expected {reason:?}: {stderr}");
}

/// A loop device this test creates itself, detached on drop.
struct Foreign(PathBuf);

impl Foreign {
    fn new(backing: &Path) -> Foreign {
        let output = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing));
        Foreign(PathBuf::from(stdout(&output).trim()))
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
