//! Writes the seed corpus of every fuzz target: real, valid encodings made by the code under
//! test (so seeds follow the format when it changes), plus a few NBD conversations.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml -p zbd-fuzz-seeds -- fuzz/corpus`

use std::path::Path;

use zbd_core::format::{
    checkpoint_slot_bytes, encode_map_page, parse_segment, parse_segment_footer, seal_segment,
    BlockState, Checkpoint, DictEntry, MapEntry, QueueEntry, Record, RecordKind, RefPayload,
    SegmentHeader, SegmentOwner, CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_VOLUME_COUNTERS, COUNTERS,
    FORMAT_VERSION, FORMAT_VERSION_MIN, MAP_ENTRIES_PER_PAGE, REF_FLAG_OWNER_SHARED,
    REF_PAYLOAD_BYTES, SEGMENT_HEADER_BYTES, SEG_FLAG_4K, SEG_FLAG_WIDE_RECORDS, VOLUME_COUNTERS,
};
use zbd_core::layout::plan;
use zbd_core::CreateOptions;
use zbd_nbd::wire;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let target_dir = dir.join(target);
    std::fs::create_dir_all(&target_dir).expect("create corpus dir");
    std::fs::write(target_dir.join(name), bytes).expect("write seed");
}

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn string32(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut data = Vec::new();
    string32(&mut data, name);
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::new();
    string32(&mut data, name);
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        string32(&mut data, query);
    }
    data
}

fn handshakes(dir: &Path) {
    let flags = (wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES).to_be_bytes();
    let mut full = flags.to_vec();
    option(&mut full, wire::OPT_STRUCTURED_REPLY, &[]);
    option(
        &mut full,
        wire::OPT_LIST_META_CONTEXT,
        &meta_data("", &["base:"]),
    );
    option(
        &mut full,
        wire::OPT_SET_META_CONTEXT,
        &meta_data("fuzz", &[wire::CONTEXT_BASE_ALLOCATION]),
    );
    option(
        &mut full,
        wire::OPT_INFO,
        &go_data("fuzz", &[wire::INFO_NAME, wire::INFO_DESCRIPTION]),
    );
    option(
        &mut full,
        wire::OPT_GO,
        &go_data("", &[wire::INFO_BLOCK_SIZE]),
    );
    write(dir, "nbd_handshake", "structured-go", &full);

    let mut old = wire::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    option(&mut old, wire::OPT_LIST, &[]);
    option(&mut old, wire::OPT_EXPORT_NAME, b"fuzz");
    write(dir, "nbd_handshake", "list-export-name", &old);

    let mut odd = flags.to_vec();
    option(&mut odd, wire::OPT_STARTTLS, &[]);
    option(&mut odd, 99, b"unknown");
    option(&mut odd, wire::OPT_ABORT, &[]);
    write(dir, "nbd_handshake", "unsupported-abort", &odd);
}

fn request(out: &mut Vec<u8>, flags: u16, command: u16, handle: u64, offset: u64, length: u32) {
    let header = wire::RequestHeader {
        magic: wire::REQUEST_MAGIC,
        flags,
        command,
        handle,
        offset,
        length,
    };
    out.extend_from_slice(&header.encode());
}

