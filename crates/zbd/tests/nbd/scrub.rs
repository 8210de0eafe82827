//! Scrubbing a served volume (issue 14): `zbd scrub` goes through the running server while fio
//! writes to it over NBD; a bit flipped in the backing file under the server is found, reported
//! (by block) and never returned as data: the client's read fails with EIO.

use std::process::{Command, Stdio};

use crate::nbd_support::{create_volume, pseudo_random, run, stdout, tools, Served, ZBD};
use zbd_testkit::nbd::Client;

const BLOCK: usize = 4096;
/// The block whose stored bytes get damaged, and the blocks written around it so that its
/// extent fills up and leaves the extent buffer (reads then come from the file).
const VICTIM: u64 = 100;

fn incompressible(block: u64) -> Vec<u8> {
    pseudo_random(block.wrapping_mul(0x9E37_79B9_7F4A_7C15), BLOCK)
}

#[test]
fn scrub_of_a_served_volume_finds_a_flipped_bit() {
    if tools(&["fio"]).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let volume = dir.path().join("vol.zbd");
    create_volume(&volume, "64M", "lz4");
    let served = Served::start(&volume, dir.path());
    let mut client = Client::connect(&served.socket).expect("connect");
    for block in VICTIM..VICTIM + 32 {
        client
            .write(block * BLOCK as u64, &incompressible(block), false)
            .expect("write");
    }
    client.flush().expect("flush");
    // fio writes the upper half meanwhile (explicit data: half compressible, refilled).
    let fio = Command::new("fio")
        .args([
            "--name=scrub-load",
            "--ioengine=nbd",
            &format!("--uri={}", served.uri()),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=4",
            "--offset=32M",
            "--size=32M",
            "--io_size=48M",
            "--buffer_compress_percentage=50",
            "--refill_buffers",
            "--randseed=14",
            "--end_fsync=1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio");
    // Flip one bit in the middle of the victim's stored bytes in the backing file.
    let mut image = std::fs::read(&volume).expect("read backing file");
    let want = incompressible(VICTIM);
    let at = image
        .windows(BLOCK)
        .position(|w| w == want.as_slice())
        .expect("victim's stored bytes in the backing file");
    image[at + 2000] ^= 0x20;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&volume)
            .expect("open backing file");
        f.write_all_at(&image[at + 2000..at + 2001], (at + 2000) as u64)
            .expect("flip");
    }
    let scrub = Command::new(ZBD)
        .arg("scrub")
        .arg(&volume)
        .args(["--rate", "16M", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run zbd scrub");
    assert_eq!(
        scrub.status.code(),
        Some(3),
        "scrub must report damage: {}",
        String::from_utf8_lossy(&scrub.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&scrub.stdout).expect("JSON report");
    let damaged: Vec<u64> = report["damaged_blocks"]
        .as_array()
        .expect("damaged_blocks")
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    assert_eq!(damaged, vec![VICTIM], "{report}");
    let fio_out = fio.wait_with_output().expect("fio");
    assert!(
        fio_out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&fio_out.stderr)
    );
    // Never returned as data: the read fails (EIO), its neighbours read fine.
    let mut buf = vec![0u8; BLOCK];
    let err = client
        .read(VICTIM * BLOCK as u64, &mut buf)
        .expect_err("the damaged block must not read");
    assert!(err.to_string().contains("error 5"), "{err}");
    client
        .read((VICTIM + 1) * BLOCK as u64, &mut buf)
        .expect("neighbour");
    assert_eq!(buf, incompressible(VICTIM + 1));
    client.disconnect();
    // `zbd stat` (answered by the server) shows the scrub.
    let stat = stdout(&run(Command::new(ZBD).arg("stat").arg(&volume)));
    assert!(
        stat.contains("1 damaged blocks found"),
        "zbd stat does not show the scrub:\n{stat}"
    );
    drop(served);
}
