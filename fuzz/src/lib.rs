//! Helpers shared by the on-disk decoder targets: checksums are what stop a fuzzer first, so each
//! target also decodes a copy whose checksum has been made right, to reach the checks behind it.

/// Stores at `crc_at` the CRC32C of `data` with those 4 bytes counted as zero (the format's rule
/// for superblocks, checkpoints and map pages).
pub fn fix_crc(data: &mut [u8], crc_at: usize) {
    data[crc_at..crc_at + 4].fill(0);
    let crc = crc32c::crc32c(data);
    data[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Little-endian integers at an offset, zero past the end (targets derive parameters from them).
pub fn le_u32(data: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    for (i, byte) in raw.iter_mut().enumerate() {
        *byte = data.get(at + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(raw)
}

pub fn le_u64(data: &[u8], at: usize) -> u64 {
    u64::from(le_u32(data, at)) | u64::from(le_u32(data, at + 4)) << 32
}

/// Where a segment header or footer block keeps its checksum.
const SEGMENT_CRC_AT: usize = 52;

/// Makes right the checksum of the segment header or footer block at `block_at`: CRC32C of the
/// 64-byte block with its checksum zeroed, then the record table it describes (`table`).
pub fn fix_segment_crc(image: &mut [u8], block_at: usize, table: std::ops::Range<usize>) {
    let crc_at = block_at + SEGMENT_CRC_AT;
    image[crc_at..crc_at + 4].fill(0);
    let crc = crc32c::crc32c(&image[block_at..block_at + zbd_core::format::SEGMENT_HEADER_BYTES]);
    let crc = crc32c::crc32c_append(crc, &image[table]);
    image[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The owner a segment header or footer block at `at` names (uuid, version, extent, allocation
/// sequence): the engine knows these, the targets take them from the input so the fuzzer can
/// match them.
pub fn segment_owner_fields(image: &[u8], at: usize) -> ([u8; 16], u32, u32, u64) {
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        *byte = image.get(at + 8 + i).copied().unwrap_or(0);
    }
    let version = le_u32(image, at + 48) & 0xffff;
    (
        uuid,
        version,
        le_u32(image, at + 32),
        le_u64(image, at + 24),
    )
}
