//! decode_map_page on one map page; a page that decodes re-encodes to the same bytes.
#![no_main]

use zbd_core::format::{
    decode_map_page, encode_map_page, MapEntry, MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES,
};
use zbd_fuzz::{fix_crc, le_u32, le_u64};

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // The engine always reads whole pages; the last page of a volume may have fewer entries.
    let mut page = input.to_vec();
    page.resize(MAP_PAGE_BYTES, 0);
    let number = le_u32(&page, 0);
    let gen = le_u64(&page, 8);
    let entries = 1 + (input.len() % MAP_ENTRIES_PER_PAGE);
    let mut out = vec![MapEntry::UNMAPPED; entries];
    let _ = decode_map_page(&page, number, u64::MAX, &mut out);
    fix_crc(&mut page, 4);
    if decode_map_page(&page, number, gen, &mut out).is_ok() {
        let encoded = encode_map_page(number, gen, &out);
        let mut again = vec![MapEntry::UNMAPPED; entries];
        decode_map_page(&encoded, number, gen, &mut again).expect("re-encoded page decodes");
        assert_eq!(again, out);
        if entries == MAP_ENTRIES_PER_PAGE {
            assert!(encoded == page, "a full page re-encodes to its own bytes");
        }
    }
});
