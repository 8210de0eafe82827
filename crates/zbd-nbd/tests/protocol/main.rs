//! The NBD server against real and raw clients: the handshake and requests of libnbd tools,
//! malformed input, concurrency, durability of FLUSH/FUA, and the server's bounds. One binary
//! (each file under tests/ is linked on its own); memory_bound.rs stays alone in its binary,
//! because it reads the process's peak RSS.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod clients;
mod concurrency;
mod durability;
mod growth;
mod limits;
