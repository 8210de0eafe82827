//! [`RadosStorage`]: the engine's byte space striped over fixed-size RADOS objects, with many
//! writes in flight and `sync` waiting for their acknowledgements.

use crate::client::{Cluster, ClusterOptions, Completion, IoCtx, Locker};
use crate::error::{errno_text, RadosError};
use crate::lock::{self, op_error, Keeper};
use crate::readahead::{Chunk, ReadAhead, CHUNK_BYTES};
use crate::RadosTarget;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use zbd_core::{Error, Result, Storage};

/// Object size when `zbd create` is not told otherwise (RBD's default too).
pub const DEFAULT_OBJECT_SIZE: u64 = 4 << 20;
/// Smallest and largest object sizes accepted at create time.
pub const OBJECT_SIZE_RANGE: (u64, u64) = (64 << 10, 32 << 20);
/// Writes (bytes) in flight before `write_at` waits for the oldest: bounds the memory that
/// buffers wait in while the OSDs are slow or down.
const MAX_INFLIGHT_BYTES: u64 = 64 << 20;
/// Object size of the metadata region (see [`Header::small_bytes`]): two 4 KiB map pages (the
/// A and B slots of one page sit side by side). In the benchmark 4 KiB objects stored 6.32 MB
/// of metadata in 1544 objects, 8 KiB ones 6.41 MB in 997: not worth half again the objects.
pub const SMALL_OBJECT_SIZE: u64 = 8 << 10;
/// Reads larger than this are split into parts read in parallel.
const READ_PART_BYTES: u64 = 256 << 10;
const HEADER_MAGIC: &str = "zbd-rados-volume 1";

/// A volume's header: what `create` chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    size: u64,
    object_size: u64,
    /// Bytes `0..small_bytes` (a multiple of `object_size`) are striped over objects of
    /// SMALL_OBJECT_SIZE instead: the engine's metadata region (superblocks, checkpoints, map)
    /// is written sparsely, a few 4 KiB pages here and there, and a RADOS object counts as
    /// big as its furthest written byte, so in 4 MiB objects those pages cost whole objects.
    small_bytes: u64,
}

impl Header {
    fn encode(&self) -> String {
        let mut text = format!(
            "{HEADER_MAGIC}\nsize {}\nobject_size {}\n",
            self.size, self.object_size
        );
        if self.small_bytes > 0 {
            text.push_str(&format!(
                "small_objects {} {SMALL_OBJECT_SIZE}\n",
                self.small_bytes
            ));
        }
        text
    }

    fn decode(text: &[u8]) -> std::result::Result<Header, String> {
        let text = std::str::from_utf8(text).map_err(|_| "not text".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(HEADER_MAGIC) {
            return Err(format!("does not start with {HEADER_MAGIC:?}"));
        }
        let mut field = |key: &str| -> std::result::Result<u64, String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("missing or bad {key:?}"))
        };
        let mut header = Header {
            size: field("size ")?,
            object_size: field("object_size ")?,
            small_bytes: 0,
        };
        if !header.object_size.is_power_of_two() || header.size == 0 {
            return Err("impossible size or object size".into());
        }
        if let Some(line) = lines.next() {
            let small: Vec<u64> = line
                .strip_prefix("small_objects ")
                .map(|v| v.split(' ').filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_default();
            match small[..] {
                [bytes, SMALL_OBJECT_SIZE] if bytes % header.object_size == 0 => {
                    header.small_bytes = bytes;
                }
                _ => return Err(format!("bad line {line:?}")),
            }
        }
        Ok(header)
    }
}

/// One asynchronous write, zero or remove in flight, over volume bytes `start..end`.
struct Op {
    start: u64,
    end: u64,
    bytes: u64,
    /// A remove or zero: best effort, its failure is not kept (a missing object is fine
    /// anyway: discard of never-written space).
    discard: bool,
    completion: Completion,
}

#[derive(Default)]
struct Inflight {
    next_seq: u64,
    ops: BTreeMap<u64, Arc<Op>>,
    bytes: u64,
    /// The first failed write (or lost lock): every later `sync` fails with it (a lost write
    /// cannot be made durable again by retrying). Discards never set it.
    first_error: Option<String>,
}

/// The part of a storage range in one object.
struct Piece {
    object: String,
    object_size: u64,
    /// Offset in the object.
    within: u64,
    /// Length.
    n: u64,
}

