//! zbd on a real Ceph cluster: one throwaway single-node cluster (scripts/ceph-cluster.sh) is
//! started for this whole test binary and always stopped, even when a test fails, so this file
//! has its own `main` (harness = false). Run one test: `cargo test --features ceph --test ceph
//! -- NAME`.

#[path = "../../zbd-core/tests/common/mod.rs"]
mod core_common;
mod nbd_support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nbd_support::{
    can_mount, fingerprint, run, tools, tree, wait_until, Attached, Mounted, Served, ZBD,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::{Codec, Storage, Volume};
use zbd_rados::{ClusterOptions, RadosStorage, RadosTarget};
use zbd_testkit::nbd::Client;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ceph-cluster.sh");
const POOL: &str = "zbdtest";

/// The cluster of this test run; dropping it stops every daemon by the PIDs it started.
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cluster = Cluster {
            conf: PathBuf::new(),
            dir,
        };
        let output = Command::new("bash")
            .arg(SCRIPT)
            .arg("start")
            .arg(cluster.dir.path())
            .arg("--cephx")
            .stdin(Stdio::null())
            .output()
            .expect("run ceph-cluster.sh");
        assert!(
            output.status.success(),
            "cannot start a Ceph cluster: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.conf = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        cluster.ceph(&["osd", "pool", "create", POOL, "8"]);
        cluster
    }

    fn ceph(&self, args: &[&str]) -> Output {
        run(Command::new("ceph")
            .arg("-c")
            .arg(&self.conf)
            .args(["--connect-timeout", "10"])
            .args(args))
    }

    fn script(&self, action: &str) {
        let status = Command::new("bash")
            .arg(SCRIPT)
            .arg(action)
            .arg(self.dir.path())
            .status()
            .expect("run ceph-cluster.sh");
        if !status.success() {
            let log = self.dir.path().join("log/osd.0.stderr");
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            panic!("ceph-cluster.sh {action} failed ({status}); osd.0 stderr: {tail:?}");
        }
    }

    fn options(&self) -> ClusterOptions {
        ClusterOptions {
            conf: Some(self.conf.clone()),
            ..ClusterOptions::default()
        }
    }

    fn zbd(&self) -> Command {
        let mut command = Command::new(ZBD);
        command.env("CEPH_CONF", &self.conf).stdin(Stdio::null());
        command
    }

    fn volume(name: &str) -> PathBuf {
        PathBuf::from(format!("rados:{POOL}/{name}"))
    }

    fn create(&self, name: &str, size: &str, extra: &[&str]) -> PathBuf {
        let volume = Self::volume(name);
        run(self
            .zbd()
            .arg("create")
            .arg(&volume)
            .args(["--size", size])
            .args(extra));
        volume
    }

