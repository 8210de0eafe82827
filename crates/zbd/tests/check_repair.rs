//! `zbd check --repair`: damaged metadata copies written again from the intact ones, offline.

use assert_cmd::Command;
use predicates::prelude::*;
use std::io::{Read, Seek, SeekFrom, Write};

fn zbd() -> Command {
    Command::cargo_bin("zbd").expect("zbd binary")
}

#[test]
fn check_repair_rewrites_a_damaged_superblock_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = dir.path().join("v.zbd");
    zbd()
        .args(["create"])
        .arg(&vol)
        .args(["--size", "16M"])
        .assert()
        .success();
    // Flip a byte of superblock copy B (the second 4 KiB).
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&vol)
        .expect("open volume");
    let at = zbd_core::format::SUPERBLOCK_BYTES as u64 + 20;
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.read_exact(&mut byte).expect("read");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(&[byte[0] ^ 0x10]).expect("write");
    drop(f);
    zbd()
        .arg("check")
        .arg(&vol)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("superblock copy B is damaged"));
    zbd()
        .args(["check", "--repair"])
        .arg(&vol)
        .assert()
        .success()
        .stdout(predicate::str::contains("clean"));
    zbd().arg("check").arg(&vol).assert().success();
}