fn requests(dir: &Path) {
    // Byte 0: bit 0 structured replies, bit 1 base:allocation, bit 2 read-only.
    let mut mixed = vec![0b011];
    request(
        &mut mixed,
        wire::CMD_FLAG_FUA,
        wire::CMD_WRITE,
        1,
        4096,
        5000,
    );
    mixed.extend((0..5000u32).map(|i| (i % 251) as u8));
    request(&mut mixed, wire::CMD_FLAG_DF, wire::CMD_READ, 2, 4000, 9000);
    request(&mut mixed, 0, wire::CMD_FLUSH, 3, 0, 0);
    request(&mut mixed, 0, wire::CMD_TRIM, 4, 0, 8192);
    request(
        &mut mixed,
        wire::CMD_FLAG_NO_HOLE,
        wire::CMD_WRITE_ZEROES,
        5,
        8192,
        4096,
    );
    request(
        &mut mixed,
        wire::CMD_FLAG_REQ_ONE,
        wire::CMD_BLOCK_STATUS,
        6,
        0,
        1 << 16,
    );
    request(&mut mixed, 0, wire::CMD_BLOCK_STATUS, 7, 0, 1 << 20);
    request(&mut mixed, 0, wire::CMD_DISC, 8, 0, 0);
    write(dir, "nbd_requests", "structured-mixed", &mixed);

    let mut simple = vec![0b000];
    request(&mut simple, 0, wire::CMD_WRITE, 1, 0, 512);
    simple.extend(std::iter::repeat(0xa5).take(512));
    request(&mut simple, 0, wire::CMD_READ, 2, 0, 512);
    request(&mut simple, 0, wire::CMD_READ, 3, u64::MAX - 10, 100);
    request(&mut simple, 0, wire::CMD_CACHE, 4, 0, 4096);
    write(dir, "nbd_requests", "simple-edges", &simple);

    let mut read_only = vec![0b101];
    request(&mut read_only, 0, wire::CMD_WRITE, 1, 0, 16);
    read_only.extend([7u8; 16]);
    request(&mut read_only, 0, wire::CMD_READ, 2, 0, 16);
    write(dir, "nbd_requests", "read-only", &read_only);
}

