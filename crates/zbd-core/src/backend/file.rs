//! A regular file or block device as storage: an exclusive `flock`, optional O_DIRECT, hole
//! punching or BLKDISCARD for freed extents.

use super::{Storage, WRITE_ALIGN_MAX};
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A regular file or a block device, locked exclusively while open.
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    /// Atomic so that a served volume's storage can be extended while the engine holds it
    /// (`extend_to` through a shared handle: online `zbd grow`).
    len: AtomicU64,
    block_device: bool,
    /// With O_DIRECT: the alignment offsets, lengths and buffers must have.
    direct: Option<usize>,
    /// What writes are aligned to so that nothing below reads before it writes
    /// ([`Storage::write_align`]): the direct-I/O alignment the kernel reports (the logical
    /// block of the device under it), 512 where it reports none.
    write_align: usize,
    /// Buffered bytes written since writeback of the file was last started
    /// (`WRITEBACK_START_BYTES`).
    unstarted: AtomicU64,
}

/// Buffered writes start the kernel's writeback of the file every this many bytes. Otherwise
/// dirty pages pile up in the page cache (the kernel starts on its own only at a tenth of RAM)
/// until the next checkpoint's fdatasync writes them all while the writer waits: on this
/// machine's disk, a sequential write spent half its time in those syncs (issue 13).
const WRITEBACK_START_BYTES: u64 = 4 << 20;

/// Reads of one batch in flight at once with O_DIRECT ([`Storage::read_many`]). A PostMark host
/// read on XFS needed at most 5 device reads; 8 covers a 1 MiB host read of 128 KiB extents.
pub const DIRECT_READS_IN_FLIGHT: usize = 8;

/// Alignment of the engine's own writes (segments, map pages, checkpoints, superblocks).
const ENGINE_ALIGN: usize = crate::format::SECTOR_BYTES;
/// Buffer address alignment used for O_DIRECT (at least what any device here asks for).
const DIRECT_MEM_ALIGN: usize = 4096;

