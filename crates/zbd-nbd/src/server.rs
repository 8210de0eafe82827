//! Listening, accepting, one thread per connection, and graceful shutdown.
//!
//! At most `connections_max` connections are served; while that many are open the accept loop
//! stops accepting, so newcomers wait in the listen backlog (their connect succeeds, the greeting
//! comes once a slot frees) instead of being closed.
//!
//! Shutdown order: stop accepting; shut the read side of every client socket so each reader
//! sees EOF after the request it is reading; wait until every request already read has replied;
//! flush the export; remove the Unix socket.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::pipe::PipeFlags;

use crate::budget::InflightBudget;
use crate::export::{Directory, Export};
use crate::handshake::{self, HandshakeError, Offer};
use crate::limits;
use crate::stream::Stream;
use crate::transmission::{self, Connection, Context};

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Name clients ask for; the empty name always selects this export too.
    pub export_name: String,
    pub description: Option<String>,
    /// Threads serving each connection, hence its requests in flight at most (the
    /// per-connection request cap; more requests wait in the socket).
    pub threads_per_connection: usize,
    /// Largest READ/WRITE payload (lowered to `inflight_bytes_max` if that is smaller).
    pub payload_bytes_max: u32,
    /// Connections served at once; more wait to be accepted.
    pub connections_max: usize,
    /// Bytes all requests in flight on all connections may hold together.
    pub inflight_bytes_max: u64,
    /// See [`limits::CLIENT_READ_TIMEOUT`].
    pub client_read_timeout: Duration,
}

impl ServerConfig {
    /// The payload cap actually enforced and advertised: a request must fit the budget.
    fn effective_payload_bytes_max(&self) -> u32 {
        let budget = u32::try_from(self.inflight_bytes_max).unwrap_or(u32::MAX);
        self.payload_bytes_max.min(budget).max(1)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: String::new(),
            description: None,
            threads_per_connection: limits::threads_per_connection_default(),
            payload_bytes_max: limits::PAYLOAD_BYTES_MAX_DEFAULT,
            connections_max: limits::CONNECTIONS_MAX_DEFAULT,
            inflight_bytes_max: limits::INFLIGHT_BYTES_DEFAULT,
            client_read_timeout: limits::CLIENT_READ_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {listen}: {source}")]
    Bind { listen: Listen, source: io::Error },
    #[error("socket {0} is in use by a running server")]
    SocketInUse(PathBuf),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("final flush of the export failed: {0}")]
    Flush(crate::export::ExportError),
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> ServerError {
    move |source| ServerError::Io { what, source }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Unix(l) => Stream::Unix(l.accept()?.0),
            Listener::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
        })
    }
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Unix(l) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }
}

/// Stops a running [`Server::serve`] from any thread. Cheap to clone; calling it twice is fine.
#[derive(Clone)]
pub struct ShutdownHandle {
    inner: Arc<ShutdownInner>,
}

struct ShutdownInner {
    requested: AtomicBool,
    wake: OwnedFd,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        if !self.inner.requested.swap(true, Ordering::SeqCst) {
            // Wakes the accept loop's poll; the byte is never read.
            let _ = rustix::io::write(&self.inner.wake, &[1]);
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.requested.load(Ordering::SeqCst)
    }
}

/// A bound NBD server for one export.
pub struct Server {
    listener: Listener,
    listen: Listen,
    export: Arc<dyn Export>,
    directory: Option<Arc<dyn Directory>>,
    config: ServerConfig,
    shutdown: ShutdownHandle,
    woken: OwnedFd,
    budget: Arc<InflightBudget>,
}

