//! Serves a RAM disk over NBD until SIGINT/SIGTERM: measures the server's own overhead.
//!
//! `cargo run --release -p zbd-nbd --example memserve -- SOCKET SIZE_MIB`

use std::sync::Arc;

use zbd_nbd::{Listen, MemExport, Server, ServerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let socket = args.next().ok_or("usage: memserve SOCKET SIZE_MIB")?;
    let size_mib: u64 = args
        .next()
        .ok_or("usage: memserve SOCKET SIZE_MIB")?
        .parse()?;
    let export = Arc::new(MemExport::new(size_mib << 20));
    let server = Server::bind(
        &Listen::Unix(socket.into()),
        export,
        ServerConfig::default(),
    )?;
    let stop = server.shutdown_handle();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stop.shutdown();
        }
    });
    server.serve()?;
    Ok(())
}
