//! Helpers shared by the integration tests of `zbd-nbd` and `zbd`: one NBD test client (a raw
//! one that sends exactly the bytes a test asks for, and a minimal blocking one that reports
//! which requests were acknowledged) and running external tools. Dev-only (`publish = false`).

pub mod nbd;
pub mod process;

/// `len` incompressible bytes from `seed` (xorshift: the same for the same seed).
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
