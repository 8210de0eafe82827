//! Round trips and rejections of every on-disk structure.

use super::*;

fn sb(version: u32) -> Superblock {
    let mut sb = Superblock {
        version,
        uuid: [7; 16],
        logical_blocks: 1000,
        extent_bytes: 32768,
        extent_count: 40,
        codec_id: 1,
        codec_level: 0,
        queue_len: 16,
        map_pages: 4,
        checkpoint_offset: 8192,
        checkpoint_slot_bytes: 4096,
        map_offset: 16384,
        data_offset: 0,
        clean_low_pct: 10,
        clean_high_pct: 25,
        settings: 0,
        created_unix: 1,
        checkpoint_offset1: 8192,
        map_offset1: 16384,
        extent_table_pages: 0,
        extent_table_offset: [0, 0],
        dict_bytes: 0,
        dict_offset: [0, 0],
        unit_blocks: 1,
        map_pages_room: 4,
        extent_table_pages_room: 0,
    };
    if version >= 2 {
        sb.extent_table_pages = 1;
        sb.extent_table_pages_room = 1;
        sb.extent_table_offset = [16384 + 8 * 4096, 0];
        sb.dict_offset = [16384 + 10 * 4096, 0];
        sb.checkpoint_offset1 = 16384 + 10 * 4096;
        sb.map_offset1 = sb.checkpoint_offset1 + 8192;
        sb.extent_table_offset[1] = sb.map_offset1 + 8 * 4096;
        sb.dict_offset[1] = sb.extent_table_offset[1] + 2 * 4096;
        sb.data_offset = sb.dict_offset[1];
    } else {
        sb.data_offset = 65536;
    }
    sb
}

#[test]
fn superblock_round_trip_and_damage() {
    for v in [1, 2, 3] {
        let sb = sb(v);
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).ok(), Some(sb));
        b[33] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(Error::CorruptMetadata(_))
        ));
    }
    assert!(matches!(
        Superblock::decode(&[0u8; 4096]),
        Err(Error::NotAVolume(_))
    ));
}

#[test]
fn superblock_keeps_settings_in_v2_only() {
    let mut v2 = sb(2);
    v2.settings = SB_SETTING_DICTIONARY;
    let b = v2.encode();
    assert_eq!(get_u32(&b, 160), SB_SETTING_DICTIONARY);
    assert_eq!(Superblock::decode(&b).ok(), Some(v2));
    let mut v1 = sb(1);
    v1.settings = SB_SETTING_DICTIONARY;
    assert_eq!(
        Superblock::decode(&v1.encode()).map(|s| s.settings).ok(),
        Some(0)
    );
}

#[test]
fn superblock_keeps_the_unit_size_in_v2_only() {
    let mut v2 = sb(2);
    v2.unit_blocks = 4;
    assert_eq!(Superblock::decode(&v2.encode()).ok(), Some(v2.clone()));
    // Volumes made before units (byte 51 zero) write single blocks.
    let mut b = v2.encode();
    b[51] = 0;
    let crc = crc_skipping(&b, 12);
    put_u32(&mut b, 12, crc);
    assert_eq!(Superblock::decode(&b).map(|s| s.unit_blocks).ok(), Some(1));
    for bad in [3u8, 32] {
        b[51] = bad;
        let crc = crc_skipping(&b, 12);
        put_u32(&mut b, 12, crc);
        assert!(Superblock::decode(&b).is_err(), "unit of {bad} blocks");
    }
    let mut v1 = sb(1);
    v1.unit_blocks = 4;
    assert_eq!(
        Superblock::decode(&v1.encode()).map(|s| s.unit_blocks).ok(),
        Some(1)
    );
}

