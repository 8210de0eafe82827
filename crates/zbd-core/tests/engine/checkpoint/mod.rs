//! Checkpoints: written and synced outside the state lock in phases, by the volume's background
//! thread when a write asks for one, beside cleaning passes and a map cache smaller than their
//! snapshot. Guards against a crash or failed sync around a checkpoint losing a flushed block,
//! and against reads seeing older data while one is in flight.

pub(crate) mod background;
mod cleaning_pass;
mod map_cache;
mod phases;