/// A zbd volume's storage in a RADOS pool, holding the volume's exclusive lock while open.
pub struct RadosStorage {
    io: Arc<IoCtx>,
    target: RadosTarget,
    header: Header,
    keeper: Keeper,
    inflight: Mutex<Inflight>,
    readahead: ReadAhead,
}

fn io_error(message: String) -> Error {
    Error::Io(std::io::Error::other(message))
}

impl RadosStorage {
    /// Opens an existing volume and locks it.
    pub fn open(
        options: &ClusterOptions,
        target: &RadosTarget,
    ) -> std::result::Result<Self, RadosError> {
        let io = Arc::new(Cluster::connect(options)?.pool(&target.pool)?);
        let header =
            read_header(&io, target)?.ok_or_else(|| RadosError::NoVolume(target.to_string()))?;
        let keeper = lock::acquire(&io, target, options.lock_lease, false)?;
        Ok(Self::new(io, target, header, keeper))
    }

    /// Creates a volume of `size` bytes striped over objects of `object_size` bytes (its first
    /// `metadata_bytes`, rounded up to whole objects, over small ones: [`SMALL_OBJECT_SIZE`]),
    /// and locks it. An existing volume of that name is refused unless `force`, which removes
    /// its objects.
    pub fn create(
        options: &ClusterOptions,
        target: &RadosTarget,
        size: u64,
        object_size: u64,
        metadata_bytes: u64,
        force: bool,
    ) -> std::result::Result<Self, RadosError> {
        let (lo, hi) = OBJECT_SIZE_RANGE;
        if !object_size.is_power_of_two() || !(lo..=hi).contains(&object_size) {
            return Err(RadosError::Invalid(format!(
                "--object-size {object_size}: must be a power of two from 64K to 32M"
            )));
        }
        let io = Arc::new(Cluster::connect(options)?.pool(&target.pool)?);
        // Lock first (this creates an empty header object): nobody else may use or create the
        // volume while we look at it. An empty header means "no volume".
        let keeper = lock::acquire(&io, target, options.lock_lease, true)?;
        let new = Header {
            size,
            object_size,
            // Whole objects (may pass the end of a tiny volume: then it is all small objects).
            small_bytes: metadata_bytes.next_multiple_of(object_size),
        };
        let storage = Self::new(io, target, new, keeper);
        match read_header(&storage.io, target) {
            Ok(None) => {}
            Ok(Some(_)) | Err(RadosError::BadHeader { .. }) if !force => {
                return Err(RadosError::Exists(target.to_string()))
            }
            Ok(Some(old)) => storage.remove_objects(old)?,
            Err(RadosError::BadHeader { .. }) => {}
            Err(e) => return Err(e),
        }
        storage
            .io
            .write_full(&target.header_object(), new.encode().as_bytes())
            .map_err(|rc| op_error(&storage.io, target, "writing the volume header", rc))?;
        Ok(storage)
    }

    fn new(io: Arc<IoCtx>, target: &RadosTarget, header: Header, keeper: Keeper) -> Self {
        RadosStorage {
            io,
            target: target.clone(),
            header,
            keeper,
            inflight: Mutex::new(Inflight::default()),
            readahead: ReadAhead::default(),
        }
    }

    /// Object size of this volume.
    pub fn object_size(&self) -> u64 {
        self.header.object_size
    }

    /// Removes every data object an old volume of this name may have written.
    fn remove_objects(&self, old: Header) -> std::result::Result<(), RadosError> {
        let small = (0..old.small_bytes / SMALL_OBJECT_SIZE).map(|i| self.target.small_object(i));
        let data = (old.small_bytes / old.object_size..old.size.div_ceil(old.object_size))
            .map(|i| self.target.data_object(i));
        let names: Vec<String> = small.chain(data).collect();
        for batch in names.chunks(128) {
            let started: Vec<_> = batch.iter().map(|name| self.io.aio_remove(name)).collect();
            for c in started {
                let rc = c.and_then(|c| match c.wait() {
                    rc if rc < 0 && rc != -libc::ENOENT => Err(rc),
                    _ => Ok(()),
                });
                rc.map_err(|rc| op_error(&self.io, &self.target, "removing old data objects", rc))?;
            }
        }
        Ok(())
    }

