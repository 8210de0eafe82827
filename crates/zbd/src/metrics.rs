//! Prometheus metrics: the text exposition format (version 0.0.4) of a volume's statistics and
//! of the requests served, for `zbd serve --metrics ADDR` (a tiny HTTP/1.1 responder on its own
//! thread) and `zbd stat --prometheus` (node_exporter's textfile collector).
//!
//! Names follow Prometheus conventions: `zbd_` prefix, base units in the name (`_bytes`,
//! `_seconds`), `_total` for counters, ratios in 0..1. Every series carries `volume="PATH"`, so
//! several volumes' files can sit in one textfile directory.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use zbd_core::Stats;

use crate::commands::stat::Savings;

/// Request kinds timed by [`Requests`], in the order they are exposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
}

const OPS: [Op; 6] = [
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::Trim,
    Op::WriteZeroes,
    Op::BlockStatus,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write_zeroes",
            Op::BlockStatus => "block_status",
        }
    }
}

/// Upper bounds of the latency buckets, seconds (the last, +Inf, is implied).
const BUCKETS_SECONDS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    5.0,
];

/// One operation's counters: updated with relaxed atomics (a few per request), read when
/// scraped.
#[derive(Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    nanos_sum: AtomicU64,
    /// Per bucket, not cumulative (+Inf last); summed when rendered.
    buckets: [AtomicU64; BUCKETS_SECONDS.len() + 1],
}

/// Requests the NBD export served, by operation: counts, bytes, errors and latency (time spent
/// in the volume, from the export's call to its return).
#[derive(Default)]
pub struct Requests {
    ops: [OpCounters; OPS.len()],
}

