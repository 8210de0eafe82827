//! NBD test clients over a Unix socket. `RawClient` sends exactly the bytes a test asks for,
//! so tests can send malformed packets and see what the server does. `Client` is a minimal
//! blocking client (fixed newstyle, NBD_OPT_GO, simple replies) for tests that need to know
//! exactly which writes and flushes were acknowledged; it returns errors instead of panicking,
//! since a server killed on purpose is part of those tests. Both take the protocol's constants
//! from `zbd_nbd::wire`, the server's own definitions.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use zbd_nbd::wire;

/// A request header as the server's own encoder writes it.
fn request_header(
    flags: u16,
    command: u16,
    handle: u64,
    offset: u64,
    length: u32,
) -> [u8; wire::REQUEST_HEADER_BYTES] {
    wire::RequestHeader {
        magic: wire::REQUEST_MAGIC,
        flags,
        command,
        handle,
        offset,
        length,
    }
    .encode()
}

/// Sends exactly the bytes a test asks for and reads replies field by field; panics on I/O
/// errors (a server that hangs fails the read timeout instead of the test run).
pub struct RawClient {
    pub stream: UnixStream,
}

#[derive(Debug)]
pub struct OptionReply {
    pub option: u32,
    pub reply: u32,
    pub data: Vec<u8>,
}

#[derive(Debug)]
pub struct Reply {
    pub handle: u64,
    /// errno of a simple reply or of a structured error chunk; 0 on success.
    pub error: u32,
    /// Structured chunk type, None for a simple reply.
    pub chunk: Option<u16>,
    pub payload: Vec<u8>,
}

impl RawClient {
    pub fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).expect("connect");
        // A server bug must fail the test, not hang it.
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        RawClient { stream }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Sends bytes the server is entitled to refuse by closing the connection first (a payload
    /// after a request that breaks the protocol, a flood from a client that never reads): a
    /// broken pipe or reset here is the server doing its job, not a failure.
    pub fn send_may_be_refused(&mut self, bytes: &[u8]) {
        if let Err(e) = self.stream.write_all(bytes) {
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ),
                "send failed other than by the server closing: {e}"
            );
        }
    }

    pub fn read_exact(&mut self, length: usize) -> Vec<u8> {
        let mut buf = vec![0u8; length];
        self.stream.read_exact(&mut buf).expect("read from server");
        buf
    }

    fn read_u16(&mut self) -> u16 {
        let raw = self.read_exact(2);
        u16::from_be_bytes([raw[0], raw[1]])
    }
    fn read_u32(&mut self) -> u32 {
        let raw = self.read_exact(4);
        u32::from_be_bytes(raw.try_into().expect("4 bytes"))
    }
    fn read_u64(&mut self) -> u64 {
        let raw = self.read_exact(8);
        u64::from_be_bytes(raw.try_into().expect("8 bytes"))
    }

    /// Reads the server greeting and returns its handshake flags.
    pub fn greeting(&mut self) -> u16 {
        assert_eq!(self.read_u64(), wire::NBDMAGIC);
        assert_eq!(self.read_u64(), wire::IHAVEOPT);
        self.read_u16()
    }

    pub fn client_flags(&mut self, flags: u32) {
        self.send(&flags.to_be_bytes());
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut out = wire::IHAVEOPT.to_be_bytes().to_vec();
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.send(&out);
    }

    pub fn option_reply(&mut self) -> OptionReply {
        assert_eq!(self.read_u64(), wire::OPTION_REPLY_MAGIC);
        let option = self.read_u32();
        let reply = self.read_u32();
        let length = self.read_u32() as usize;
        let data = self.read_exact(length);
        OptionReply {
            option,
            reply,
            data,
        }
    }

    /// Reads option replies up to and including the final ACK or error.
    pub fn option_replies(&mut self) -> Vec<OptionReply> {
        let mut replies = Vec::new();
        loop {
            let reply = self.option_reply();
            let last = reply.reply == wire::REP_ACK || reply.reply & (1 << 31) != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// Data of NBD_OPT_GO / NBD_OPT_INFO.
    pub fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for info in infos {
            data.extend_from_slice(&info.to_be_bytes());
        }
        data
    }

    /// Data of NBD_OPT_SET/LIST_META_CONTEXT.
    pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for query in queries {
            data.extend_from_slice(&(query.len() as u32).to_be_bytes());
            data.extend_from_slice(query.as_bytes());
        }
        data
    }

    /// A complete, well-formed handshake; returns the export size and transmission flags.
    pub fn handshake(&mut self, structured: bool, block_status: bool) -> (u64, u16) {
        self.greeting();
        self.client_flags(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES);
        if structured {
            self.option(wire::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(self.option_reply().reply, wire::REP_ACK);
        }
        if block_status {
            self.option(
                wire::OPT_SET_META_CONTEXT,
                &Self::meta_data("", &[wire::CONTEXT_BASE_ALLOCATION]),
            );
            let replies = self.option_replies();
            assert_eq!(replies.last().expect("reply").reply, wire::REP_ACK);
        }
        self.option(wire::OPT_GO, &Self::go_data("", &[]));
        let mut size_flags = None;
        for reply in self.option_replies() {
            assert_eq!(reply.reply & (1 << 31), 0, "GO failed: {reply:?}");
            if reply.reply == wire::REP_INFO && reply.data[0..2] == [0, 0] {
                let size = u64::from_be_bytes(reply.data[2..10].try_into().expect("size"));
                let flags = u16::from_be_bytes([reply.data[10], reply.data[11]]);
                size_flags = Some((size, flags));
            }
        }
        size_flags.expect("NBD_INFO_EXPORT")
    }

    pub fn request(&mut self, flags: u16, command: u16, handle: u64, offset: u64, length: u32) {
        self.send(&request_header(flags, command, handle, offset, length));
    }

    /// Reads one reply (one simple reply, or one structured chunk). For a simple reply to a
    /// successful READ pass the length to read the data too.
    pub fn reply(&mut self, simple_read_length: usize) -> Reply {
        self.reply_or_eof(simple_read_length)
            .expect("server closed instead of replying")
    }

    /// Like `reply`, but None when the server closed the connection before a reply started.
    pub fn reply_or_eof(&mut self, simple_read_length: usize) -> Option<Reply> {
        let mut first = [0u8; 1];
        match self.stream.read(&mut first) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a reply: {e}"),
        }
        let rest = self.read_exact(3);
        let magic = u32::from_be_bytes([first[0], rest[0], rest[1], rest[2]]);
        Some(self.reply_after_magic(magic, simple_read_length))
    }

    fn reply_after_magic(&mut self, magic: u32, simple_read_length: usize) -> Reply {
        if magic == wire::SIMPLE_REPLY_MAGIC {
            let error = self.read_u32();
            let handle = self.read_u64();
            let payload = if error == 0 {
                self.read_exact(simple_read_length)
            } else {
                Vec::new()
            };
            return Reply {
                handle,
                error,
                chunk: None,
                payload,
            };
        }
        assert_eq!(magic, wire::STRUCTURED_REPLY_MAGIC, "unknown reply magic");
        let flags = self.read_u16();
        let kind = self.read_u16();
        let handle = self.read_u64();
        let length = self.read_u32() as usize;
        let payload = self.read_exact(length);
        assert_ne!(
            flags & wire::REPLY_FLAG_DONE,
            0,
            "server sends single-chunk replies"
        );
        let error = if kind & (1 << 15) != 0 {
            u32::from_be_bytes(payload[0..4].try_into().expect("errno"))
        } else {
            0
        };
        Reply {
            handle,
            error,
            chunk: Some(kind),
            payload,
        }
    }

    /// True if the server closed the connection (EOF or reset) instead of sending anything.
    pub fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => true,
            Err(e) => panic!("waiting for the server to close: {e}"),
        }
    }
}

