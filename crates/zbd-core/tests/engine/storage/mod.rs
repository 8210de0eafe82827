//! The storage backends under a volume: real files (buffered and O_DIRECT), a loop block
//! device (512-byte and 4 KiB sectors) and RAM. Guards against backend-specific loss: misaligned direct I/O, discards that
//! write, stripes of RAM read or written wrongly.

mod aligned;
mod block_device;
mod direct;
mod file;
mod ram;
