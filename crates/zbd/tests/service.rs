//! `zbd` run as a service (issue 29): a server that outlives its log reader and stops cleanly on
//! SIGTERM, default sockets that do not collide, `zbd attach` waiting for a starting server and
//! naming a stale socket, honest savings, metrics, `zbd list`, units.
//! Servers are stopped by PID when a test ends, whether it passed or not; waits poll a condition
//! with a deadline, never a bare sleep.

use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const ZBD: &str = env!("CARGO_BIN_EXE_zbd");
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `zbd detach DEVICE --state-dir STATE`, which must succeed.
fn detach(device: impl AsRef<std::ffi::OsStr>, state: &std::path::Path) {
    let out = Command::new(ZBD)
        .arg("detach")
        .arg(device)
        .arg("--state-dir")
        .arg(state)
        .output()
        .expect("zbd detach");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether every tool is installed; says which one is not (the test then returns early).
fn have_all(tools: &[&str]) -> bool {
    match tools.iter().find(|t| !have(t)) {
        Some(tool) => {
            eprintln!("skipped: {tool} not installed");
            false
        }
        None => true,
    }
}

fn create(volume: &Path, size: &str) {
    let out = Command::new(ZBD)
        .arg("create")
        .arg(volume)
        .args(["--size", size])
        .output()
        .expect("zbd create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `zbd serve` child, stopped by PID on drop (SIGKILL if SIGTERM did not end it in time).
struct Server {
    child: Option<Child>,
    volume: PathBuf,
}

impl Server {
    /// Starts `zbd serve VOLUME ARGS --pidfile DIR/NAME.pid` with the given stderr and waits
    /// for the pidfile.
    fn start(volume: &Path, args: &[&str], stderr: Stdio) -> Server {
        let pidfile = volume.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let child = Command::new(ZBD)
            .arg("serve")
            .arg(volume)
            .args(args)
            .arg("--pidfile")
            .arg(&pidfile)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start zbd serve");
        let mut server = Server {
            child: Some(child),
            volume: volume.to_path_buf(),
        };
        wait_until("zbd serve's pidfile", || {
            let child = server.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                panic!("zbd serve {} exited early: {status}", volume.display());
            }
            pidfile.exists()
        });
        server
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("running")
    }

    /// SIGTERM, then the exit status (None: it did not exit in time, and was killed).
    fn terminate(&mut self) -> Option<ExitStatus> {
        let child = self.child.take()?;
        zbd_testkit::process::terminate(child, DEADLINE)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() && self.terminate().is_none() {
            eprintln!("zbd serve {} had to be killed", self.volume.display());
        }
    }
}

fn nbdinfo_size(uri: &str) -> Result<u64, String> {
    let out = Command::new("timeout")
        .args(["10", "nbdinfo", "--size", uri])
        .output()
        .map_err(|e| format!("cannot run nbdinfo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nbdinfo {uri}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("nbdinfo printed no size: {e}"))
}

/// A server whose stderr reader went away (`zbd serve ... 2>&1 | head -1`) keeps answering,
/// and still closes the volume and exits 0 on SIGTERM (it used to panic on EPIPE: exit 101).
#[test]
fn serve_outlives_a_closed_stderr_and_exits_0_on_sigterm() {
    if !have("nbdinfo") {
        eprintln!("skipped: nbdinfo not installed (libnbd-bin)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "64M");
    let socket = dir.path().join("v.sock");
    let socket_arg = socket.to_str().expect("path");
    let mut server = Server::start(&volume, &["--socket", socket_arg], Stdio::piped());
    let stderr = server.child().stderr.take().expect("stderr pipe");
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().expect("a log line").expect("first log line");
    assert!(first.starts_with("zbd: opened "), "first line: {first}");
    let second = lines.next().expect("a log line").expect("second log line");
    assert!(second.contains("serving"), "second line: {second}");
    drop(lines);
    // The reader is gone now (as `head -2` exits): every later log line meets EPIPE.
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    for attempt in 0..3 {
        let size = nbdinfo_size(&uri).unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        assert_eq!(size, 64 << 20);
    }
    let status = server.terminate().expect("zbd serve exits on SIGTERM");
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM must close cleanly: {status}"
    );
}

/// The line `zbd serve` logs first names its NBD URI; returns the socket in it.
fn served_socket(log: &Path) -> PathBuf {
    let mut socket = None;
    wait_until("the serving line", || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        socket = text
            .lines()
            .find_map(|l| l.split("?socket=").nth(1))
            .map(PathBuf::from);
        socket.is_some()
    });
    socket.expect("socket")
}

/// Two volumes with the same file name, served with default sockets, both serve, on different
/// sockets (they used to collide on /run/zbd/<file name>.sock).
#[test]
fn default_sockets_of_same_named_volumes_differ() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut servers = Vec::new();
    let mut sockets = Vec::new();
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        let volume = dir.path().join(sub).join("v.zbd");
        create(&volume, "16M");
        let log = dir.path().join(format!("{sub}.log"));
        let file = std::fs::File::create(&log).expect("log");
        servers.push(Server::start(&volume, &[], Stdio::from(file)));
        sockets.push(served_socket(&log));
    }
    assert_ne!(sockets[0], sockets[1]);
    for (server, socket) in servers.iter_mut().zip(&sockets) {
        assert!(socket.starts_with("/run/zbd"), "{}", socket.display());
        let alive = server.child().try_wait().expect("wait").is_none();
        assert!(alive, "server for {} exited", socket.display());
        assert!(socket.exists(), "{} is gone", socket.display());
    }
}

/// A stale socket (its server is gone) is named in one line, without nbdfuse's raw error.
#[test]
fn attach_names_a_stale_socket_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    let out = Command::new(ZBD)
        .arg("attach")
        .arg("--socket")
        .arg(&socket)
        .args(["--wait", "0", "--state-dir"])
        .arg(dir.path().join("state"))
        .output()
        .expect("zbd attach");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("stale socket"), "{stderr}");
    assert!(stderr.contains(socket.to_str().expect("path")), "{stderr}");
    assert!(!stderr.contains("nbdfuse"), "{stderr}");
}