impl Server {
    /// Binds the socket (a stale Unix socket left by a dead server is replaced; a live one is
    /// an error). Clients can connect as soon as this returns.
    pub fn bind(
        listen: &Listen,
        export: Arc<dyn Export>,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        let bind_error = |source| ServerError::Bind {
            listen: listen.clone(),
            source,
        };
        let (listener, listen) = match listen {
            Listen::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path).map_err(bind_error)?;
                (Listener::Unix(listener), Listen::Unix(path.clone()))
            }
            Listen::Tcp(address) => {
                let listener = TcpListener::bind(address).map_err(bind_error)?;
                let bound = listener.local_addr().map_err(bind_error)?;
                (Listener::Tcp(listener), Listen::Tcp(bound))
            }
        };
        match &listener {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
        .map_err(io_error("set listener non-blocking"))?;
        let (woken, wake) = rustix::pipe::pipe()
            .map_err(io::Error::from)
            .map_err(io_error("create shutdown pipe"))?;
        Ok(Server {
            listener,
            listen,
            export,
            directory: None,
            shutdown: ShutdownHandle {
                inner: Arc::new(ShutdownInner {
                    requested: AtomicBool::new(false),
                    wake,
                }),
            },
            woken,
            budget: Arc::new(InflightBudget::new(config.inflight_bytes_max)),
            config,
        })
    }

    /// Offers the exports of `directory` beside the default one, by name.
    pub fn set_directory(&mut self, directory: Arc<dyn Directory>) {
        self.directory = Some(directory);
    }

    /// The server-wide in-flight memory budget (to watch it; the server manages it).
    pub fn inflight_budget(&self) -> Arc<InflightBudget> {
        Arc::clone(&self.budget)
    }

    /// The address actually bound (for TCP port 0, the chosen port).
    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Serves until [`ShutdownHandle::shutdown`], then finishes in-flight requests, flushes the
    /// export and returns.
    pub fn serve(self) -> Result<(), ServerError> {
        let (slot_freed, free_signal) =
            rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)
                .map_err(io::Error::from)
                .map_err(io_error("create connection-slot pipe"))?;
        let shared = Arc::new(Shared {
            export: Arc::clone(&self.export),
            directory: self.directory.clone(),
            config: self.config.clone(),
            budget: Arc::clone(&self.budget),
            shutting_down: AtomicBool::new(false),
            clients: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
            free_signal,
        });
        tracing::info!(
            listen = %self.listen,
            size = self.export.size(),
            connections_max = self.config.connections_max,
            inflight_bytes_max = self.config.inflight_bytes_max,
            "NBD server listening"
        );
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let accepted = self.accept_loop(&shared, &mut threads, &slot_freed);

        shared.shutting_down.store(true, Ordering::SeqCst);
        if let Ok(clients) = shared.clients.lock() {
            for stream in clients.values() {
                let _ = stream.shutdown(Shutdown::Read);
            }
        }
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("an NBD connection thread panicked");
            }
        }
        let flushed = self.export.flush().map_err(ServerError::Flush);
        if let Listen::Unix(path) = &self.listen {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!(listen = %self.listen, "NBD server stopped");
        accepted.and(flushed)
    }

    fn accept_loop(
        &self,
        shared: &Arc<Shared>,
        threads: &mut Vec<JoinHandle<()>>,
        slot_freed: &OwnedFd,
    ) -> Result<(), ServerError> {
        let mut full_logged = false;
        while !self.shutdown.is_shutting_down() {
            // Drain before counting: a connection decrements `active`, then signals, so a slot
            // freed after this point still wakes the poll below.
            let mut drain = [0u8; 64];
            while matches!(rustix::io::read(slot_freed, &mut drain), Ok(n) if n > 0) {}
            let full = shared.active.load(Ordering::SeqCst) >= self.config.connections_max;
            if full && !full_logged {
                tracing::info!(
                    "serving {} connections (the limit): new clients wait to be accepted",
                    self.config.connections_max
                );
            }
            full_logged = full;
            let listener_fd = self.listener.as_fd();
            let mut fds = [
                PollFd::new(&self.woken, PollFlags::IN),
                PollFd::new(slot_freed, PollFlags::IN),
                PollFd::new(&listener_fd, PollFlags::IN),
            ];
            // While full, the listener is left out of the poll: newcomers wait in the backlog.
            let watched = if full { 2 } else { 3 };
            match poll(&mut fds[..watched], None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(io_error("poll listener")(error.into())),
            }
            if self.shutdown.is_shutting_down() {
                break;
            }
            if full {
                continue;
            }
            let stream = match self.listener.accept() {
                Ok(stream) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => {
                    // EMFILE and friends: log and keep serving the clients we have.
                    tracing::warn!("accept failed: {error}");
                    continue;
                }
            };
            threads.retain(|thread| !thread.is_finished());
            shared.active.fetch_add(1, Ordering::SeqCst);
            match spawn_connection(shared, stream) {
                Ok(thread) => threads.push(thread),
                Err(error) => {
                    shared.active.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!("cannot start a connection thread: {error}");
                }
            }
        }
        Ok(())
    }
}

