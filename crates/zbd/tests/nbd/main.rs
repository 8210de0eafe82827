//! `zbd serve` over NBD end to end (root, real tools): a filesystem on an attached device,
//! power loss under a served volume, scrubbing while served. One binary: each file under
//! tests/ is linked on its own.

#[path = "../nbd_support/mod.rs"]
mod nbd_support;

mod devices;
mod filesystem;
mod power_loss;
mod scrub;
