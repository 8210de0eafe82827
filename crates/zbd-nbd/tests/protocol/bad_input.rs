//! Malformed and hostile input, sent byte by byte by a raw client. After every case a good
//! client must still work and the export must hold exactly what good clients wrote.

use std::process::Command;

use crate::common::{noise, run, tool, TestServer};
use zbd_nbd::wire;
use zbd_testkit::nbd::RawClient;

const SIZE: u64 = 8 << 20;

/// Fills the export with known data through a well-behaved raw client.
fn seed(server: &TestServer) -> Vec<u8> {
    let data = noise(42, SIZE as usize);
    let mut client = RawClient::connect(&server.socket);
    client.handshake(false, false);
    for (index, chunk) in data.chunks(1 << 20).enumerate() {
        client.request(
            0,
            wire::CMD_WRITE,
            index as u64,
            index as u64 * (1 << 20),
            1 << 20,
        );
        client.send(chunk);
        let reply = client.reply(0);
        assert_eq!((reply.handle, reply.error), (index as u64, 0));
    }
    client.request(0, wire::CMD_FLUSH, 99, 0, 0);
    assert_eq!(client.reply(0).error, 0);
    client.request(0, wire::CMD_DISC, 0, 0, 0);
    data
}

/// A good client reads everything back and finds the seeded data.
fn assert_intact(server: &TestServer, data: &[u8]) {
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, false);
    client.request(0, wire::CMD_READ, 1, 0, SIZE as u32);
    let reply = client.reply(0);
    assert_eq!(reply.error, 0);
    assert_eq!(reply.chunk, Some(wire::REPLY_TYPE_OFFSET_DATA));
    assert_eq!(&reply.payload[..8], &0u64.to_be_bytes());
    assert!(&reply.payload[8..] == data, "export data changed");
    assert!(
        server.contents(0, data.len()) == data,
        "export data changed"
    );
}

fn expect_option_error(client: &mut RawClient, option: u32, data: &[u8], expected: u32) {
    client.option(option, data);
    let reply = client.option_reply();
    assert_eq!(reply.option, option);
    assert_eq!(reply.reply, expected, "option {option}: {reply:?}");
}

