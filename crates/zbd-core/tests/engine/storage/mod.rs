//! The storage backends under a volume: real files (buffered and O_DIRECT), a loop block
//! device and RAM. Guards against backend-specific loss: misaligned direct I/O, discards that
//! write, stripes of RAM read or written wrongly.

mod block_device;
mod direct;
mod file;
mod ram;