    /// `zbd serve` with this cluster's config (CEPH_CONF, inherited).
    fn serve(&self, volume: &Path, dir: &Path, extra: &[&str]) -> Served {
        std::env::set_var("CEPH_CONF", &self.conf);
        Served::start_with(volume, dir, extra)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(SCRIPT)
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

fn target(name: &str) -> RadosTarget {
    RadosTarget {
        pool: POOL.into(),
        name: name.into(),
    }
}

/// Storage level: random unaligned writes, reads and discards across object boundaries, with
/// many writes in flight, then sequential scans with writes just ahead, against a byte vector;
/// then the same bytes after a reopen.
fn storage_matches_byte_model(cluster: &Cluster) {
    const SIZE: u64 = 1 << 20;
    let t = target("storage-model");
    let options = cluster.options();
    // The first 128 KiB over small objects (rounded up from 100 000), the rest over 64 KiB ones.
    let storage =
        RadosStorage::create(&options, &t, SIZE, 64 << 10, 100_000, false).expect("create");
    let mut model = vec![0u8; SIZE as usize];
    let mut rng = SmallRng::seed_from_u64(11);
    for i in 0..600 {
        let offset = rng.random_range(0..SIZE - 1);
        let len = rng.random_range(1..=(SIZE - offset).min(200_000));
        let range = offset as usize..(offset + len) as usize;
        match rng.random_range(0..10) {
            0..=4 => {
                // Some writes are all zeros (RadosStorage turns them into zero operations).
                let zeros = i % 5 == 0;
                let data: Vec<u8> = (0..len)
                    .map(|_| if zeros { 0 } else { rng.random() })
                    .collect();
                storage.write_at(offset, &data).expect("write");
                model[range].copy_from_slice(&data);
            }
            5..=7 => {
                let mut buf = vec![0u8; len as usize];
                storage.read_at(offset, &mut buf).expect("read");
                assert!(buf == model[range], "op {i}: read {offset}+{len} differs");
            }
            8 => {
                storage.discard(offset, len).expect("discard");
                model[range].fill(0);
            }
            _ => storage.sync().expect("sync"),
        }
    }
    // Sequential scans (read-ahead serves them) while writes and discards land just ahead of
    // the reader: every read must still see them.
    for scan in 0..3u64 {
        let mut offset = scan * 777;
        while offset < SIZE {
            let len = (20_000 + scan * 3000).min(SIZE - offset);
            let range = offset as usize..(offset + len) as usize;
            let mut buf = vec![0u8; len as usize];
            storage.read_at(offset, &mut buf).expect("read");
            assert!(
                buf == model[range],
                "scan {scan}: read {offset}+{len} differs"
            );
            offset += len;
            let ahead = offset + rng.random_range(0..300_000);
            if rng.random_range(0..3) == 0 && ahead < SIZE {
                let n = rng.random_range(1..=(SIZE - ahead).min(50_000));
                let range = ahead as usize..(ahead + n) as usize;
                if rng.random_range(0..4) == 0 {
                    storage.discard(ahead, n).expect("discard");
                    model[range].fill(0);
                } else {
                    let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                    storage.write_at(ahead, &data).expect("write");
                    model[range].copy_from_slice(&data);
                }
            }
        }
    }
    storage.sync().expect("sync");
    drop(storage);
    let storage = RadosStorage::open(&options, &t).expect("reopen");
    let mut all = vec![0u8; SIZE as usize];
    storage.read_at(0, &mut all).expect("read all");
    assert!(all == model, "content differs after reopen");
}

/// The engine's model test over RADOS: a seeded workload of writes, zero-writes, trims and
/// flushes against a byte vector, with clean reopens and "flush, then the process dies".
fn engine_matches_byte_model(cluster: &Cluster) {
    use core_common::{apply_model, apply_volume, open_opts, small_volume, workload};
    const SIZE: u64 = 2 << 20;
    let t = target("engine-model");
    let options = cluster.options();
    let opts = small_volume(SIZE, 16384, Codec::Lz4, 16, 8);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let storage = RadosStorage::create(
        &options,
        &t,
        sb.total_bytes(),
        256 << 10,
        sb.data_offset,
        false,
    )
    .expect("create");
    let mut vol = Volume::create(Box::new(storage), &opts).expect("create volume");
    let mut model = vec![0u8; SIZE as usize];
    let reopen = || {
        Volume::open(
            Box::new(RadosStorage::open(&options, &t).expect("open")),
            open_opts(),
        )
    };
    for (i, op) in workload(7, SIZE, 1500).iter().enumerate() {
        apply_volume(&vol, op).unwrap_or_else(|e| panic!("op {i}: {e}"));
        apply_model(&mut model, op);
        if i % 300 == 299 {
            let mut all = vec![0u8; SIZE as usize];
            vol.read(0, &mut all).expect("read");
            assert!(all == model, "content differs after op {i}");
            if i % 600 == 299 {
                vol.close().expect("close");
                drop(vol);
            } else {
                vol.flush().expect("flush");
                vol.abandon();
                // What a killed process leaves: only the flushed state.
            }
            vol = reopen().expect("reopen");
        }
    }
    let mut all = vec![0u8; SIZE as usize];
    vol.read(0, &mut all).expect("read");
    assert!(all == model, "final content differs");
    assert!(vol.check(&|_, _| {}).is_clean(), "check finds damage");
    vol.close().expect("close");
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `command`, which must fail with one line of stderr containing `needle`.
fn expect_error(command: &mut Command, needle: &str) {
    let output = command.output().expect("run zbd");
    let stderr = stderr_of(&output);
    assert!(!output.status.success(), "{command:?} succeeded");
    assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains(needle), "expected {needle:?}: {stderr}");
}

/// Bad input gets one line naming the problem.
fn bad_input_gets_one_line_errors(cluster: &Cluster) {
    let volume = cluster.create("bad-input", "64M", &[]);
    expect_error(
        cluster.zbd().args(["check", "rados:nosuchpool/x"]),
        "Ceph pool \"nosuchpool\" does not exist",
    );
    expect_error(
        cluster
            .zbd()
            .arg("check")
            .arg(Cluster::volume("nosuchvolume")),
        "no volume rados:zbdtest/nosuchvolume",
    );
    expect_error(
        cluster.zbd().args(["check", "rados:zbdtest"]),
        "expected rados:POOL/NAME",
    );
    expect_error(
        cluster
            .zbd()
            .arg("check")
            .arg(&volume)
            .args(["--ceph-conf", "/nonexistent/ceph.conf"]),
        "cannot read Ceph config /nonexistent/ceph.conf",
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let unreachable = dir.path().join("unreachable.conf");
    std::fs::write(&unreachable, "[global]\nmon host = [v1:127.0.0.1:9]\n").expect("conf");
    let started = Instant::now();
    expect_error(
        cluster
            .zbd()
            .arg("check")
            .arg(&volume)
            .arg("--ceph-conf")
            .arg(&unreachable)
            .args(["--ceph-connect-timeout", "2"]),
        "cannot reach the Ceph cluster",
    );
    assert!(started.elapsed() < Duration::from_secs(30), "connect hung");
    expect_error(
        cluster
            .zbd()
            .arg("create")
            .arg(&volume)
            .args(["--size", "64M"]),
        "already holds a zbd volume",
    );
    // Locked: a server holds it; `compact` (which needs the volume to itself) is refused, while
    // `check` goes through the server (a scrub) and succeeds.
    let served = cluster.serve(&volume, dir.path(), &[]);
    expect_error(
        cluster.zbd().arg("compact").arg(&volume),
        &format!("volume rados:{POOL}/bad-input is in use by client."),
    );
    run(cluster.zbd().arg("check").arg(&volume));
    drop(served);
    run(cluster.zbd().arg("check").arg(&volume));
}

/// With cephx on, a user whose caps do not cover the pool, or only allow reading it, and a
/// user with no key, each get one line naming the user and the volume (hence the pool).
fn permission_denied_names_user_and_pool(cluster: &Cluster) {
    let volume = cluster.create("perm", "64M", &[]);
    let keyring = |user: &str| {
        let path = cluster.dir.path().join(format!("client.{user}.keyring"));
        path.to_string_lossy().into_owned()
    };
    for (user, osd_caps) in [
        ("nopool", "allow rw pool=someotherpool"),
        ("readonly", "allow r pool=zbdtest"),
    ] {
        cluster.ceph(&[
            "auth",
            "get-or-create",
            &format!("client.{user}"),
            "mon",
            "allow r",
            "osd",
            osd_caps,
            "-o",
            &keyring(user),
        ]);
    }
    let denied = |user: &str, what: &str| {
        format!("permission denied to Ceph user client.{user} for {what} of rados:{POOL}/perm")
    };
    expect_error(
        cluster
            .zbd()
            .arg("check")
            .arg(&volume)
            .args(["--ceph-id", "nopool"]),
        &denied("nopool", "reading the volume header"),
    );
    // Reading is allowed, taking the lock (a write) is not.
    expect_error(
        cluster
            .zbd()
            .arg("compact")
            .arg(&volume)
            .args(["--ceph-id", "readonly"]),
        &denied("readonly", "locking the volume"),
    );
    expect_error(
        cluster
            .zbd()
            .arg("check")
            .arg(&volume)
            .args(["--ceph-id", "nosuchuser"]),
        "no key for Ceph user client.nosuchuser",
    );
    // The admin still can.
    run(cluster.zbd().arg("check").arg(&volume));
}

/// A RADOS volume gets 256 KiB extents unless told otherwise (each extent write is one OSD
/// operation), and `--extent-size` still decides when given.
fn rados_volumes_default_to_large_extents(cluster: &Cluster) {
    let extent = |volume: &PathBuf| {
        let out = run(cluster.zbd().arg("stat").arg(volume));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find(|l| l.contains("codec / extent"))
            .map(|l| l.rsplit('/').next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|| panic!("no extent line in zbd stat:\n{text}"))
    };
    let default = cluster.create("extdefault", "16M", &[]);
    assert_eq!(extent(&default), "256.00 KiB");
    let chosen = cluster.create("extchosen", "16M", &["--extent-size", "64K"]);
    assert_eq!(extent(&chosen), "64.00 KiB");
}

/// Whether librados is mapped into process `pid`.
fn maps_librados(pid: u32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read /proc/PID/maps");
    maps.lines().any(|line| line.contains("librados.so"))
}

/// librados is opened when a rados: volume is, never for a file volume (its and libceph-common's
/// pages and initialisers cost about 14 MiB of RSS: issue 9's 128 MiB bound at 1 TiB). The
/// rados: server is the control: the same check sees the library there.
fn librados_loaded_only_for_rados_volumes(cluster: &Cluster) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("file.zbd");
    run(cluster
        .zbd()
        .arg("create")
        .arg(&file)
        .args(["--size", "64M"]));
    let served = Served::start(&file, dir.path());
    assert!(
        !maps_librados(served.pid()),
        "zbd serve of a file volume has librados mapped"
    );
    drop(served);
    let volume = cluster.create("dlopen", "64M", &[]);
    let served = cluster.serve(&volume, dir.path(), &[]);
    assert!(
        maps_librados(served.pid()),
        "zbd serve of {} has no librados mapped",
        volume.display()
    );
}

/// Two servers start on one volume at once: exactly one serves, the other says who has it.
fn two_servers_race_one_wins(cluster: &Cluster) {
    let volume = cluster.create("race", "64M", &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut children: Vec<_> = (0..2)
        .map(|i| {
            cluster
                .zbd()
                .arg("serve")
                .arg(&volume)
                .arg("--socket")
                .arg(dir.path().join(format!("{i}.sock")))
                .arg("--pidfile")
                .arg(dir.path().join(format!("{i}.pid")))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn zbd serve")
        })
        .collect();
    // Exactly one exits (the loser); the winner writes its pidfile and keeps serving.
    let mut loser = None;
    wait_until("one server to give up", || {
        loser = children
            .iter_mut()
            .position(|c| c.try_wait().expect("try_wait").is_some());
        loser.is_some()
    });
    let loser = loser.expect("loser");
    let winner = 1 - loser;
    let pidfile = dir.path().join(format!("{winner}.pid"));
    wait_until("the winner's pidfile", || pidfile.exists());
    let lost = children
        .remove(loser)
        .wait_with_output()
        .expect("loser output");
    let mut won = children.remove(0);
    let still_running = won.try_wait().expect("try_wait").is_none();
    let _ = Command::new("kill").arg(won.id().to_string()).status();
    let won_status = won.wait().expect("winner exit");
    assert!(still_running, "both servers exited");
    assert!(won_status.success(), "winner did not stop cleanly");
    assert!(!lost.status.success());
    assert!(
        stderr_of(&lost).contains("is in use by client."),
        "loser: {}",
        stderr_of(&lost)
    );
}

const BLOCK: usize = 4096;
const BLOCKS: u64 = 2048;

/// Block `block` at `version`: self-describing, about 2:1 compressible.
fn content(block: u64, version: u64) -> Vec<u8> {
    let mut out = vec![(version % 251) as u8; BLOCK];
    out[..8].copy_from_slice(&block.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let mut rng = SmallRng::seed_from_u64(block << 32 ^ version);
    for chunk in out[16..].chunks_mut(128) {
        let half = chunk.len() / 2;
        rng.fill(&mut chunk[..half]);
    }
    out
}

fn version_of(block: u64, bytes: &[u8]) -> Result<u64, String> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let version = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if bytes != content(block, version) {
        return Err(format!("block {block}: not any version we wrote"));
    }
    Ok(version)
}

/// Reads every block; each must hold a version between the last flushed and the last sent.
fn check_blocks(socket: &Path, durable: &[u64], sent: &[u64]) -> Vec<u64> {
    let mut client = Client::connect(socket).expect("connect");
    let mut buf = vec![0u8; BLOCK];
    let mut found = Vec::new();
    for block in 0..BLOCKS {
        client.read(block * BLOCK as u64, &mut buf).expect("read");
        let i = block as usize;
        let version = version_of(block, &buf).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            version >= durable[i] && version <= sent[i],
            "block {block}: version {version}, flushed {} sent {}",
            durable[i],
            sent[i]
        );
        found.push(version);
    }
    client.disconnect();
    found
}

/// `zbd serve` killed with -9 at random points under writes and flushes; after `zbd unlock`
/// and a restart every flushed block holds its flushed version or a later one it was sent.
fn crash_keeps_every_flushed_block(cluster: &Cluster) {
    let volume = cluster.create("crash", "16M", &["--object-size", "1M"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut durable = vec![0u64; BLOCKS as usize];
    let mut sent = vec![0u64; BLOCKS as usize];
    let mut rng = SmallRng::seed_from_u64(0xC4A5);
    for cycle in 0..4 {
        let mut served = cluster.serve(&volume, dir.path(), &[]);
        let found = check_blocks(&served.socket, &durable, &sent);
        durable.clone_from(&found);
        sent.clone_from(&found);
        if cycle == 3 {
            assert!(served.stop(), "zbd serve did not stop cleanly");
            break;
        }
        let kill_after = rng.random_range(200..1500u64);
        let mut client = Client::connect(&served.socket).expect("connect");
        let mut acked = durable.clone();
        for n in 0..kill_after {
            let block = rng.random_range(0..BLOCKS);
            let i = block as usize;
            sent[i] += 1;
            client
                .write(block * BLOCK as u64, &content(block, sent[i]), false)
                .expect("write");
            acked[i] = sent[i];
            if n % 37 == 36 {
                client.flush().expect("flush");
                durable.clone_from(&acked);
            }
        }
        served.kill();
        drop(client);
        let unlocked = run(cluster.zbd().arg("unlock").arg(&volume));
        assert!(
            String::from_utf8_lossy(&unlocked.stdout).contains("broke the lock"),
            "no lock left by the killed server"
        );
    }
    run(cluster.zbd().arg("check").arg(&volume));
}

/// A discard the OSDs reject (here: it times out while the only OSD is frozen) fails alone:
/// the writes and syncs after it succeed (docs/design.md: a rejected discard never trips the
/// fence). The discarded ranges read as zeros or as their old bytes (the OSD may still apply a
/// request its client gave up on).
fn rejected_discard_does_not_fail_later_syncs(cluster: &Cluster) {
    const SIZE: u64 = 1 << 20;
    let t = target("rejected-discard");
    let options = ClusterOptions {
        op_timeout: Duration::from_secs(SHORT_OP_TIMEOUT),
        ..cluster.options()
    };
    let storage = RadosStorage::create(&options, &t, SIZE, 64 << 10, 0, false).expect("create");
    let data: Vec<u8> = (0..256 << 10).map(|i: u32| (i % 251) as u8).collect();
    storage.write_at(0, &data).expect("write");
    storage.sync().expect("sync");
    cluster.script("pause-osd");
    // A whole object (remove) and part of one (zero): both time out.
    let issued = storage
        .discard(0, 64 << 10)
        .and_then(|()| storage.discard(70_000, 1000));
    // A read of the range waits for the discards (then times out itself): bounded by the op
    // timeout, it is how we know they have failed.
    let mut buf = vec![0u8; 80_000];
    let read = storage.read_at(0, &mut buf);
    cluster.script("resume-osd");
    issued.expect("starting the discards");
    assert!(read.is_err(), "a read succeeded with the OSD frozen");
    storage
        .write_at(200_000, &data[..4096])
        .expect("write after");
    storage
        .sync()
        .expect("a sync after a rejected discard must succeed");
    let mut all = vec![0u8; data.len()];
    storage.read_at(0, &mut all).expect("read");
    let mut expected = data.clone();
    expected[200_000..204_096].copy_from_slice(&data[..4096]);
    for range in [0..64 << 10, 70_000..71_000] {
        let old_or_zero = all[range.clone()] == expected[range.clone()]
            || all[range.clone()].iter().all(|&b| b == 0);
        assert!(old_or_zero, "discarded range {range:?} holds other bytes");
        expected[range.clone()].copy_from_slice(&all[range]);
    }
    assert!(all == expected, "content outside the discards differs");
}

/// The lock lease of the servers of the takeover tests (the shortest zbd accepts): a paused
/// server's watch expires this long after its last ping, and then another may take over.
const LEASE: &str = "10";

/// Sends `signal` to `pid`.
fn signal(pid: u32, signal: &str) {
    run(Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string()));
}

/// Server 1 writes and flushes, then is paused (SIGSTOP) past its lease; server 2 takes the
/// volume over (blocklisting server 1 first) and writes; server 1 is resumed: every write and
/// flush it is then asked for fails, it fences itself, and none of its writes lands. After
/// both stop, the volume holds exactly server 2's view, which includes what server 1 flushed
/// before the takeover, and `zbd check` is clean.
fn takeover_fences_a_paused_server(cluster: &Cluster) {
    const FLUSHED_BY_1: std::ops::Range<u64> = 0..512;
    const WRITTEN_BY_2: std::ops::Range<u64> = 256..768;
    let volume = cluster.create("takeover", "16M", &["--object-size", "1M"]);
    let (dir1, dir2) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let lease = ["--rados-lock-lease", LEASE];
    let mut expected = vec![0u64; BLOCKS as usize];
    let mut server1 = cluster.serve(&volume, dir1.path(), &lease);
    let mut client1 = Client::connect(&server1.socket).expect("connect");
    for block in FLUSHED_BY_1 {
        client1
            .write(block * BLOCK as u64, &content(block, 1), false)
            .expect("write");
        expected[block as usize] = 1;
    }
    client1.flush().expect("flush");
    signal(server1.pid(), "STOP");
    // Server 2 waits for server 1's watch to expire, then takes over; resume server 1 if
    // anything below fails, so that dropping it can stop it.
    let resume1 = |served: &Served| signal(served.pid(), "CONT");
    let taken = catch_unwind(AssertUnwindSafe(|| {
        let started = Instant::now();
        let server2 = cluster.serve(&volume, dir2.path(), &lease);
        (server2, started.elapsed())
    }));
    let (mut server2, waited) = match taken {
        Ok(taken) => taken,
        Err(panic) => {
            resume1(&server1);
            std::panic::resume_unwind(panic);
        }
    };
    let log2 = std::fs::read_to_string(dir2.path().join("serve.log")).unwrap_or_default();
    let seen = check_blocks(&server2.socket, &expected, &expected);
    assert_eq!(
        seen, expected,
        "server 2 does not see what server 1 flushed"
    );
    let mut client2 = Client::connect(&server2.socket).expect("connect");
    for block in WRITTEN_BY_2 {
        client2
            .write(block * BLOCK as u64, &content(block, 2), false)
            .expect("server 2 write");
        expected[block as usize] = 2;
    }
    client2.flush().expect("server 2 flush");
    resume1(&server1);
    // Server 1, resumed: FUA writes (each one must reach the storage), then flushes.
    let (mut failed, mut acknowledged) = (0u64, Vec::new());
    let mut first_error = None;
    let writes1: Vec<u64> = (0..BLOCKS).step_by(2).collect();
    for &block in &writes1 {
        match client1.write(block * BLOCK as u64, &content(block, 3), true) {
            Ok(()) => acknowledged.push(block),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let flushes_failed = (0..3).filter(|_| client1.flush().is_err()).count();
    drop(client1);
    let log1 = std::fs::read_to_string(dir1.path().join("serve.log")).unwrap_or_default();
    println!(
        "takeover: server 2 took over after {:.1} s; server 1 resumed: {} FUA writes, {failed} \
         failed ({:?}), {} acknowledged, {flushes_failed}/3 flushes failed",
        waited.as_secs_f64(),
        writes1.len(),
        first_error.as_deref().unwrap_or("-"),
        acknowledged.len()
    );
    assert!(
        log2.contains("took over the lock") && log2.contains("no watch"),
        "server 2 did not say it took over an expired watch: {log2}"
    );
    // Server 1 kept its watch (pinged every 5 s) until up to a lease after its pause: server
    // 2 must have waited for it to expire, not taken the silence for death.
    assert!(
        waited >= Duration::from_secs(5),
        "server 2 took over after {waited:?}, before server 1's watch could expire"
    );
    assert!(
        acknowledged.is_empty(),
        "server 1 acknowledged {acknowledged:?}"
    );
    assert_eq!(flushes_failed, 3, "a flush of server 1 succeeded");
    assert!(
        log1.contains("lost the volume's lock") || log1.contains("blocklisted"),
        "server 1 did not say why it stopped: {log1}"
    );
    let fenced = log1.lines().find(|l| l.contains("stopped writing"));
    println!("takeover: server 1 logged: {}", fenced.unwrap_or("-"));
    assert!(fenced.is_some(), "server 1 did not fence itself: {log1}");
    // Server 1 may fail to close (its volume failed); server 2 closes cleanly.
    server1.stop();
    assert!(server2.stop(), "server 2 did not stop cleanly");
    drop(client2);
    let server3 = cluster.serve(&volume, dir2.path(), &[]);
    let found = check_blocks(&server3.socket, &expected, &expected);
    assert_eq!(found, expected);
    drop(server3);
    run(cluster.zbd().arg("check").arg(&volume));
    println!(
        "takeover: {} blocks checked exact ({} of server 1 flushed before, {} of server 2), zbd \
         check clean",
        BLOCKS,
        FLUSHED_BY_1.end - FLUSHED_BY_1.start,
        WRITTEN_BY_2.end - WRITTEN_BY_2.start
    );
}

/// `zbd unlock` of a live, idle server: it is blocklisted, and its timer finds the lock lost
/// within a quarter lease, with no request from anyone; its next flush fails, and a new server
/// gets the volume at once.
fn unlocked_server_notices_on_its_timer(cluster: &Cluster) {
    let volume = cluster.create("unlocked", "16M", &["--object-size", "1M"]);
    let (dir1, dir2) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut server1 = cluster.serve(&volume, dir1.path(), &["--rados-lock-lease", LEASE]);
    let mut client = Client::connect(&server1.socket).expect("connect");
    client
        .write(0, &content(0, 1), false)
        .expect("write before");
    client.flush().expect("flush before");
    let unlocked = run(cluster.zbd().arg("unlock").arg(&volume));
    assert!(
        String::from_utf8_lossy(&unlocked.stdout).contains("blocklisted"),
        "unlock did not blocklist"
    );
    let started = Instant::now();
    let log = dir1.path().join("serve.log");
    wait_until("server 1 to find its lock lost", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("lost the volume's lock"))
    });
    let noticed = started.elapsed();
    let written = client.write(4096, &content(1, 1), false);
    let flushed = client.flush();
    assert!(
        written.is_err() || flushed.is_err(),
        "server 1 wrote and flushed after losing its lock"
    );
    drop(client);
    server1.stop();
    let server2 = cluster.serve(&volume, dir2.path(), &[]);
    let mut expected = vec![0u64; BLOCKS as usize];
    expected[0] = 1;
    check_blocks(&server2.socket, &expected, &expected);
    println!(
        "unlock of a live server: it found its lock lost after {:.1} s (lease {LEASE} s)",
        noticed.as_secs_f64()
    );
}

/// `kill -9` of a server, then `zbd serve` again: the new server takes the dead one's lock
/// over at once (its PID is dead on this host), no `zbd unlock` and no lease to wait for,
/// and every flushed block is there.
fn restart_after_kill_needs_no_unlock(cluster: &Cluster) {
    let volume = cluster.create("restart", "16M", &["--object-size", "1M"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut durable = vec![0u64; BLOCKS as usize];
    let mut served = cluster.serve(&volume, dir.path(), &[]);
    let mut client = Client::connect(&served.socket).expect("connect");
    for block in 0..300 {
        client
            .write(block * BLOCK as u64, &content(block, 1), false)
            .expect("write");
        durable[block as usize] = 1;
    }
    client.flush().expect("flush");
    served.kill();
    drop(client);
    let started = Instant::now();
    let served = cluster.serve(&volume, dir.path(), &[]);
    let waited = started.elapsed();
    // The default lease is 30 s: taking over a dead PID must not wait for it.
    assert!(waited < Duration::from_secs(20), "restart took {waited:?}");
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert!(log.contains("has exited"), "no takeover logged: {log}");
    check_blocks(&served.socket, &durable, &durable);
    println!(
        "restart after kill -9: serving again after {:.1} s",
        waited.as_secs_f64()
    );
}

/// How long the OSD stays frozen in the outage test: a few seconds, far below the first
/// server's op timeout and within the PG read lease (scripts/ceph-cluster.sh explains why that
/// matters on a one-OSD cluster).
const OUTAGE: Duration = Duration::from_secs(4);
/// The op timeout of the second server, which the outage outlasts.
const SHORT_OP_TIMEOUT: u64 = 3;

/// The OSD is frozen (SIGSTOP: to its clients a frozen OSD is a dead one; the monitor of this
/// one-OSD cluster has no peer to report it) for a few seconds while writes and a flush are in
/// flight: they wait, then complete once it is back (SIGCONT), and nothing is lost. Then it
/// stays frozen past --rados-op-timeout: the flush fails with EIO (NBD error 5), and what was
/// flushed before is intact once the OSD is back.
fn osd_outage_waits_then_fails_past_timeout(cluster: &Cluster) {
    let volume = cluster.create("outage", "16M", &["--object-size", "1M"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut durable = vec![0u64; BLOCKS as usize];
    {
        let served = cluster.serve(&volume, dir.path(), &["--rados-op-timeout", "60"]);
        let mut client = Client::connect(&served.socket).expect("connect");
        for block in 0..256 {
            client
                .write(block * BLOCK as u64, &content(block, 1), false)
                .expect("write");
            durable[block as usize] = 1;
        }
        client.flush().expect("flush");
        cluster.script("pause-osd");
        // Writes and a flush while the OSD is down: they must wait, not fail.
        let socket = served.socket.clone();
        let (done_tx, done_rx) = mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut client = Client::connect(&socket).expect("connect");
            for block in 256..512u64 {
                client.write(block * BLOCK as u64, &content(block, 1), false)?;
            }
            let flushed = client.flush();
            let _ = done_tx.send(());
            flushed
        });
        // The outage lasts OUTAGE; the flush must not return during it.
        let waited = done_rx.recv_timeout(OUTAGE).is_err();
        cluster.script("resume-osd");
        let resumed = Instant::now();
        let result = writer.join().expect("writer");
        assert!(
            waited,
            "the flush returned while the OSD was down: {result:?}"
        );
        result.expect("writes and flush after the OSD came back");
        assert!(
            resumed.elapsed() < Duration::from_secs(30),
            "the flush took {:?} after the OSD came back",
            resumed.elapsed()
        );
        durable[256..512].fill(1);
        let sent = durable.clone();
        drop(client);
        check_blocks(&served.socket, &durable, &sent);
    }
    // Past the timeout: every request issued during the outage fails after SHORT_OP_TIMEOUT.
    let timeout = SHORT_OP_TIMEOUT.to_string();
    let mut served = cluster.serve(&volume, dir.path(), &["--rados-op-timeout", &timeout]);
    let mut client = Client::connect(&served.socket).expect("connect");
    cluster.script("pause-osd");
    let started = Instant::now();
    let mut first_error = None;
    for block in 512..768u64 {
        if let Err(e) = client.write(block * BLOCK as u64, &content(block, 1), false) {
            first_error = Some(e);
            break;
        }
    }
    let flushed = client.flush();
    let elapsed = started.elapsed();
    cluster.script("resume-osd");
    let error = first_error
        .or(flushed.err())
        .expect("writes and flush succeeded with the OSD down");
    assert!(
        error.to_string().contains("server error 5"),
        "not EIO: {error}"
    );
    // It waited for the timeout (not an immediate failure) and not much longer.
    let waited = Duration::from_secs(SHORT_OP_TIMEOUT);
    assert!(
        elapsed >= waited - Duration::from_millis(500) && elapsed < waited * 10,
        "failed after {elapsed:?} with --rados-op-timeout {SHORT_OP_TIMEOUT}"
    );
    drop(client);
    // The failed server may not close cleanly; a new one recovers from what was flushed.
    served.kill();
    run(cluster.zbd().arg("unlock").arg(&volume));
    let mut sent = durable.clone();
    sent[512..768].fill(1);
    let served = cluster.serve(&volume, dir.path(), &[]);
    check_blocks(&served.socket, &durable, &sent);
}

/// ext4 on a served RADOS volume: copy a real tree, `e2fsck -fn` clean, every file equal after
/// the server restarts.
fn ext4_keeps_every_file_across_restart(cluster: &Cluster) {
    if tools(&["nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "e2fsck"]).is_none()
        || !can_mount()
    {
        return;
    }
    let source = Path::new("/usr/share/doc");
    let volume = cluster.create("ext4", "1G", &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let mnt = dir.path().join("mnt");
    let expected: Vec<_> = tree(source)
        .into_iter()
        .map(|p| (fingerprint(&source.join(&p)), p))
        .collect();
    assert!(expected.len() > 100, "too few files to mean anything");
    {
        let served = cluster.serve(&volume, dir.path(), &[]);
        let mut attached = Attached::new(&served.socket, &state);
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&attached.device));
        let mut mounted = Mounted::new(&attached.device, &mnt);
        run(Command::new("cp").arg("-a").arg(source).arg(&mnt));
        mounted.unmount();
        run(Command::new("e2fsck")
            .args(["-f", "-n"])
            .arg(&attached.device));
        assert!(attached.detach().status.success(), "detach");
        drop(served);
    }
    let served = cluster.serve(&volume, dir.path(), &[]);
    let attached = Attached::new(&served.socket, &state);
    run(Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&attached.device));
    let mounted = Mounted::new(&attached.device, &mnt);
    let copy = mnt.join("doc");
    let differing: Vec<_> = expected
        .iter()
        .filter(|(print, p)| fingerprint(&copy.join(p)) != *print)
        .map(|(_, p)| p)
        .take(5)
        .collect();
    assert!(
        differing.is_empty(),
        "files differ after restart: {differing:?}"
    );
    assert_eq!(tree(&copy).len(), expected.len());
    drop(mounted);
    drop(attached);
}

type Test = fn(&Cluster);

fn main() -> ExitCode {
    let tests: &[(&str, Test)] = &[
        ("storage_matches_byte_model", storage_matches_byte_model),
        ("engine_matches_byte_model", engine_matches_byte_model),
        (
            "bad_input_gets_one_line_errors",
            bad_input_gets_one_line_errors,
        ),
        (
            "permission_denied_names_user_and_pool",
            permission_denied_names_user_and_pool,
        ),
        ("two_servers_race_one_wins", two_servers_race_one_wins),
        (
            "librados_loaded_only_for_rados_volumes",
            librados_loaded_only_for_rados_volumes,
        ),
        (
            "rados_volumes_default_to_large_extents",
            rados_volumes_default_to_large_extents,
        ),
        (
            "crash_keeps_every_flushed_block",
            crash_keeps_every_flushed_block,
        ),
        (
            "rejected_discard_does_not_fail_later_syncs",
            rejected_discard_does_not_fail_later_syncs,
        ),
        (
            "takeover_fences_a_paused_server",
            takeover_fences_a_paused_server,
        ),
        (
            "unlocked_server_notices_on_its_timer",
            unlocked_server_notices_on_its_timer,
        ),
        (
            "restart_after_kill_needs_no_unlock",
            restart_after_kill_needs_no_unlock,
        ),
        (
            "osd_outage_waits_then_fails_past_timeout",
            osd_outage_waits_then_fails_past_timeout,
        ),
        (
            "ext4_keeps_every_file_across_restart",
            ext4_keeps_every_file_across_restart,
        ),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<_> = tests
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        return ExitCode::SUCCESS;
    }
    if tools(&["ceph-mon", "ceph-osd", "ceph", "monmaptool"]).is_none() {
        eprintln!("SKIPPED: Ceph is not installed (scripts/install-deps.sh --with-ceph)");
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let cluster = Cluster::start();
    eprintln!(
        "ceph cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let failures = AtomicU64::new(0);
    for (name, test) in selected {
        let t = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| test(&cluster)));
        let verdict = if result.is_ok() {
            "ok"
        } else {
            failures.fetch_add(1, Ordering::SeqCst);
            "FAILED"
        };
        println!(
            "test {name} ... {verdict} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }
    drop(cluster);
    let failed = failures.load(Ordering::SeqCst);
    println!(
        "ceph tests: {} failed, {:.1} s in all",
        failed,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
