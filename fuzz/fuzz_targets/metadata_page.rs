//! The bit-10 metadata page decoders (format/pages.rs) on one body each: the first input byte
//! picks the decoder, the rest is the body. A body that decodes re-encodes to one that decodes
//! to the same value. The frame is fuzzed too, keyed by the address the input names.
#![no_main]

use zbd_core::format::*;
use zbd_fuzz::{le_u32, le_u64};

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    let Some((&which, rest)) = input.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    b.resize(PAGE_BODY_BYTES, 0);
    let same = |again: &[u8], what: &str| assert_eq!(again.len(), PAGE_BODY_BYTES, "{what}");
    match which % 9 {
        0 => {
            if let Ok(v) = decode_map_leaf(&b) {
                let again = encode_map_leaf(&v);
                same(&again[..], "leaf");
                assert_eq!(decode_map_leaf(&again[..]).ok(), Some(v));
            }
        }
        1 => {
            if let Ok(v) = decode_map_interior(&b) {
                assert_eq!(&encode_map_interior(&v)[..], &b[..]);
            }
        }
        2 => {
            if let Ok(v) = decode_pair_states(&b) {
                assert_eq!(&encode_pair_states(&v)[..], &b[..]);
            }
        }
        3 => {
            if let Ok(v) = decode_directory(&b) {
                assert_eq!(decode_directory(&encode_directory(&v)[..]).ok(), Some(v));
            }
        }
        4 => {
            if let Ok(v) = decode_list(&b) {
                assert_eq!(decode_list(&encode_list(&v)[..]).ok(), Some(v));
            }
        }
        5 => {
            if let Ok(v) = decode_device_table(&b) {
                let again = encode_device_table(&v).expect("decoded rows encode");
                assert_eq!(decode_device_table(&again[..]).ok(), Some(v));
            }
        }
        6 => {
            if let Ok(v) = decode_pct(&b) {
                let again = encode_pct(&v).expect("decoded entries encode");
                assert_eq!(decode_pct(&again[..]).ok(), Some(v));
            }
        }
        7 => {
            if let Ok(v) = decode_release_queue(&b) {
                let again = encode_release_queue(&v).expect("decoded entries encode");
                assert_eq!(decode_release_queue(&again[..]).ok(), Some(v));
            }
        }
        _ => {
            if let Ok(e) = Extension::decode(&b) {
                let mut again = [0u8; EXTENSION_HEADER_BYTES];
                e.encode(&mut again);
                assert_eq!(Extension::decode(&again).ok(), Some(e));
            }
            let _ = PairListEntry::decode(&b);
            let mut page = rest.to_vec();
            page.resize(MAP_PAGE_BYTES, 0);
            let at = PageAddress {
                id: le_u32(&page, 4),
                kind: PageKind::List,
                level: 0,
                position: le_u64(&page, 8),
            };
            let _ = open_page(&page, &[0; 16], &at);
        }
    }
});
