//! The server's bounds: the payload cap follows the in-flight budget, connections over the limit
//! wait to be accepted, and clients that leave or stall mid-request give back what they held.

use std::io::Read;
use std::time::Duration;

use crate::common::{noise, TestServer};
use zbd_nbd::{wire, MemExport, ServerConfig};
use zbd_testkit::nbd::RawClient;

const SIZE: u64 = 8 << 20;
const BUDGET: u64 = 1 << 20;

fn config(connections_max: usize) -> ServerConfig {
    ServerConfig {
        inflight_bytes_max: BUDGET,
        connections_max,
        ..ServerConfig::default()
    }
}

fn write(client: &mut RawClient, handle: u64, offset: u64, data: &[u8]) {
    client.request(0, wire::CMD_WRITE, handle, offset, data.len() as u32);
    client.send(data);
}

/// Does the server say anything on this socket before a client it serves speaks again?
/// Checked without waiting: data already queued means the server accepted and greeted.
fn has_pending_bytes(client: &RawClient) -> bool {
    client.stream.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    let pending = match (&client.stream).read(&mut byte) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("peeking: {e}"),
    };
    client.stream.set_nonblocking(false).expect("blocking");
    pending
}

#[test]
fn requests_bigger_than_the_budget_get_a_clean_error_and_the_connection_lives() {
    let server = TestServer::start_with(MemExport::new(SIZE), config(4));
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES);
    client.option(wire::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.option_reply().reply, wire::REP_ACK);
    client.option(
        wire::OPT_GO,
        &RawClient::go_data("", &[wire::INFO_BLOCK_SIZE]),
    );
    let replies = client.option_replies();
    let sizes = replies
        .iter()
        .find(|r| r.reply == wire::REP_INFO && r.data[0..2] == wire::INFO_BLOCK_SIZE.to_be_bytes())
        .expect("INFO_BLOCK_SIZE");
    let maximum = u32::from_be_bytes(sizes.data[10..14].try_into().expect("max"));
    assert_eq!(
        u64::from(maximum),
        BUDGET,
        "advertised maximum follows the budget"
    );

    // Twice the budget: the payload is read and dropped, the reply is EINVAL.
    let big = noise(1, 2 * BUDGET as usize);
    write(&mut client, 1, 0, &big);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (1, wire::EINVAL));
    client.request(0, wire::CMD_READ, 2, 0, 2 * BUDGET as u32);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (2, wire::EINVAL));

    // The whole budget in one request works, on the same connection.
    let fits = noise(2, BUDGET as usize);
    write(&mut client, 3, 4096, &fits);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (3, 0));
    client.request(0, wire::CMD_READ, 4, 4096, BUDGET as u32);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (4, 0));
    assert!(reply.payload[8..] == fits[..], "read back what was written");
    assert!(
        server.contents(0, 4096).iter().all(|&b| b == 0),
        "skipped WRITE left no trace"
    );
    server.stop().expect("clean stop");
}

#[test]
fn a_client_over_the_connection_limit_waits_and_is_then_served() {
    let server = TestServer::start_with(MemExport::new(SIZE), config(1));
    let mut first = RawClient::connect(&server.socket);
    first.handshake(false, false);
    // Connects (the backlog takes it) but is not accepted while `first` holds the only slot.
    let mut second = RawClient::connect(&server.socket);
    // A round trip on `first` proves the server is running and had every chance to greet.
    first.request(0, wire::CMD_FLUSH, 1, 0, 0);
    assert_eq!(first.reply(0).error, 0);
    assert!(
        !has_pending_bytes(&second),
        "second client greeted beyond the limit"
    );
    drop(first);
    // Now it gets the greeting: it waited, it was not dropped.
    second.handshake(false, false);
    write(&mut second, 2, 0, &[7u8; 4096]);
    assert_eq!(second.reply(0).error, 0);
    assert_eq!(server.contents(0, 4096), vec![7u8; 4096]);
    server.stop().expect("clean stop");
}

#[test]
fn clients_leaving_mid_request_or_mid_handshake_free_their_slot_and_budget() {
    let server = TestServer::start_with(MemExport::new(SIZE), config(1));
    // Takes the whole budget for a WRITE, sends half the payload, leaves.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(false, false);
    client.request(0, wire::CMD_WRITE, 1, 0, BUDGET as u32);
    client.send(&vec![0xaa; BUDGET as usize / 2]);
    drop(client);
    // Leaves in the middle of the client flags.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.send(&[0, 0]);
    drop(client);
    // Leaves in the middle of an option.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE);
    client.send(&wire::IHAVEOPT.to_be_bytes());
    drop(client);
    // With one slot, this client is only served once each of those ended, and its write needs
    // the whole budget back.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, false);
    let data = noise(3, BUDGET as usize);
    write(&mut client, 2, 0, &data);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (2, 0));
    assert!(server.contents(0, BUDGET as usize) == data);
    server.stop().expect("clean stop");
}

#[test]
fn a_client_stalling_inside_a_write_payload_loses_its_budget_to_others() {
    let config = ServerConfig {
        client_read_timeout: Duration::from_millis(500),
        ..config(2)
    };
    let server = TestServer::start_with(MemExport::new(SIZE), config);
    let mut staller = RawClient::connect(&server.socket);
    staller.handshake(false, false);
    let mut other = RawClient::connect(&server.socket);
    other.handshake(false, false);
    staller.request(0, wire::CMD_WRITE, 2, 0, BUDGET as u32);
    staller.send(&[0x55; 4096]);
    // The staller holds the whole budget before `other` asks for it.
    while server.budget.held_bytes() < BUDGET {
        std::thread::yield_now();
    }
    // Needs the whole budget: served only once the staller has been cut off.
    let data = noise(4, BUDGET as usize);
    write(&mut other, 3, 0, &data);
    let reply = other.reply(0);
    assert_eq!((reply.handle, reply.error), (3, 0));
    assert!(staller.closed_by_server(), "stalled client was not cut off");
    assert!(server.contents(0, BUDGET as usize) == data);
    server.stop().expect("clean stop");
}