#[test]
fn map_entries_of_units_round_trip_in_the_reserved_bits() {
    let entries = [
        MapEntry {
            state: BlockState::Data,
            codec: 2,
            len: 65024,
            extent: 7,
            offset: (1 << 20) - 512,
            crc: 0xdead_beef,
            unit_index: 15,
            unit_blocks: 16,
            dict: 0,
            seeded: true,
        },
        MapEntry {
            state: BlockState::Data,
            codec: 1,
            len: 3000,
            extent: 1,
            offset: 4096,
            crc: 5,
            unit_index: 0,
            unit_blocks: 1,
            dict: 127,
            seeded: false,
        },
        MapEntry::ZERO,
        MapEntry {
            state: BlockState::Corrupt,
            ..MapEntry::UNMAPPED
        },
    ];
    let page = encode_map_page(3, 9, &entries);
    // Single blocks keep the v1 encoding: state byte 2, location word = offset; a seeded
    // checksum is state 5 (v3), beside the unit size bits.
    let o = MAP_PAGE_HEADER_BYTES + MAP_ENTRY_BYTES;
    assert_eq!(page[o], 2);
    let mut out = [MapEntry::UNMAPPED; 4];
    decode_map_page(&page, 3, 9, &mut out).expect("decode");
    assert_eq!(out, entries);
    // Unit fields: state byte bits 3-7 (beside state 5), location word bits 20-24 and 25-31.
    assert_eq!(page[MAP_PAGE_HEADER_BYTES], 5 | (15 << 3));
    assert_eq!(
        get_u32(&page, MAP_PAGE_HEADER_BYTES + 8),
        ((1 << 20) - 512) | (15 << 20)
    );
}

#[test]
fn a_shared_entry_round_trips_in_a_leaf_and_is_damage_in_a_v2_page() {
    let max = SBT_KEY_FIELD_MAX;
    for (birth, serial, index) in [
        (0, 1, 0),
        (255, 7, 15),
        (max, max, 3),
        (1 << 40, 1 << 33, 9),
    ] {
        let key = SbtKey { birth, serial };
        let e = MapEntry::shared(key, index);
        assert_eq!(e.sbt_key(), Some(key));
        assert_eq!(e.unit_index, index);
        let leaf = encode_map_leaf(&[e]);
        // format.md, "Bit 12": state 4 with the index in bits 3-6, birth at 1-6, serial at
        // 8-13, bytes 7, 14 and 15 zero.
        assert_eq!(leaf[0], 4 | index << 3);
        assert_eq!(&leaf[1..7], &birth.to_le_bytes()[..6]);
        assert_eq!(&leaf[8..14], &serial.to_le_bytes()[..6]);
        assert_eq!((leaf[7], leaf[14], leaf[15]), (0, 0, 0));
        assert_eq!(map_leaf_entry(&leaf, 0).expect("valid"), e);
        // Bytes no writer sets make it damage, not another key.
        for (at, bit) in [(0, 0x80), (7, 1), (14, 1), (15, 0x80)] {
            let mut bad = leaf.clone();
            bad[at] ^= bit;
            assert!(map_leaf_entry(&bad, 0).is_err(), "byte {at}");
        }
        // A v2 map page never holds one.
        let page = encode_map_page(3, 9, &[e]);
        let mut out = [MapEntry::UNMAPPED; 1];
        assert!(decode_map_page(&page, 3, 9, &mut out).is_err());
    }
    assert_eq!(MapEntry::ZERO.sbt_key(), None);
    assert_eq!(
        std::mem::size_of::<MapEntry>(),
        20,
        "v2's map cache holds them decoded"
    );
}

#[test]
fn records_of_units_and_dictionaries_are_supported_within_their_ranges() {
    let r = |index: u8, blocks: u16, dict: u16| Record {
        unit_index: index,
        unit_blocks: blocks,
        dict,
        ..Record::new(RecordKind::Data, 0, 1, 1)
    };
    assert!(!r(0, 1, 0).uses_unsupported_features());
    assert!(!r(3, 4, 0).uses_unsupported_features());
    assert!(!r(15, 16, 0).uses_unsupported_features());
    assert!(r(4, 4, 0).uses_unsupported_features());
    assert!(r(0, 17, 0).uses_unsupported_features());
    assert!(r(0, 0, 0).uses_unsupported_features());
    assert!(!r(0, 4, 1).uses_unsupported_features());
    assert!(!r(0, 1, 127).uses_unsupported_features());
    // A map entry holds 7 bits of dictionary id.
    assert!(r(0, 1, 128).uses_unsupported_features());
    assert!(r(0, 4, 0).in_unit() && !r(0, 1, 0).in_unit());
}

