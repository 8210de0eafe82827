//! A deliberately dumb NBD client that sends exactly the bytes a test asks for, so tests can send
//! malformed packets and see what the server does.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use zbd_nbd::wire;

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
        let header = wire::RequestHeader {
            magic: wire::REQUEST_MAGIC,
            flags,
            command,
            handle,
            offset,
            length,
        };
        self.send(&header.encode());
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
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
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
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
            Err(e) => panic!("waiting for the server to close: {e}"),
        }
    }
}
