//! NBD protocol server over any block export. Knows nothing of compression.
//!
//! Implement [`Export`] for a device, bind a [`Server`] on a Unix socket or TCP address, call
//! [`Server::serve`] on a thread of your choice and stop it with its [`ShutdownHandle`]. See
//! `docs/nbd.md` for the protocol subset, threading and durability rules.
//!
//! ```no_run
//! use std::sync::Arc;
//! use zbd_nbd::{Listen, MemExport, Server, ServerConfig};
//!
//! let export = Arc::new(MemExport::new(64 << 20));
//! let server = Server::bind(&Listen::Unix("/tmp/mem.sock".into()), export, ServerConfig::default())?;
//! let stop = server.shutdown_handle();
//! let thread = std::thread::spawn(move || server.serve());
//! // ... clients use nbd+unix:///?socket=/tmp/mem.sock ...
//! stop.shutdown();
//! thread.join().expect("server thread")?;
//! # Ok::<(), zbd_nbd::ServerError>(())
//! ```

mod budget;
mod export;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handshake;
pub mod limits;
mod mem;
mod server;
mod stream;
mod transmission;
pub mod wire;

pub use budget::{Grant, InflightBudget};
pub use export::{BlockSizes, Directory, ErrorKind, Export, ExportError, ExportResult, Extent};
pub use mem::{MemExport, MEM_CHUNK_BYTES};
pub use server::{Listen, Server, ServerConfig, ServerError, ShutdownHandle};
