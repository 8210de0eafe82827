//! zbd volumes in a Ceph RADOS pool.
//!
//! A volume `rados:POOL/NAME` is a header object `zbd_header.NAME` (its size and object size,
//! and the exclusive lock of whoever has it open) and data objects `zbd_data.NAME.<index>` of a
//! fixed size, created on first write. [`RadosStorage`] implements the engine's `Storage` trait
//! over them, so nothing above it knows it is Ceph. docs/ceph.md explains how to run it.

mod client;
mod error;
mod ffi;
mod lock;
mod readahead;
mod storage;

pub use client::{ClusterOptions, Locker};
pub use error::RadosError;
pub use storage::{
    break_lock, describe, RadosStorage, DEFAULT_OBJECT_SIZE, OBJECT_SIZE_RANGE, SMALL_OBJECT_SIZE,
};

use std::fmt;

/// Prefix that names a RADOS volume wherever a volume path is accepted.
pub const SCHEME: &str = "rados:";

/// `rados:POOL/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RadosTarget {
    /// The pool.
    pub pool: String,
    /// The volume's name inside the pool.
    pub name: String,
}

impl RadosTarget {
    /// Parses `rados:POOL/NAME`; `None` if `text` does not start with `rados:`.
    pub fn parse(text: &str) -> Option<Result<RadosTarget, RadosError>> {
        let rest = text.strip_prefix(SCHEME)?;
        let bad = |why: &str| {
            Some(Err(RadosError::Invalid(format!(
                "{text:?}: {why} (expected rados:POOL/NAME)"
            ))))
        };
        let Some((pool, name)) = rest.split_once('/') else {
            return bad("no volume name");
        };
        if pool.is_empty() || name.is_empty() {
            return bad("empty pool or volume name");
        }
        if name.contains('/') || text.contains('\0') || text.chars().any(char::is_whitespace) {
            return bad("names cannot contain '/', spaces or NUL");
        }
        Some(Ok(RadosTarget {
            pool: pool.to_string(),
            name: name.to_string(),
        }))
    }

    /// The header object.
    pub fn header_object(&self) -> String {
        format!("zbd_header.{}", self.name)
    }

    /// The small object holding bytes `index * SMALL_OBJECT_SIZE ..` of the volume's metadata
    /// region.
    pub fn small_object(&self, index: u64) -> String {
        format!("zbd_meta.{}.{index:016x}", self.name)
    }

    /// The data object holding bytes `index * object_size ..` of the volume.
    pub fn data_object(&self, index: u64) -> String {
        format!("zbd_data.{}.{index:016x}", self.name)
    }
}

impl fmt::Display for RadosTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.pool, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert!(RadosTarget::parse("/var/lib/x.zbd").is_none());
        let t = RadosTarget::parse("rados:rbd/vol1").and_then(Result::ok);
        assert_eq!(
            t,
            Some(RadosTarget {
                pool: "rbd".into(),
                name: "vol1".into()
            })
        );
        for bad in [
            "rados:",
            "rados:pool",
            "rados:/x",
            "rados:p/",
            "rados:p/a/b",
            "rados:p/a b",
        ] {
            assert!(
                matches!(RadosTarget::parse(bad), Some(Err(_))),
                "{bad} accepted"
            );
        }
        let t = RadosTarget::parse("rados:p/v").and_then(Result::ok);
        assert_eq!(
            t.map(|t| (t.to_string(), t.header_object(), t.data_object(10))),
            Some((
                "rados:p/v".into(),
                "zbd_header.v".into(),
                "zbd_data.v.000000000000000a".into()
            ))
        );
    }
}
