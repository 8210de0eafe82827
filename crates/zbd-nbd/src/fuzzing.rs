//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`, off in normal builds):
//! the real handshake and the real request reader, checker and replies, fed from a byte slice,
//! against a small RAM export. Each returns nothing; a panic or a broken invariant is the finding.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::budget::InflightBudget;
use crate::export::Export;
use crate::handshake::{self, Offer, Session, BASE_ALLOCATION_ID};
use crate::mem::MemExport;
use crate::transmission::{self, Connection, Context};

/// Small enough that every exec is cheap, big enough for multi-chunk requests.
const EXPORT_BYTES: u64 = 1 << 20;
const PAYLOAD_BYTES_MAX: u32 = 256 << 10;
const BUDGET_BYTES: u64 = 512 << 10;

/// Runs the server side of a handshake on `input` as everything the client sends.
pub fn handshake(input: &[u8]) {
    let export = MemExport::new(EXPORT_BYTES);
    let shutting_down = AtomicBool::new(input.first().is_some_and(|b| b & 0x80 != 0));
    let offer = Offer {
        export: &export,
        name: "fuzz",
        directory: None,
        description: Some("fuzzed export"),
        payload_bytes_max: PAYLOAD_BYTES_MAX,
        shutting_down: &shutting_down,
    };
    let mut reader = input;
    let mut replies = Vec::new();
    let _ = handshake::negotiate(&mut reader, &mut replies, &offer);
}

/// Runs the transmission phase on `input`: its first byte picks the session (bit 0 structured
/// replies, bit 1 `base:allocation` selected, bit 2 read-only export), the rest is the request
/// stream. Afterwards every request must have given its budget back.
pub fn requests(input: &[u8]) {
    let Some((&choice, stream)) = input.split_first() else {
        return;
    };
    let mut export = MemExport::new(EXPORT_BYTES);
    if choice & 4 != 0 {
        export = export.read_only();
    }
    let export: Arc<dyn Export> = Arc::new(export);
    let structured = choice & 1 != 0;
    let session = Session {
        structured,
        allocation_context: (structured && choice & 2 != 0).then_some(BASE_ALLOCATION_ID),
        transmission_flags: handshake::transmission_flags(&*export, structured),
        size: export.size(),
    };
    let connection = Arc::new(Connection::new(0, session, Box::new(io::sink())));
    let budget = Arc::new(InflightBudget::new(BUDGET_BYTES));
    let context = Context {
        export,
        payload_bytes_max: PAYLOAD_BYTES_MAX,
        threads: 1,
        budget: Arc::clone(&budget),
        payload_timeout: crate::limits::CLIENT_READ_TIMEOUT,
    };
    transmission::serve(stream, &connection, &context);
    assert_eq!(budget.held_bytes(), 0, "a request kept its budget");
}
