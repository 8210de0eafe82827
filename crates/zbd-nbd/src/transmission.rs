//! The transmission phase of one connection: a few threads take turns reading a request, then
//! each checks and runs its own request against the export and writes the reply, in whatever
//! order they finish, under the socket's write lock.

use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::budget::{Grant, InflightBudget};
use crate::export::{Export, ExportError, Extent};
use crate::handshake::Session;
use crate::limits;
use crate::stream::Stream;
use crate::wire::{self, RequestHeader};

/// Where replies go: the client socket, or a sink when fuzzing.
pub(crate) trait ReplySink: Write + Send {
    /// Ends the connection in both directions (the readers then see EOF).
    fn close(&mut self);
}

impl ReplySink for Stream {
    fn close(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl ReplySink for io::Sink {
    fn close(&mut self) {}
}

/// The read side of a connection. Its read timeout (set by the server for the whole
/// connection) is the longest a WRITE payload may stall; transmission shortens it while a payload
/// nears its deadline, so the deadline holds however the client spaces its bytes.
pub(crate) trait ClientReader: Read {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl ClientReader for BufReader<Stream> {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.get_ref().set_read_timeout(Some(timeout))
    }
}

/// Fuzzing: the whole stream is already there, nothing can stall.
impl ClientReader for &[u8] {
    fn set_read_timeout(&mut self, _timeout: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// State of one connection shared by its threads.
pub(crate) struct Connection {
    pub id: u64,
    pub session: Session,
    writer: Mutex<Box<dyn ReplySink>>,
    broken: AtomicBool,
}

impl Connection {
    pub(crate) fn new(id: u64, session: Session, writer: Box<dyn ReplySink>) -> Self {
        Connection {
            id,
            session,
            writer: Mutex::new(writer),
            broken: AtomicBool::new(false),
        }
    }

    /// Writes one complete reply. A failure (client gone, or not reading for the write timeout)
    /// breaks the connection: later replies are dropped and the readers see EOF.
    fn send(&self, reply: &[u8]) {
        if self.broken.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut writer) = self.writer.lock() else {
            return;
        };
        if let Err(error) = writer.write_all(reply) {
            tracing::warn!(
                conn = self.id,
                "cannot send reply, closing connection: {error}"
            );
            self.broken.store(true, Ordering::SeqCst);
            writer.close();
        }
    }
}

/// What every connection needs.
pub(crate) struct Context {
    pub export: Arc<dyn Export>,
    /// Never more than the budget's limit, so a request within it can always be granted.
    pub payload_bytes_max: u32,
    pub threads: usize,
    /// Shared by every connection of the server.
    pub budget: Arc<InflightBudget>,
    /// How long a WRITE payload may stall (see [`limits::CLIENT_READ_TIMEOUT`]); also the base
    /// of the whole payload's deadline.
    pub payload_timeout: Duration,
}

/// A checked request, ready to run.
#[derive(Debug)]
enum Op {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        may_trim: bool,
        fua: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
}

/// Why a request is refused without reaching the export.
struct Rejection {
    errno: u32,
    reason: String,
}

fn reject(errno: u32, reason: impl Into<String>) -> Rejection {
    Rejection {
        errno,
        reason: reason.into(),
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the stream ended cleanly before the first.
/// The socket's read timeout is ignored here: a request header holds nothing, and a client may
/// stay idle between requests as long as it likes.
fn read_exact_or_eof(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("request header cut after {filled} bytes"),
                ))
            }
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

/// The latest a WRITE payload of `length` bytes must have arrived, its reading having started at
/// `start`: the stall timeout, plus the time the payload takes at the slowest rate we accept.
fn payload_deadline(start: Instant, length: u32, stall_timeout: Duration) -> Instant {
    let transfer = Duration::from_secs_f64(
        f64::from(length) / limits::PAYLOAD_RATE_BYTES_PER_SECOND_MIN as f64,
    );
    start + stall_timeout + transfer
}

/// Reads a WRITE payload, which holds budget: no read may stall longer than `stall_timeout`
/// (the socket's own read timeout), and the whole payload must arrive by `deadline`, so a client
/// trickling a byte now and then cannot keep its budget for ever.
fn read_payload(
    reader: &mut impl ClientReader,
    data: &mut [u8],
    deadline: Instant,
    stall_timeout: Duration,
) -> io::Result<()> {
    let mut filled = 0;
    let mut shortened = false;
    let outcome = loop {
        if filled == data.len() {
            break Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "payload not complete by its deadline ({filled} of {} bytes)",
                    data.len()
                ),
            ));
        }
        // Only a payload already slower than the slowest rate pays for the extra system call.
        if left < stall_timeout {
            if let Err(error) = reader.set_read_timeout(left) {
                break Err(error);
            }
            shortened = true;
        }
        match reader.read(&mut data[filled..]) {
            Ok(0) => break Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => break Err(error),
        }
    };
    if shortened {
        // Back to the connection's own timeout (the connection is dropped anyway on a failure).
        reader.set_read_timeout(stall_timeout)?;
    }
    outcome
}

