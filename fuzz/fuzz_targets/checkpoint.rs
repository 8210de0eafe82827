//! Checkpoint::decode on one checkpoint slot; what decodes must survive encode + decode.
#![no_main]

use zbd_core::format::{Checkpoint, COUNTERS};
use zbd_fuzz::{fix_crc, le_u32};

/// Offset of the `used` field (bytes covered by the checksum).
const USED_AT: usize = 64 + COUNTERS * 8;

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    // The engine passes the uuid and map page count from the superblock; taking them from the
    // slot itself lets the fuzzer reach past those checks.
    let mut uuid = [0u8; 16];
    if let Some(bytes) = input.get(16..32) {
        uuid.copy_from_slice(bytes);
    }
    let map_pages = le_u32(input, 60);
    let queue_max = 1 << 12;
    let _ = Checkpoint::decode(input, &uuid, queue_max, map_pages);
    let used = le_u32(input, USED_AT) as usize;
    if used >= 16 && used <= input.len() {
        let mut copy = input.to_vec();
        fix_crc(&mut copy[..used], 12);
        if let Some(checkpoint) = Checkpoint::decode(&copy, &uuid, queue_max, map_pages) {
            let slot_bytes = u32::try_from(copy.len()).expect("slot fits u32");
            let encoded = checkpoint.encode(&uuid, slot_bytes);
            let again = Checkpoint::decode(&encoded, &uuid, queue_max, map_pages)
                .expect("re-encoded checkpoint decodes");
            assert_eq!(again, checkpoint);
        }
    }
});