#[test]
fn malformed_handshakes_are_refused_without_harm() {
    let server = TestServer::start(SIZE);
    let data = seed(&server);

    // Unknown client flags: the protocol says drop the connection.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(0x8000_0000);
    assert!(client.closed_by_server());

    // Bad option magic.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE);
    client.send(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0]);
    assert!(client.closed_by_server());

    // An option claiming a gigabyte of data.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE);
    let mut header = wire::IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&wire::OPT_GO.to_be_bytes());
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    client.send(&header);
    assert!(client.closed_by_server());

    // Options the server answers with an error, on one connection that then still works.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES);
    expect_option_error(&mut client, 0x1234, b"junk", wire::REP_ERR_UNSUP);
    expect_option_error(&mut client, wire::OPT_STARTTLS, &[], wire::REP_ERR_UNSUP);
    expect_option_error(
        &mut client,
        wire::OPT_EXTENDED_HEADERS,
        &[],
        wire::REP_ERR_UNSUP,
    );
    expect_option_error(&mut client, wire::OPT_LIST, b"x", wire::REP_ERR_INVALID);
    expect_option_error(
        &mut client,
        wire::OPT_STRUCTURED_REPLY,
        b"x",
        wire::REP_ERR_INVALID,
    );
    // Name length says 100 bytes, 3 follow.
    let mut lying = 100u32.to_be_bytes().to_vec();
    lying.extend_from_slice(b"abc");
    expect_option_error(&mut client, wire::OPT_GO, &lying, wire::REP_ERR_INVALID);
    // Info request count says 5, one follows.
    let mut truncated = RawClient::go_data("", &[]);
    truncated.truncate(4);
    truncated.extend_from_slice(&5u16.to_be_bytes());
    truncated.extend_from_slice(&wire::INFO_NAME.to_be_bytes());
    expect_option_error(
        &mut client,
        wire::OPT_INFO,
        &truncated,
        wire::REP_ERR_INVALID,
    );
    let unknown = RawClient::go_data("nope", &[]);
    expect_option_error(&mut client, wire::OPT_GO, &unknown, wire::REP_ERR_UNKNOWN);
    // Meta contexts need structured replies first.
    let meta = RawClient::meta_data("", &[wire::CONTEXT_BASE_ALLOCATION]);
    expect_option_error(
        &mut client,
        wire::OPT_SET_META_CONTEXT,
        &meta,
        wire::REP_ERR_INVALID,
    );
    client.option(wire::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.option_reply().reply, wire::REP_ACK);
    let mut bad_query = RawClient::meta_data("", &[]);
    bad_query.truncate(bad_query.len() - 4);
    bad_query.extend_from_slice(&9u32.to_be_bytes());
    expect_option_error(
        &mut client,
        wire::OPT_SET_META_CONTEXT,
        &bad_query,
        wire::REP_ERR_INVALID,
    );
    // Invalid UTF-8 export name.
    let mut not_utf8 = 2u32.to_be_bytes().to_vec();
    not_utf8.extend_from_slice(&[0xff, 0xfe, 0, 0]);
    expect_option_error(
        &mut client,
        wire::OPT_INFO,
        &not_utf8,
        wire::REP_ERR_INVALID,
    );
    // ...and the same connection still negotiates normally.
    client.option(wire::OPT_GO, &RawClient::go_data("", &[wire::INFO_NAME]));
    let replies = client.option_replies();
    assert_eq!(replies.last().map(|r| r.reply), Some(wire::REP_ACK));
    client.request(0, wire::CMD_DISC, 0, 0, 0);

    // EXPORT_NAME of an unknown export cannot be answered with an error: connection dropped.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE);
    client.option(wire::OPT_EXPORT_NAME, b"nope");
    assert!(client.closed_by_server());

    // Disconnects at every point of the greeting and of an option.
    for cut in [0usize, 2, 4, 10, 19] {
        let mut client = RawClient::connect(&server.socket);
        client.greeting();
        let mut bytes = wire::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        bytes.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
        bytes.extend_from_slice(&wire::OPT_GO.to_be_bytes());
        bytes.extend_from_slice(&8u32.to_be_bytes());
        client.send(&bytes[..cut.min(bytes.len())]);
        drop(client);
    }

    // ABORT gets an ACK.
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE);
    client.option(wire::OPT_ABORT, &[]);
    assert_eq!(client.option_reply().reply, wire::REP_ACK);

    assert_intact(&server, &data);
    server.stop().expect("clean stop");
}

fn expect_error(client: &mut RawClient, handle: u64, errno: u32) {
    let reply = client.reply(0);
    assert_eq!(reply.handle, handle);
    assert_eq!(reply.error, errno, "request {handle}: {reply:?}");
}

