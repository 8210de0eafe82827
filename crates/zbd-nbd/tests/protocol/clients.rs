//! Real NBD clients (libnbd's nbdinfo and nbdcopy, qemu-img, qemu-io, fio's nbd engine) against
//! an in-process server on a Unix socket.

use std::process::Command;

use crate::common::{file_bytes, noise, run, stdout, tool, TestServer};
use zbd_nbd::{Export, MemExport, ServerConfig};

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_shows_export_flags_and_block_sizes() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let config = ServerConfig {
        export_name: "disk".into(),
        description: Some("test disk".into()),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(MemExport::new(64 * MIB), config);
    let uri = format!("nbd+unix:///disk?socket={}", server.socket.display());
    let json = stdout(&run(Command::new(&nbdinfo).arg("--json").arg(&uri)));
    for expected in [
        "\"export-size\": 67108864",
        "\"is_read_only\": false",
        "\"can_flush\": true",
        "\"can_fua\": true",
        "\"can_multi_conn\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"can_df\": true",
        "\"block_size_minimum\": 1",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 33554432",
        "\"description\": \"test disk\"",
        "\"base:allocation\"",
    ] {
        assert!(json.contains(expected), "missing {expected} in:\n{json}");
    }
    let list = stdout(&run(Command::new(&nbdinfo)
        .arg("--list")
        .arg("--json")
        .arg(server.uri())));
    assert!(list.contains("\"export-name\": \"disk\""), "{list}");
    server.stop().expect("clean stop");
}

#[test]
fn nbdinfo_on_read_only_export() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let server = TestServer::start_with(MemExport::new(MIB).read_only(), ServerConfig::default());
    let json = stdout(&run(Command::new(&nbdinfo).arg("--json").arg(server.uri())));
    assert!(json.contains("\"is_read_only\": true"), "{json}");
    assert!(json.contains("\"can_trim\": false"), "{json}");
}

/// Parses `nbdinfo --map` lines: offset, length, type number.
fn map(nbdinfo: &std::path::Path, uri: &str) -> Vec<(u64, u64, u32)> {
    let text = stdout(&run(Command::new(nbdinfo).arg("--map").arg(uri)));
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().expect("offset"),
                fields[1].parse().expect("length"),
                fields[2].parse().expect("type"),
            )
        })
        .collect()
}

#[test]
fn qemu_io_writes_reads_discards_and_map_shows_holes() {
    let (Some(qemu_io), Some(nbdinfo)) = (tool("qemu-io"), tool("nbdinfo")) else {
        return;
    };
    let server = TestServer::start(16 * MIB);
    let flushes_before = server.export.flush_count();
    let commands = [
        "write -P 0x5a 0 4M",
        "flush",
        "write -f -P 0x33 1M 64k",
        "discard 2M 1M",
        "write -z 3M 512k",
        "read -P 0x5a 0 1M",
        "read -P 0x33 1M 64k",
        "read -P 0x5a 1088k 960k",
        "read -P 0 2M 1536k",
        "read -P 0x5a 3584k 512k",
        "read -P 0 4M 12M",
    ];
    let mut command = Command::new(&qemu_io);
    command.args(["-f", "raw"]);
    for c in commands {
        command.arg("-c").arg(c);
    }
    let output = run(command.arg(server.uri()));
    let text = stdout(&output);
    assert!(
        !text.contains("failed"),
        "qemu-io reported a failure:\n{text}"
    );
    assert_eq!(text.matches("read ").count(), 6, "{text}");

    // The export itself holds what qemu-io wrote.
    assert!(server.contents(0, MIB as usize).iter().all(|&b| b == 0x5a));
    assert!(server.contents(MIB, 64 << 10).iter().all(|&b| b == 0x33));
    assert!(server
        .contents(2 * MIB, MIB as usize)
        .iter()
        .all(|&b| b == 0));
    assert!(
        server.export.flush_count() > flushes_before,
        "FLUSH/FUA never reached the export"
    );

    // The discarded megabyte is a hole ("hole,zero" = type 3); 0..2M is data.
    let extents = map(&nbdinfo, &server.uri());
    assert!(extents.contains(&(0, 2 * MIB, 0)), "{extents:?}");
    assert!(
        extents
            .iter()
            .any(|&(o, l, t)| o == 2 * MIB && l >= MIB && t == 3),
        "{extents:?}"
    );
    assert!(
        extents.iter().any(|&(o, _, t)| o == 4 * MIB && t == 3),
        "{extents:?}"
    );
    server.stop().expect("clean stop");
}

#[test]
fn qemu_io_pattern_mismatch_is_detected() {
    // Guards the test above: a wrong pattern must make qemu-io say so.
    let Some(qemu_io) = tool("qemu-io") else {
        return;
    };
    let server = TestServer::start(MIB);
    let output = Command::new(&qemu_io)
        .args(["-f", "raw", "-c", "write -P 1 0 4k", "-c", "read -P 2 0 4k"])
        .arg(server.uri())
        .output()
        .expect("run qemu-io");
    let text = stdout(&output);
    assert!(text.contains("Pattern verification failed"), "{text}");
}

