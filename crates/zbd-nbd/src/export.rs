//! The one trait the server serves: a byte-addressed device of fixed size.
//!
//! The server checks every request against [`Export::size`] and its own limits before calling the
//! export, so implementations only see in-range, bounded requests. All methods take `&self` and
//! are called from many worker threads at once (requests from several connections run in
//! parallel); an implementation does its own locking.
//!
//! Durability contract (this is what makes `NBD_FLAG_CAN_MULTI_CONN` honest): once a write, trim
//! or write-zeroes call has returned, its effect is visible to every later call from any thread,
//! and [`Export::flush`] makes durable every such call that returned before `flush` was called,
//! whichever connection it came from. A call with `fua = true` is durable when it returns.

use crate::wire;

/// Class of failure, mapped onto the few errno values the NBD protocol allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Operation not permitted (e.g. a write to a read-only export).
    Permission,
    /// Input/output error: the storage failed or the data is corrupt.
    Io,
    /// Out of memory.
    NoMemory,
    /// Invalid argument.
    Invalid,
    /// No space left on the device.
    NoSpace,
    /// Value too large.
    Overflow,
    /// Operation not supported (e.g. a fast zero the export cannot do quickly).
    NotSupported,
    /// The export is shutting down.
    Shutdown,
}

impl ErrorKind {
    /// The value sent in a reply's error field.
    pub fn errno(self) -> u32 {
        match self {
            ErrorKind::Permission => wire::EPERM,
            ErrorKind::Io => wire::EIO,
            ErrorKind::NoMemory => wire::ENOMEM,
            ErrorKind::Invalid => wire::EINVAL,
            ErrorKind::NoSpace => wire::ENOSPC,
            ErrorKind::Overflow => wire::EOVERFLOW,
            ErrorKind::NotSupported => wire::ENOTSUP,
            ErrorKind::Shutdown => wire::ESHUTDOWN,
        }
    }
}

/// An error from an export: a class for the wire and a message for the log (and, with structured
/// replies, for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ExportError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ExportError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ExportError {
            kind,
            message: message.into(),
        }
    }
    pub fn io(message: impl Into<String>) -> Self {
        ExportError::new(ErrorKind::Io, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ExportError::new(ErrorKind::Invalid, message)
    }
    pub fn no_space(message: impl Into<String>) -> Self {
        ExportError::new(ErrorKind::NoSpace, message)
    }
    pub fn permission(message: impl Into<String>) -> Self {
        ExportError::new(ErrorKind::Permission, message)
    }
}

impl From<std::io::Error> for ExportError {
    fn from(error: std::io::Error) -> Self {
        // EDQUOT and EFBIG map to ENOSPC, as the protocol asks; the rest is an I/O error.
        let kind = match error.raw_os_error() {
            Some(28) | Some(122) | Some(27) => ErrorKind::NoSpace,
            _ => ErrorKind::Io,
        };
        ExportError::new(kind, error.to_string())
    }
}

pub type ExportResult<T> = Result<T, ExportError>;

/// One run of bytes with the same allocation state, as reported by [`Export::block_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// Not allocated in the backing store (reads as zero unless `zero` is false).
    pub hole: bool,
    /// Known to read as all zeroes.
    pub zero: bool,
}

impl Extent {
    pub fn data(length: u64) -> Self {
        Extent {
            length,
            hole: false,
            zero: false,
        }
    }
    pub fn hole(length: u64) -> Self {
        Extent {
            length,
            hole: true,
            zero: true,
        }
    }
    /// Flags of the `base:allocation` context.
    pub fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.hole {
            flags |= wire::STATE_HOLE;
        }
        if self.zero {
            flags |= wire::STATE_ZERO;
        }
        flags
    }
}

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest addressable unit; 1 means any byte offset and length works.
    pub minimum: u32,
    /// Size below which requests cost a read-modify-write.
    pub preferred: u32,
    /// Largest READ/WRITE payload; the server lowers it to its own cap.
    pub maximum: u32,
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }
}

/// Exports beside the default one, found by name at each handshake (the other devices of a
/// zbd volume): a client lists them (NBD_OPT_LIST) and picks one by name.
pub trait Directory: Send + Sync + 'static {
    /// Their names, in the order a listing shows them (the default export's is listed first).
    fn names(&self) -> Vec<String>;
    /// The export named `name` (never the default one's name), if there is one now.
    fn find(&self, name: &str) -> Option<std::sync::Arc<dyn Export>>;
}

/// A block device the server exports.
pub trait Export: Send + Sync + 'static {
    /// Size in bytes. It may grow while served (`zbd grow` of a served volume): each connection
    /// is told the size at its handshake and keeps it (requests past it are refused as past
    /// the end), so only clients that connect afterwards see the new size.
    fn size(&self) -> u64;

    /// Writes, trims and write-zeroes fail with EPERM and the client is told so at handshake.
    fn is_read_only(&self) -> bool {
        false
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::default()
    }

    /// Fills `buf` with the bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()>;

    /// Stores `data` at `offset`; when `fua` is set, durably before returning.
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ExportResult<()>;

    /// Makes durable every write, trim and write-zeroes that returned before this call.
    fn flush(&self) -> ExportResult<()>;

    /// Hint that `length` bytes at `offset` are no longer needed; afterwards they may read as
    /// anything until written again.
    fn trim(&self, offset: u64, length: u64, fua: bool) -> ExportResult<()>;

    /// Makes `length` bytes at `offset` read as zero. With `may_trim` the export may deallocate
    /// them; without, it must keep them allocated (`NBD_CMD_FLAG_NO_HOLE`).
    fn write_zeroes(&self, offset: u64, length: u64, may_trim: bool, fua: bool)
        -> ExportResult<()>;

    /// Allocation state of the bytes from `offset`: consecutive extents starting at `offset`,
    /// together covering at least one byte and at most `length` bytes. Returning fewer bytes than
    /// asked is allowed (the client asks again from where the answer stopped).
    fn block_status(&self, _offset: u64, length: u64) -> ExportResult<Vec<Extent>> {
        Ok(vec![Extent::data(length)])
    }
}
