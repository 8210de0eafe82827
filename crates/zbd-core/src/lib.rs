//! zbd engine: compressed, log-structured, crash-safe block store.
//!
//! Logical 4 KiB blocks are compressed one by one, packed into fixed-size extents that are only
//! ever appended to, and found again through a persistent translation map. See docs/design.md
//! for the design and docs/format.md for the on-disk format.

pub mod backend;
mod buffer;
mod cleaner;
pub mod codec;
pub mod dedup;
mod dicts;
mod engine;
pub mod error;
mod extents;
pub mod format;
pub mod layout;
mod map;
pub mod meta;
mod par;
mod readcache;
mod recovery;
mod state;
pub mod stats;
mod units;
mod volume;
mod writeback;

pub use backend::{FileStorage, IoOptions, MemStorage, QueuedStorage, SimStorage, Storage};
pub use cleaner::PassResult;
pub use codec::Codec;
/// Microbenchmarks of engine internals (`zbd bench extents`); not a stable API.
#[doc(hidden)]
pub use engine::bench;
pub use engine::{
    AllocState, CheckReport, DedupReport, DeviceInfo, OpenOptions, Retrained, AGING_DEFAULT,
    BUFFER_BYTES_DEFAULT, READ_CACHE_BYTES_DEFAULT,
};
pub use error::{Error, Result};
pub use layout::{parse_size, CreateOptions, DICTIONARY_DEFAULT};
pub use map::{DeviceSpace, MapCacheStats, MAP_CACHE_BYTES_DEFAULT};
pub use readcache::ReadCacheStats;
pub use stats::{Counters, DictStat, Space, Stats, UnitSizeStat};
pub use volume::Volume;

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn volume_is_send_and_sync() {
        assert_send_sync::<super::Volume>();
    }
}