#[test]
fn checkpoint_round_trip() {
    for v in [1, 2] {
        let sb = sb(v);
        let mut c = Checkpoint::empty(&sb);
        c.seq = 9;
        c.write_seq = 100;
        c.next_alloc_seq = 50;
        c.counters = [3; COUNTERS];
        c.queue = vec![QueueEntry {
            extent: 4,
            alloc_seq: 49,
        }];
        c.page_slots = vec![0, 1, 2, 1];
        let mut b = c.encode(&sb).expect("encode");
        assert_eq!(Checkpoint::decode(&b, &sb).ok(), Some(c));
        let at = if v == 1 {
            CHECKPOINT_HEADER_BYTES
        } else {
            CHECKPOINT_V2_HEADER_BYTES
        };
        b[at] ^= 4;
        assert!(Checkpoint::decode(&b, &sb).is_err());
    }
}

#[test]
fn segment_round_trip_rejects_other_generation_and_survives_header_damage() {
    for version in [1u32, 2, 3] {
        let mut ext = vec![0u8; 8192];
        let payload_at = 512 + SEGMENT_HEADER_BYTES;
        ext[payload_at..payload_at + 10].copy_from_slice(b"0123456789");
        let r = Record {
            len: 10,
            offset: payload_at as u32,
            crc: 1,
            seeded: version >= 3,
            ..Record::new(RecordKind::Data, 3, 1, 5)
        };
        let h = SegmentHeader {
            version,
            alloc_seq: 77,
            extent: 2,
            seg_offset: 512,
            payload_len: 10,
            record_count: 1,
            durable_seq: if version >= 2 { 4 } else { 0 },
            flags: 0,
        };
        let n = seal_segment(&mut ext, &[9; 16], &h, &[r]);
        assert_eq!(n % SECTOR_BYTES, 0);
        let owner = SegmentOwner {
            uuid: &[9; 16],
            version,
            extent: 2,
            alloc_seq: 77,
        };
        assert_eq!(parse_segment(&ext, &owner, 512).ok(), Some((h, vec![r])));
        let other = SegmentOwner {
            alloc_seq: 78,
            ..owner
        };
        assert!(parse_segment(&ext, &other, 512).is_err());
        // An upgraded (v3) volume keeps its v2 segments; no other version mixes.
        for volume in [1u32, 2, 3] {
            let fits = volume == version || (volume == 3 && version == 2);
            let owner = SegmentOwner {
                version: volume,
                ..owner
            };
            assert_eq!(
                parse_segment(&ext, &owner, 512).is_ok(),
                fits,
                "segment v{version} in volume v{volume}"
            );
        }
        // One bit of the record count: the header fails, the footer (v2) still reads.
        ext[512 + 44] ^= 1;
        assert!(parse_segment(&ext, &owner, 512).is_err());
        let footer = parse_segment_footer(&ext, &owner, 512 + n);
        assert_eq!(footer.ok(), (version >= 2).then(|| (h, vec![r])));
    }
}

#[test]
fn decoders_reject_short_and_garbage_input() {
    let sb = sb(2);
    for len in [0usize, 1, 63, 64, 100, 4095] {
        let b = vec![0xffu8; len];
        assert!(Superblock::decode(&b).is_err());
        assert!(Checkpoint::decode(&b, &sb).is_err());
        let mut out = [MapEntry::UNMAPPED; 4];
        assert!(decode_map_page(&b, 0, 1, &mut out).is_err());
        let owner = SegmentOwner {
            uuid: &[0xff; 16],
            version: 2,
            extent: u32::MAX,
            alloc_seq: u64::MAX,
        };
        assert!(parse_segment(&b, &owner, 0).is_err());
        assert!(parse_segment_footer(&b, &owner, len).is_err());
    }
}