    /// Splits storage bytes `offset..offset+len` at object boundaries.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            (pos < end).then(|| {
                let (object, object_size) = if pos < self.header.small_bytes {
                    let index = pos / SMALL_OBJECT_SIZE;
                    (self.target.small_object(index), SMALL_OBJECT_SIZE)
                } else {
                    let index = pos / self.header.object_size;
                    (self.target.data_object(index), self.header.object_size)
                };
                let within = pos % object_size;
                let n = (object_size - within).min(end - pos);
                let piece = Piece {
                    object,
                    object_size,
                    within,
                    n,
                };
                pos += n;
                piece
            })
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.header.size => Ok(()),
            _ => Err(Error::CorruptMetadata(format!(
                "access {offset}+{len} past the end of {} ({} bytes)",
                self.target, self.header.size
            ))),
        }
    }

    /// Registers a started operation; waits for the oldest ones while too many bytes are in
    /// flight.
    fn track(&self, start: u64, len: u64, discard: bool, completion: Completion) {
        let bytes = len.max(1);
        let op = Arc::new(Op {
            start,
            end: start + len,
            bytes,
            discard,
            completion,
        });
        let mut inflight = self.inflight.lock();
        let seq = inflight.next_seq;
        inflight.next_seq += 1;
        inflight.ops.insert(seq, op);
        inflight.bytes += bytes;
        while inflight.bytes > MAX_INFLIGHT_BYTES {
            let oldest: Vec<_> = inflight
                .ops
                .iter()
                .take(16)
                .map(|(s, o)| (*s, Arc::clone(o)))
                .collect();
            drop(inflight);
            self.retire(oldest);
            inflight = self.inflight.lock();
        }
    }

    /// Waits for `ops` (without holding the lock), then forgets them, keeping the first error.
    fn retire(&self, ops: Vec<(u64, Arc<Op>)>) {
        let results: Vec<i32> = ops.iter().map(|(_, op)| op.completion.wait()).collect();
        let mut inflight = self.inflight.lock();
        for ((seq, op), rc) in ops.into_iter().zip(results) {
            if inflight.ops.remove(&seq).is_none() {
                continue; // another thread retired it (and recorded its result)
            }
            inflight.bytes -= op.bytes;
            // A rejected discard leaves old bytes in freed space, which the engine never
            // trusts (docs/design.md, "Failed syncs"): it must not fail later syncs.
            let failed = rc < 0 && !op.discard;
            if failed && inflight.first_error.is_none() {
                inflight.first_error = Some(format!(
                    "{}: writing object {} failed: {}",
                    self.target,
                    op.completion.object().to_string_lossy(),
                    errno_text(rc)
                ));
            }
        }
    }

    /// Waits for the operations issued so far that `select` picks.
    fn wait_for(&self, select: impl Fn(&Op) -> bool) {
        let ops: Vec<_> = {
            let inflight = self.inflight.lock();
            inflight
                .ops
                .iter()
                .filter(|(_, op)| select(op))
                .map(|(s, o)| (*s, Arc::clone(o)))
                .collect()
        };
        if !ops.is_empty() {
            self.retire(ops);
        }
    }

    fn read_error(&self, object: &str, rc: i32) -> Error {
        io_error(format!(
            "{}: reading object {object}: {}",
            self.target,
            errno_text(rc)
        ))
    }

    /// Starts reading storage bytes `offset..offset + len` from the objects, bypassing
    /// read-ahead: every piece at once, so the pieces of a large read (and of all the reads of a
    /// `read_many`) are served in parallel by the OSDs holding them. `finish_direct` waits.
    fn start_direct(&self, offset: u64, len: u64) -> Result<Vec<(usize, usize, Completion)>> {
        let mut started = Vec::new();
        let mut at = 0usize;
        for Piece {
            object, within, n, ..
        } in self.pieces(offset, len)
        {
            let mut done = 0u64;
            while done < n {
                let part = (n - done).min(READ_PART_BYTES);
                let c = self
                    .io
                    .aio_read(&object, within + done, part as usize)
                    .map_err(|rc| self.read_error(&object, rc))?;
                started.push((at, part as usize, c));
                at += part as usize;
                done += part;
            }
        }
        Ok(started)
    }

    /// Waits for the reads `start_direct` started and copies what they read into `buf`.
    fn finish_direct(
        &self,
        started: Vec<(usize, usize, Completion)>,
        buf: &mut [u8],
    ) -> Result<()> {
        for (at, n, c) in started {
            let got = c
                .read_result()
                .map_err(|rc| self.read_error(&c.object().to_string_lossy(), rc))?;
            // Past the object's end, or never written: zeros.
            buf[at..at + got.len()].copy_from_slice(got);
            buf[at + got.len()..at + n].fill(0);
        }
        Ok(())
    }

    /// Starts reading the read-ahead chunk at `start`; `None` past the end of the volume or if
    /// librados refuses (the read is then simply not ahead).
    fn start_chunk(&self, start: u64) -> Option<Chunk> {
        let len = CHUNK_BYTES.min(self.header.size.checked_sub(start)?);
        if len == 0 {
            return None;
        }
        let mut parts = Vec::new();
        let mut at = 0;
        for Piece {
            object, within, n, ..
        } in self.pieces(start, len)
        {
            let read = self.io.aio_read(&object, within, n as usize).ok()?;
            parts.push((at, n, read));
            at += n;
        }
        Some(Chunk::new(start, parts))
    }

    /// A write that could not be started: it fails, and so does every later sync.
    fn started(&self, message: String) -> Error {
        let mut inflight = self.inflight.lock();
        inflight.first_error.get_or_insert_with(|| message.clone());
        io_error(message)
    }
}

