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