#[test]
fn malformed_requests_get_errors_and_leave_data_intact() {
    let server = TestServer::start(SIZE);
    let data = seed(&server);

    for structured in [false, true] {
        let mut client = RawClient::connect(&server.socket);
        client.handshake(structured, false);
        // Unknown command, unsupported command, unknown flag, flag of another command.
        client.request(0, 99, 1, 0, 4096);
        expect_error(&mut client, 1, wire::EINVAL);
        client.request(0, wire::CMD_CACHE, 2, 0, 4096);
        expect_error(&mut client, 2, wire::EINVAL);
        client.request(1 << 9, wire::CMD_READ, 3, 0, 4096);
        expect_error(&mut client, 3, wire::EINVAL);
        client.request(wire::CMD_FLAG_NO_HOLE, wire::CMD_TRIM, 4, 0, 4096);
        expect_error(&mut client, 4, wire::EINVAL);
        client.request(wire::CMD_FLAG_FAST_ZERO, wire::CMD_WRITE_ZEROES, 5, 0, 4096);
        expect_error(&mut client, 5, wire::EINVAL);
        // Past the end, and offsets that overflow.
        client.request(0, wire::CMD_READ, 6, SIZE - 100, 4096);
        expect_error(&mut client, 6, wire::EINVAL);
        client.request(0, wire::CMD_READ, 7, u64::MAX - 10, 4096);
        expect_error(&mut client, 7, wire::EINVAL);
        client.request(0, wire::CMD_TRIM, 8, SIZE, 1);
        expect_error(&mut client, 8, wire::ENOSPC);
        client.request(0, wire::CMD_WRITE_ZEROES, 9, u64::MAX, 4096);
        expect_error(&mut client, 9, wire::ENOSPC);
        // A write past the end carries its payload: it must be consumed, not parsed as requests.
        client.request(0, wire::CMD_WRITE, 10, SIZE - 10, 28);
        client.send(
            &wire::RequestHeader {
                magic: wire::REQUEST_MAGIC,
                flags: 0,
                command: wire::CMD_TRIM,
                handle: 666,
                offset: 0,
                length: SIZE as u32,
            }
            .encode(),
        );
        expect_error(&mut client, 10, wire::ENOSPC);
        // Oversized READ: refused, connection stays usable.
        client.request(0, wire::CMD_READ, 11, 0, 64 << 20);
        expect_error(&mut client, 11, wire::EINVAL);
        // FLUSH with a range, BLOCK_STATUS without a context.
        client.request(0, wire::CMD_FLUSH, 12, 4096, 0);
        expect_error(&mut client, 12, wire::EINVAL);
        client.request(0, wire::CMD_BLOCK_STATUS, 13, 0, 4096);
        expect_error(&mut client, 13, wire::EINVAL);
        // The connection still serves good requests.
        client.request(0, wire::CMD_READ, 14, 4096, 4096);
        let reply = client.reply(4096);
        assert_eq!((reply.handle, reply.error), (14, 0));
        let body = if structured {
            &reply.payload[8..]
        } else {
            &reply.payload[..]
        };
        assert!(body == &data[4096..8192]);
        client.request(0, wire::CMD_DISC, 0, 0, 0);
    }

    // Read-only violations are covered by nbdinfo_on_read_only_export; block status bounds:
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, true);
    client.request(0, wire::CMD_BLOCK_STATUS, 1, SIZE, 1);
    expect_error(&mut client, 1, wire::EINVAL);
    client.request(0, wire::CMD_BLOCK_STATUS, 2, 0, 0);
    expect_error(&mut client, 2, wire::EINVAL);
    client.request(
        wire::CMD_FLAG_REQ_ONE,
        wire::CMD_BLOCK_STATUS,
        3,
        0,
        SIZE as u32,
    );
    let reply = client.reply(0);
    assert_eq!(reply.chunk, Some(wire::REPLY_TYPE_BLOCK_STATUS));
    assert_eq!(reply.payload.len(), 12, "REQ_ONE must give one descriptor");
    client.request(0, wire::CMD_DISC, 0, 0, 0);

    assert_intact(&server, &data);
    server.stop().expect("clean stop");
}

#[test]
fn protocol_breaking_requests_drop_only_that_connection() {
    let server = TestServer::start(SIZE);
    let data = seed(&server);

    // Oversized WRITE: the payload cannot be skipped, so the connection goes.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(false, false);
    client.request(0, wire::CMD_WRITE, 1, 0, u32::MAX);
    client.send_may_be_refused(&[0xaa; 4096]);
    assert!(client.closed_by_server());

    // Bad request magic.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, false);
    client.send(&[0x11; wire::REQUEST_HEADER_BYTES]);
    assert!(client.closed_by_server());

    // Disconnect inside a request header, and inside a WRITE payload: nothing is written.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(false, false);
    let header = wire::RequestHeader {
        magic: wire::REQUEST_MAGIC,
        flags: 0,
        command: wire::CMD_WRITE,
        handle: 5,
        offset: 0,
        length: 1 << 20,
    };
    client.send(&header.encode()[..13]);
    drop(client);
    let mut client = RawClient::connect(&server.socket);
    client.handshake(false, false);
    client.send(&header.encode());
    client.send(&[0xbb; 300 << 10]);
    drop(client);

    // A client that pipelines many requests and disconnects without reading replies.
    // The requests go out as one buffer: 500 tiny writes cost a socket buffer's worth of kernel
    // overhead, so the client would block mid-flood while the server blocks writing replies
    // nobody reads, and the test would measure the server's write timeout instead.
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, false);
    let mut flood = Vec::new();
    for handle in 0..500u64 {
        let header = wire::RequestHeader {
            magic: wire::REQUEST_MAGIC,
            flags: 0,
            command: wire::CMD_READ,
            handle,
            offset: (handle % 8) << 20,
            length: 1 << 20,
        };
        flood.extend_from_slice(&header.encode());
    }
    client.send_may_be_refused(&flood);
    drop(client);

    // A good external client still works, and the data is intact.
    if let Some(nbdcopy) = tool("nbdcopy") {
        let copy = server.path("copy.img");
        run(Command::new(nbdcopy).arg(server.uri()).arg(&copy));
        assert!(std::fs::read(&copy).expect("copy") == data);
    }
    assert_intact(&server, &data);
    server.stop().expect("clean stop");
}

