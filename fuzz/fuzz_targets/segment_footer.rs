//! parse_segment_footer on an extent image whose last sector ends with a v2 segment footer; a
//! segment found by its footer re-seals to one that parses the same from footer and header.
#![no_main]

use zbd_core::format::{
    parse_segment, parse_segment_footer, seal_segment, SegmentForm, SegmentOwner, SECTOR_BYTES,
    SEGMENT_HEADER_BYTES,
};
use zbd_fuzz::{fix_segment_crc, le_u32, segment_owner_fields};

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // Recovery looks for footers ending at sector boundaries; take the image's last one.
    let end = input.len() / SECTOR_BYTES * SECTOR_BYTES;
    let footer = end.saturating_sub(SEGMENT_HEADER_BYTES);
    let (uuid, version, extent, alloc_seq) = segment_owner_fields(input, footer);
    let owner = SegmentOwner {
        uuid: &uuid,
        version,
        extent,
        alloc_seq,
    };
    let _ = parse_segment_footer(input, &owner, end);
    if end < SEGMENT_HEADER_BYTES {
        return;
    }

    // Same image with the footer checksum made right, when its table lies inside the image.
    let records = le_u32(input, footer + 44) as usize;
    let flags = input
        .get(footer + 50..footer + 52)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let record_bytes = SegmentForm { version, flags }.record_bytes();
    let Some(table) = records
        .checked_mul(record_bytes)
        .and_then(|n| footer.checked_sub(n))
    else {
        return;
    };
    let mut image = input.to_vec();
    fix_segment_crc(&mut image, footer, table..footer);
    if let Ok((header, records)) = parse_segment_footer(&image, &owner, end) {
        let mut resealed = image.clone();
        seal_segment(&mut resealed, &uuid, &header, &records);
        let again = parse_segment_footer(&resealed, &owner, end).expect("re-sealed footer parses");
        assert_eq!(again, (header, records));
        let from_header = parse_segment(&resealed, &owner, header.seg_offset as usize)
            .expect("re-sealed header parses");
        assert_eq!(from_header, again);
    }
});