/// Runs the transmission phase until the client disconnects (DISC, EOF), breaks the protocol,
/// or the server shuts the socket's read side; returns once every request read has replied.
///
/// Up to `context.threads` threads serve the connection, as nbdkit does: each takes the socket's
/// read side in turn, reads one request, lets go, runs the request and writes its reply under the
/// write lock. The thread that read a request runs it (no hand-off between threads), replies go
/// out in completion order, and at most `threads` requests are in flight. Their buffers come out
/// of the server-wide budget, taken while holding the read side, so a connection that must wait
/// for memory stops reading its socket.
pub(crate) fn serve<R: ClientReader + Send>(
    reader: R,
    connection: &Arc<Connection>,
    context: &Context,
) {
    // None once the connection is finished: the other threads stop at their next turn.
    let reader = Mutex::new(Some(reader));
    std::thread::scope(|scope| {
        for index in 1..context.threads.max(1) {
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-{}-{index}", connection.id))
                .spawn_scoped(scope, || serve_requests(&reader, connection, context));
            if let Err(error) = spawned {
                tracing::warn!(
                    conn = connection.id,
                    "running with {index} threads: {error}"
                );
                break;
            }
        }
        serve_requests(&reader, connection, context);
    });
    if let Ok(mut writer) = connection.writer.lock() {
        writer.close();
    }
}

fn serve_requests<R: ClientReader>(
    reader: &Mutex<Option<R>>,
    connection: &Connection,
    context: &Context,
) {
    loop {
        let next = {
            let Ok(mut guard) = reader.lock() else {
                return;
            };
            let Some(stream) = guard.as_mut() else {
                return;
            };
            match read_request(stream, connection, context) {
                Next::Run(handle, op, grant) => (handle, op, grant),
                Next::Answered => continue,
                Next::Stop => {
                    *guard = None;
                    return;
                }
            }
        };
        let (handle, op, grant) = next;
        let reply = run(&*context.export, connection, handle, op);
        connection.send(&reply);
        // Only now is the request's memory free: the reply buffer lived until it was sent.
        drop(reply);
        drop(grant);
    }
}

enum Next<'a> {
    /// A checked request for the caller to run, with the budget its buffers hold.
    Run(u64, Op, Option<Grant<'a>>),
    /// A request refused and already answered.
    Answered,
    /// The connection is over.
    Stop,
}

