//! An export that grows while served (`zbd grow` of a served volume): a client that connects
//! afterwards is told the new size and uses it; a client connected before keeps the size it
//! was told, and its requests past that are refused as past the end (EINVAL for reads, ENOSPC
//! for writes), never run. Guards against checking requests against the export's current size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use zbd_nbd::{Export, ExportError, ExportResult, Listen, Server, ServerConfig};
use zbd_testkit::nbd::Client;

const OLD: u64 = 1 << 20;
const NEW: u64 = 2 << 20;

/// RAM of `NEW` bytes of which the first `size` are exported.
struct Growing {
    size: AtomicU64,
    bytes: Mutex<Vec<u8>>,
}

impl Growing {
    fn range(&self, offset: u64, len: usize) -> ExportResult<std::ops::Range<usize>> {
        // The server checks ranges; a request past the size here means it checked the wrong one.
        let end = offset + len as u64;
        if end > self.size.load(Ordering::SeqCst) {
            return Err(ExportError::invalid("past the export's size"));
        }
        Ok(offset as usize..end as usize)
    }
}

impl Export for Growing {
    fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.bytes.lock().expect("lock")[range]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> ExportResult<()> {
        let range = self.range(offset, data.len())?;
        self.bytes.lock().expect("lock")[range].copy_from_slice(data);
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
fn connections_keep_the_size_they_were_told_and_new_ones_see_growth() {
    crate::common::init_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("nbd.sock");
    let export = Arc::new(Growing {
        size: AtomicU64::new(OLD),
        bytes: Mutex::new(vec![0; NEW as usize]),
    });
    let server = Server::bind(
        &Listen::Unix(socket.clone()),
        Arc::clone(&export) as Arc<dyn Export>,
        ServerConfig::default(),
    )
    .expect("bind");
    let stop = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve());

    let mut old = Client::connect(&socket).expect("connect before");
    assert_eq!(old.size, OLD);
    old.write(0, &[1u8; 4096], false).expect("write before");
    export.size.store(NEW, Ordering::SeqCst);

    let mut new = Client::connect(&socket).expect("connect after");
    assert_eq!(
        new.size, NEW,
        "a connection after the growth is told the new size"
    );
    let far = OLD + 4096;
    new.write(far, &[2u8; 4096], false)
        .expect("write past the old end");
    let mut buf = vec![0u8; 4096];
    new.read(0, &mut buf).expect("read");
    assert_eq!(buf, vec![1u8; 4096]);

    // The old connection: past its size, refused by the server with the codes of "past the end".
    let read = old
        .read(far, &mut buf)
        .expect_err("read past the told size");
    assert!(read.to_string().contains("error 22"), "{read}");
    let write = old
        .write(far, &[3u8; 4096], false)
        .expect_err("write past the told size");
    assert!(write.to_string().contains("error 28"), "{write}");
    old.read(0, &mut buf).expect("inside its size");
    assert_eq!(buf, vec![1u8; 4096]);
    new.read(far, &mut buf).expect("read");
    assert_eq!(buf, vec![2u8; 4096], "the refused write changed nothing");

    old.disconnect();
    new.disconnect();
    stop.shutdown();
    thread.join().expect("server thread").expect("serve");
}