impl Requests {
    /// Records one request of `op` over `bytes` that took from `started` to now.
    pub fn record(&self, op: Op, bytes: u64, started: Instant, ok: bool) {
        let elapsed = started.elapsed();
        let Some(counters) = OPS
            .iter()
            .position(|o| *o == op)
            .and_then(|i| self.ops.get(i))
        else {
            return;
        };
        counters.requests.fetch_add(1, Ordering::Relaxed);
        counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !ok {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        counters.nanos_sum.fetch_add(nanos, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS_SECONDS.len());
        if let Some(count) = counters.buckets.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Builds the exposition text: one `# HELP`/`# TYPE` pair per family, then its samples.
struct Text {
    out: String,
    volume: String,
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{name}{{volume=\"{}\"", self.volume);
        for (key, label) in labels {
            let _ = write!(self.out, ",{key}=\"{}\"", escape(label));
        }
        let _ = writeln!(self.out, "}} {value}");
    }

    /// A family with one sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// The metrics of volume `name`, and of the requests served if `requests` is given.
pub fn render(
    name: &str,
    s: &Stats,
    thin: &crate::thin::Settings,
    requests: Option<&Requests>,
) -> String {
    let mut t = Text {
        out: String::new(),
        volume: escape(name),
    };
    space(&mut t, s);
    thin_provisioning(&mut t, s, thin);
    io(&mut t, s);
    health(&mut t, s);
    if let Some(requests) = requests {
        served(&mut t, requests);
    }
    t.out
}

fn space(t: &mut Text, s: &Stats) {
    let split = Savings::of(s);
    let g = "gauge";
    t.one(
        "zbd_logical_size_bytes",
        g,
        "Logical size of the volume.",
        s.logical_bytes as f64,
    );
    t.family("zbd_logical_bytes", g, "Logical bytes by block state.");
    t.sample(
        "zbd_logical_bytes",
        &[("state", "data")],
        split.data_logical_bytes as f64,
    );
    t.sample(
        "zbd_logical_bytes",
        &[("state", "zero")],
        split.zero_bytes as f64,
    );
    t.sample(
        "zbd_logical_bytes",
        &[("state", "unmapped")],
        split.unmapped_bytes as f64,
    );
    t.one(
        "zbd_physical_live_bytes",
        g,
        "Stored (compressed or raw) bytes of live blocks.",
        s.physical_bytes_live as f64,
    );
    t.one(
        "zbd_physical_allocated_bytes",
        g,
        "Bytes of extents in use (live, partly dead, open).",
        s.physical_bytes_allocated as f64,
    );
    t.one(
        "zbd_physical_dead_bytes",
        g,
        "Bytes of extents in use that hold no live data (the cleaner's work).",
        s.dead_bytes as f64,
    );
    t.one(
        "zbd_data_area_bytes",
        g,
        "Size of the data area.",
        s.data_area_bytes as f64,
    );
    t.one(
        "zbd_metadata_area_bytes",
        g,
        "Size of the metadata area (superblocks, checkpoints, map).",
        s.metadata_bytes as f64,
    );
    t.one(
        "zbd_metadata_ram_bytes",
        g,
        "RAM used by the map and extent table.",
        s.metadata_ram_bytes as f64,
    );
    t.one(
        "zbd_data_savings_ratio",
        g,
        "1 - stored bytes / logical bytes of non-zero data blocks (0..1).",
        split.data_savings_pct / 100.0,
    );
    t.one(
        "zbd_savings_including_zeroes_ratio",
        g,
        "1 - stored bytes / logical bytes of data and zero blocks (0..1).",
        s.savings_pct / 100.0,
    );
    t.one(
        "zbd_dedup_ratio",
        g,
        "Blocks holding data / blocks stored for them (1 without deduplication).",
        s.dedup_ratio,
    );
    if let Some(d) = &s.dedup_index {
        t.one(
            "zbd_dedup_index_budget_bytes",
            g,
            "RAM budget of the inline dedup index.",
            d.budget_bytes as f64,
        );
        t.one(
            "zbd_dedup_lookups_total",
            "counter",
            "Blocks written that the inline dedup index was asked about (this open).",
            d.index.lookups as f64,
        );
        t.one(
            "zbd_dedup_hits_total",
            "counter",
            "Blocks written that equalled a stored block and became references (this open).",
            d.index.verified as f64,
        );
    }
    t.one(
        "zbd_write_amplification_ratio",
        g,
        "Bytes written to storage (data, metadata, cleaner) / bytes the host wrote.",
        s.write_amplification,
    );
    t.one(
        "zbd_extent_size_bytes",
        g,
        "Size of one extent.",
        f64::from(s.extent_bytes),
    );
    t.family("zbd_extents", g, "Extents of the data area by state.");
    for (state, count) in [
        ("free", s.extents_free),
        ("in_use", s.extents_in_use),
        ("open", s.extents_open),
        ("pending_free", s.extents_pending_free),
    ] {
        t.sample("zbd_extents", &[("state", state)], count as f64);
    }
    t.one(
        "zbd_data_area_extents",
        g,
        "Extents in the data area.",
        s.extents_total as f64,
    );
    t.one(
        "zbd_cleaner_low_watermark_ratio",
        g,
        "Free extents below which the cleaner starts (0..1).",
        f64::from(s.clean_low_pct) / 100.0,
    );
}

/// The warning threshold and the reserve (docs/operations.md, "Thin provisioning").
fn thin_provisioning(t: &mut Text, s: &Stats, thin: &crate::thin::Settings) {
    let r = crate::thin::Report::of_stats(s, thin);
    let g = "gauge";
    t.one(
        "zbd_data_area_used_ratio",
        g,
        "Live (stored) data and map pages carved from the data area / its size (0..1).",
        r.data_area_used_pct / 100.0,
    );
    t.one(
        "zbd_data_area_writable_used_ratio",
        g,
        "Live data and map pages / the part of the data area writes may fill (less the \
         space reserve and the cleaner's last extent): 1 at ENOSPC.",
        r.writable_used_pct / 100.0,
    );
    t.one(
        "zbd_data_area_warn_used_ratio",
        g,
        "Warning threshold on zbd_data_area_writable_used_ratio (zbd serve --warn-used).",
        f64::from(r.warn_used_pct) / 100.0,
    );
    t.one(
        "zbd_data_area_above_warn",
        g,
        "1 when the data area is used at or above the warning threshold.",
        if r.above_warn { 1.0 } else { 0.0 },
    );
    t.one(
        "zbd_space_reserve_bytes",
        g,
        "Free space host writes leave for a filesystem's repair (zbd serve --reserve).",
        r.reserve_bytes as f64,
    );
    t.one(
        "zbd_space_reserve_lent",
        g,
        "1 when the reserve is lent to writes (the volume opened full).",
        if r.reserve_lent { 1.0 } else { 0.0 },
    );
}

fn io(t: &mut Text, s: &Stats) {
    let c = &s.counters;
    let k = "counter";
    t.one(
        "zbd_host_written_bytes_total",
        k,
        "Bytes the host wrote.",
        c.host_bytes_written as f64,
    );
    t.one(
        "zbd_host_read_bytes_total",
        k,
        "Bytes the host read.",
        c.host_bytes_read as f64,
    );
    t.family(
        "zbd_storage_written_bytes_total",
        k,
        "Bytes written to storage, by kind.",
    );
    for (kind, bytes) in [
        ("data", c.data_bytes_written),
        ("metadata", c.metadata_bytes_written),
        ("cleaner", c.cleaner_bytes_written),
    ] {
        t.sample(
            "zbd_storage_written_bytes_total",
            &[("kind", kind)],
            bytes as f64,
        );
    }
    t.one(
        "zbd_storage_read_bytes_total",
        k,
        "Bytes read from storage for host reads.",
        c.storage_bytes_read as f64,
    );
    t.one(
        "zbd_flushes_total",
        k,
        "Flushes completed.",
        c.flushes as f64,
    );
    t.one(
        "zbd_checkpoints_total",
        k,
        "Checkpoints written.",
        c.checkpoints as f64,
    );
    t.one(
        "zbd_cleaner_runs_total",
        k,
        "Cleaner passes.",
        c.cleaner_runs as f64,
    );
    t.one(
        "zbd_cleaner_extents_reclaimed_total",
        k,
        "Extents the cleaner freed.",
        c.extents_reclaimed as f64,
    );
    t.one(
        "zbd_cleaner_moved_bytes_total",
        k,
        "Bytes of live blocks the cleaner moved.",
        c.cleaner_bytes_moved as f64,
    );
    t.one(
        "zbd_cleaner_locked_runs_total",
        k,
        "Writes that cleaned with every other request waiting (the cleaner fell behind).",
        s.locked_cleanings as f64,
    );
    t.one(
        "zbd_cleaner_space_short_rounds_total",
        k,
        "Writes that found space short and cleaned before placing again.",
        s.space_short_rounds as f64,
    );
    let m = &s.map_cache;
    t.one(
        "zbd_map_cache_hits_total",
        k,
        "Map page lookups found in RAM.",
        m.hits as f64,
    );
    t.one(
        "zbd_map_cache_faults_total",
        k,
        "Map page lookups that read the page from the volume.",
        m.faults as f64,
    );
    t.one(
        "zbd_map_cache_read_bytes_total",
        k,
        "Bytes of map pages read from the volume.",
        m.bytes_read as f64,
    );
    t.family(
        "zbd_map_cache_pages",
        "gauge",
        "Map pages in RAM, by state.",
    );
    for (state, pages) in [
        ("resident", m.resident_pages),
        ("dirty", m.dirty_pages),
        ("budget", m.budget_pages),
    ] {
        t.sample("zbd_map_cache_pages", &[("state", state)], pages as f64);
    }
    let r = &s.read_cache;
    for (name, help, stored, unit) in [
        (
            "zbd_read_cache_hits_total",
            "Read cache lookups found in RAM: stored bytes, or a decoded unit (decode skipped).",
            r.hits,
            r.unit_hits,
        ),
        (
            "zbd_read_cache_misses_total",
            "Read cache lookups not found: stored bytes read from the volume, or a unit decoded.",
            r.misses,
            r.unit_misses,
        ),
    ] {
        t.family(name, "counter", help);
        t.sample(name, &[("kind", "stored")], stored as f64);
        t.sample(name, &[("kind", "unit")], unit as f64);
    }
    t.family(
        "zbd_read_cache_bytes",
        "gauge",
        "Read cache size, by state.",
    );
    for (state, bytes) in [("held", r.bytes), ("budget", r.budget_bytes)] {
        t.sample("zbd_read_cache_bytes", &[("state", state)], bytes as f64);
    }
}

fn health(t: &mut Text, s: &Stats) {
    let c = &s.counters;
    t.one(
        "zbd_failed",
        "gauge",
        "1 when the volume stopped writing after a failed write or sync (fenced).",
        if s.failed.is_some() { 1.0 } else { 0.0 },
    );
    t.one(
        "zbd_damaged_blocks",
        "gauge",
        "Blocks known damaged (map page damaged).",
        s.damaged_blocks as f64,
    );
    t.one(
        "zbd_corrupt_reads_total",
        "counter",
        "Reads that failed their checksum.",
        c.corrupt_reads as f64,
    );
    t.one(
        "zbd_last_scrub_timestamp_seconds",
        "gauge",
        "When the last complete scrub ended, Unix time (0: never).",
        c.last_scrub_unix as f64,
    );
    t.one(
        "zbd_last_scrub_damaged_blocks",
        "gauge",
        "Damaged blocks the last complete scrub found.",
        c.last_scrub_damaged as f64,
    );
    t.one(
        "zbd_recovery_replayed_records",
        "gauge",
        "Log records replayed by the recovery of this open.",
        s.recovery_records_replayed as f64,
    );
}

fn served(t: &mut Text, requests: &Requests) {
    let k = "counter";
    let families = [
        (
            "zbd_nbd_requests_total",
            "NBD requests served, by operation.",
        ),
        (
            "zbd_nbd_request_errors_total",
            "NBD requests that failed, by operation.",
        ),
        (
            "zbd_nbd_request_bytes_total",
            "Bytes NBD requests covered, by operation.",
        ),
    ];
    for (index, (name, help)) in families.iter().enumerate() {
        t.family(name, k, help);
        for (op, counters) in OPS.iter().zip(&requests.ops) {
            let value = match index {
                0 => &counters.requests,
                1 => &counters.errors,
                _ => &counters.bytes,
            };
            t.sample(
                name,
                &[("op", op.name())],
                value.load(Ordering::Relaxed) as f64,
            );
        }
    }
    let name = "zbd_nbd_request_duration_seconds";
    t.family(
        name,
        "histogram",
        "Time NBD requests spent in the volume, by operation.",
    );
    for (op, counters) in OPS.iter().zip(&requests.ops) {
        let mut cumulative = 0u64;
        let bounds = BUCKETS_SECONDS.iter().map(|b| b.to_string());
        for (bound, count) in bounds
            .chain(std::iter::once("+Inf".to_string()))
            .zip(&counters.buckets)
        {
            cumulative += count.load(Ordering::Relaxed);
            t.sample(
                &format!("{name}_bucket"),
                &[("op", op.name()), ("le", &bound)],
                cumulative as f64,
            );
        }
        let sum = counters.nanos_sum.load(Ordering::Relaxed) as f64 / 1e9;
        t.sample(&format!("{name}_sum"), &[("op", op.name())], sum);
        t.sample(
            &format!("{name}_count"),
            &[("op", op.name())],
            cumulative as f64,
        );
    }
}

/// Parses `--metrics`: `PORT` (127.0.0.1:PORT) or `HOST:PORT` as given.
pub fn parse_address(text: &str) -> Result<SocketAddr> {
    let with_host = if text.contains(':') {
        text.to_string()
    } else {
        format!("127.0.0.1:{text}")
    };
    with_host
        .to_socket_addrs()
        .with_context(|| format!("--metrics {text:?}: expected PORT or HOST:PORT"))?
        .next()
        .with_context(|| format!("--metrics {text:?}: the host has no address"))
}

/// Longest request head read; a bigger one gets 431.
const REQUEST_HEAD_BYTES_MAX: usize = 8192;
/// A scraper that sends nothing or reads nothing for this long is dropped.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `address` and answers `GET /metrics` with `render_now()` on one thread, one
/// connection at a time (a scraper every few seconds needs no more). Returns the bound address.
pub fn spawn_http(
    address: SocketAddr,
    render_now: impl Fn() -> Option<String> + Send + 'static,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(address)
        .with_context(|| format!("--metrics: cannot listen on {address}"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("--metrics: cannot listen on {address}"))?;
    std::thread::Builder::new()
        .name("zbd-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let _ = answer(stream, &render_now);
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, render_now: &dyn Fn() -> Option<String>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > REQUEST_HEAD_BYTES_MAX {
            return respond(&mut stream, "431 Request Header Fields Too Large", "", "");
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => match render_now() {
            Some(body) => {
                let body = if method == "HEAD" { "" } else { body.as_str() };
                respond(
                    &mut stream,
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    body,
                )
            }
            None => respond(
                &mut stream,
                "503 Service Unavailable",
                "text/plain",
                "closing\n",
            ),
        },
        ("GET", _) | ("HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "zbd serves /metrics only\n",
        ),
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", ""),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
