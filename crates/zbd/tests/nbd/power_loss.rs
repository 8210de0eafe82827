//! Power loss under load: the volume lives on a disk that forgets unflushed writes (an nbdkit
//! writeback cache made a block device by `zbd attach`). A client writes and flushes on two
//! connections; zbd and the disk are killed together; after a restart every block must hold its
//! last flushed version or a later one that was really written. Flushes are sent on the other
//! connection than the writes, so they cover writes completed elsewhere (NBD_FLAG_CAN_MULTI_CONN).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::nbd_support::{
    can_mount, create_volume, fingerprint, run, tools, tree, wait_until, Attached, Mounted, Served,
    VolatileDisk,
};
use zbd_testkit::nbd::Client;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 2048;
const MAGIC: &[u8; 8] = b"ZBDPLOSS";

/// Deterministic, half-compressible content of `block` at `version`.
fn content(block: u64, version: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&block.to_le_bytes());
    out[16..24].copy_from_slice(&version.to_le_bytes());
    let mut state = (block << 32 ^ version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for (index, byte) in out[24..].iter_mut().enumerate() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Runs of 64 random bytes and 64 repeated ones: compresses about 2:1.
        *byte = if index / 64 % 2 == 0 {
            state as u8
        } else {
            (version % 251) as u8
        };
    }
    out
}

/// Version a block holds (0: never written), or why its content is not any version we wrote.
fn decode(block: u64, bytes: &[u8]) -> Result<u64, String> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    if &bytes[..8] != MAGIC {
        return Err("not our data".into());
    }
    let stored_block = u64::from_le_bytes(bytes[8..16].try_into().expect("8"));
    let version = u64::from_le_bytes(bytes[16..24].try_into().expect("8"));
    if stored_block != block {
        return Err(format!("holds block {stored_block}'s data"));
    }
    if bytes != content(block, version) {
        return Err(format!("version {version} is torn or corrupt"));
    }
    Ok(version)
}

/// What the client knows about each block.
#[derive(Clone, Default)]
struct History {
    /// Highest version sent (acknowledged or not).
    sent: Vec<u64>,
    /// Highest version acknowledged.
    acked: Vec<u64>,
    /// Highest version guaranteed durable (acknowledged before a FLUSH that completed, or FUA).
    durable: Vec<u64>,
}

impl History {
    fn new() -> Self {
        let n = BLOCKS as usize;
        History {
            sent: vec![0; n],
            acked: vec![0; n],
            durable: vec![0; n],
        }
    }
}