/// `zbd attach` started before its server waits for it (bounded), then attaches.
#[test]
fn attach_waits_for_a_starting_server() {
    if !have_all(&["nbdfuse", "fusermount3", "losetup"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let socket = dir.path().join("v.sock");
    let state = dir.path().join("state");
    let attach = Command::new(ZBD)
        .arg("attach")
        .arg("--socket")
        .arg(&socket)
        .args(["--method", "fuse", "--wait", "30", "--state-dir"])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("zbd attach");
    // Started after attach: attach must not give up on the missing socket.
    let mut server = Server::start(
        &volume,
        &["--socket", socket.to_str().expect("path")],
        Stdio::null(),
    );
    let out = attach.wait_with_output().expect("attach output");
    let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut listed = None;
    let mut dio = None;
    let mnt = dir.path().join("mnt");
    if out.status.success() {
        // No second page cache under the filesystem: the loop device does direct I/O.
        let name = device.trim_start_matches("/dev/");
        dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))
            .ok()
            .map(|v| v.trim().to_string());
        // zbd list names the device and where it is mounted.
        std::fs::create_dir(&mnt).expect("mkdir");
        let mkfs = Command::new("mkfs.ext4").args(["-q", &device]).status();
        let mount = Command::new("mount").arg(&device).arg(&mnt).status();
        let list = Command::new(ZBD)
            .args(["list", "--json", "--state-dir"])
            .arg(&state)
            .output()
            .expect("zbd list");
        let _ = Command::new("umount").arg(&mnt).status();
        assert!(mkfs.is_ok_and(|s| s.success()) && mount.is_ok_and(|s| s.success()));
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
        let pid = server.child().id();
        listed = list
            .as_array()
            .and_then(|l| l.iter().find(|e| e["pid"] == pid).cloned())
            .map(|e| (e["device"].clone(), e["mountpoint"].clone()));
        assert!(listed.is_some(), "{list}");
        detach(&device, &state);
    }
    assert!(
        out.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(device.starts_with("/dev/"), "{device}");
    assert_eq!(
        dio,
        Some("1".to_string()),
        "{device} does not do direct I/O"
    );
    let (listed_device, listed_mountpoint) = listed.expect("listed");
    assert_eq!(listed_device, device.as_str());
    assert_eq!(listed_mountpoint, mnt.to_str().expect("path"));
}

/// An error names its path once, and its cause once (a missing socket directory).
#[test]
fn serve_error_names_the_missing_directory_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let socket = dir.path().join("missing").join("v.sock");
    let out = Command::new(ZBD)
        .arg("serve")
        .arg(&volume)
        .arg("--socket")
        .arg(&socket)
        .output()
        .expect("zbd serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let missing = dir.path().join("missing");
    assert!(
        stderr.contains(&format!("directory {} does not exist", missing.display())),
        "{stderr}"
    );
    assert_eq!(stderr.matches("No such file").count(), 0, "{stderr}");
}

/// Deterministic incompressible bytes (xorshift64).
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

fn stat_json(volume: &Path) -> serde_json::Value {
    let out = Command::new(ZBD)
        .args(["stat", "--json"])
        .arg(volume)
        .output()
        .expect("zbd stat");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stat json")
}

/// Savings on the data actually stored are told apart from zero and never-written blocks: 512 KiB
/// random + 512 KiB text + 3 MiB zeroes on a 16 MiB volume is about 2:1 on its data, not the
/// 8:1 that counting the zeroes gives.
#[test]
fn stat_separates_data_savings_from_zero_and_unwritten_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let mut input = random_bytes(512 << 10, 0x9e37_79b9_7f4a_7c15);
    input.extend((0..512 << 10).map(|i| b"zbd compresses blocks of text\n"[i % 30]));
    input.resize(4 << 20, 0);
    let file = dir.path().join("in.bin");
    std::fs::write(&file, &input).expect("input");
    let out = Command::new(ZBD)
        .arg("copy")
        .arg(&volume)
        .arg(&file)
        .output()
        .expect("zbd copy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let v = stat_json(&volume);
    assert_eq!(v["data_logical_bytes"], 1 << 20, "{v}");
    assert_eq!(v["zero_bytes"], 3 << 20, "{v}");
    assert_eq!(v["unmapped_bytes"], 12 << 20, "{v}");
    assert_eq!(v["data_stored_bytes"], v["physical_bytes_live"]);
    let data_pct = v["data_savings_pct"].as_f64().expect("data savings");
    assert!((35.0..65.0).contains(&data_pct), "data savings {data_pct}");
    let ratio = v["data_compression_ratio"].as_f64().expect("ratio");
    assert!((1.5..3.0).contains(&ratio), "data ratio {ratio}");
    // The figure over data and zero blocks is still there, and much higher.
    assert!(v["savings_pct"].as_f64().expect("savings") > 80.0, "{v}");

    let out = Command::new(ZBD)
        .arg("stat")
        .arg(&volume)
        .output()
        .expect("zbd stat");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("data savings"))
        .unwrap_or_else(|| panic!("no data savings line: {text}"));
    assert!(line.contains(&format!("{data_pct:.1} %")), "{line}");
    assert!(text.contains("zero / never written"), "{text}");
}