/// Reads and checks one request (with its payload). Rejections are answered right here.
fn read_request<'a>(
    reader: &mut impl ClientReader,
    connection: &Connection,
    context: &'a Context,
) -> Next<'a> {
    let id = connection.id;
    let mut raw = [0u8; wire::REQUEST_HEADER_BYTES];
    match read_exact_or_eof(reader, &mut raw) {
        Ok(true) => {}
        Ok(false) => {
            tracing::debug!(conn = id, "client closed the connection");
            return Next::Stop;
        }
        Err(error) => {
            tracing::warn!(
                conn = id,
                "connection lost while reading a request: {error}"
            );
            return Next::Stop;
        }
    }
    let header = RequestHeader::decode(&raw);
    if header.magic != wire::REQUEST_MAGIC {
        tracing::warn!(
            conn = id,
            "bad request magic {:#x}, dropping connection",
            header.magic
        );
        return Next::Stop;
    }
    if header.command == wire::CMD_DISC {
        tracing::debug!(conn = id, "client sent DISC");
        return Next::Stop;
    }
    let mut payload = None;
    let mut grant = None;
    if header.command == wire::CMD_WRITE {
        if header.length > context.payload_bytes_max {
            return skip_oversized_write(reader, connection, context, &header);
        }
        // Waits while the budget is spent: this connection reads nothing more meanwhile.
        grant = context.budget.acquire(u64::from(header.length));
        let mut data = vec![0u8; header.length as usize];
        // From now: a wait for budget is not the client's doing.
        let deadline = payload_deadline(Instant::now(), header.length, context.payload_timeout);
        if let Err(error) = read_payload(reader, &mut data, deadline, context.payload_timeout) {
            // A timeout here means the client stalled or trickled mid-payload, holding budget.
            tracing::warn!(
                conn = id,
                "connection lost or stalled inside a WRITE payload: {error}"
            );
            return Next::Stop;
        }
        payload = Some(data);
    }
    match check(&header, payload, connection.session, context) {
        Ok(op) => {
            let reply_bytes = match op {
                Op::Read { length, .. } => u64::from(length),
                Op::BlockStatus { .. } => limits::BLOCK_STATUS_REPLY_BYTES_MAX,
                _ => 0,
            };
            if reply_bytes > 0 {
                // Capped at the whole budget so a tiny budget still serves BLOCK_STATUS.
                grant = context
                    .budget
                    .acquire(reply_bytes.min(context.budget.limit_bytes()));
            }
            Next::Run(header.handle, op, grant)
        }
        Err(rejection) => {
            tracing::warn!(
                conn = id,
                command = wire::command_name(header.command),
                offset = header.offset,
                length = header.length,
                flags = header.flags,
                errno = rejection.errno,
                "rejected request: {}",
                rejection.reason
            );
            let reply = error_reply(
                connection.session,
                header.handle,
                rejection.errno,
                &rejection.reason,
            );
            connection.send(&reply);
            Next::Answered
        }
    }
}

/// A WRITE longer than the payload cap: reads its payload in small pieces and throws it away
/// (holding no budget), then answers EINVAL, so the client learns what went wrong and the
/// connection stays in step. Beyond `WRITE_SKIP_BYTES_MAX` the connection is dropped instead.
fn skip_oversized_write<'a>(
    reader: &mut impl Read,
    connection: &Connection,
    context: &Context,
    header: &RequestHeader,
) -> Next<'a> {
    let id = connection.id;
    if header.length > limits::WRITE_SKIP_BYTES_MAX {
        tracing::warn!(
            conn = id,
            offset = header.offset,
            length = header.length,
            "rejected WRITE: payload larger than {} bytes is not worth skipping, \
             dropping connection",
            limits::WRITE_SKIP_BYTES_MAX
        );
        return Next::Stop;
    }
    let mut left = u64::from(header.length);
    let mut scratch = [0u8; 16 << 10];
    while left > 0 {
        let take = left.min(scratch.len() as u64) as usize;
        if let Err(error) = reader.read_exact(&mut scratch[..take]) {
            tracing::warn!(conn = id, "connection lost inside a WRITE payload: {error}");
            return Next::Stop;
        }
        left -= take as u64;
    }
    let reason = format!(
        "WRITE longer than the {} bytes this server accepts (the advertised maximum block size)",
        context.payload_bytes_max
    );
    tracing::warn!(
        conn = id,
        offset = header.offset,
        length = header.length,
        "rejected request: {reason}"
    );
    connection.send(&error_reply(
        connection.session,
        header.handle,
        wire::EINVAL,
        &reason,
    ));
    Next::Answered
}

