//! Engine errors. Every variant maps to one errno so the NBD server can answer a client without
//! knowing anything about compression.

use std::io;

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors of the engine. `Display` is a one-line message naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage below failed (read, write, sync, discard).
    #[error("storage I/O failed: {0}")]
    Io(#[from] io::Error),
    /// A stored block failed its checksum or could not be decoded: that block is lost, the rest of
    /// the volume is fine.
    #[error("corrupt data in logical block {lba}")]
    Corrupt {
        /// Logical block (4 KiB units) whose stored bytes are damaged.
        lba: u64,
    },
    /// Volume metadata (superblock, checkpoint, map page) is damaged or inconsistent.
    #[error("corrupt volume metadata: {0}")]
    CorruptMetadata(String),
    /// The path is not a zbd volume, or it is one of a format version we do not understand.
    #[error("not a zbd volume: {0}")]
    NotAVolume(String),
    /// No free extent is left for new data (live data does not fit the data area).
    #[error("no space left in the volume's data area")]
    NoSpace,
    /// Placement found free extents at the host floor on a volume that never cleans under the
    /// state lock (bit 10, docs/design.md "Room first, sequence last"): nothing of the block
    /// was applied; the writer cleans with the lock released and places again. The engine
    /// turns it into progress or `NoSpace`; a caller of `Volume` never sees it.
    #[error("no space left in the volume's data area until the cleaner runs")]
    SpaceShort,
    /// The request reaches past the end of the volume.
    #[error("request {offset}+{len} is outside the volume ({size} bytes)")]
    OutOfRange {
        /// Request start in bytes.
        offset: u64,
        /// Request length in bytes.
        len: u64,
        /// Logical size of the volume in bytes.
        size: u64,
    },
    /// The volume was opened read-only.
    #[error("volume is open read-only")]
    ReadOnly,
    /// Another process holds the volume open.
    #[error("volume is in use by another process (could not lock {0})")]
    InUse(String),
    /// The volume stopped writing after a failed write or sync; reopening it recovers from what
    /// is on disk.
    #[error("volume stopped writing after {0}; reopen it to recover")]
    Failed(String),
    /// A parameter given by the caller is invalid (extent size, codec name, sizes).
    #[error("invalid parameter: {0}")]
    Invalid(String),
}

/// Linux errno values used by [`Error::errno`]; kept here so callers need no libc.
pub mod errno {
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// No space left on device.
    pub const ENOSPC: i32 = 28;
    /// Read-only file system.
    pub const EROFS: i32 = 30;
    /// Device or resource busy.
    pub const EBUSY: i32 = 16;
}

impl Error {
    /// The errno a block-device client should see for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(_) | Error::Corrupt { .. } | Error::CorruptMetadata(_) | Error::Failed(_) => {
                errno::EIO
            }
            Error::NotAVolume(_) | Error::Invalid(_) | Error::OutOfRange { .. } => errno::EINVAL,
            Error::NoSpace | Error::SpaceShort => errno::ENOSPC,
            Error::ReadOnly => errno::EROFS,
            Error::InUse(_) => errno::EBUSY,
        }
    }
}