/// Runs `promtool check metrics` on `text`; None if promtool is not installed.
fn promtool_check(text: &str) -> Option<Result<(), String>> {
    use std::io::Write;
    if !have("promtool") {
        return None;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    })
}

/// The value of the first sample of `name` in exposition text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn copy_into(volume: &Path, dir: &Path) {
    let mut input = random_bytes(256 << 10, 7);
    input.extend((0..768 << 10).map(|i| b"metrics of a compressed volume\n"[i % 31]));
    let file = dir.join("in.bin");
    std::fs::write(&file, &input).expect("input");
    let out = Command::new(ZBD)
        .arg("copy")
        .arg(volume)
        .arg(&file)
        .output()
        .expect("zbd copy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `zbd stat --prometheus` prints metrics promtool accepts (no lint warnings either), with the
/// physical bytes `zbd stat --json` reports.
#[test]
fn stat_prometheus_passes_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    copy_into(&volume, dir.path());
    let out = Command::new(ZBD)
        .args(["stat", "--prometheus"])
        .arg(&volume)
        .output()
        .expect("zbd stat --prometheus");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = stat_json(&volume);
    let live = json["physical_bytes_live"].as_f64().expect("live bytes");
    assert!(live > 0.0);
    assert_eq!(
        sample(&text, "zbd_physical_live_bytes"),
        Some(live),
        "{text}"
    );
    assert!(text.contains("# TYPE zbd_flushes_total counter"), "{text}");
    match promtool_check(&text) {
        None => eprintln!("skipped promtool: not installed (Debian package prometheus)"),
        Some(result) => result.unwrap_or_else(|e| panic!("promtool check metrics: {e}\n{text}")),
    }
}

/// `GET path` on 127.0.0.1:port; the response body if the status is 200.
fn http_get(address: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    Ok(body.to_string())
}

