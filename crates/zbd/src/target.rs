//! Where a volume lives: a file or block device path, or `rados:POOL/NAME` (a Ceph RADOS pool,
//! with the `ceph` cargo feature). The one place that opens or creates the storage a volume
//! argument names; every subcommand goes through it.

use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};
use zbd_core::{FileStorage, Storage};

/// How to reach a Ceph cluster, for `rados:POOL/NAME` volumes (ignored for files).
#[derive(clap::Args, Clone, Debug)]
pub struct CephArgs {
    /// Ceph config file for rados:POOL/NAME volumes [default: $CEPH_CONF, then Ceph's defaults].
    #[arg(long, value_name = "FILE")]
    pub ceph_conf: Option<PathBuf>,
    /// Ceph user, without "client." [default: admin].
    #[arg(long, value_name = "NAME")]
    pub ceph_id: Option<String>,
    /// Seconds an OSD request waits (e.g. while an OSD restarts) before failing with EIO;
    /// 0 waits forever.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub rados_op_timeout: u64,
    /// Seconds to wait for the cluster's monitors when connecting.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub ceph_connect_timeout: u64,
    /// Seconds a server that stopped answering (crashed, paused, cut off) keeps a rados:
    /// volume's lock before another server may take the volume over (blocklisting it first).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub rados_lock_lease: u64,
}

/// A volume argument.
pub enum Target {
    /// A regular file or block device.
    File(PathBuf),
    /// An object set in a RADOS pool.
    #[cfg(feature = "ceph")]
    Rados(zbd_rados::RadosTarget),
}

/// Prefix of RADOS volume names (also known without the `ceph` feature, to say it is missing).
const RADOS_SCHEME: &str = "rados:";

impl Target {
    /// Parses a volume argument: `rados:POOL/NAME` or a path.
    pub fn parse(path: &Path) -> Result<Target> {
        let text = path.to_string_lossy();
        if !text.starts_with(RADOS_SCHEME) {
            return Ok(Target::File(path.to_path_buf()));
        }
        #[cfg(feature = "ceph")]
        {
            match zbd_rados::RadosTarget::parse(&text) {
                Some(parsed) => Ok(Target::Rados(parsed?)),
                None => Ok(Target::File(path.to_path_buf())),
            }
        }
        #[cfg(not(feature = "ceph"))]
        bail!("{text}: this zbd was built without Ceph support (cargo build --features ceph)")
    }

    /// A file path, if the volume is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Target::File(path) => Some(path),
            #[cfg(feature = "ceph")]
            Target::Rados(_) => None,
        }
    }

    /// Opens a file or block device volume's storage, locked for this process, with O_DIRECT
    /// if `direct`, as a `FileStorage` the caller can share with the engine (`zbd serve`: an
    /// online grow extends it); None for other targets.
    pub fn open_file(&self, direct: bool, writable: bool) -> Option<Result<FileStorage>> {
        match self {
            Target::File(path) => Some(
                FileStorage::open(path, writable)
                    .and_then(|s| if direct { s.into_direct(path) } else { Ok(s) })
                    .map_err(|e| anyhow!("{}: {e}", path.display())),
            ),
            #[cfg(feature = "ceph")]
            Target::Rados(_) => None,
        }
    }

    /// Opens the volume's storage, locked for this process.
    pub fn open(&self, ceph: &CephArgs, writable: bool) -> Result<Box<dyn Storage>> {
        let _ = ceph;
        match self {
            Target::File(path) => {
                let storage = FileStorage::open(path, writable)
                    .map_err(|e| anyhow!("{}: {e}", path.display()))?;
                Ok(Box::new(storage))
            }
            #[cfg(feature = "ceph")]
            Target::Rados(target) => Ok(Box::new(zbd_rados::RadosStorage::open(
                &cluster_options(ceph),
                target,
            )?)),
        }
    }

    /// Opens a file or block device with O_DIRECT (`zbd serve --direct`).
    pub fn open_direct(&self, writable: bool) -> Result<Box<dyn Storage>> {
        match self {
            Target::File(path) => {
                let storage = FileStorage::open(path, writable)
                    .and_then(|s| s.into_direct(path))
                    .map_err(|e| anyhow!("{}: {e}", path.display()))?;
                Ok(Box::new(storage))
            }
            #[cfg(feature = "ceph")]
            Target::Rados(_) => bail!("--direct applies to files and block devices only"),
        }
    }

    /// Creates storage of `total_bytes` for a new volume whose first `metadata_bytes` hold the
    /// engine's metadata. For RADOS, `object_size` (default 4 MiB) stripes it (the metadata
    /// region over small objects) and `force` replaces an existing volume of that name.
    pub fn create(
        &self,
        ceph: &CephArgs,
        total_bytes: u64,
        metadata_bytes: u64,
        object_size: Option<u64>,
        force: bool,
    ) -> Result<Box<dyn Storage>> {
        let _ = (ceph, metadata_bytes, force);
        match self {
            Target::File(path) => {
                if object_size.is_some() {
                    bail!("--object-size applies to rados:POOL/NAME volumes only");
                }
                let storage = FileStorage::create(path, total_bytes)
                    .map_err(|e| anyhow!("{}: {e}", path.display()))?;
                Ok(Box::new(storage))
            }
            #[cfg(feature = "ceph")]
            Target::Rados(target) => Ok(Box::new(zbd_rados::RadosStorage::create(
                &cluster_options(ceph),
                target,
                total_bytes,
                object_size.unwrap_or(zbd_rados::DEFAULT_OBJECT_SIZE),
                metadata_bytes,
                force,
            )?)),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::File(path) => write!(f, "{}", path.display()),
            #[cfg(feature = "ceph")]
            Target::Rados(target) => write!(f, "{target}"),
        }
    }
}

#[cfg(feature = "ceph")]
pub fn cluster_options(ceph: &CephArgs) -> zbd_rados::ClusterOptions {
    use std::time::Duration;
    zbd_rados::ClusterOptions {
        conf: ceph.ceph_conf.clone(),
        id: ceph.ceph_id.clone(),
        connect_timeout: Duration::from_secs(ceph.ceph_connect_timeout.max(1)),
        op_timeout: Duration::from_secs(ceph.rados_op_timeout),
        lock_lease: Duration::from_secs(ceph.rados_lock_lease.max(1)),
    }
}
