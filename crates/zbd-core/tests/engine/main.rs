//! The engine by component: what a write stores, what a read returns, checkpoints, the cleaner,
//! trained dictionaries, the format and its fixtures, and the storage backends under a volume.
//! Each guards a class of bug of that component, mostly against a byte model of the volume;
//! crash sweeps and injected faults across the whole engine are in the `durability` binary,
//! random workloads against the model in `model`.
//!
//! One test binary for all of them: each file under tests/ is linked on its own, and linking
//! is most of the build time of the tests.

#[path = "../common/mod.rs"]
mod common;

mod checkpoint;
mod cleaner;
mod dictionaries;
mod format;
mod read;
mod storage;
mod volume;
mod write;