/// A process stopped by PID when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port (bound then released: another process could take it meanwhile, which
/// would fail the test loudly, not wrongly).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `zbd serve --metrics` answers on loopback with metrics promtool accepts, counts the NBD
/// requests served, and a real Prometheus scraping it reports the physical bytes `zbd stat
/// --json` does.
#[test]
fn serve_metrics_are_scraped_by_prometheus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    copy_into(&volume, dir.path());
    let socket = dir.path().join("v.sock");
    let log = dir.path().join("serve.log");
    let file = std::fs::File::create(&log).expect("log");
    let _server = Server::start(
        &volume,
        &[
            "--socket",
            socket.to_str().expect("path"),
            "--metrics",
            "127.0.0.1:0",
        ],
        Stdio::from(file),
    );
    let mut address = String::new();
    wait_until("the metrics line", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("metrics on http://").nth(1) {
            address = rest.split('/').next().unwrap_or_default().to_string();
        }
        !address.is_empty()
    });
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    if have("nbdinfo") {
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        let out = Command::new("nbdinfo")
            .arg("--map")
            .arg(&uri)
            .output()
            .expect("nbdinfo");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if have("nbdcopy") {
        // Read everything back through the server: the read cache is asked for every block.
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        let out = Command::new("nbdcopy")
            .arg(&uri)
            .arg("null:")
            .output()
            .expect("nbdcopy");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let body = http_get(&address, "/metrics").expect("GET /metrics");
    if have("nbdcopy") {
        let misses = body
            .lines()
            .find(|l| {
                l.starts_with("zbd_read_cache_misses_total{") && l.contains("kind=\"stored\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(misses.is_some_and(|n| n >= 1.0), "{body}");
        // `zbd stat` asks the server, which has served no read since.
        let cache = stat_json(&volume)["read_cache"].clone();
        assert_eq!(misses, cache["misses"].as_f64(), "{cache}\n{body}");
    }
    assert!(
        http_get(&address, "/other").is_err(),
        "only /metrics is served"
    );
    if have("nbdinfo") {
        let statuses = body
            .lines()
            .find(|l| l.starts_with("zbd_nbd_requests_total{") && l.contains("op=\"block_status\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(statuses.is_some_and(|n| n >= 1.0), "{body}");
    }
    assert!(
        body.contains("zbd_nbd_request_duration_seconds_bucket{"),
        "{body}"
    );
    match promtool_check(&body) {
        None => eprintln!("skipped promtool: not installed (Debian package prometheus)"),
        Some(result) => result.unwrap_or_else(|e| panic!("promtool check metrics: {e}\n{body}")),
    }
    let live = stat_json(&volume)["physical_bytes_live"]
        .as_f64()
        .expect("live bytes");

    if !have("prometheus") {
        eprintln!("skipped the Prometheus scrape: prometheus not installed");
        return;
    }
    let port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: zbd\n    \
             static_configs:\n      - targets: ['{address}']\n"
        ),
    )
    .expect("config");
    let prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("prometheus.log")).expect("log"),
        ))
        .spawn()
        .expect("start prometheus");
    let _prometheus = Reaped(prometheus);
    let api = format!("127.0.0.1:{port}");
    let mut scraped = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while scraped.is_none() {
        assert!(
            Instant::now() < deadline,
            "Prometheus never returned zbd_physical_live_bytes: {}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
        let Ok(body) = http_get(&api, "/api/v1/query?query=zbd_physical_live_bytes") else {
            continue;
        };
        let reply: serde_json::Value = serde_json::from_str(&body).expect("api json");
        scraped = reply["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
    }
    assert_eq!(scraped, Some(live));
}

/// `zbd list` shows two served volumes (socket, size, savings, state) and a dead control socket
/// (a server killed with SIGKILL leaves one) as dead, without failing.
#[test]
fn list_shows_served_volumes_and_a_dead_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut servers = Vec::new();
    for name in ["one.zbd", "two.zbd"] {
        let volume = dir.path().join(name);
        create(&volume, "16M");
        copy_into(&volume, dir.path());
        let socket = volume.with_extension("sock");
        servers.push((
            Server::start(
                &volume,
                &["--socket", socket.to_str().expect("path")],
                Stdio::null(),
            ),
            volume,
            socket,
        ));
    }
    // A dead control socket, removed when the test ends.
    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    std::fs::create_dir_all("/run/zbd").expect("run dir");
    let dead = Removed(PathBuf::from(format!(
        "/run/zbd/ctl-test-dead-{}.sock",
        std::process::id()
    )));
    drop(std::os::unix::net::UnixListener::bind(&dead.0).expect("bind"));

    let out = Command::new(ZBD)
        .args(["list", "--json"])
        .output()
        .expect("zbd list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let entries = list.as_array().expect("array");
    for (server, volume, socket) in &mut servers {
        let pid = server.child().id();
        let entry = entries
            .iter()
            .find(|e| e["pid"] == pid)
            .unwrap_or_else(|| panic!("{} not listed: {list}", volume.display()));
        assert_eq!(entry["state"], "serving", "{entry}");
        assert_eq!(entry["volume"], volume.to_str().expect("path"), "{entry}");
        assert_eq!(entry["socket"], socket.to_str().expect("path"), "{entry}");
        assert_eq!(entry["size_bytes"], 16 << 20, "{entry}");
        let savings = entry["data_savings_pct"].as_f64().expect("savings");
        assert!(savings > 10.0, "{entry}");
    }
    let dead_entry = entries
        .iter()
        .find(|e| e["control"] == dead.0.to_str().expect("path"))
        .unwrap_or_else(|| panic!("dead socket not listed: {list}"));
    assert_eq!(dead_entry["state"], "dead");

    let out = Command::new(ZBD).arg("list").output().expect("zbd list");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("STATE"), "{text}");
    for (_, volume, _) in &servers {
        let line = text
            .lines()
            .find(|l| l.contains(volume.to_str().expect("path")))
            .unwrap_or_else(|| panic!("{} not in the table: {text}", volume.display()));
        assert!(line.starts_with("serving"), "{line}");
    }
    assert!(text.lines().any(|l| l.starts_with("dead")), "{text}");
}

/// The units under packaging/systemd, their `/usr/bin/zbd` pointed at the binary under test,
/// pass `systemd-analyze verify` without a warning, and keep systemd from restarting a fenced
/// volume (exit 3, tested below).
#[test]
fn units_pass_systemd_analyze_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd");
    let serve = std::fs::read_to_string(units.join("zbd@.service")).expect("zbd@.service");
    assert!(serve.contains("\nType=notify\n"), "{serve}");
    assert!(serve.contains("\nRestartPreventExitStatus=3\n"), "{serve}");
    assert!(serve.contains("\nExecStart=/usr/bin/zbd serve --from-list %i\n"));
    if !have("systemd-analyze") {
        eprintln!("skipped systemd-analyze verify: systemd-analyze not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for unit in ["zbd@.service", "zbd-attach@.service"] {
        let text = std::fs::read_to_string(units.join(unit)).expect("unit");
        std::fs::write(dir.path().join(unit), text.replace("/usr/bin/zbd", ZBD)).expect("copy");
        let instance = unit.replace("@.", "@test.");
        std::os::unix::fs::symlink(unit, dir.path().join(&instance)).expect("instance");
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.path().join("zbd@test.service"))
        .arg(dir.path().join("zbd-attach@test.service"))
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .expect("systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.trim().is_empty(), "warnings: {said}");
}

/// What zbd@NAME.service runs: `zbd serve --from-list NAME` serves the list's volume with its
/// options, sends READY=1 to $NOTIFY_SOCKET only once its socket answers, STOPPING=1 on
/// SIGTERM, and exits 0; then what zbd-attach@NAME.service runs attaches it as /dev/zbd/NAME.
#[test]
fn serve_from_list_notifies_systemd_when_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let socket = dir.path().join("listed.sock");
    let name = format!("test-{}", std::process::id());
    let list = dir.path().join("volumes");
    std::fs::write(
        &list,
        format!(
            "# test list\nother /nonexistent.zbd\n{name}  {}  socket={},map-cache=1M\n",
            volume.display(),
            socket.display()
        ),
    )
    .expect("list");
    let notify_path = dir.path().join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("notify socket");
    notify.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let child = Command::new(ZBD)
        .args(["serve", "--from-list", &name, "--list"])
        .arg(&list)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("zbd serve --from-list");
    let mut server = Server {
        child: Some(child),
        volume: volume.clone(),
    };
    let mut message = [0u8; 256];
    let n = notify
        .recv(&mut message)
        .expect("READY=1 within the deadline");
    let ready = String::from_utf8_lossy(&message[..n]).into_owned();
    assert!(ready.starts_with("READY=1\n"), "{ready}");
    assert!(
        ready.contains(&format!("MAINPID={}", server.child().id())),
        "{ready}"
    );
    // Ready means answering: no retry here.
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    if have("nbdinfo") {
        assert_eq!(nbdinfo_size(&uri), Ok(16 << 20));
    } else {
        std::os::unix::net::UnixStream::connect(&socket).expect("socket answers at READY=1");
    }

    if ["nbdfuse", "fusermount3", "losetup"]
        .iter()
        .all(|t| have(t))
    {
        let state = dir.path().join("state");
        let out = Command::new(ZBD)
            .args(["attach", "--from-list", &name, "--list"])
            .arg(&list)
            .arg("--state-dir")
            .arg(&state)
            .args(["--method", "fuse"])
            .output()
            .expect("zbd attach --from-list");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let link = PathBuf::from(format!("/dev/zbd/{name}"));
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let target = std::fs::read_link(&link);
        let detach = Command::new(ZBD)
            .arg("detach")
            .arg(&link)
            .arg("--state-dir")
            .arg(&state)
            .output()
            .expect("zbd detach");
        let _ = std::fs::remove_file(&link);
        assert_eq!(target.expect("link"), PathBuf::from(&device));
        assert!(
            detach.status.success(),
            "{}",
            String::from_utf8_lossy(&detach.stderr)
        );
        assert!(!link.exists(), "detach removes the link");
    } else {
        eprintln!("skipped attach --from-list: nbdfuse, fusermount3 or losetup missing");
    }

    let _ = Command::new("kill")
        .args(["-TERM", &server.child().id().to_string()])
        .status();
    let n = notify.recv(&mut message).expect("STOPPING=1");
    assert_eq!(&message[..n], b"STOPPING=1");
    let status = server.terminate().expect("exits");
    assert_eq!(status.code(), Some(0));
}

/// A tmpfs mount, unmounted when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A volume that fenced itself (its final flush hit ENOSPC on a full tmpfs) makes the server
/// exit 3, which zbd@.service's RestartPreventExitStatus= keeps from being restarted.
#[test]
fn fenced_volume_exits_3() {
    if !have("nbdcopy") {
        eprintln!("skipped: nbdcopy not installed (libnbd-bin)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4M", "tmpfs"])
        .arg(&mnt)
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    }
    let _mount = Mounted(mnt.clone());
    let volume = mnt.join("v.zbd");
    create(&volume, "64M");
    let input = dir.path().join("random");
    std::fs::write(&input, random_bytes(16 << 20, 99)).expect("input");
    let socket = dir.path().join("v.sock");
    let mut server = Server::start(
        &volume,
        &["--socket", socket.to_str().expect("path")],
        Stdio::null(),
    );
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    // Fails or not, depending on when the storage runs out: the fence is what counts.
    let _ = Command::new("timeout")
        .args(["60", "nbdcopy"])
        .arg(&input)
        .arg(&uri)
        .output();
    let status = server.terminate().expect("exits");
    assert_eq!(status.code(), Some(3), "{status}");
}

/// `zbd gen-man DIR` writes a page per visible subcommand, rendered from the clap definition
/// (the flags added here are in it); `zbd completions bash` is a script bash accepts.
#[test]
fn manual_and_completions_come_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let man = dir.path().join("man1");
    let out = Command::new(ZBD)
        .arg("gen-man")
        .arg(&man)
        .output()
        .expect("zbd gen-man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "zbd.1",
        "zbd-serve.1",
        "zbd-list.1",
        "zbd-stat.1",
        "zbd-attach.1",
    ] {
        assert!(man.join(page).is_file(), "{page} missing");
    }
    assert!(!man.join("zbd-help.1").exists());
    assert!(
        !man.join("zbd-gen-man.1").exists(),
        "hidden commands have no page"
    );
    let serve = std::fs::read_to_string(man.join("zbd-serve.1")).expect("page");
    assert!(
        serve.contains("metrics") && serve.contains("from\\-list"),
        "{serve}"
    );

    let out = Command::new(ZBD)
        .args(["completions", "bash"])
        .output()
        .expect("zbd completions");
    assert!(out.status.success());
    let script = dir.path().join("zbd.bash");
    std::fs::write(&script, &out.stdout).expect("script");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .expect("bash -n");
    assert!(syntax.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--prometheus"));
}

/// The alert rules docs/operations.md recommends are valid Prometheus rules.
#[test]
fn alert_rules_pass_promtool() {
    if !have("promtool") {
        eprintln!("skipped: promtool not installed (Debian package prometheus)");
        return;
    }
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/prometheus/zbd-alerts.yml");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("SUCCESS: 8 rules found"), "{said}");
}

/// `make deb`'s script packages the binary, units, the volume list as a conffile, man pages,
/// completions and docs (built here from the test's binary).
#[test]
fn debian_package_holds_the_service_files() {
    if !have("dpkg-deb") {
        eprintln!("skipped: dpkg-deb not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-deb.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--bin", ZBD, "--out"])
        .arg(dir.path())
        .output()
        .expect("build-deb.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let contents = Command::new("dpkg-deb")
        .args(["-c", &deb])
        .output()
        .expect("dpkg-deb -c");
    let listing = String::from_utf8_lossy(&contents.stdout);
    for file in [
        "./usr/bin/zbd",
        "./usr/lib/systemd/system/zbd@.service",
        "./usr/lib/systemd/system/zbd-attach@.service",
        "./etc/zbd/volumes",
        "./usr/share/man/man1/zbd-serve.1.gz",
        "./usr/share/bash-completion/completions/zbd",
        "./usr/share/zsh/vendor-completions/_zbd",
        "./usr/share/doc/zbd/operations.md",
    ] {
        assert!(listing.contains(file), "{file} missing:\n{listing}");
    }
    let conffiles = Command::new("dpkg-deb")
        .args(["-I", &deb, "conffiles"])
        .output()
        .expect("conffiles");
    assert_eq!(
        String::from_utf8_lossy(&conffiles.stdout).trim(),
        "/etc/zbd/volumes"
    );
    // dpkg installs it into an empty root (its dependencies are not there: forced), and the
    // installed binary runs and knows its version.
    if !have("dpkg") {
        return;
    }
    let root = dir.path().join("root");
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(d)).expect("dpkg dirs");
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").expect("status");
    let installed = Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args([
            "--force-depends",
            "--force-script-chrootless",
            "--force-not-root",
            "-i",
        ])
        .arg(&deb)
        .output()
        .expect("dpkg -i");
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let version = Command::new(root.join("usr/bin/zbd"))
        .arg("--version")
        .output()
        .expect("installed zbd");
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("zbd "),
        "{version:?}"
    );
}

