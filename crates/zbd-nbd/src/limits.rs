//! Every bound the server enforces, in one place. Units come last in the names.

use std::time::Duration;

/// Largest READ/WRITE payload by default (also the `maximum` block size we advertise; lowered to
/// the in-flight budget if that is smaller). A longer READ gets EINVAL; a longer WRITE has its
/// payload read and discarded, then EINVAL, up to [`WRITE_SKIP_BYTES_MAX`]. TRIM and WRITE_ZEROES
/// carry no payload and are never capped.
pub const PAYLOAD_BYTES_MAX_DEFAULT: u32 = 32 << 20;

/// An oversized WRITE payload up to this long is skipped (read in small pieces, never held) and
/// answered EINVAL; a longer one drops the connection: 4 GiB of garbage is more likely a client
/// out of step than data, and reading it would take the connection minutes.
pub const WRITE_SKIP_BYTES_MAX: u32 = 64 << 20;

/// Bytes that requests in flight on all connections together may hold by default (WRITE payloads
/// and READ replies): eight requests of the largest size, or thousands of typical ones.
pub const INFLIGHT_BYTES_DEFAULT: u64 = 256 << 20;

/// BLOCK_STATUS reply bytes counted against the in-flight budget (the largest such reply).
pub const BLOCK_STATUS_REPLY_BYTES_MAX: u64 = 4 + 8 * DESCRIPTORS_MAX as u64;

/// Largest option payload accepted during the handshake; a bigger one drops the connection
/// (the longest legitimate option is a few strings of at most 4096 bytes).
pub const OPTION_BYTES_MAX: u32 = 64 << 10;

/// Options one connection may send before it must pick an export.
pub const OPTIONS_PER_CONNECTION_MAX: u32 = 1024;

/// Longest string (export name, metadata context query) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;

/// Longest error message we send in a structured error chunk.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// A client must finish each handshake read, and send each piece of a WRITE's payload once its
/// header has arrived, within this time; a payload holds budget, so a stalled sender cannot keep
/// it. Between requests a connection may stay idle for ever.
pub const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The slowest a WRITE payload may arrive: the whole payload must be in within
/// [`CLIENT_READ_TIMEOUT`] plus its length at this rate once its budget is granted (30 s for
/// 4 KiB, 38 s for 1 MiB, 286 s for 32 MiB), so a client trickling a byte now and then cannot
/// hold its budget for ever. 1 Mbit/s: a link slower than that is too slow for a block device.
pub const PAYLOAD_RATE_BYTES_PER_SECOND_MIN: u64 = 128 << 10;

/// A reply that the client does not read within this time breaks the connection, so a stuck
/// client cannot hold worker threads (and the socket lock) forever.
pub const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Threads serving one connection by default, hence requests in flight per connection: one per
/// core, within these bounds. Our requests are CPU-bound (compression), so threads beyond the
/// cores only add context switches: on 2 cores, 4 threads per connection gave 165k random 4 KiB
/// reads/s from a zbd volume, 8 gave 131k and 16 gave 117k (fio, iodepth 16, 2 connections).
pub const THREADS_PER_CONNECTION_MIN: usize = 4;
pub const THREADS_PER_CONNECTION_MAX: usize = 16;

/// The default number of threads per connection on this machine.
pub fn threads_per_connection_default() -> usize {
    std::thread::available_parallelism()
        .map_or(THREADS_PER_CONNECTION_MIN, |cores| cores.get())
        .clamp(THREADS_PER_CONNECTION_MIN, THREADS_PER_CONNECTION_MAX)
}

/// Block status descriptors in one reply (the client asks again for the rest).
pub const DESCRIPTORS_MAX: usize = 16 << 10;

/// Connections served at once; more wait in the listen backlog until one ends.
pub const CONNECTIONS_MAX_DEFAULT: usize = 64;

const _: () = assert!(STRING_BYTES_MAX < OPTION_BYTES_MAX as usize);
const _: () = assert!(THREADS_PER_CONNECTION_MIN <= THREADS_PER_CONNECTION_MAX);
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT <= WRITE_SKIP_BYTES_MAX);
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT as u64 <= INFLIGHT_BYTES_DEFAULT);
const _: () = assert!(PAYLOAD_RATE_BYTES_PER_SECOND_MIN > 0);