fn on_disk(dir: &Path) {
    let sb = plan(&CreateOptions::new(64 << 20)).expect("plan a 64 MiB volume");
    write(dir, "superblock", "64mib-default", &sb.encode());
    let mut big = CreateOptions::new(1 << 40);
    big.extent_bytes = 1 << 20;
    let sb_big = plan(&big).expect("plan a 1 TiB volume");
    write(dir, "superblock", "1tib-1mib-extents", &sb_big.encode());

    // A small geometry of its own so the seed stays short: 7 map pages, 2 extent-table pages.
    let mut ck_sb = sb.clone();
    ck_sb.map_pages = 7;
    ck_sb.extent_table_pages = 2;
    ck_sb.checkpoint_slot_bytes = checkpoint_slot_bytes(sb.queue_len, 7, 2);
    let mut checkpoint = Checkpoint::empty(&ck_sb);
    checkpoint.seq = 7;
    checkpoint.write_seq = 1234;
    checkpoint.next_alloc_seq = 99;
    checkpoint.counters = [5; COUNTERS];
    checkpoint.queue = (0..3)
        .map(|i| QueueEntry {
            extent: i * 2,
            alloc_seq: 90 + u64::from(i),
        })
        .collect();
    checkpoint.page_slots = vec![0, 1, 2, 1, 2, 0, 1];
    checkpoint.page_summaries = vec![1, 0, 2, 0, 0, 1, 0];
    checkpoint.flags = CKPT_FLAG_VOLUME_COUNTERS | CKPT_FLAG_EXTENT_TABLE;
    checkpoint.volume_counters = [3; VOLUME_COUNTERS];
    checkpoint.dicts[0] = DictEntry {
        id: 1,
        codec: 1,
        flags: 1,
        region_offset: 0,
        len: 4096,
        crc: 0x0bad_cafe,
        created_seq: 1000,
        live_blocks: 0,
    };
    checkpoint.extent_table_slots = vec![1, 2];
    assert!(
        ck_sb.version >= 2,
        "seeds are written for the current format"
    );
    let slot = checkpoint.encode(&ck_sb).expect("encode");
    // A seed the decoder refuses would only teach the fuzzer the first check.
    assert_eq!(Checkpoint::decode(&slot, &ck_sb).ok(), Some(checkpoint));
    write(dir, "checkpoint", "three-queued-v2", &slot);

    let entry = |state, extent, offset| MapEntry {
        state,
        codec: 1,
        len: 1800,
        extent,
        offset,
        crc: 0xdead_beef,
        ..MapEntry::UNMAPPED
    };
    let mut entries = vec![MapEntry::UNMAPPED; MAP_ENTRIES_PER_PAGE];
    entries[0] = entry(BlockState::Data, 3, 64);
    entries[1] = MapEntry::ZERO;
    entries[2] = entry(BlockState::Corrupt, 0, 0);
    entries[MAP_ENTRIES_PER_PAGE - 1] = entry(BlockState::Data, 9, 4096);
    write(
        dir,
        "map_page",
        "full-page",
        &encode_map_page(2, 17, &entries),
    );
    write(
        dir,
        "map_page",
        "short-last-page",
        &encode_map_page(0, 1, &entries[..5]),
    );

    let payload_at = SEGMENT_HEADER_BYTES;
    let records = [
        Record {
            codec: 1,
            len: 300,
            offset: payload_at as u32,
            crc: 0x1234_5678,
            ..Record::new(RecordKind::Data, 42, 1, 1000)
        },
        Record::new(RecordKind::Zero, 50, 8, 1001),
        Record::new(RecordKind::Trim, 100, 1000, 1002),
    ];
    let forms = [
        (FORMAT_VERSION_MIN, 0),
        (FORMAT_VERSION, 0),
        (FORMAT_VERSION, SEG_FLAG_WIDE_RECORDS),
        (FORMAT_VERSION, SEG_FLAG_WIDE_RECORDS | SEG_FLAG_4K),
    ];
    for (version, flags) in forms {
        let header = SegmentHeader {
            version,
            flags,
            alloc_seq: 55,
            extent: 3,
            seg_offset: 0,
            payload_len: 300,
            record_count: records.len() as u32,
            durable_seq: if version >= 2 { 999 } else { 0 },
        };
        let mut extent = vec![0u8; 16384];
        extent[payload_at..payload_at + 300].fill(0x3c);
        let total = seal_segment(&mut extent, &sb.uuid, &header, &records);
        let owner = SegmentOwner {
            uuid: &sb.uuid,
            version,
            extent: 3,
            alloc_seq: 55,
        };
        let parsed = parse_segment(&extent, &owner, 0).expect("seed segment parses");
        assert_eq!(parsed.1, records);
        if version >= 2 {
            let from_footer = parse_segment_footer(&extent, &owner, total);
            assert_eq!(from_footer.ok(), Some(parsed));
        }
        let name = match flags {
            0 => format!("three-records-v{version}"),
            _ => format!("three-records-v{version}-flags{flags}"),
        };
        write(dir, "segment", &name, &extent[..total]);
        if version >= 2 {
            // The footer target reads the footer that ends the image's last sector.
            write(dir, "segment_footer", &name, &extent[..total]);
        }
    }

    // Bit 12's kinds in a 64-byte table: a ref with its payload and a move.
    let target = RefPayload {
        index: 1,
        lba: 43,
        extent: 3,
        offset: payload_at as u32,
        stored_len: 300,
        codec: 1,
        unit_blocks: 2,
        dict: 0,
        flags: REF_FLAG_OWNER_SHARED,
        crc: 0x1234_5678,
    };
    let payload = target.encode();
    let shared = [
        Record {
            len: REF_PAYLOAD_BYTES as u32,
            offset: payload_at as u32,
            // The engine checks this CRC, not parse: any value parses.
            crc: 0x0102_0304,
            ..Record::new(RecordKind::Ref, 7, 1, 1003)
        },
        Record {
            codec: 1,
            len: 200,
            offset: (payload_at + REF_PAYLOAD_BYTES) as u32,
            crc: 1,
            fingerprint: 0xabcd_0123,
            source_extent: 9,
            source_offset: 8192,
            ..Record::new(RecordKind::Move, 44, 1, 1004)
        },
    ];
    let header = SegmentHeader {
        version: FORMAT_VERSION,
        flags: SEG_FLAG_WIDE_RECORDS,
        alloc_seq: 55,
        extent: 3,
        seg_offset: 0,
        payload_len: (REF_PAYLOAD_BYTES + 200) as u32,
        record_count: shared.len() as u32,
        durable_seq: 999,
    };
    let mut extent = vec![0u8; 16384];
    extent[payload_at..payload_at + REF_PAYLOAD_BYTES].copy_from_slice(&payload);
    let total = seal_segment(&mut extent, &sb.uuid, &header, &shared);
    let owner = SegmentOwner {
        uuid: &sb.uuid,
        version: FORMAT_VERSION,
        extent: 3,
        alloc_seq: 55,
    };
    let parsed = parse_segment(&extent, &owner, 0).expect("seed segment parses");
    assert_eq!(parsed.1, shared);
    write(dir, "segment", "ref-and-move-v3-flags1", &extent[..total]);
    write(
        dir,
        "segment_footer",
        "ref-and-move-v3-flags1",
        &extent[..total],
    );
}