/// Removes a Unix socket nobody listens on; refuses a live one.
fn remove_stale_socket(path: &Path) -> Result<(), ServerError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ServerError::SocketInUse(path.to_path_buf()));
    }
    std::fs::remove_file(path).map_err(io_error("remove stale socket"))
}

/// State all connection threads share.
struct Shared {
    export: Arc<dyn Export>,
    directory: Option<Arc<dyn Directory>>,
    config: ServerConfig,
    budget: Arc<InflightBudget>,
    shutting_down: AtomicBool,
    /// A clone of every open client socket, so shutdown can end their readers.
    clients: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
    /// Connections accepted and not yet finished.
    active: AtomicUsize,
    /// Write end of the pipe that wakes the accept loop when a connection ends.
    free_signal: OwnedFd,
}

fn spawn_connection(shared: &Arc<Shared>, stream: Stream) -> io::Result<JoinHandle<()>> {
    stream.set_nonblocking(false)?;
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let registered = stream.try_clone()?;
    if let Ok(mut clients) = shared.clients.lock() {
        clients.insert(id, registered);
    }
    // A shutdown that started before registration would miss this socket.
    if shared.shutting_down.load(Ordering::SeqCst) {
        let _ = stream.shutdown(Shutdown::Read);
    }
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            run_connection(&shared, id, stream);
            if let Ok(mut clients) = shared.clients.lock() {
                clients.remove(&id);
            }
            shared.active.fetch_sub(1, Ordering::SeqCst);
            // Non-blocking: a full pipe already holds a wake-up.
            let _ = rustix::io::write(&shared.free_signal, &[1]);
        })
}

fn run_connection(shared: &Shared, id: u64, stream: Stream) {
    let peer = stream.peer();
    let writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(error) => {
            tracing::warn!(conn = id, "cannot clone client socket: {error}");
            return;
        }
    };
    // Kept for the whole connection: transmission ignores it between requests, and enforces it
    // inside a WRITE payload.
    let _ = stream.set_read_timeout(Some(shared.config.client_read_timeout));
    let _ = writer.set_write_timeout(Some(limits::REPLY_WRITE_TIMEOUT));
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let mut handshake_writer = match writer.try_clone() {
        Ok(w) => w,
        Err(error) => {
            tracing::warn!(conn = id, "cannot clone client socket: {error}");
            return;
        }
    };
    let offer = Offer {
        export: &*shared.export,
        name: &shared.config.export_name,
        directory: shared.directory.as_deref(),
        description: shared.config.description.as_deref(),
        payload_bytes_max: shared.config.effective_payload_bytes_max(),
        shutting_down: &shared.shutting_down,
    };
    let (session, chosen) = match handshake::negotiate(&mut reader, &mut handshake_writer, &offer) {
        Ok(negotiated) => negotiated,
        Err(HandshakeError::Aborted) => {
            tracing::debug!(conn = id, "client aborted the handshake");
            return;
        }
        Err(error) => {
            tracing::warn!(conn = id, %peer, "handshake failed: {error}");
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    };
    tracing::info!(
        conn = id,
        %peer,
        structured = session.structured,
        block_status = session.allocation_context.is_some(),
        "client connected"
    );
    let connection = Arc::new(Connection::new(id, session, Box::new(writer)));
    let context = Context {
        export: chosen.unwrap_or_else(|| Arc::clone(&shared.export)),
        payload_bytes_max: shared.config.effective_payload_bytes_max(),
        threads: shared.config.threads_per_connection,
        budget: Arc::clone(&shared.budget),
        payload_timeout: shared.config.client_read_timeout,
    };
    transmission::serve(reader, &connection, &context);
    tracing::info!(conn = id, "client disconnected");
}
