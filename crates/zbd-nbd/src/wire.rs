//! Wire constants of the NBD protocol, mirroring the "Values" section of the specification
//! (NetworkBlockDevice/nbd `doc/proto.md`), plus the few fixed-size header layouts we parse.
//! Old drafts of the spec numbered the meta-context options differently; these are the values
//! the current spec, qemu, libnbd and nbdkit use (LIST_META_CONTEXT = 9, SET_META_CONTEXT = 10).
//!
//! Everything on the wire is big-endian ("network byte order").

// ---- Magic numbers -------------------------------------------------------------------------

/// `NBDMAGIC`: first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second magic of the newstyle handshake, and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- Handshake flags (server, 16 bits) and client flags (32 bits) --------------------------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- Transmission flags (16 bits) ----------------------------------------------------------

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- Option types --------------------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---- Option reply types --------------------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;

const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR + 1;
pub const REP_ERR_POLICY: u32 = REP_ERR + 2;
pub const REP_ERR_INVALID: u32 = REP_ERR + 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR + 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR + 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR + 9;

// ---- Info types (NBD_REP_INFO payload starts with one of these, 16 bits) -------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- Metadata contexts ---------------------------------------------------------------------

/// The one metadata context the specification defines.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// Namespace prefix of `base:allocation`; a LIST query of just the namespace lists all of it.
pub const CONTEXT_BASE_NAMESPACE: &str = "base:";

pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// ---- Commands ------------------------------------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_RESIZE: u16 = 8;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- Structured reply flags and chunk types ------------------------------------------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;

pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// ---- Error values (the only ones the protocol allows on the wire) --------------------------

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---- Sizes of fixed headers ----------------------------------------------------------------

/// Option request header: magic (8) + option (4) + length (4).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Request header: magic (4) + flags (2) + type (2) + handle (8) + offset (8) + length (4).
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Simple reply: magic (4) + error (4) + handle (8).
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Structured reply chunk header: magic (4) + flags (2) + type (2) + handle (8) + length (4).
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Zero padding after NBD_OPT_EXPORT_NAME's reply unless NO_ZEROES was negotiated.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;

/// Name of a command for log lines.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        CMD_RESIZE => "RESIZE",
        _ => "UNKNOWN",
    }
}

/// Name of an option for log lines.
pub fn option_name(option: u32) -> &'static str {
    match option {
        OPT_EXPORT_NAME => "EXPORT_NAME",
        OPT_ABORT => "ABORT",
        OPT_LIST => "LIST",
        OPT_PEEK_EXPORT => "PEEK_EXPORT",
        OPT_STARTTLS => "STARTTLS",
        OPT_INFO => "INFO",
        OPT_GO => "GO",
        OPT_STRUCTURED_REPLY => "STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "EXTENDED_HEADERS",
        _ => "UNKNOWN",
    }
}

/// A transmission request header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub magic: u32,
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    pub fn decode(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Self {
        let mut cursor = Cursor::new(bytes);
        RequestHeader {
            magic: cursor.u32(),
            flags: cursor.u16(),
            command: cursor.u16(),
            handle: cursor.u64(),
            offset: cursor.u64(),
            length: cursor.u32(),
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&self.magic.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

/// Reads big-endian integers from a fixed array whose size the caller already checked; only used
/// on arrays of exactly the decoded size, so the slices cannot run past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        out
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
}

/// Parses length-prefixed fields out of an option's payload, which comes from the client and so
/// may be truncated or lie about its lengths: every read is checked.
pub struct PayloadReader<'a> {
    bytes: &'a [u8],
}

impl<'a> PayloadReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        PayloadReader { bytes }
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
    pub fn bytes(&mut self, count: usize) -> Option<&'a [u8]> {
        if count > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Some(head)
    }
    pub fn u16(&mut self) -> Option<u16> {
        let raw = self.bytes(2)?;
        Some(u16::from_be_bytes([raw[0], raw[1]]))
    }
    pub fn u32(&mut self) -> Option<u32> {
        let raw = self.bytes(4)?;
        Some(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }
    pub fn u64(&mut self) -> Option<u64> {
        let high = u64::from(self.u32()?);
        let low = u64::from(self.u32()?);
        Some(high << 32 | low)
    }
    /// A string prefixed by its 32-bit length, at most `max_bytes` long and valid UTF-8.
    pub fn string32(&mut self, max_bytes: usize) -> Option<&'a str> {
        let length = usize::try_from(self.u32()?).ok()?;
        if length > max_bytes {
            return None;
        }
        std::str::from_utf8(self.bytes(length)?).ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips() {
        let header = RequestHeader {
            magic: REQUEST_MAGIC,
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(RequestHeader::decode(&bytes), header);
    }

    #[test]
    fn payload_reader_rejects_lying_lengths() {
        let mut data = Vec::new();
        data.extend_from_slice(&100u32.to_be_bytes());
        data.extend_from_slice(b"abc");
        assert_eq!(PayloadReader::new(&data).string32(4096), None);

        let mut ok = Vec::new();
        ok.extend_from_slice(&3u32.to_be_bytes());
        ok.extend_from_slice(b"abc");
        let mut reader = PayloadReader::new(&ok);
        assert_eq!(reader.string32(4096), Some("abc"));
        assert_eq!(reader.remaining(), 0);
        assert_eq!(PayloadReader::new(&ok).string32(2), None);
    }

    #[test]
    fn error_replies_have_bit_31() {
        assert_eq!(REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(REP_ERR_UNKNOWN, 0x8000_0006);
        assert_eq!(REPLY_TYPE_ERROR, 0x8001);
        assert_eq!(OPT_LIST_META_CONTEXT, 9);
    }
}
