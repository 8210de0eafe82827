//! `FileStorage` on a real block device (a loop device over a file we make): freed space is
//! really discarded. Guards the bug where fallocate(PUNCH_HOLE) on a block device became
//! WRITE_ZEROES, counted (and possibly performed) as writes of every freed extent.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use zbd_core::{FileStorage, Storage};

const MIB: u64 = 1 << 20;

/// A loop device this test created; detached on drop, even when the test fails.
pub(super) struct Loop(pub PathBuf);

impl Loop {
    fn attach(image: &Path) -> Loop {
        Loop::attach_with(image, &[])
    }

    /// With extra `losetup` options (e.g. `--sector-size 4096`).
    pub fn attach_with(image: &Path, options: &[&str]) -> Loop {
        let _guard = super::fork_guard();
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .args(options)
            .arg(image)
            .output()
            .expect("run losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        Loop(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// Sectors written and discarded, from /sys/block/loopN/stat (fields 7 and 14).
    fn written_and_discarded_sectors(&self) -> (u64, u64) {
        let name = self.0.file_name().expect("device name").to_string_lossy();
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("stat");
        let fields: Vec<u64> = stat
            .split_whitespace()
            .map(|f| f.parse().expect("number"))
            .collect();
        (fields[6], fields[13])
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _guard = super::fork_guard();
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

pub(super) fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        eprintln!("SKIPPED: needs root for losetup");
    }
    root
}

#[test]
fn discard_on_a_block_device_frees_space_without_writing() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0xab_u8; (16 * MIB) as usize]).expect("write image");
    let allocated_before = std::fs::metadata(&image).expect("meta").blocks() * 512;
    assert!(allocated_before >= 16 * MIB);

    let device = Loop::attach(&image);
    let storage = FileStorage::open(&device.0, true).expect("open loop device");
    assert!(storage.is_block_device());
    let (written_before, discarded_before) = device.written_and_discarded_sectors();

    storage.discard(4 * MIB, 8 * MIB).expect("discard");
    storage.sync().expect("sync");

    let (written_after, discarded_after) = device.written_and_discarded_sectors();
    assert_eq!(
        written_after, written_before,
        "a discard must not count as writes"
    );
    assert_eq!(discarded_after - discarded_before, 8 * MIB / 512);
    // The loop device punched the range out of its backing file.
    let allocated_after = std::fs::metadata(&image).expect("meta").blocks() * 512;
    assert!(
        allocated_after <= allocated_before - 8 * MIB,
        "backing file still holds {allocated_after} bytes (was {allocated_before})"
    );
    // The rest of the device still holds its data.
    let mut buf = vec![0u8; MIB as usize];
    storage.read_at(0, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0xab));
    storage.read_at(12 * MIB, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0xab));
}
