//! parse_segment on an extent image; a segment that parses re-seals to one that parses the same.
#![no_main]

use zbd_core::format::{parse_segment, seal_segment, SEGMENT_HEADER_BYTES};
use zbd_fuzz::{le_u32, le_u64};

/// Offset of the header checksum (covers the header with it zeroed, then the record table).
const CRC_AT: usize = 52;

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // The caller knows the volume uuid, the extent, its allocation sequence and where the
    // segment starts; taken from the image itself so the fuzzer can match them.
    let mut uuid = [0u8; 16];
    if let Some(bytes) = input.get(8..24) {
        uuid.copy_from_slice(bytes);
    }
    let alloc_seq = le_u64(input, 24);
    let extent = le_u32(input, 32);
    let _ = parse_segment(input, &uuid, extent, alloc_seq, 0);

    // Same image with the checksum made right, when the table lies inside it.
    let payload_len = le_u32(input, 40) as usize;
    let records = le_u32(input, 44) as usize;
    let table = SEGMENT_HEADER_BYTES + payload_len;
    let Some(table_end) = records.checked_mul(40).and_then(|n| n.checked_add(table)) else {
        return;
    };
    if table_end > input.len() {
        return;
    }
    let mut image = input.to_vec();
    image[CRC_AT..CRC_AT + 4].fill(0);
    let crc = crc32c::crc32c(&image[..SEGMENT_HEADER_BYTES]);
    let crc = crc32c::crc32c_append(crc, &image[table..table_end]);
    image[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    if let Some((header, records)) = parse_segment(&image, &uuid, extent, alloc_seq, 0) {
        let mut resealed = image.clone();
        // Sealing pads to a sector, which may run past an image cut short.
        resealed.resize(resealed.len().max(header.padded_len() as usize), 0);
        seal_segment(&mut resealed, &uuid, &header, &records);
        let again = parse_segment(&resealed, &uuid, extent, alloc_seq, 0)
            .expect("re-sealed segment parses");
        assert_eq!(again, (header, records));
    }
});