/// A v3 superblock keeps its room to grow; the room never falls below the pages in use, and
/// v2 readers of the same bytes (room fields reserved) see no room.
#[test]
fn superblock_room_to_grow_round_trips_and_is_checked() {
    // 700 blocks in 3 map pages, in a map region laid out for 4.
    let mut sb = sb(3);
    sb.logical_blocks = 700;
    sb.map_pages = 3;
    let b = sb.encode();
    assert_eq!(Superblock::decode(&b).ok(), Some(sb.clone()));
    let mut under = sb.clone();
    under.map_pages_room = 2;
    assert!(
        Superblock::decode(&under.encode()).is_err(),
        "room below map pages"
    );
    let mut over = sb.clone();
    over.map_pages_room = 5;
    assert!(
        Superblock::decode(&over.encode()).is_err(),
        "room overlaps the next region"
    );
    let mut v2 = sb.clone();
    v2.version = 2;
    assert_eq!(
        Superblock::decode(&v2.encode())
            .map(|s| s.map_pages_room)
            .ok(),
        Some(3),
        "v2: no room fields"
    );
}

/// A bit-10 checkpoint of `sb` (slot widened to 8 KiB) with a queue, table slots and an
/// extension that lists a directory, a summary list and pair states.
fn bit10_checkpoint() -> (Superblock, Checkpoint) {
    let mut sb = sb(3);
    sb.checkpoint_slot_bytes = 8192;
    let mut ext = ExtensionBody {
        header: Extension {
            h: 5,
            pairs0: 4,
            list_capacity: 64,
            device_list: 9,
            device_rows: 1,
            next_device: 2,
            pct_root: PAGE_ID_NONE,
            sbt_root: PAGE_ID_NONE,
            ..Extension::default()
        },
        directory: vec![(11, PairSlot::B)],
        summary_lists: vec![12],
        pair_list: (20..70)
            .map(|id| PairListEntry {
                id,
                state: PairState::SlotA,
            })
            .collect(),
    };
    // As the catalog hands it over: counts taken from the lists.
    ext.header = ext.counted().expect("counted");
    let mut c = Checkpoint::empty_bit10(&sb, ext);
    c.seq = 9;
    c.write_seq = 100;
    c.next_alloc_seq = 50;
    c.counters = [3; COUNTERS];
    c.queue = vec![QueueEntry {
        extent: 4,
        alloc_seq: 49,
    }];
    c.extent_table_slots = vec![2];
    c.flags |= CKPT_FLAG_EXTENT_TABLE;
    (sb, c)
}

/// Bit 10's slot (format.md, "Checkpoint slot with bit 10"): v2's header, queue and table
/// slots, then the extension, with byte 60 holding `pairs0`; every single bit flip of the used
/// part is refused, and so is an extension whose header disagrees with the slot even under a
/// valid CRC.
#[test]
fn bit10_checkpoint_round_trip_and_damage() {
    let (sb, c) = bit10_checkpoint();
    let b = c.encode(&sb).expect("encode");
    assert_eq!(get_u32(&b, 60), 4, "pairs0 at byte 60");
    assert_eq!(Checkpoint::decode(&b, &sb).expect("decode"), c);
    let used = get_u32(&b, 64 + COUNTERS * 8) as usize;
    for bit in 0..used * 8 {
        let mut d = b.clone();
        d[bit / 8] ^= 1 << (bit % 8);
        assert!(Checkpoint::decode(&d, &sb).is_err(), "bit {bit} flipped");
    }
    // The extension's byte total, one entry short, resealed: its lists no longer end the slot.
    let at = used - c.extension.as_ref().expect("bit 10").len();
    let mut d = b.clone();
    let bytes = get_u32(&d, at);
    put_u32(&mut d, at, bytes - 8);
    put_u32(&mut d, at + 20, 49);
    let crc = crc_skipping(&d[..used], 12);
    put_u32(&mut d, 12, crc);
    let e = Checkpoint::decode(&d, &sb).expect_err("short extension");
    assert!(e.to_string().contains("disagrees"), "{e}");
    // A v2 checkpoint of the same volume still reads as v2.
    let mut v2 = Checkpoint::empty(&sb);
    v2.seq = 3;
    let b = v2.encode(&sb).expect("encode");
    assert_eq!(Checkpoint::decode(&b, &sb).expect("decode"), v2);
}