/// Checks a request against the protocol, the negotiated session and the export; never touches
/// the export's data.
fn check(
    header: &RequestHeader,
    payload: Option<Vec<u8>>,
    session: Session,
    context: &Context,
) -> Result<Op, Rejection> {
    let export = &*context.export;
    let fua = header.flags & wire::CMD_FLAG_FUA != 0;
    let allowed = match header.command {
        wire::CMD_READ if session.structured => wire::CMD_FLAG_FUA | wire::CMD_FLAG_DF,
        wire::CMD_READ | wire::CMD_WRITE | wire::CMD_FLUSH | wire::CMD_TRIM => wire::CMD_FLAG_FUA,
        wire::CMD_WRITE_ZEROES => wire::CMD_FLAG_FUA | wire::CMD_FLAG_NO_HOLE,
        wire::CMD_BLOCK_STATUS => wire::CMD_FLAG_FUA | wire::CMD_FLAG_REQ_ONE,
        other => return Err(reject(wire::EINVAL, format!("unknown command {other}"))),
    };
    if header.flags & !allowed != 0 {
        return Err(reject(
            wire::EINVAL,
            format!(
                "flags {:#x} not valid for this command",
                header.flags & !allowed
            ),
        ));
    }
    let writes = matches!(
        header.command,
        wire::CMD_WRITE | wire::CMD_TRIM | wire::CMD_WRITE_ZEROES
    );
    if writes && export.is_read_only() {
        return Err(reject(wire::EPERM, "export is read-only"));
    }
    if header.command == wire::CMD_FLUSH {
        if header.offset != 0 || header.length != 0 {
            return Err(reject(wire::EINVAL, "FLUSH must have offset and length 0"));
        }
        return Ok(Op::Flush);
    }
    // The size this connection was told, not the export's current one: a client must not
    // reach bytes it does not know exist, and the protocol answers them as past the end.
    let size = session.size;
    let in_range = header
        .offset
        .checked_add(u64::from(header.length))
        .is_some_and(|end| end <= size);
    if !in_range {
        // The protocol asks for ENOSPC on writes past the end, EINVAL on other requests.
        let errno = if writes { wire::ENOSPC } else { wire::EINVAL };
        return Err(reject(
            errno,
            format!("range past the end of the export ({size} bytes)"),
        ));
    }
    let (offset, length) = (header.offset, header.length);
    match header.command {
        wire::CMD_READ => {
            if length > context.payload_bytes_max {
                return Err(reject(
                    wire::EINVAL,
                    format!("READ longer than {} bytes", context.payload_bytes_max),
                ));
            }
            Ok(Op::Read { offset, length })
        }
        wire::CMD_WRITE => match payload {
            Some(data) => Ok(Op::Write { offset, data, fua }),
            None => Err(reject(wire::EIO, "WRITE without payload")),
        },
        wire::CMD_TRIM => Ok(Op::Trim {
            offset,
            length,
            fua,
        }),
        wire::CMD_WRITE_ZEROES => Ok(Op::WriteZeroes {
            offset,
            length,
            may_trim: header.flags & wire::CMD_FLAG_NO_HOLE == 0,
            fua,
        }),
        _ => {
            if session.allocation_context.is_none() {
                return Err(reject(
                    wire::EINVAL,
                    "BLOCK_STATUS without a negotiated base:allocation context",
                ));
            }
            if length == 0 {
                return Err(reject(wire::EINVAL, "BLOCK_STATUS of zero bytes"));
            }
            Ok(Op::BlockStatus {
                offset,
                length,
                req_one: header.flags & wire::CMD_FLAG_REQ_ONE != 0,
            })
        }
    }
}

/// Runs one checked request and returns its complete reply.
fn run(export: &dyn Export, connection: &Connection, handle: u64, op: Op) -> Vec<u8> {
    let session = connection.session;
    let outcome = match op {
        Op::Read { offset, length } => {
            return read_reply(export, connection, handle, offset, length)
        }
        Op::Write { offset, data, fua } => export.write_at(offset, &data, fua),
        Op::Flush => export.flush(),
        Op::Trim {
            offset,
            length,
            fua,
        } => export.trim(offset, u64::from(length), fua),
        Op::WriteZeroes {
            offset,
            length,
            may_trim,
            fua,
        } => export.write_zeroes(offset, u64::from(length), may_trim, fua),
        Op::BlockStatus {
            offset,
            length,
            req_one,
        } => match export.block_status(offset, u64::from(length)) {
            Ok(extents) => return block_status_reply(session, handle, length, req_one, &extents),
            Err(error) => Err(error),
        },
    };
    match outcome {
        Ok(()) => simple_reply(handle, 0),
        Err(error) => failed(connection, handle, &error),
    }
}

