//! The read path: lookups in the paged map, batched and concurrent storage reads, the read
//! cache and streaming reads. Guards against a read returning another block's bytes, older
//! data, zeros a block never held, or a damaged block's bytes as data.

mod batches;
mod cache;
mod concurrent;
mod paged_map;
mod parallel;
mod streaming;
