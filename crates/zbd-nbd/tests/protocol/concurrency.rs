//! Requests on one connection run concurrently and reply out of order: a read that cannot finish
//! until the client has seen the reply to a later read, and sent a third one, must still succeed.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use zbd_nbd::{wire, Export, ExportError, ExportResult, Listen, Server, ServerConfig};
use zbd_testkit::nbd::RawClient;

/// Reads at offset 0 wait (up to 10 s) for a read at offset 8192, which opens the gate.
struct GateExport {
    opened: Mutex<bool>,
    changed: Condvar,
}

impl Export for GateExport {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        if offset == 0 {
            let opened = self.opened.lock().expect("lock");
            let (opened, _) = self
                .changed
                .wait_timeout_while(opened, Duration::from_secs(10), |open| !*open)
                .expect("lock");
            if !*opened {
                return Err(ExportError::io(
                    "the later read never ran: requests are serialised",
                ));
            }
        } else if offset == 8192 {
            *self.opened.lock().expect("lock") = true;
            self.changed.notify_all();
        }
        buf.fill(offset as u8 + 1);
        Ok(())
    }
    fn write_at(&self, _: u64, _: &[u8], _: bool) -> ExportResult<()> {
        Ok(())
    }
    fn flush(&self) -> ExportResult<()> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> ExportResult<()> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> ExportResult<()> {
        Ok(())
    }
}

#[test]
fn a_later_request_can_overtake_an_earlier_one() {
    crate::common::init_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("nbd.sock");
    let export = Arc::new(GateExport {
        opened: Mutex::new(false),
        changed: Condvar::new(),
    });
    let server = Server::bind(
        &Listen::Unix(socket.clone()),
        export,
        ServerConfig::default(),
    )
    .expect("bind");
    let stop = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve());

    let mut client = RawClient::connect(&socket);
    client.handshake(false, false);
    client.request(0, wire::CMD_READ, 1, 0, 512);
    client.request(0, wire::CMD_READ, 2, 4096, 512);
    // Read 1 is blocked, so the first reply must be read 2's.
    let first = client.reply(512);
    client.request(0, wire::CMD_READ, 3, 8192, 512);
    let mut rest = [client.reply(512), client.reply(512)];
    client.request(0, wire::CMD_DISC, 0, 0, 0);
    stop.shutdown();
    thread.join().expect("server thread").expect("clean stop");

    assert_eq!(
        (first.handle, first.error),
        (2, 0),
        "read 2 should overtake read 1"
    );
    rest.sort_by_key(|reply| reply.handle);
    assert_eq!(
        (rest[0].handle, rest[0].error),
        (1, 0),
        "read 1 failed: {:?}",
        rest[0]
    );
    assert_eq!((rest[1].handle, rest[1].error), (3, 0));
    assert!(rest[0].payload.iter().all(|&b| b == 1));
}
