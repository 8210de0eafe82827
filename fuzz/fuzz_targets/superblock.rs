//! Superblock::decode on one superblock copy; what decodes must survive encode + decode.
#![no_main]

use zbd_core::format::{Superblock, SUPERBLOCK_BYTES};

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // The engine always reads a whole copy; decode must also refuse short ones without panicking.
    let _ = Superblock::decode(input);
    // With the checksum made right, the fuzzer gets past it to the geometry checks.
    let mut copy = input.to_vec();
    copy.resize(SUPERBLOCK_BYTES.max(copy.len()), 0);
    zbd_fuzz::fix_crc(&mut copy[..SUPERBLOCK_BYTES], 12);
    if let Ok(sb) = Superblock::decode(&copy) {
        let again = Superblock::decode(&sb.encode()).expect("re-encoded superblock decodes");
        assert_eq!(again, sb);
    }
});
