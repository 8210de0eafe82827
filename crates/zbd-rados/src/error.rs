//! Errors of the RADOS backend: each names the problem in one line, with the fix where there is
//! one.

/// Errors of connecting to a cluster and opening, creating or unlocking a volume in it.
#[derive(Debug, thiserror::Error)]
pub enum RadosError {
    /// The config file given cannot be read or parsed.
    #[error("cannot read Ceph config {path}: {reason}")]
    Config {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// No config file given and none found where Ceph looks.
    #[error("no Ceph config found: give --ceph-conf FILE or set CEPH_CONF")]
    NoConfig,
    /// No monitor answered.
    #[error("cannot reach the Ceph cluster{conf}: no monitor answered within {seconds} s")]
    Unreachable {
        /// " of FILE" when a config was named.
        conf: String,
        /// The connect timeout.
        seconds: u64,
    },
    /// The cluster refused the user.
    #[error(
        "permission denied to Ceph user {user} for {what} (check its key and caps, docs/ceph.md)"
    )]
    Permission {
        /// `client.NAME`.
        user: String,
        /// What was refused.
        what: String,
    },
    /// The cluster wants cephx and no keyring holds the user's key.
    #[error(
        "no key for Ceph user {0}: no keyring found (set `keyring` in the config or check --ceph-id)"
    )]
    NoKey(String),
    /// librados cannot be loaded (it is only loaded for `rados:` volumes).
    #[error(
        "cannot load {library}, which rados: volumes need: {reason} (install Ceph's client library: librados2 on Debian/Ubuntu)"
    )]
    NoLibrary {
        /// The file name passed to dlopen.
        library: String,
        /// dlerror()'s text.
        reason: String,
    },
    /// Other connection failures.
    #[error("cannot connect to the Ceph cluster: {0}")]
    Connect(String),
    /// The pool does not exist.
    #[error("Ceph pool {0:?} does not exist (create it: ceph osd pool create {0})")]
    NoPool(String),
    /// No volume of that name in the pool.
    #[error("no volume {0} (make one with `zbd create`)")]
    NoVolume(String),
    /// `create` found a volume of that name.
    #[error("{0} already holds a zbd volume (use --force to overwrite it)")]
    Exists(String),
    /// Another client holds the volume's lock.
    #[error("volume {volume} is in use by {holder}")]
    InUse {
        /// `rados:POOL/NAME`.
        volume: String,
        /// Client, address and the holder's host and PID.
        holder: String,
    },
    /// The header object does not describe a volume this version understands.
    #[error("{volume}: bad volume header: {reason}")]
    BadHeader {
        /// `rados:POOL/NAME`.
        volume: String,
        /// What is wrong.
        reason: String,
    },
    /// A malformed `rados:` name or option.
    #[error("{0}")]
    Invalid(String),
    /// A RADOS operation failed.
    #[error("{what}: {reason}")]
    Op {
        /// The operation.
        what: String,
        /// The errno text.
        reason: String,
    },
}

/// Text of a negative errno as librados returns it.
pub fn errno_text(rc: i32) -> String {
    match -rc {
        libc::ETIMEDOUT => "timed out (is an OSD down? see --rados-op-timeout)".to_string(),
        // EBLOCKLISTED in Ceph.
        libc::ESHUTDOWN => {
            "refused: this client is blocklisted (another server took the volume over)".to_string()
        }
        e => std::io::Error::from_raw_os_error(e).to_string(),
    }
}
