//! Many clients pipeline the largest WRITEs without reading replies; the server's memory stays
//! within the in-flight budget (checked on the process's peak RSS, as a bound computed from the
//! configuration), and every write completes correctly afterwards.
//!
//! Alone in its test binary: the peak RSS is the process's, so no other test may run beside it.

mod common;

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use common::noise;
use zbd_nbd::{
    wire, Export, ExportResult, Extent, InflightBudget, Listen, MemExport, Server, ServerConfig,
};
use zbd_testkit::nbd::RawClient;

const CLIENTS: usize = 4;
const THREADS: usize = 4;
/// The largest payload; above glibc's largest mmap threshold, so each buffer is its own mapping
/// and freeing it returns the memory (the peak measures what was held, not allocator caching).
const PAYLOAD: usize = 32 << 20;
const BUDGET: u64 = 2 * PAYLOAD as u64;
const MIB: u64 = 1 << 20;

/// A RAM export whose writes wait at a gate, so requests pile up in the server the way they do
/// in front of a slow disk. The gate opens once the server has stopped reading because the
/// budget is spent, or, without a working budget, once every thread of every connection holds
/// a payload (the most the server could ever hold).
struct GatedExport {
    inner: MemExport,
    budget: OnceLock<Arc<InflightBudget>>,
    pending: Mutex<(usize, bool)>,
    arrived: Condvar,
}

impl GatedExport {
    fn wait_at_gate(&self) {
        let mut state = self.pending.lock().expect("gate");
        state.0 += 1;
        while !state.1 {
            let budget_blocks = self.budget.get().is_some_and(|b| b.waiting() > 0);
            if budget_blocks || state.0 >= CLIENTS * THREADS {
                state.1 = true;
                self.arrived.notify_all();
                break;
            }
            // The budget has no wake-up to offer: look again shortly.
            state = self
                .arrived
                .wait_timeout(state, Duration::from_millis(5))
                .expect("gate")
                .0;
        }
    }
}

impl Export for GatedExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ExportResult<()> {
        self.wait_at_gate();
        self.inner.write_at(offset, data, fua)
    }
    fn flush(&self) -> ExportResult<()> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> ExportResult<()> {
        self.inner.trim(offset, length, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_trim: bool,
        fua: bool,
    ) -> ExportResult<()> {
        self.inner.write_zeroes(offset, length, may_trim, fua)
    }
    fn block_status(&self, offset: u64, length: u64) -> ExportResult<Vec<Extent>> {
        self.inner.block_status(offset, length)
    }
}

/// A field of /proc/self/status in KiB, as bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("number");
    kib * 1024
}

#[test]
fn memory_of_requests_in_flight_stays_within_the_budget() {
    common::init_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("nbd.sock");
    let export = Arc::new(GatedExport {
        inner: MemExport::new((CLIENTS * PAYLOAD) as u64),
        budget: OnceLock::new(),
        pending: Mutex::new((0, false)),
        arrived: Condvar::new(),
    });
    let config = ServerConfig {
        threads_per_connection: THREADS,
        inflight_bytes_max: BUDGET,
        connections_max: CLIENTS,
        ..ServerConfig::default()
    };
    let server = Server::bind(&Listen::Unix(socket.clone()), export.clone(), config).expect("bind");
    let _ = export.budget.set(server.inflight_budget());
    let stop = server.shutdown_handle();
    let serving = std::thread::spawn(move || server.serve());

    // Every client's data exists (and is touched) before the baseline.
    let patterns: Vec<Arc<Vec<u8>>> = (0..CLIENTS)
        .map(|i| Arc::new(noise(i as u64 + 10, PAYLOAD)))
        .collect();
    let mut clients: Vec<RawClient> = (0..CLIENTS)
        .map(|_| {
            let mut client = RawClient::connect(&socket);
            client.handshake(false, false);
            client
        })
        .collect();
    let baseline = status_bytes("VmRSS:");

    std::thread::scope(|scope| {
        for (index, client) in clients.iter_mut().enumerate() {
            let data = Arc::clone(&patterns[index]);
            scope.spawn(move || {
                let offset = (index * PAYLOAD) as u64;
                // All the writes first, replies only afterwards.
                for handle in 0..THREADS as u64 {
                    client.request(0, wire::CMD_WRITE, handle, offset, PAYLOAD as u32);
                    client.send(&data);
                }
                let mut handles: Vec<u64> = (0..THREADS)
                    .map(|_| {
                        let reply = client.reply(0);
                        assert_eq!(reply.error, 0, "write {} failed", reply.handle);
                        reply.handle
                    })
                    .collect();
                handles.sort_unstable();
                assert_eq!(handles, (0..THREADS as u64).collect::<Vec<_>>());
            });
        }
    });
    let peak = status_bytes("VmHWM:");
    // What the export stores, plus the budget, plus room for thread stacks, socket buffers'
    // user-side copies and allocator slack. Without the budget the server holds
    // CLIENTS × THREADS × PAYLOAD = 512 MiB here.
    let stored = (CLIENTS * PAYLOAD) as u64;
    let bound = baseline + stored + BUDGET + 48 * MIB;
    eprintln!(
        "baseline {} MiB, peak {} MiB, bound {} MiB",
        baseline / MIB,
        peak / MIB,
        bound / MIB
    );
    assert!(
        peak <= bound,
        "peak RSS {} MiB exceeds baseline + stored data + budget + slack = {} MiB",
        peak / MIB,
        bound / MIB
    );

    for (index, pattern) in patterns.iter().enumerate() {
        let mut back = vec![0u8; PAYLOAD];
        export
            .read_at((index * PAYLOAD) as u64, &mut back)
            .expect("read back");
        assert!(back == **pattern, "client {index}'s data is wrong");
    }
    drop(clients);
    stop.shutdown();
    serving.join().expect("server thread").expect("clean stop");
}