impl FileStorage {
    /// Opens an existing file or block device and takes an exclusive lock on it.
    pub fn open(path: &Path, writable: bool) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| {
                Error::Io(io::Error::new(
                    e.kind(),
                    format!("cannot open {}: {e}", path.display()),
                ))
            })?;
        Self::from_file(file, path)
    }

    /// Creates (or truncates to `len`) a sparse file; a block device is opened as is.
    pub fn create(path: &Path, len: u64) -> Result<Self> {
        let is_bdev = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(!is_bdev)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                Error::Io(io::Error::new(
                    e.kind(),
                    format!("cannot create {}: {e}", path.display()),
                ))
            })?;
        let s = Self::from_file(file, path)?;
        if !s.block_device {
            s.file.set_len(0)?;
            s.file.set_len(len)?;
            return Ok(FileStorage {
                len: AtomicU64::new(len),
                ..s
            });
        }
        let have = s.len.load(Ordering::SeqCst);
        if have < len {
            return Err(Error::Invalid(format!(
                "block device {} has {have} bytes, the volume needs {len} (lower --size or --capacity)",
                path.display(),
            )));
        }
        Ok(s)
    }

    fn from_file(mut file: File, path: &Path) -> Result<Self> {
        // Exclusive advisory lock: a second zbd on the same volume gets a clear "in use" error.
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| Error::InUse(path.display().to_string()))?;
        // The engine reads what its map names (a block, a unit, a record table) at scattered
        // places, and the cleaner reads whole extents by itself: kernel readahead only
        // multiplies the bytes read from the device (issue 30 measured 3.2x). Advice only: a
        // file system that ignores it still works.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random);
        let block_device = file.metadata()?.file_type().is_block_device();
        // Block devices report length 0 in metadata; seeking to the end gives the real size.
        let len = file.seek(SeekFrom::End(0))?;
        let write_align = match dio_align(&file) {
            Ok(Some(a)) if a.is_power_of_two() && (ENGINE_ALIGN..=WRITE_ALIGN_MAX).contains(&a) => {
                a
            }
            _ => ENGINE_ALIGN,
        };
        Ok(FileStorage {
            file,
            len: AtomicU64::new(len),
            block_device,
            direct: None,
            write_align,
            unstarted: AtomicU64::new(0),
        })
    }

    /// Makes the storage at least `len` bytes long (`zbd grow`): a file is extended (sparse)
    /// and synced, file and directory entry, before anything refers to the new bytes; a block
    /// device must be that large already (grow it first, e.g. with lvextend). Takes `&self`: a
    /// served volume's storage is extended while the engine uses it, which reads and writes
    /// nothing past its own geometry, so the longer file is unused until a superblock says
    /// otherwise. Calls must not race each other (one grow at a time).
    pub fn extend_to(&self, len: u64, path: &Path) -> Result<()> {
        let have = self.len.load(Ordering::SeqCst);
        if len <= have {
            return Ok(());
        }
        if self.block_device {
            // The device may have been grown since it was opened (lvextend): ask it again.
            let now = (&self.file).seek(SeekFrom::End(0))?;
            if now >= len {
                self.len.store(now, Ordering::SeqCst);
                return Ok(());
            }
            return Err(Error::Invalid(format!(
                "block device {} has {now} bytes, {len} are needed: grow the device first",
                path.display(),
            )));
        }
        self.file.set_len(len)?;
        self.file.sync_all()?;
        self.len.store(len, Ordering::SeqCst);
        Ok(())
    }

    /// Switches to direct I/O (O_DIRECT: no page cache; reads and writes go to the device).
    /// Fails with a clear error when the file system or device cannot do it, or needs a larger
    /// alignment than the engine's 512-byte sectors.
    pub fn into_direct(mut self, path: &Path) -> Result<Self> {
        let unsupported = |why: String| {
            Error::Invalid(format!(
                "--direct: {} cannot be used with O_DIRECT: {why}",
                path.display()
            ))
        };
        // Kernels before 6.1 do not report the alignment: assume the common 512 bytes (a device
        // that needs more fails its first write with EINVAL).
        let align = match dio_align(&self.file).map_err(|e| Error::Io(e.into()))? {
            Some(0) => {
                return Err(unsupported(
                    "its file system does not support direct I/O".into(),
                ))
            }
            Some(a) => a,
            None => ENGINE_ALIGN,
        };
        if align > WRITE_ALIGN_MAX || !align.is_power_of_two() {
            return Err(unsupported(format!(
                "it needs {align}-byte aligned I/O and zbd aligns its writes to at most \
                 {WRITE_ALIGN_MAX} bytes"
            )));
        }
        self.write_align = self.write_align.max(align);
        let flags = rustix::fs::fcntl_getfl(&self.file).map_err(|e| Error::Io(e.into()))?;
        rustix::fs::fcntl_setfl(&self.file, flags | rustix::fs::OFlags::DIRECT)
            .map_err(|e| unsupported(e.to_string()))?;
        self.direct = Some(align);
        Ok(self)
    }

    /// Whether this is a block device (no hole punching on discard).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Whether O_DIRECT is in use.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    fn read_exact(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let Some(align) = self.direct else {
            return self.file.read_exact_at(buf, offset);
        };
        // Widen to the alignment (reads only what a request needs, rounded to sectors).
        let a = align as u64;
        let start = offset / a * a;
        let end = (offset + buf.len() as u64).div_ceil(a) * a;
        let mut tmp = AlignedBuf::new((end - start) as usize);
        self.file.read_exact_at(tmp.as_mut(), start)?;
        let s = (offset - start) as usize;
        buf.copy_from_slice(&tmp.as_mut()[s..s + buf.len()]);
        Ok(())
    }

    fn write_all(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let Some(align) = self.direct else {
            return self.file.write_all_at(data, offset);
        };
        // `align` is a power of two (checked in `into_direct`).
        if offset & (align as u64 - 1) != 0 || data.len() & (align - 1) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "unaligned direct write of {} bytes at {offset} (needs {align})",
                    data.len()
                ),
            ));
        }
        let mut tmp = AlignedBuf::new(data.len());
        tmp.as_mut().copy_from_slice(data);
        self.file.write_all_at(tmp.as_mut(), offset)
    }
}

/// The direct-I/O offset alignment the kernel reports for `file` (6.1+: `statx` DIOALIGN; for a
/// block device its logical block size); `None` when it reports none, `Some(0)` when the file
/// system cannot do direct I/O.
fn dio_align(file: &File) -> rustix::io::Result<Option<usize>> {
    use rustix::fs::{AtFlags, StatxFlags};
    let st = rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN)?;
    Ok(
        (st.stx_mask & StatxFlags::DIOALIGN.bits() != 0)
            .then_some(st.stx_dio_offset_align as usize),
    )
}