/// Encoding refuses what could not be read back or would pass the slot into the next one.
#[test]
fn bit10_checkpoint_encode_refuses_what_does_not_fit() {
    let (mut sb, c) = bit10_checkpoint();
    let mut flagless = c.clone();
    flagless.flags &= !CKPT_FLAG_METADATA_PAGES;
    assert!(flagless.encode(&sb).is_err());
    let mut bare = c.clone();
    bare.extension = None;
    assert!(bare.encode(&sb).is_err());
    sb.checkpoint_slot_bytes = 4096;
    let mut long = c;
    long.extension.as_mut().expect("bit 10").pair_list = (100..600)
        .map(|id| PairListEntry {
            id,
            state: PairState::Free,
        })
        .collect();
    long.extension
        .as_mut()
        .expect("bit 10")
        .header
        .list_capacity = 1000;
    let e = long.encode(&sb).expect_err("passes the slot");
    assert!(e.to_string().contains("passes its slot"), "{e}");
}

/// Bit 11's forms: 64-byte records (device, fingerprint) read back through the header and the
/// footer, in 512-byte and 4 KiB sectors.
#[test]
fn wide_records_round_trip_in_both_forms() {
    for flags in [SEG_FLAG_WIDE_RECORDS, SEG_FLAG_WIDE_RECORDS | SEG_FLAG_4K] {
        let mut ext = vec![0u8; 65536];
        let start = 4096;
        let payload_at = start + SEGMENT_HEADER_BYTES;
        let records: Vec<Record> = (0..4u8)
            .map(|i| Record {
                codec: 1,
                len: 3000,
                offset: payload_at as u32,
                crc: 0xdead_beef,
                unit_index: i,
                unit_blocks: 4,
                dict: 127,
                seeded: true,
                fingerprint: 0x1234_5600 + u32::from(i),
                ..Record::new(RecordKind::Data, 100 + u64::from(i), 1, 7 + u64::from(i))
            })
            .chain([Record::new(RecordKind::Trim, 9, 1 << 30, 11)])
            .collect();
        let h = SegmentHeader {
            version: 3,
            alloc_seq: 5,
            extent: 2,
            seg_offset: start as u32,
            payload_len: 3000,
            record_count: records.len() as u32,
            durable_seq: 6,
            flags,
        };
        let n = seal_segment(&mut ext, &[3; 16], &h, &records);
        assert_eq!(n as u64, h.padded_len());
        assert_eq!(n % h.form().sector(), 0);
        let owner = SegmentOwner {
            uuid: &[3; 16],
            version: 3,
            extent: 2,
            alloc_seq: 5,
        };
        let want = Some((h, records.clone()));
        assert_eq!(parse_segment(&ext, &owner, start).ok(), want);
        assert_eq!(parse_segment_footer(&ext, &owner, start + n).ok(), want);
        // A v2 volume has no such segments.
        let v2 = SegmentOwner {
            version: 2,
            ..owner
        };
        assert!(parse_segment(&ext, &v2, start).is_err());
        // A record of another device (bit 13) keeps its block key: stored as device and LBA.
        let other = Record {
            lba: block_key(7, 12_345),
            ..records[0]
        };
        let mut b = [0u8; WIDE_RECORD_BYTES];
        other.encode(&mut b);
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")), 7);
        assert_eq!(
            u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            12_345
        );
        assert_eq!(Record::decode(&b), Some(other));
        assert_eq!(other.device(), 7);
        // Device 0, or an LBA past a device's keys, is no record this build writes.
        let mut bad = b;
        bad[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Record::decode(&bad), None);
        let mut bad = b;
        bad[16..24].copy_from_slice(&DEVICE_KEY_STRIDE.to_le_bytes());
        assert_eq!(Record::decode(&bad), None);
    }
}