/// One body per page kind of format v3's bit 10, prefixed by the byte that picks its decoder in
/// the `metadata_page` target.
fn metadata_pages(dir: &Path) {
    use zbd_core::format::*;
    let seed = |which: u8, name: &str, body: &[u8]| {
        let mut bytes = vec![which];
        bytes.extend_from_slice(body);
        write(dir, "metadata_page", name, &bytes);
    };
    let mut entry = MapEntry::UNMAPPED;
    entry.state = BlockState::Data;
    entry.extent = 3;
    seed(
        0,
        "map-leaf",
        &encode_map_leaf(&[
            MapEntry::ZERO,
            entry,
            MapEntry::shared(
                SbtKey {
                    birth: 1 << 40,
                    serial: 7,
                },
                3,
            ),
        ])[..],
    );
    let slots = [ChildSlot::Page(9), ChildSlot::AllZero];
    seed(1, "map-interior", &encode_map_interior(&slots)[..]);
    seed(
        2,
        "pair-states",
        &encode_pair_states(&[PairState::SlotA, PairState::SlotB])[..],
    );
    let dir_entry = DirectoryEntry {
        page: Some(5),
        free: 100,
        slot: PairSlot::B,
    };
    seed(3, "directory", &encode_directory(&[dir_entry])[..]);
    seed(4, "list", &encode_list(&[7, 8, 9])[..]);
    let row = DeviceRow {
        id: 1,
        parent: 0,
        kind: DeviceKind::Default,
        depth: 2,
        flags: 0,
        root: ChildSlot::Page(4),
        name: "default".into(),
        blocks: 1 << 20,
        created_seq: 0,
        created_at: 0,
        bytes_used: 0,
        blocks_used: 0,
        epoch: 0,
        pages_max: 1,
    };
    let table = encode_device_table(&[row]).expect("a valid row");
    seed(5, "device-table", &table[..]);
    let pct = [PctEntry {
        key: PctEntry::key(0, 1),
        page: 4,
        value: 2,
    }];
    seed(6, "pct", &encode_pct(&pct).expect("one entry")[..]);
    let release = ReleaseEntry {
        device: 2,
        root: 4,
        level: 1,
        flags: 1,
        number: 1,
        position: 0,
        cursor: 0,
    };
    seed(
        7,
        "release-queue",
        &encode_release_queue(&[release]).expect("one entry")[..],
    );
    let ext = Extension {
        bytes: 4096,
        list_capacity: 4096,
        device_rows: 1,
        next_device: 2,
        ..Extension::default()
    };
    let mut b = [0u8; EXTENSION_HEADER_BYTES];
    ext.encode(&mut b);
    seed(8, "extension", &b);
}

fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "corpus".into());
    handshakes(&dir);
    requests(&dir);
    on_disk(&dir);
    metadata_pages(&dir);
    eprintln!("seeds written under {}", dir.display());
}
