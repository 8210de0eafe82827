//! The server's log sink: no log reader can stall or kill the server.
//!
//! `zbd serve` runs under systemd, behind a pipe to a logger, or with `2>&1 | head -1`: its
//! stderr may be slow, full or closed. Writing to it from the accept or I/O threads would block
//! them on a full pipe, and `eprintln!` (or tracing-subscriber's report of its own write errors)
//! panics on EPIPE, which killed the connection thread, or the process with exit code 101.
//! So every line goes through a bounded queue to one writer thread:
//! - a full queue drops the line (counted, and the count is logged once the writer catches up);
//! - a write error (EPIPE: the reader went away; Rust already ignores SIGPIPE) makes the writer
//!   drop every later line instead of failing;
//! - nothing but the writer thread ever touches stderr while the sink is installed.
//!
//! Commands other than `serve` never install it: [`line`] then writes directly, ignoring errors.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Lines waiting for the writer; more are dropped.
const QUEUE_LINES_MAX: usize = 4096;

enum Message {
    Line(Vec<u8>),
    /// Answered once every line queued before it was written (or dropped).
    Flush(SyncSender<()>),
}

struct Sink {
    sender: SyncSender<Message>,
    dropped: AtomicU64,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Installs the sink and starts its writer thread (once; later calls do nothing).
pub fn install() {
    let (sender, receiver) = sync_channel(QUEUE_LINES_MAX);
    let sink = Sink {
        sender,
        dropped: AtomicU64::new(0),
    };
    if SINK.set(sink).is_ok() {
        // If the thread cannot start, lines fill the queue and are then dropped: never fatal.
        let _ = std::thread::Builder::new()
            .name("zbd-log".into())
            .spawn(move || write_lines(receiver));
    }
}

fn write_lines(receiver: Receiver<Message>) {
    let mut stderr = std::io::stderr();
    let mut broken = false;
    for message in receiver {
        match message {
            Message::Line(bytes) => {
                if broken {
                    continue;
                }
                let dropped = SINK
                    .get()
                    .map_or(0, |s| s.dropped.swap(0, Ordering::Relaxed));
                let mut result = Ok(());
                if dropped > 0 {
                    result = writeln!(stderr, "zbd: {dropped} log lines dropped (stderr too slow)");
                }
                // Any error (EPIPE above all) means nobody reads: drop the rest.
                broken = result.and_then(|()| stderr.write_all(&bytes)).is_err();
            }
            Message::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Queues `bytes` (one or more whole lines); drops them if the queue is full.
fn push(bytes: Vec<u8>) {
    match SINK.get() {
        Some(sink) => match sink.sender.try_send(Message::Line(bytes)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                sink.dropped.fetch_add(1, Ordering::Relaxed);
            }
        },
        None => {
            let _ = std::io::stderr().write_all(&bytes);
        }
    }
}

/// Whether [`line`] writes JSON objects (`zbd serve --log-format json`), like tracing's events.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`line`] write one JSON object per line, in the shape of tracing-subscriber's JSON
/// events (`timestamp`, `level`, `fields.message`, `target`), so a collector parses both alike.
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// Logs one line (a newline is added).
pub fn line(text: impl Into<String>) {
    let mut text = text.into();
    if JSON.load(Ordering::Relaxed) {
        let event = serde_json::json!({
            "timestamp": rfc3339_now(),
            "level": "INFO",
            "fields": { "message": text },
            "target": "zbd",
        });
        text = event.to_string();
    }
    text.push('\n');
    push(text.into_bytes());
}

/// Now as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC), without a date crate.
fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = now.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        now.subsec_micros()
    )
}

/// Waits, at most `timeout`, until every line queued so far is written (before exiting).
pub fn flush(timeout: Duration) {
    let Some(sink) = SINK.get() else { return };
    let deadline = Instant::now() + timeout;
    let (done, written) = sync_channel(1);
    let mut message = Message::Flush(done);
    loop {
        match sink.sender.try_send(message) {
            Ok(()) => break,
            Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                message = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// What tracing-subscriber writes each formatted event into: the event goes to the queue.
pub struct QueueWriter;

impl Write for QueueWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        push(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