/// `zbd create` warns when the data area cannot hold the logical size (thin provisioning), and
/// only then.
#[test]
fn create_warns_when_over_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (capacity, warned) in [(Some("16M"), true), (None, false)] {
        let volume = dir.path().join(format!("v{warned}.zbd"));
        let mut command = Command::new(ZBD);
        command.arg("create").arg(&volume).args(["--size", "64M"]);
        if let Some(capacity) = capacity {
            command.args(["--capacity", capacity]);
        }
        let out = command.output().expect("zbd create");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(
            stderr.contains("warning: over-committed"),
            warned,
            "{stderr}"
        );
    }
}

/// After a crash (SIGKILL) the next server says in its first line what recovery replayed.
#[test]
fn serve_logs_what_recovery_replayed() {
    if !have("nbdcopy") {
        eprintln!("skipped: nbdcopy not installed (libnbd-bin)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let input = dir.path().join("random");
    std::fs::write(&input, random_bytes(1 << 20, 5)).expect("input");
    let socket = dir.path().join("v.sock");
    let socket_arg = socket.to_str().expect("path");
    let mut server = Server::start(&volume, &["--socket", socket_arg], Stdio::null());
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    // --flush: without it the data may still be queued in the server when it is killed, and
    // there would be nothing on disk to replay.
    let out = Command::new("nbdcopy")
        .arg("--flush")
        .arg(&input)
        .arg(&uri)
        .output()
        .expect("nbdcopy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut child = server.child.take().expect("child");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let log = dir.path().join("again.log");
    let file = std::fs::File::create(&log).expect("log");
    let _again = Server::start(&volume, &["--socket", socket_arg], Stdio::from(file));
    let mut first = String::new();
    wait_until("the opened line", || {
        first = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        first.contains("serving") || first.starts_with("zbd: opened")
    });
    assert!(first.contains("recovered: replayed"), "{first}");
}

/// `zbd attach --uri nbd://HOST:PORT` attaches a volume served on TCP (`zbd serve --listen`).
#[test]
fn attach_takes_a_tcp_uri() {
    if !have_all(&["nbdfuse", "fusermount3", "losetup"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _server = Server::start(&volume, &["--listen", &listen], Stdio::null());
    let state = dir.path().join("state");
    let out = Command::new(ZBD)
        .args([
            "attach",
            "--uri",
            &format!("nbd://{listen}"),
            "--method",
            "fuse",
        ])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .expect("zbd attach --uri");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let size = Command::new("blockdev")
        .args(["--getsize64", &device])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    detach(&device, &state);
    assert_eq!(size.expect("blockdev"), (16u64 << 20).to_string());
}

/// `--log-format json`: every line the server writes, its own and tracing's, is one JSON object
/// with a timestamp, a level and a message.
#[test]
fn serve_logs_json_lines() {
    let hour_now = || {
        Command::new("date")
            .args(["-u", "+%Y-%m-%dT%H"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .expect("date")
    };
    let hour_before = hour_now();
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "16M");
    let socket = dir.path().join("v.sock");
    let log = dir.path().join("serve.log");
    let file = std::fs::File::create(&log).expect("log");
    let mut server = Server::start(
        &volume,
        &[
            "--socket",
            socket.to_str().expect("path"),
            "--log-format",
            "json",
        ],
        Stdio::from(file),
    );
    if have("nbdinfo") {
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        nbdinfo_size(&uri).expect("nbdinfo");
    }
    let status = server.terminate().expect("exits");
    assert!(status.success());
    let hour_after = hour_now();
    let text = std::fs::read_to_string(&log).expect("log");
    let mut messages = Vec::new();
    for line in text.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let timestamp = event["timestamp"].as_str().expect("timestamp");
        assert!(timestamp.ends_with('Z') && timestamp.len() >= 20, "{line}");
        assert!(event["level"].is_string(), "{line}");
        messages.push(
            event["fields"]["message"]
                .as_str()
                .expect("message")
                .to_string(),
        );
        if event["target"] == "zbd" {
            // Ours are formatted by hand: the clock hour date(1) gave before or after.
            let hour = timestamp.get(..13).expect("hour");
            assert!(
                hour == hour_before || hour == hour_after,
                "{hour} vs {hour_before}"
            );
        }
    }
    assert!(messages.iter().any(|m| m.contains("serving")), "{text}");
    assert!(
        messages.iter().any(|m| m.contains("closed cleanly")),
        "{text}"
    );
}

/// A pidfile left by a killed server is removed as soon as the next one starts, so a script
/// waiting for the pidfile does not take the new server as ready too early (here: it never
/// gets ready, and the stale file must not remain).
#[test]
fn serve_removes_a_stale_pidfile_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("zbd.pid");
    std::fs::write(&pidfile, "999999\n").expect("stale pidfile");
    let out = Command::new(ZBD)
        .arg("serve")
        .arg(dir.path().join("missing.zbd"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--pidfile")
        .arg(&pidfile)
        .output()
        .expect("zbd serve");
    assert_eq!(out.status.code(), Some(1));
    assert!(!pidfile.exists(), "stale pidfile left in place");
}

/// A read that meets a damaged block says so in the server's log (once per block at first,
/// never per retry forever), and the client gets an error, not data.
#[test]
fn serve_logs_damage_found_on_read() {
    if !have("nbdcopy") {
        eprintln!("skipped: nbdcopy not installed (libnbd-bin)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = dir.path().join("v.zbd");
    create(&volume, "4M");
    copy_into(&volume, dir.path());
    let data_offset = stat_json(&volume)["metadata_bytes"]
        .as_u64()
        .expect("metadata bytes");
    // Damage the first stored payload (just past the first segment header).
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&volume)
        .expect("open");
    f.seek(SeekFrom::Start(data_offset + 80)).expect("seek");
    f.write_all(&[0xff, 0x00, 0xff]).expect("damage");
    drop(f);
    let socket = dir.path().join("v.sock");
    let log = dir.path().join("serve.log");
    let file = std::fs::File::create(&log).expect("log");
    let _server = Server::start(
        &volume,
        &["--socket", socket.to_str().expect("path")],
        Stdio::from(file),
    );
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let out = Command::new("nbdcopy")
        .arg(&uri)
        .arg("null:")
        .output()
        .expect("nbdcopy");
    assert!(!out.status.success(), "a damaged block was read as data");
    let mut text = String::new();
    wait_until("the damage line", || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("damaged data: block 0 ")
    });
    assert_eq!(text.matches("damaged data:").count(), 1, "{text}");
}