/// Ref and move records (bit 12) round-trip in 64-byte tables beside data records, never
/// parse from v2's 40-byte layout, and stay refused by the engine until it replays them.
#[test]
fn ref_and_move_records_round_trip_only_as_64_byte_records() {
    let mut ext = vec![0u8; 65536];
    let start = 8192;
    let payload_at = (start + SEGMENT_HEADER_BYTES) as u32;
    let target = RefPayload {
        index: 2,
        lba: 1 << 40,
        extent: 77,
        offset: 123_456,
        stored_len: 9_000,
        codec: 3,
        unit_blocks: 4,
        dict: 127,
        flags: REF_FLAG_OWNER_SHARED,
        crc: 0x0bad_cafe,
    };
    let payload = target.encode();
    assert_eq!(RefPayload::decode(&payload).expect("valid"), target);
    assert_eq!(target.birth_lba(), (1 << 40) - 2);
    let refr = Record {
        len: REF_PAYLOAD_BYTES as u32,
        offset: payload_at,
        crc: crc32c::crc32c(&payload),
        ..Record::new(RecordKind::Ref, 900, 1, 20)
    };
    let mv = Record {
        codec: 1,
        len: 700,
        offset: payload_at + 64,
        crc: 5,
        unit_index: 1,
        unit_blocks: 2,
        seeded: true,
        fingerprint: 0xfeed_f00d,
        source_extent: 12,
        source_offset: 4096 * 31,
        ..Record::new(RecordKind::Move, 41, 1, 21)
    };
    let data = Record {
        len: 0,
        offset: payload_at + 764,
        ..Record::new(RecordKind::Data, 3, 1, 22)
    };
    let records = vec![refr, mv, data];
    let h = SegmentHeader {
        version: 3,
        alloc_seq: 5,
        extent: 2,
        seg_offset: start as u32,
        payload_len: 764,
        record_count: 3,
        durable_seq: 6,
        flags: SEG_FLAG_WIDE_RECORDS,
    };
    seal_segment(&mut ext, &[3; 16], &h, &records);
    let owner = SegmentOwner {
        uuid: &[3; 16],
        version: 3,
        extent: 2,
        alloc_seq: 5,
    };
    assert_eq!(
        parse_segment(&ext, &owner, start).ok(),
        Some((h, records.clone()))
    );
    // Moves (build order 2a) and refs (2b) are replayed.
    assert!(!refr.uses_unsupported_features() && !mv.uses_unsupported_features());
    assert!(Record {
        unit_index: 2,
        ..mv
    }
    .uses_unsupported_features());
    // A move whose bytes pass the payload's end is damage, as a data record's.
    let past = Record { len: 765, ..mv };
    seal_segment(&mut ext, &[3; 16], &h, &[refr, past, data]);
    assert!(parse_segment(&ext, &owner, start).is_err());

    let mut wide = [0u8; WIDE_RECORD_BYTES];
    mv.encode(&mut wide);
    assert_eq!(get_u32(&wide, 48), 12);
    assert_eq!(get_u32(&wide, 52), 4096 * 31);
    // Reserved bytes in use, a ref whose payload is not 64 bytes, or a source on a record that
    // is not a move: damage (a newer writer's, which its checkpoint bit refuses first).
    for (r, at) in [(mv, 56), (mv, 63), (refr, 48), (refr, 46)] {
        let mut b = [0u8; WIDE_RECORD_BYTES];
        r.encode(&mut b);
        b[at] = 1;
        assert_eq!(Record::decode(&b), None, "{:?} byte {at}", r.kind);
    }
    refr.encode(&mut wide);
    put_u32(&mut wide, 4, 63);
    assert_eq!(Record::decode(&wide), None);
    // v2's layout has no kinds 4 and 5.
    let mut narrow = [0u8; RECORD_BYTES];
    Record::new(RecordKind::Data, 3, 1, 22).encode(&mut narrow);
    for kind in [4, 5, 6] {
        narrow[0] = kind;
        assert_eq!(Record::decode(&narrow), None, "kind {kind}");
    }
}