/// A raw disk image holding a real ext4 filesystem full of real files.
fn make_disk_image(path: &std::path::Path, size_mib: u64) -> bool {
    let (Some(mkfs), Some(_)) = (tool("mkfs.ext4"), tool("qemu-img")) else {
        return false;
    };
    let tree = path.with_extension("tree");
    std::fs::create_dir_all(&tree).expect("tree dir");
    let mut copied = 0u64;
    let mut entries: Vec<_> = std::fs::read_dir("/usr/bin")
        .expect("/usr/bin")
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if !meta.is_file() || copied + meta.len() > size_mib * MIB / 3 {
            continue;
        }
        if std::fs::copy(entry.path(), tree.join(entry.file_name())).is_ok() {
            copied += meta.len();
        }
    }
    std::fs::write(tree.join("noise.bin"), noise(7, 3 << 20)).expect("noise");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "raw"])
        .arg(path)
        .arg(format!("{size_mib}M")));
    run(Command::new(mkfs)
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(path));
    true
}

#[test]
fn qemu_img_convert_in_and_nbdcopy_out_are_identical() {
    let (Some(qemu_img), Some(nbdcopy)) = (tool("qemu-img"), tool("nbdcopy")) else {
        return;
    };
    let size_mib = 64;
    let server = TestServer::start(size_mib * MIB);
    let image = server.path("disk.img");
    if !make_disk_image(&image, size_mib) {
        return;
    }
    run(Command::new(&qemu_img)
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&image)
        .arg(server.uri()));
    let copy = server.path("copy.img");
    run(Command::new(&nbdcopy).arg(server.uri()).arg(&copy));
    let (original, copied) = (file_bytes(&image), file_bytes(&copy));
    assert_eq!(original.len(), copied.len());
    assert!(
        original == copied,
        "nbdcopy output differs from the converted image"
    );
    // And the export itself, read directly, matches too.
    assert!(server.contents(0, original.len()) == original);
    server.stop().expect("clean stop");
}

fn fio_job(server: &TestServer, name: &str, rw: &str, bs: &str, size_mib: u64) -> String {
    format!(
        "[global]\nioengine=nbd\nuri={uri}\niodepth=16\nnumjobs=2\noffset_increment={size_mib}M\n\
         size={size_mib}M\nrefill_buffers=1\nbuffer_compress_percentage=50\n\
         buffer_compress_chunk=4k\nverify=crc32c\ndo_verify=1\nverify_fatal=1\n\
         group_reporting=1\nverify_state_save=0\n[{name}]\nrw={rw}\nbs={bs}\n",
        uri = server.uri()
    )
}

#[test]
fn fio_nbd_engine_verifies_random_and_sequential_writes() {
    let Some(fio) = tool("fio") else { return };
    let server = TestServer::start(64 * MIB);
    for (name, rw, bs) in [("seq", "write", "1M"), ("rand", "randwrite", "4k")] {
        let job = server.path(&format!("{name}.fio"));
        std::fs::write(&job, fio_job(&server, name, rw, bs, 16)).expect("job file");
        let report = server.path(&format!("{name}.json"));
        // In the temp dir: fio may leave state files in its working directory.
        run(Command::new(&fio)
            .current_dir(server.dir.path())
            .arg("--output-format=json")
            .arg(format!("--output={}", report.display()))
            .arg(&job));
        let text = String::from_utf8_lossy(&file_bytes(&report)).into_owned();
        // The nbd engine prints a line before the JSON document.
        let json: serde_json::Value =
            serde_json::from_str(&text[text.find('{').expect("JSON")..]).expect("fio JSON");
        let job = &json["jobs"][0];
        assert_eq!(job["error"], 0, "fio job {name} failed: {job}");
        let written = job["write"]["io_bytes"].as_u64().expect("write bytes");
        let verified = job["read"]["io_bytes"].as_u64().expect("read bytes");
        // group_reporting sums both jobs: each wrote and verified its 16 MiB.
        assert_eq!(written, 32 * MIB, "{name}");
        assert_eq!(
            verified,
            32 * MIB,
            "{name}: verify did not read everything back"
        );
    }
    // Both jobs really wrote (numjobs=2 means two connections, two regions).
    assert!(server.contents(0, 4096).iter().any(|&b| b != 0));
    assert!(server.contents(16 * MIB, 4096).iter().any(|&b| b != 0));
    server.stop().expect("clean stop");
}

#[test]
fn graceful_stop_flushes_the_export() {
    let server = TestServer::start(MIB);
    let export = server.export.clone();
    let before = export.flush_count();
    server.stop().expect("clean stop");
    assert_eq!(export.flush_count(), before + 1);
    assert_eq!(Export::size(&*export), MIB);
}

#[test]
fn tcp_listener_serves_on_loopback() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    crate::common::init_logging();
    let export = std::sync::Arc::new(MemExport::new(MIB));
    let address = "127.0.0.1:0".parse().expect("address");
    let server = zbd_nbd::Server::bind(
        &zbd_nbd::Listen::Tcp(address),
        export,
        ServerConfig::default(),
    )
    .expect("bind");
    let zbd_nbd::Listen::Tcp(bound) = server.listen().clone() else {
        panic!("not TCP")
    };
    assert_ne!(bound.port(), 0);
    let stop = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve());
    let output = Command::new(&nbdinfo)
        .arg("--size")
        .arg(format!("nbd://{bound}"))
        .output()
        .expect("run nbdinfo");
    stop.shutdown();
    thread.join().expect("server thread").expect("clean stop");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), MIB.to_string());
}
