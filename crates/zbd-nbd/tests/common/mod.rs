//! Shared by the integration tests: an in-process server on a Unix socket in a temp dir that
//! stops (shutdown, join) when dropped, and helpers to run external clients.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

// Not every test binary runs tools.
use zbd_nbd::{
    InflightBudget, Listen, MemExport, Server, ServerConfig, ServerError, ShutdownHandle,
};
#[allow(unused_imports)]
pub use zbd_testkit::process::{run, stdout, tool};

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "zbd_nbd=warn".into()),
        )
        .try_init();
}

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub export: Arc<MemExport>,
    pub budget: Arc<InflightBudget>,
    stop: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    pub fn start(size: u64) -> Self {
        Self::start_with(MemExport::new(size), ServerConfig::default())
    }

    pub fn start_with(export: MemExport, config: ServerConfig) -> Self {
        init_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("nbd.sock");
        let export = Arc::new(export);
        let server = Server::bind(&Listen::Unix(socket.clone()), export.clone(), config)
            .expect("bind server");
        let stop = server.shutdown_handle();
        let budget = server.inflight_budget();
        let thread = std::thread::spawn(move || server.serve());
        TestServer {
            dir,
            socket,
            export,
            budget,
            stop,
            thread: Some(thread),
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Graceful stop; returns what `serve` returned.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.stop.shutdown();
        let thread = self.thread.take().expect("server thread");
        thread.join().expect("server thread panicked")
    }

    /// Bytes of the export, read directly (the oracle for what clients wrote).
    pub fn contents(&self, offset: u64, length: usize) -> Vec<u8> {
        use zbd_nbd::Export;
        let mut buf = vec![0u8; length];
        self.export.read_at(offset, &mut buf).expect("read export");
        buf
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Deterministic, poorly compressible bytes.
pub fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

pub fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
