//! The volume against a plain byte model: random operation sequences (proptest and seeded),
//! and many threads against per-block and per-granule version models. Guards against any
//! sequence of operations or interleaving returning bytes the model does not hold.

#[path = "../common/mod.rs"]
mod common;

mod concurrency;
mod sequential;
mod stress;
