//! parse_segment on an extent image (segment header at offset 0); a segment that parses re-seals
//! to one that parses the same, from its header and (v2) from its footer.
#![no_main]

use zbd_core::format::{
    parse_segment, parse_segment_footer, seal_segment, RecordKind, RefPayload, SegmentForm,
    SegmentOwner, SEGMENT_HEADER_BYTES,
};
use zbd_fuzz::{fix_segment_crc, le_u32, segment_owner_fields};

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    let (uuid, version, extent, alloc_seq) = segment_owner_fields(input, 0);
    let owner = SegmentOwner {
        uuid: &uuid,
        version,
        extent,
        alloc_seq,
    };
    let _ = parse_segment(input, &owner, 0);

    // Same image with the header checksum made right, when the table lies inside it.
    let payload_len = le_u32(input, 40) as usize;
    let records = le_u32(input, 44) as usize;
    let flags = input
        .get(50..52)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let record_bytes = SegmentForm { version, flags }.record_bytes();
    let table = SEGMENT_HEADER_BYTES + payload_len;
    let Some(table_end) = records
        .checked_mul(record_bytes)
        .and_then(|n| n.checked_add(table))
    else {
        return;
    };
    if table_end > input.len() {
        return;
    }
    let mut image = input.to_vec();
    fix_segment_crc(&mut image, 0, table..table_end);
    if let Ok((header, records)) = parse_segment(&image, &owner, 0) {
        // A ref record's payload lies in the payload area (parse checked its bounds); one that
        // decodes re-encodes to its own bytes.
        for r in records.iter().filter(|r| r.kind == RecordKind::Ref) {
            let bytes = &image[r.offset as usize..(r.offset + r.len) as usize];
            if let Ok(p) = RefPayload::decode(bytes) {
                assert_eq!(&p.encode()[..], bytes);
            }
        }
        let mut resealed = image.clone();
        let total = seal_segment(&mut resealed, &uuid, &header, &records);
        let again = parse_segment(&resealed, &owner, 0).expect("re-sealed segment parses");
        assert_eq!(again, (header, records));
        if version >= 2 {
            let from_footer =
                parse_segment_footer(&resealed, &owner, total).expect("re-sealed footer parses");
            assert_eq!(from_footer, again);
        }
    }
});