impl Storage for RadosStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.header.size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut one = [(offset, buf)];
        self.read_many(&mut one).pop().expect("one result per read")
    }

    /// Every read is a network round trip: the reads a host read needs (one per extent) are
    /// all in flight at once, and the OSDs serve them in parallel. Those read-ahead holds are
    /// copied from memory.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        // A read must see every write issued before it.
        let ranges: Vec<(u64, u64)> = reads
            .iter()
            .map(|(offset, buf)| (*offset, offset + buf.len() as u64))
            .collect();
        self.wait_for(|op| ranges.iter().any(|&(lo, hi)| op.start < hi && lo < op.end));
        let started: Vec<Result<Option<_>>> = reads
            .iter_mut()
            .map(|(offset, buf)| {
                self.check_range(*offset, buf.len() as u64)?;
                if self.readahead.read(*offset, buf) {
                    return Ok(None);
                }
                self.start_direct(*offset, buf.len() as u64).map(Some)
            })
            .collect();
        let results: Vec<Result<()>> = reads
            .iter_mut()
            .zip(started)
            .map(|((_, buf), started)| match started? {
                Some(started) => self.finish_direct(started, buf),
                None => Ok(()),
            })
            .collect();
        for ((offset, buf), res) in reads.iter().zip(&results) {
            if res.is_ok() {
                self.readahead
                    .after_read(*offset, buf.len() as u64, |start| self.start_chunk(start));
            }
        }
        results
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.keeper.writable().map_err(|why| self.started(why))?;
        let issue = || {
            let mut at = 0usize;
            for Piece {
                object, within, n, ..
            } in self.pieces(offset, data.len() as u64)
            {
                let piece = data[at..at + n as usize].to_vec();
                let start = offset + at as u64;
                at += n as usize;
                let c = self.io.aio_write(&object, within, piece).map_err(|rc| {
                    let what = format!("{}: starting a write", self.target);
                    self.started(format!("{what}: {}", errno_text(rc)))
                })?;
                self.track(start, n, false, c);
            }
            Ok(())
        };
        let issued = issue();
        // After issuing (readahead.rs: later chunk reads are ordered after the write).
        self.readahead.invalidate(offset, data.len() as u64);
        issued
    }

    /// Waits for the writes issued before it; asserts the lock meanwhile (one more
    /// operation in flight, no added round trip): a server that lost its lock never reports
    /// a sync as successful.
    fn sync(&self) -> Result<()> {
        let locked = self.keeper.start_assert();
        let issued = self.inflight.lock().next_seq;
        let ops: Vec<_> = {
            let inflight = self.inflight.lock();
            inflight
                .ops
                .range(..issued)
                .map(|(s, o)| (*s, Arc::clone(o)))
                .collect()
        };
        self.retire(ops);
        let locked = self.keeper.finish_assert(locked);
        let mut inflight = self.inflight.lock();
        if let Err(why) = locked {
            inflight.first_error.get_or_insert(why);
        }
        match &inflight.first_error {
            Some(message) => Err(io_error(message.clone())),
            None => Ok(()),
        }
    }

    /// Best effort: a discard that fails, or is refused because the lock is not confirmed,
    /// fails alone and never makes a later sync fail.
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        self.keeper.writable().map_err(io_error)?;
        let issue = || {
            let mut at = offset;
            for Piece {
                object,
                object_size,
                within,
                n,
            } in self.pieces(offset, len)
            {
                let c = if n == object_size {
                    self.io.aio_remove(&object)
                } else {
                    let to_end = within + n == object_size;
                    self.io.aio_zero(&object, within, n, to_end)
                }
                .map_err(|rc| {
                    io_error(format!(
                        "{}: starting a discard: {}",
                        self.target,
                        errno_text(rc)
                    ))
                })?;
                self.track(at, n, true, c);
                at += n;
            }
            Ok(())
        };
        let issued = issue();
        self.readahead.invalidate(offset, len);
        issued
    }
}

