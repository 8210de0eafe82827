//! The write path: request edges, compression units, and the extent buffer that packs blocks
//! into open extents. Guards against writes that store or split the wrong bytes and against
//! the buffer's bookkeeping drifting from its open extents.

pub(crate) mod extent_buffer;
mod requests;
mod units;
