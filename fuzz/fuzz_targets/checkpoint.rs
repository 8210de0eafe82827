//! Checkpoint::decode on one checkpoint slot; what decodes must survive encode + decode.
#![no_main]

use zbd_core::format::{Checkpoint, Superblock, COUNTERS};
use zbd_fuzz::{fix_crc, le_u32};

/// Offset of the `used` field (bytes covered by the checksum).
const USED_AT: usize = 64 + COUNTERS * 8;

/// The superblock the engine would pass: version, uuid and page counts are taken from the slot
/// itself so the fuzzer can match them; the slot size is the input's.
fn superblock_for(slot: &[u8]) -> Superblock {
    let mut uuid = [0u8; 16];
    if let Some(bytes) = slot.get(16..32) {
        uuid.copy_from_slice(bytes);
    }
    let version = le_u32(slot, 8);
    Superblock {
        version,
        uuid,
        logical_blocks: 0,
        extent_bytes: 0,
        extent_count: 0,
        codec_id: 0,
        codec_level: 0,
        queue_len: 1 << 12,
        map_pages: le_u32(slot, 60),
        checkpoint_offset: 0,
        checkpoint_slot_bytes: u32::try_from(slot.len()).unwrap_or(u32::MAX),
        map_offset: 0,
        data_offset: 0,
        clean_low_pct: 0,
        clean_high_pct: 0,
        created_unix: 0,
        checkpoint_offset1: 0,
        map_offset1: 0,
        extent_table_pages: if version >= 2 { le_u32(slot, 200) } else { 0 },
        extent_table_offset: [0; 2],
        dict_bytes: 0,
        dict_offset: [0; 2],
        unit_blocks: 1,
        settings: 0,
        map_pages_room: 0,
        extent_table_pages_room: 0,
    }
}

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    let sb = superblock_for(input);
    let _ = Checkpoint::decode(input, &sb);
    let used = le_u32(input, USED_AT) as usize;
    if used >= 16 && used <= input.len() {
        let mut copy = input.to_vec();
        fix_crc(&mut copy[..used], 12);
        if let Ok(checkpoint) = Checkpoint::decode(&copy, &sb) {
            let encoded = checkpoint
                .encode(&sb)
                .expect("a decoded checkpoint encodes");
            let again = Checkpoint::decode(&encoded, &sb).expect("re-encoded checkpoint decodes");
            assert_eq!(again, checkpoint);
        }
    }
});