fn failed(connection: &Connection, handle: u64, error: &ExportError) -> Vec<u8> {
    tracing::warn!(conn = connection.id, "request failed: {error}");
    error_reply(
        connection.session,
        handle,
        error.kind.errno(),
        &error.message,
    )
}

fn read_reply(
    export: &dyn Export,
    connection: &Connection,
    handle: u64,
    offset: u64,
    length: u32,
) -> Vec<u8> {
    let structured = connection.session.structured;
    if structured && length == 0 {
        return structured_header(handle, wire::REPLY_TYPE_NONE, 0);
    }
    let prefix = if structured {
        wire::STRUCTURED_HEADER_BYTES + 8
    } else {
        wire::SIMPLE_REPLY_BYTES
    };
    let mut reply = vec![0u8; prefix + length as usize];
    if let Err(error) = export.read_at(offset, &mut reply[prefix..]) {
        return failed(connection, handle, &error);
    }
    let header = if structured {
        let mut header = structured_header(handle, wire::REPLY_TYPE_OFFSET_DATA, 8 + length);
        header.extend_from_slice(&offset.to_be_bytes());
        header
    } else {
        simple_reply(handle, 0)
    };
    reply[..prefix].copy_from_slice(&header);
    reply
}

/// Turns the export's extents into at most `DESCRIPTORS_MAX` descriptors covering at most
/// `length` bytes, merging neighbours with equal flags; never returns an empty list.
fn descriptors(length: u32, req_one: bool, extents: &[Extent]) -> Vec<(u32, u32)> {
    let limit = if req_one { 1 } else { limits::DESCRIPTORS_MAX };
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut remaining = length;
    for extent in extents {
        if remaining == 0 {
            break;
        }
        let piece = u32::try_from(extent.length)
            .unwrap_or(u32::MAX)
            .min(remaining);
        if piece == 0 {
            continue;
        }
        remaining -= piece;
        let full = out.len() == limit;
        match out.last_mut() {
            Some(last) if last.1 == extent.flags() => last.0 += piece,
            _ if full => break,
            _ => out.push((piece, extent.flags())),
        }
    }
    if out.is_empty() {
        // Status 0 ("allocated, contents unknown") is always a truthful answer.
        out.push((length, 0));
    }
    out
}

fn block_status_reply(
    session: Session,
    handle: u64,
    length: u32,
    req_one: bool,
    extents: &[Extent],
) -> Vec<u8> {
    let list = descriptors(length, req_one, extents);
    let context = session
        .allocation_context
        .unwrap_or(crate::handshake::BASE_ALLOCATION_ID);
    let payload_bytes = 4 + 8 * list.len() as u32;
    let mut reply = structured_header(handle, wire::REPLY_TYPE_BLOCK_STATUS, payload_bytes);
    reply.extend_from_slice(&context.to_be_bytes());
    for (piece, flags) in list {
        reply.extend_from_slice(&piece.to_be_bytes());
        reply.extend_from_slice(&flags.to_be_bytes());
    }
    reply
}

fn simple_reply(handle: u64, errno: u32) -> Vec<u8> {
    let mut reply = Vec::with_capacity(wire::SIMPLE_REPLY_BYTES);
    reply.extend_from_slice(&wire::SIMPLE_REPLY_MAGIC.to_be_bytes());
    reply.extend_from_slice(&errno.to_be_bytes());
    reply.extend_from_slice(&handle.to_be_bytes());
    reply
}