#[test]
fn a_ref_payload_refuses_what_no_writer_makes() {
    let good = RefPayload {
        index: 0,
        lba: 10,
        extent: 1,
        offset: 0,
        stored_len: 4096,
        codec: 0,
        unit_blocks: 1,
        dict: 0,
        flags: 0,
        crc: 1,
    };
    assert!(RefPayload::decode(&good.encode()).is_ok());
    let bad = [
        RefPayload { flags: 4, ..good },
        RefPayload {
            unit_blocks: 0,
            ..good
        },
        RefPayload {
            unit_blocks: 17,
            ..good
        },
        RefPayload { index: 1, ..good },
        RefPayload {
            index: 3,
            unit_blocks: 4,
            lba: 2,
            ..good
        },
        RefPayload { dict: 128, ..good },
    ];
    for p in bad {
        assert!(RefPayload::decode(&p.encode()).is_err(), "{p:?}");
    }
    let mut b = good.encode();
    b[63] = 1;
    assert!(RefPayload::decode(&b).is_err());
    assert!(RefPayload::decode(&b[..63]).is_err());
}

/// The 4 KiB form keeps the two copies of a segment's header and record table in different
/// 4 KiB sectors whatever its payload and record count: a lost (garbled) sector leaves one
/// copy, so a flushed block whose payload was in it reads as damage, never as its older value.
#[test]
fn a_garbled_4k_sector_leaves_one_copy_of_every_record() {
    let owner = SegmentOwner {
        uuid: &[8; 16],
        version: 3,
        extent: 1,
        alloc_seq: 2,
    };
    let flags = SEG_FLAG_WIDE_RECORDS | SEG_FLAG_4K;
    let mut checked = 0;
    for records in [1usize, 2, 5, 31, 62, 63, 64, 65, 130] {
        let payloads = (0..=40_000).step_by(997).chain(
            // Around the sector boundaries where the first table copy ends.
            (1..=9usize).flat_map(|k| {
                let edge =
                    (k * 4096).checked_sub(SEGMENT_HEADER_BYTES + records * WIDE_RECORD_BYTES);
                edge.map_or(0..0, |e| e.saturating_sub(3)..e + 3)
            }),
        );
        for payload in payloads {
            let h = SegmentHeader {
                version: 3,
                alloc_seq: 2,
                extent: 1,
                seg_offset: 4096,
                payload_len: payload as u32,
                record_count: records as u32,
                durable_seq: 1,
                flags,
            };
            let len = h.padded_len() as usize;
            let mut ext = vec![0u8; 4096 + len + 4096];
            let recs: Vec<Record> = (0..records as u64)
                .map(|i| Record::new(RecordKind::Zero, i, 1, i + 1))
                .collect();
            assert_eq!(seal_segment(&mut ext, owner.uuid, &h, &recs), len);
            for sector in (4096..4096 + len).step_by(4096) {
                let mut bad = ext.clone();
                bad[sector..sector + 4096].fill(0xa5);
                let found = parse_segment(&bad, &owner, 4096)
                    .or_else(|_| parse_segment_footer(&bad, &owner, 4096 + len));
                assert_eq!(
                    found.ok().map(|f| f.1),
                    Some(recs.clone()),
                    "payload {payload}, {records} records: sector at {sector} of {len} bytes \
                     took both copies"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}