#[test]
fn many_requests_in_flight_get_out_of_order_replies_matched_by_handle() {
    let server = TestServer::start(SIZE);
    let data = seed(&server);
    let mut client = RawClient::connect(&server.socket);
    client.handshake(true, true);
    let count = 200u64;
    for handle in 0..count {
        let offset = (handle * 37 % 2000) * 4096;
        client.request(0, wire::CMD_READ, handle, offset, 4096);
    }
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let reply = client.reply(0);
        assert_eq!(reply.error, 0);
        let handle = reply.handle;
        let offset = (handle * 37 % 2000) * 4096;
        assert_eq!(&reply.payload[..8], &offset.to_be_bytes());
        assert!(reply.payload[8..] == data[offset as usize..offset as usize + 4096]);
        assert!(
            !std::mem::replace(&mut seen[handle as usize], true),
            "duplicate reply"
        );
    }
    assert!(seen.iter().all(|&s| s));
    server.stop().expect("clean stop");
}

#[test]
fn read_only_export_refuses_writes_and_meta_contexts_list() {
    let server = TestServer::start_with(
        zbd_nbd::MemExport::new(SIZE).read_only(),
        zbd_nbd::ServerConfig::default(),
    );
    let mut client = RawClient::connect(&server.socket);
    client.greeting();
    client.client_flags(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES);
    client.option(wire::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.option_reply().reply, wire::REP_ACK);
    for queries in [&[][..], &["base:"][..]] {
        client.option(
            wire::OPT_LIST_META_CONTEXT,
            &RawClient::meta_data("", queries),
        );
        let replies = client.option_replies();
        assert_eq!(replies.len(), 2, "{replies:?}");
        assert_eq!(replies[0].reply, wire::REP_META_CONTEXT);
        assert_eq!(
            &replies[0].data[4..],
            wire::CONTEXT_BASE_ALLOCATION.as_bytes()
        );
    }
    client.option(
        wire::OPT_SET_META_CONTEXT,
        &RawClient::meta_data("", &["x-unknown:thing"]),
    );
    let replies = client.option_replies();
    assert_eq!(
        replies.len(),
        1,
        "an unknown context selects nothing: {replies:?}"
    );
    client.option(wire::OPT_GO, &RawClient::go_data("", &[]));
    let mut flags = 0;
    for reply in client.option_replies() {
        if reply.reply == wire::REP_INFO && reply.data[0..2] == [0, 0] {
            flags = u16::from_be_bytes([reply.data[10], reply.data[11]]);
        }
    }
    assert_ne!(flags & wire::FLAG_READ_ONLY, 0);
    assert_eq!(flags & wire::FLAG_SEND_TRIM, 0);

    client.request(0, wire::CMD_WRITE, 1, 0, 4);
    client.send(b"data");
    expect_error(&mut client, 1, wire::EPERM);
    client.request(0, wire::CMD_TRIM, 2, 0, 4096);
    expect_error(&mut client, 2, wire::EPERM);
    client.request(0, wire::CMD_WRITE_ZEROES, 3, 0, 4096);
    expect_error(&mut client, 3, wire::EPERM);
    // No context was selected, so BLOCK_STATUS is refused; reads work.
    client.request(0, wire::CMD_BLOCK_STATUS, 4, 0, 4096);
    expect_error(&mut client, 4, wire::EINVAL);
    client.request(0, wire::CMD_READ, 5, 0, 4096);
    let reply = client.reply(0);
    assert_eq!((reply.handle, reply.error), (5, 0));
    assert!(reply.payload[8..].iter().all(|&b| b == 0));
    client.request(0, wire::CMD_DISC, 0, 0, 0);
    server.stop().expect("clean stop");
}