fn check_and_adopt(socket: &Path, history: &Mutex<History>) {
    let mut client = Client::connect(socket).expect("connect after restart");
    let mut history = history.lock().expect("history");
    let mut problems = Vec::new();
    let mut buf = vec![0u8; BLOCK];
    for block in 0..BLOCKS {
        client
            .read(block * BLOCK as u64, &mut buf)
            .expect("read after restart");
        let index = block as usize;
        match decode(block, &buf) {
            Ok(found) if found >= history.durable[index] && found <= history.sent[index] => {
                // What recovery kept is the new baseline (made durable by the flush below).
                history.sent[index] = found;
                history.acked[index] = found;
                history.durable[index] = found;
            }
            Ok(found) => problems.push(format!(
                "block {block}: version {found}, but durable {} and sent {}",
                history.durable[index], history.sent[index]
            )),
            Err(why) => problems.push(format!("block {block}: {why}")),
        }
    }
    assert!(
        problems.is_empty(),
        "{} bad blocks after power loss: {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    client.flush().expect("flush");
    client.disconnect();
}

/// Writes random blocks on one connection (some FUA, some flushed on the same connection) while
/// another connection flushes, until an I/O error (the power cut).
fn workload(
    socket: &Path,
    history: &Arc<Mutex<History>>,
    acked_writes: &Arc<AtomicU64>,
    seed: u64,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let socket = socket.to_path_buf();
        let history = Arc::clone(history);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let Ok(mut client) = Client::connect(&socket) else {
                return 0;
            };
            let mut flushes = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let covered = history.lock().expect("history").acked.clone();
                if client.flush().is_err() {
                    break;
                }
                flushes += 1;
                let mut history = history.lock().expect("history");
                for (durable, acked) in history.durable.iter_mut().zip(covered) {
                    *durable = (*durable).max(acked);
                }
            }
            flushes
        })
    };
    let mut client = Client::connect(socket).expect("connect writer");
    let mut state = seed | 1;
    let mut count = 0u64;
    loop {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let block = state % BLOCKS;
        let index = block as usize;
        let version = {
            let mut history = history.lock().expect("history");
            history.sent[index] += 1;
            history.sent[index]
        };
        let fua = state >> 40 & 15 == 0;
        if client
            .write(block * BLOCK as u64, &content(block, version), fua)
            .is_err()
        {
            break;
        }
        {
            let mut history = history.lock().expect("history");
            history.acked[index] = history.acked[index].max(version);
            if fua {
                history.durable[index] = history.durable[index].max(version);
            }
        }
        acked_writes.fetch_add(1, Ordering::SeqCst);
        count += 1;
        if count.is_multiple_of(64) {
            let covered = history.lock().expect("history").acked.clone();
            if client.flush().is_err() {
                break;
            }
            let mut history = history.lock().expect("history");
            for (durable, acked) in history.durable.iter_mut().zip(covered) {
                *durable = (*durable).max(acked);
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let flushes = flusher.join().expect("flusher");
    eprintln!("cycle: {count} writes acknowledged, {flushes} flushes on the other connection");
}

#[test]
fn power_loss_keeps_every_flushed_block() {
    if tools(&["nbdkit", "nbdfuse", "fusermount3", "losetup"]).is_none() || !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(512 << 20))
        .expect("image");
    let state_dir = dir.path().join("state");
    let zbd_dir = dir.path().join("zbd");
    std::fs::create_dir_all(&zbd_dir).expect("zbd dir");

    let mut disk = VolatileDisk::start(&image, &dir.path().join("disk"));
    let mut device = Attached::new(&disk.socket, &state_dir);
    create_volume(&device.device, "64M", "lz4");
    let history = Arc::new(Mutex::new(History::new()));
    let cycles = 3;
    for cycle in 0..cycles {
        let mut served = Served::start(&device.device, &zbd_dir);
        check_and_adopt(&served.socket, &history);
        if cycle == cycles - 1 {
            assert!(served.stop(), "zbd serve did not exit cleanly");
            break;
        }
        let acked = Arc::new(AtomicU64::new(0));
        let writer = {
            let socket = served.socket.clone();
            let history = Arc::clone(&history);
            let acked = Arc::clone(&acked);
            std::thread::spawn(move || workload(&socket, &history, &acked, 0x5EED + cycle))
        };
        // Cut the power at a different point each cycle, mid-stream.
        let target = 600 + 700 * cycle;
        wait_until("the workload to get going", || {
            acked.load(Ordering::SeqCst) >= target
        });
        disk.kill();
        served.kill();
        writer.join().expect("workload thread");

        // Reboot: a fresh nbdkit (empty cache) on the same image, a new block device.
        let detached = device.detach();
        assert!(
            detached.status.success(),
            "detach after power loss: {detached:?}"
        );
        disk = VolatileDisk::start(&image, &dir.path().join("disk"));
        device = Attached::new(&disk.socket, &state_dir);
    }
    run(Command::new(crate::nbd_support::ZBD)
        .arg("check")
        .arg(&device.device));
}

/// ext4 on zbd on the forgetful disk: power cut during a copy with periodic syncs; after the
/// restart the journal replays on mount and `e2fsck -fn` finds the filesystem clean, and every
/// file synced before the cut reads back intact.
#[test]
fn power_loss_under_ext4_leaves_a_clean_filesystem() {
    if tools(&[
        "nbdkit",
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
    ])
    .is_none()
        || !can_mount()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(1 << 30))
        .expect("image");
    let state_dir = dir.path().join("state");
    let zbd_dir = dir.path().join("zbd");
    std::fs::create_dir_all(&zbd_dir).expect("zbd dir");
    let mount_dir = dir.path().join("mnt");

    let mut disk = VolatileDisk::start(&image, &dir.path().join("disk"));
    let mut device = Attached::new(&disk.socket, &state_dir);
    create_volume(&device.device, "512M", "lz4");
    let mut served = Served::start(&device.device, &zbd_dir);
    let mut filesystem = Attached::new(&served.socket, &state_dir);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&filesystem.device));

    // A first tree, synced: it must survive whole.
    let mut mounted = Mounted::new(&filesystem.device, &mount_dir);
    let synced_source = Path::new("/usr/share/doc");
    run(Command::new("cp")
        .arg("-a")
        .arg(synced_source)
        .arg(mount_dir.join("synced")));
    run(Command::new("sync").arg("-f").arg(&mount_dir));
    let expected: Vec<_> = tree(synced_source)
        .into_iter()
        .map(|relative| {
            let print = fingerprint(&synced_source.join(&relative));
            (relative, print)
        })
        .collect();

    // A second copy in flight when the power goes.
    let mut copy = Command::new("cp")
        .arg("-a")
        .arg("/usr/lib")
        .arg(mount_dir.join("in-flight"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cp");
    wait_until("the second copy to write something", || {
        std::fs::read_dir(mount_dir.join("in-flight"))
            .map(|d| d.count() > 3)
            .unwrap_or(false)
    });
    disk.kill();
    served.kill();
    let _ = copy.kill();
    let _ = copy.wait();
    mounted.unmount_after_failure();
    let detached = filesystem.detach();
    assert!(
        detached.status.success(),
        "detach filesystem device: {detached:?}"
    );
    let detached = device.detach();
    assert!(detached.status.success(), "detach disk: {detached:?}");

    // Reboot the stack.
    let _disk = VolatileDisk::start(&image, &dir.path().join("disk"));
    let device = Attached::new(&_disk.socket, &state_dir);
    let mut served = Served::start(&device.device, &zbd_dir);
    let mut filesystem = Attached::new(&served.socket, &state_dir);
    let mut mounted = Mounted::new(&filesystem.device, &mount_dir); // replays the journal
    let mut differing = Vec::new();
    for (relative, print) in &expected {
        let path = mount_dir.join("synced").join(relative);
        if std::fs::symlink_metadata(&path).is_err() || fingerprint(&path) != *print {
            differing.push(relative.clone());
        }
    }
    assert!(
        differing.is_empty(),
        "{} synced files lost or changed: {:?}",
        differing.len(),
        &differing[..differing.len().min(5)]
    );
    mounted.unmount();
    run(Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&filesystem.device));
    let detached = filesystem.detach();
    assert!(detached.status.success(), "{detached:?}");
    assert!(served.stop(), "zbd serve did not exit cleanly");
}