/// A zeroed buffer whose start is aligned for O_DIRECT (over-allocated, then sliced: no unsafe).
struct AlignedBuf {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let buf = vec![0u8; len + DIRECT_MEM_ALIGN];
        let start = buf.as_ptr().align_offset(DIRECT_MEM_ALIGN);
        AlignedBuf { buf, start, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl Storage for FileStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len.load(Ordering::SeqCst))
    }

    fn write_align(&self) -> usize {
        self.write_align
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_exact(offset, buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::CorruptMetadata(format!(
                    "read past the end of the storage at byte {offset} (truncated volume?)"
                ))
            } else {
                Error::Io(e)
            }
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_all(offset, data)?;
        if self.direct.is_none() {
            let n = data.len() as u64;
            if self.unstarted.fetch_add(n, Ordering::Relaxed) + n >= WRITEBACK_START_BYTES {
                self.unstarted.store(0, Ordering::Relaxed);
                start_writeback(&self.file);
            }
        }
        Ok(())
    }

    /// With O_DIRECT every read goes to the device, so the ranges of one batch (the extents of
    /// one host read) are read concurrently, up to [`DIRECT_READS_IN_FLIGHT`] at once. Buffered
    /// reads mostly come from the page cache, where a helper thread costs more than the read:
    /// those stay one after the other.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        let width = if self.direct.is_some() {
            DIRECT_READS_IN_FLIGHT
        } else {
            1
        };
        super::read_concurrently(self, reads, width)
    }

    fn sync(&self) -> Result<()> {
        // Block devices need fsync too (flushes the device cache); fdatasync is enough for both.
        Ok(self.file.sync_data()?)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        // On a block device, fallocate(PUNCH_HOLE) is not a discard: the kernel turns it into
        // WRITE_ZEROES (blkdev_issue_zeroout), which devices may implement by writing zeros and
        // which /sys/block/*/stat counts as written sectors (an overwrite of 64 MiB at 2:1 showed
        // 66 MiB written for 33 MiB of data). BLKDISCARD is the real discard: a loop device
        // punches the hole in its backing file, an SSD or thin volume gets its space back, and
        // the sectors count as discarded, not written.
        let result = if self.block_device {
            block_discard(&self.file, offset, len)
        } else {
            use rustix::fs::FallocateFlags;
            let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            rustix::fs::fallocate(&self.file, flags, offset, len)
        };
        match result {
            Ok(()) => Ok(()),
            // Filesystems or devices without hole punching or discard: space is simply not
            // given back.
            Err(rustix::io::Errno::OPNOTSUPP)
            | Err(rustix::io::Errno::NOSYS)
            | Err(rustix::io::Errno::NOTTY) => Ok(()),
            Err(e) => Err(Error::Io(e.into())),
        }
    }
}

/// Starts writeback of the file's dirty pages without waiting for it (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE` alone). A hint: it neither waits nor consumes a writeback error (the
/// kernel records those for the next fdatasync, which the engine runs before it calls anything
/// durable), so its own result is ignored.
#[allow(unsafe_code)]
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range takes a file descriptor and three integers and touches no memory
    // of ours; the descriptor is open for as long as `file` is borrowed. Offset 0 and length 0
    // mean the whole file.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

/// `BLKDISCARD` from <linux/fs.h>: `_IO(0x12, 119)`, argument a pointer to `u64 [start, length]`.
const BLKDISCARD: rustix::ioctl::Opcode = rustix::ioctl::opcode::none(0x12, 119);

/// Discards `len` bytes at `offset` of a block device.
#[allow(unsafe_code)]
fn block_discard(file: &File, offset: u64, len: u64) -> rustix::io::Result<()> {
    // SAFETY: `Setter::new` requires a valid opcode and the input type the kernel expects for
    // it. BLKDISCARD is `_IO(0x12, 119)` and the kernel (blkdev_ioctl -> blk_ioctl_discard)
    // copies exactly a `uint64_t range[2]` = (start, length) in bytes from the pointer, which
    // is `[u64; 2]` here; it writes nothing back. `ioctl` requires the fd to be open for the
    // call, which the borrowed `File` guarantees, and `Setter` keeps its input alive and passes
    // a pointer to it for the duration of the call. On a file that is not a block device the
    // kernel answers ENOTTY without touching memory.
    unsafe {
        let discard = rustix::ioctl::Setter::<BLKDISCARD, [u64; 2]>::new([offset, len]);
        rustix::ioctl::ioctl(file, discard)
    }
}