/// A minimal blocking NBD client: one request at a time, errors returned, never panics.
pub struct Client {
    stream: UnixStream,
    pub size: u64,
    next_handle: u64,
}

fn protocol(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Client {
    /// Connects to the default export.
    pub fn connect(socket: &Path) -> io::Result<Client> {
        Client::connect_to(socket, "")
    }

    /// Connects to the export named `export` ("" is the default one).
    pub fn connect_to(socket: &Path, export: &str) -> io::Result<Client> {
        let mut stream = UnixStream::connect(socket)?;
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting)?;
        if greeting[0..8] != wire::NBDMAGIC.to_be_bytes()
            || greeting[8..16] != wire::IHAVEOPT.to_be_bytes()
        {
            return Err(protocol("bad greeting".into()));
        }
        stream.write_all(&(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES).to_be_bytes())?;
        // No info requests.
        let data = RawClient::go_data(export, &[]);
        let mut go = wire::IHAVEOPT.to_be_bytes().to_vec();
        go.extend_from_slice(&wire::OPT_GO.to_be_bytes());
        go.extend_from_slice(&(data.len() as u32).to_be_bytes());
        go.extend_from_slice(&data);
        stream.write_all(&go)?;
        let mut size = None;
        loop {
            let mut header = [0u8; 20];
            stream.read_exact(&mut header)?;
            let reply = u32::from_be_bytes(header[12..16].try_into().expect("4"));
            let length = u32::from_be_bytes(header[16..20].try_into().expect("4")) as usize;
            let mut data = vec![0u8; length];
            stream.read_exact(&mut data)?;
            match reply {
                wire::REP_ACK => break,
                wire::REP_INFO if data.len() >= 12 && data[0..2] == [0, 0] => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().expect("8")));
                }
                wire::REP_INFO => {}
                other => return Err(protocol(format!("GO failed: reply {other:#x}"))),
            }
        }
        let size = size.ok_or_else(|| protocol("no NBD_INFO_EXPORT".into()))?;
        Ok(Client {
            stream,
            size,
            next_handle: 1,
        })
    }

    fn request(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> io::Result<u64> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut out = request_header(flags, command, handle, offset, length).to_vec();
        out.extend_from_slice(data);
        self.stream.write_all(&out)?;
        Ok(handle)
    }

    fn reply(&mut self, handle: u64, data: &mut [u8]) -> io::Result<()> {
        let mut header = [0u8; 16];
        self.stream.read_exact(&mut header)?;
        if header[0..4] != wire::SIMPLE_REPLY_MAGIC.to_be_bytes() {
            return Err(protocol("bad reply magic".into()));
        }
        let error = u32::from_be_bytes(header[4..8].try_into().expect("4"));
        if u64::from_be_bytes(header[8..16].try_into().expect("8")) != handle {
            return Err(protocol("reply for another handle".into()));
        }
        if error != 0 {
            return Err(io::Error::other(format!("server error {error}")));
        }
        self.stream.read_exact(data)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { wire::CMD_FLAG_FUA } else { 0 };
        let handle = self.request(flags, wire::CMD_WRITE, offset, data.len() as u32, data)?;
        self.reply(handle, &mut [])
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let handle = self.request(0, wire::CMD_FLUSH, 0, 0, &[])?;
        self.reply(handle, &mut [])
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let handle = self.request(0, wire::CMD_READ, offset, buf.len() as u32, &[])?;
        self.reply(handle, buf)
    }

    pub fn disconnect(mut self) {
        let _ = self.request(0, wire::CMD_DISC, 0, 0, &[]);
    }
}
