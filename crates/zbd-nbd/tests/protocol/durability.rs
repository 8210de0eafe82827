//! FLUSH/FUA semantics across connections (what NBD_FLAG_CAN_MULTI_CONN promises) and graceful
//! shutdown, checked against an export that keeps unflushed writes apart from durable ones.

use std::sync::{Arc, Mutex};

use crate::common::noise;
use zbd_nbd::{wire, Export, ExportResult, Listen, MemExport, Server, ServerConfig};
use zbd_testkit::nbd::RawClient;

const SIZE: u64 = 4 << 20;

/// Writes land in `live`; `flush` copies `live` into `durable`; FUA copies just its range.
/// What `durable` holds is what would survive a power cut.
struct VolatileExport {
    live: MemExport,
    durable: Mutex<Vec<u8>>,
}

impl VolatileExport {
    fn new() -> Self {
        VolatileExport {
            live: MemExport::new(SIZE),
            durable: Mutex::new(vec![0u8; SIZE as usize]),
        }
    }
    fn persist(&self, offset: u64, length: u64) -> ExportResult<()> {
        let mut bytes = vec![0u8; length as usize];
        self.live.read_at(offset, &mut bytes)?;
        let mut durable = self.durable.lock().expect("lock");
        durable[offset as usize..(offset + length) as usize].copy_from_slice(&bytes);
        Ok(())
    }
    fn durable(&self, offset: u64, length: usize) -> Vec<u8> {
        self.durable.lock().expect("lock")[offset as usize..offset as usize + length].to_vec()
    }
}

impl Export for VolatileExport {
    fn size(&self) -> u64 {
        SIZE
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        self.live.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ExportResult<()> {
        self.live.write_at(offset, data, false)?;
        if fua {
            self.persist(offset, data.len() as u64)?;
        }
        Ok(())
    }
    fn flush(&self) -> ExportResult<()> {
        self.persist(0, SIZE)
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> ExportResult<()> {
        self.live.trim(offset, length, false)?;
        if fua {
            self.persist(offset, length)?;
        }
        Ok(())
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_trim: bool,
        fua: bool,
    ) -> ExportResult<()> {
        self.live.write_zeroes(offset, length, may_trim, false)?;
        if fua {
            self.persist(offset, length)?;
        }
        Ok(())
    }
}

struct Running {
    export: Arc<VolatileExport>,
    socket: std::path::PathBuf,
    stop: zbd_nbd::ShutdownHandle,
    thread: Option<std::thread::JoinHandle<Result<(), zbd_nbd::ServerError>>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start() -> Self {
        crate::common::init_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("nbd.sock");
        let export = Arc::new(VolatileExport::new());
        let server = Server::bind(
            &Listen::Unix(socket.clone()),
            export.clone(),
            ServerConfig::default(),
        )
        .expect("bind");
        let stop = server.shutdown_handle();
        let thread = Some(std::thread::spawn(move || server.serve()));
        Running {
            export,
            socket,
            stop,
            thread,
            _dir: dir,
        }
    }
    fn stop(&mut self) -> Result<(), zbd_nbd::ServerError> {
        self.stop.shutdown();
        self.thread
            .take()
            .map_or(Ok(()), |t| t.join().expect("server thread"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn write(client: &mut RawClient, flags: u16, handle: u64, offset: u64, data: &[u8]) {
    client.request(flags, wire::CMD_WRITE, handle, offset, data.len() as u32);
    client.send(data);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (handle, 0));
}

#[test]
fn flush_on_one_connection_covers_writes_completed_on_another() {
    let running = Running::start();
    let mut writer = RawClient::connect(&running.socket);
    let (_, flags) = writer.handshake(false, false);
    assert_ne!(flags & wire::FLAG_CAN_MULTI_CONN, 0);
    let mut flusher = RawClient::connect(&running.socket);
    flusher.handshake(true, false);

    let data = noise(1, 256 << 10);
    write(&mut writer, 0, 1, 1 << 20, &data);
    assert!(
        running.export.durable(1 << 20, data.len()) != data,
        "not flushed yet"
    );

    flusher.request(0, wire::CMD_FLUSH, 2, 0, 0);
    assert_eq!(flusher.reply(0).error, 0);
    assert!(
        running.export.durable(1 << 20, data.len()) == data,
        "FLUSH missed the other connection's write"
    );

    // FUA on the second connection also makes the first connection's completed write durable
    // for the range it covers, and its own data durable before the reply.
    let more = noise(2, 64 << 10);
    write(&mut writer, 0, 3, 2 << 20, &more);
    write(&mut flusher, wire::CMD_FLAG_FUA, 4, 3 << 20, &more);
    assert!(
        running.export.durable(3 << 20, more.len()) == more,
        "FUA write not durable"
    );
}

#[test]
fn shutdown_finishes_in_flight_requests_then_flushes() {
    let mut running = Running::start();
    let mut client = RawClient::connect(&running.socket);
    client.handshake(true, false);
    let count = 64u64;
    let data: Vec<Vec<u8>> = (0..count).map(|i| noise(i, 64 << 10)).collect();
    for (handle, chunk) in data.iter().enumerate() {
        client.request(
            0,
            wire::CMD_WRITE,
            handle as u64,
            handle as u64 * (64 << 10),
            chunk.len() as u32,
        );
        client.send(chunk);
    }
    // The first reply proves the server is busy with this client before the stop begins.
    let first = client.reply(0);
    assert_eq!(first.error, 0);
    let mut acknowledged = vec![first.handle];
    // Stop while the writes are in flight; read replies meanwhile so nothing blocks.
    let stopper = {
        let stop = running.stop.clone();
        std::thread::spawn(move || stop.shutdown())
    };
    while let Some(reply) = client.reply_or_eof(0) {
        assert_eq!(reply.error, 0, "write {} failed", reply.handle);
        acknowledged.push(reply.handle);
    }
    eprintln!(
        "{} of {count} writes acknowledged before the stop",
        acknowledged.len()
    );
    stopper.join().expect("stopper");
    running.stop().expect("clean stop");
    // Every acknowledged write is durable: the server flushed after the last reply.
    for handle in acknowledged {
        let offset = handle * (64 << 10);
        assert!(
            running.export.durable(offset, 64 << 10) == data[handle as usize],
            "write {handle} lost"
        );
    }
}
