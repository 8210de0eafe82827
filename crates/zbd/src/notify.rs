//! sd_notify(3) without libsystemd: one datagram to `$NOTIFY_SOCKET` (a path, or an abstract
//! socket when it starts with `@`). `zbd@.service` is `Type=notify`: systemd holds units
//! ordered after it until `READY=1`, which `zbd serve` sends once its socket answers.
//! Without `$NOTIFY_SOCKET` (not started by systemd) nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=...`, newline-separated) to the service
/// manager; errors are ignored, as sd_notify's are: a missing manager must not stop a server.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(socket) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = target.as_encoded_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => send_abstract(&socket, name, state),
        None => {
            let _ = socket.send_to(state.as_bytes(), &target);
        }
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(socket: &UnixDatagram, name: &[u8], state: &str) {
    use std::os::linux::net::SocketAddrExt;
    if let Ok(address) = std::os::unix::net::SocketAddr::from_abstract_name(name) {
        let _ = socket.send_to_addr(state.as_bytes(), &address);
    }
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_socket: &UnixDatagram, _name: &[u8], _state: &str) {}