impl Drop for RadosStorage {
    fn drop(&mut self) {
        // Completions wait for their operations when dropped; then give the volume back. The
        // read-ahead's reads too, now: after `io` is destroyed they would never complete.
        // The keeper, dropped after this, unwatches and releases the lock.
        self.wait_for(|_| true);
        self.readahead.clear();
    }
}

/// The header, `None` if the volume does not exist (no header object, or an empty one left by
/// a `create` that did not finish).
fn read_header(
    io: &IoCtx,
    target: &RadosTarget,
) -> std::result::Result<Option<Header>, RadosError> {
    let object = target.header_object();
    let mut buf = vec![0u8; 4096];
    let n = io
        .read(&object, 0, &mut buf)
        .map_err(|rc| op_error(io, target, "reading the volume header", rc))?;
    if n == 0 {
        return Ok(None);
    }
    Header::decode(&buf[..n])
        .map(Some)
        .map_err(|reason| RadosError::BadHeader {
            volume: target.to_string(),
            reason,
        })
}

/// "client.4151 at 127.0.0.1:0/2215 (zbd PID 812 on host web1)".
pub fn describe(locker: &Locker) -> String {
    let mut text = format!("{} at {}", locker.client, locker.address);
    let parts: Vec<&str> = locker.cookie.split(':').collect();
    if let ["zbd", host, pid, _] = parts[..] {
        text.push_str(&format!(" (zbd PID {pid} on host {host})"));
    }
    text
}

/// Breaks the lock of a volume (`zbd unlock`), whatever its holder is doing: each holder is
/// first added to the OSD blocklist (for `blocklist_seconds`, 0: the cluster's default), so
/// that it can never write again, even if it was only cut off or paused and comes back.
/// There is no way to skip that: a holder that still runs would overwrite the next owner's
/// writes. Returns the holders.
pub fn break_lock(
    options: &ClusterOptions,
    target: &RadosTarget,
    blocklist_seconds: u32,
) -> std::result::Result<Vec<Locker>, RadosError> {
    let io = Cluster::connect(options)?.pool(&target.pool)?;
    if read_header(&io, target)?.is_none() {
        return Err(RadosError::NoVolume(target.to_string()));
    }
    let holders = lock::lockers(&io, target)?;
    for holder in &holders {
        lock::take_over(&io, target, holder, blocklist_seconds)?;
    }
    Ok(holders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let mut h = Header {
            size: 123 << 20,
            object_size: 4 << 20,
            small_bytes: 0,
        };
        assert_eq!(Header::decode(h.encode().as_bytes()), Ok(h));
        h.small_bytes = 8 << 20;
        assert_eq!(Header::decode(h.encode().as_bytes()), Ok(h));
        // A volume smaller than its (whole-object) metadata region.
        h.size = 1835008;
        h.small_bytes = 4 << 20;
        assert_eq!(Header::decode(h.encode().as_bytes()), Ok(h));
        let odd = "zbd-rados-volume 1\nsize 9\nobject_size 4096\nsmall_objects 100 8192\n";
        assert!(Header::decode(odd.as_bytes()).is_err());
        assert!(Header::decode(b"zbd-rados-volume 2\nsize 1\nobject_size 4096\n").is_err());
        assert!(Header::decode(b"zbd-rados-volume 1\nsize 1\nobject_size 3000\n").is_err());
        assert!(Header::decode(b"zbd-rados-volume 1\nsize 1\n").is_err());
    }

    #[test]
    fn holder_description_names_host_and_pid() {
        let l = Locker {
            client: "client.4151".into(),
            cookie: "zbd:web1:812:0badcafe".into(),
            address: "127.0.0.1:0/2215".into(),
        };
        assert_eq!(
            describe(&l),
            "client.4151 at 127.0.0.1:0/2215 (zbd PID 812 on host web1)"
        );
    }
}