/// Header of the final (DONE) chunk of a structured reply; the payload follows.
fn structured_header(handle: u64, kind: u16, payload_bytes: u32) -> Vec<u8> {
    let mut header = Vec::with_capacity(wire::STRUCTURED_HEADER_BYTES + payload_bytes as usize);
    header.extend_from_slice(&wire::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    header.extend_from_slice(&wire::REPLY_FLAG_DONE.to_be_bytes());
    header.extend_from_slice(&kind.to_be_bytes());
    header.extend_from_slice(&handle.to_be_bytes());
    header.extend_from_slice(&payload_bytes.to_be_bytes());
    header
}

/// An error reply: a structured error chunk carrying the message when structured replies were
/// negotiated (required for READ), else a simple reply with the errno.
fn error_reply(session: Session, handle: u64, errno: u32, message: &str) -> Vec<u8> {
    if !session.structured {
        return simple_reply(handle, errno);
    }
    let mut cut = message.len().min(limits::ERROR_MESSAGE_BYTES_MAX);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let text = &message.as_bytes()[..cut];
    let mut reply = structured_header(handle, wire::REPLY_TYPE_ERROR, 6 + text.len() as u32);
    reply.extend_from_slice(&errno.to_be_bytes());
    reply.extend_from_slice(&(text.len() as u16).to_be_bytes());
    reply.extend_from_slice(text);
    reply
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_merge_clamp_and_limit() {
        let extents = [
            Extent::data(4096),
            Extent::data(4096),
            Extent::hole(8192),
            Extent::data(1 << 20),
        ];
        assert_eq!(
            descriptors(20000, false, &extents),
            vec![(8192, 0), (8192, 3), (3616, 0)]
        );
        assert_eq!(descriptors(20000, true, &extents), vec![(8192, 0)]);
        assert_eq!(descriptors(100, false, &[]), vec![(100, 0)]);
        assert_eq!(descriptors(100, false, &[Extent::hole(0)]), vec![(100, 0)]);
    }

    #[test]
    fn error_reply_is_structured_when_negotiated() {
        let session = Session {
            structured: true,
            allocation_context: None,
            transmission_flags: 0,
            size: 1 << 20,
        };
        let reply = error_reply(session, 7, wire::EINVAL, "bad");
        assert_eq!(&reply[0..4], &wire::STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&reply[6..8], &wire::REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&reply[16..20], &9u32.to_be_bytes());
        assert_eq!(&reply[20..24], &wire::EINVAL.to_be_bytes());
        assert_eq!(&reply[26..], b"bad");
        let simple = error_reply(
            Session {
                structured: false,
                ..session
            },
            7,
            wire::EINVAL,
            "bad",
        );
        assert_eq!(simple.len(), wire::SIMPLE_REPLY_BYTES);
    }

    /// A client sends a WRITE header, then its payload one byte per half read timeout: no single
    /// read ever times out, yet the request must be cut off (its budget given back) once the
    /// payload is overdue. Each pause between bytes is a read of the client socket that also
    /// watches for the server closing it; at most 40 bytes are trickled.
    #[test]
    fn a_trickled_write_payload_is_cut_off_at_its_deadline() {
        use std::os::unix::net::UnixStream;

        let timeout = Duration::from_millis(300);
        let (mut client, server_side) = UnixStream::pair().unwrap();
        let server_side = Stream::Unix(server_side);
        server_side.set_read_timeout(Some(timeout)).unwrap();
        let writer = server_side.try_clone().unwrap();
        let session = Session {
            structured: false,
            allocation_context: None,
            transmission_flags: 0,
            size: 1 << 20,
        };
        let connection = Arc::new(Connection::new(1, session, Box::new(writer)));
        let budget = Arc::new(InflightBudget::new(1 << 20));
        let context = Context {
            export: Arc::new(crate::mem::MemExport::new(1 << 20)),
            payload_bytes_max: 1 << 20,
            threads: 1,
            budget: Arc::clone(&budget),
            payload_timeout: timeout,
        };
        let served = std::thread::spawn(move || {
            serve(BufReader::new(server_side), &connection, &context);
        });
        let header = RequestHeader {
            magic: wire::REQUEST_MAGIC,
            flags: 0,
            command: wire::CMD_WRITE,
            handle: 7,
            offset: 0,
            length: 4096,
        };
        let started = Instant::now();
        client.write_all(&header.encode()).unwrap();
        client.set_read_timeout(Some(timeout / 2)).unwrap();
        let mut closed = false;
        for _ in 0..40 {
            if client.write_all(&[0x55]).is_err() {
                closed = true;
                break;
            }
            match client.read(&mut [0u8; 1]) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => panic!("a reply to a WRITE whose payload never arrived"),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let elapsed = started.elapsed();
        assert!(
            closed,
            "a client trickling its WRITE payload was still served after {elapsed:?}"
        );
        assert!(
            elapsed >= timeout,
            "cut off after {elapsed:?}, before its deadline"
        );
        served.join().unwrap();
        assert_eq!(
            budget.held_bytes(),
            0,
            "the trickled request kept its budget"
        );
    }
}
