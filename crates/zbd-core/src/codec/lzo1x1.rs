//! A fast LZO1X compressor of the LZO1X-1 class: greedy parsing, one hash probe per position, no
//! match search beyond that probe. It trades ratio for speed the way the Linux kernel's `lzo`
//! (LZO1X-1) does, which is what the ZBD paper measured; the slow, high-ratio encoder
//! (lzokay-native, LZO1X-999-like) stays available as `lzo:999`.
//!
//! The output is a plain LZO1X stream, so any LZO1X decoder reads it: the engine decodes with
//! lzokay-native, as it does for blocks written by the slow encoder, and both share codec id 4.
//!
//! Provenance: the stream format (instruction encodings, the 2-bit literal count carried by a
//! match, the end marker) was learned from the MIT-licensed lzokay (C++, Jack Andersen) and
//! lzokay-native (Rust) encoders and decoders. The matcher and this code are written from that
//! format description; nothing here is taken from liblzo2 or Linux's lib/lzo (GPL).
//!
//! The instructions this encoder emits (d = distance, 1-based):
//!
//! | instruction | bytes | when |
//! |---|---|---|
//! | first literals | `17 + n`, then n bytes | stream starts with 1..=238 literals |
//! | literals | `n - 3`, n bytes (4..=18); or `0`, zeros, `n - 18` mod 255, n bytes | after a match |
//! | 1..3 literals | the low 2 bits of the byte before last of the previous match | after a match |
//! | M2 | `(len-1)<<5 \| (d-1 & 7)<<2`, `(d-1)>>3` | len 3..=8, d <= 2 KiB |
//! | M3 | `0x20 \| len-2` (len <= 33, else `0x20`, zeros, rest), LE16 `(d-1)<<2` | d <= 16 KiB |
//! | M4 | `0x10 \| H<<3 \| len-2` (len <= 9, else long form), LE16 `(d-16384)<<2` | d <= 48 KiB - 1 |
//! | end | `0x11 0x00 0x00` (an M4 of distance 16384) | always last |
//!
//! Matches are at least 4 bytes (the probe compares 4 bytes), so the M1 forms (2- and 3-byte
//! matches whose meaning depends on the previous instruction) are never needed.

/// Longest distance an LZO1X match can encode (M4: 16384 + 15 bits).
const MAX_DISTANCE: usize = 0xbfff;
/// Hash table size (entries). 16 K entries of u32 (64 KiB) fit in L2 and make collisions rare
/// for the engine's units (4..128 KiB); the reference LZO1X-1 uses the same size.
const HASH_BITS: u32 = 14;
/// Largest extra step of the literal skip (see the main loop).
const SKIP_MAX: usize = 32;
/// Inputs this encoder takes; positions are kept as u32 and offset by a generation counter.
/// Larger inputs return `None` (the engine's units are at most 128 KiB).
pub const MAX_INPUT: usize = 1 << 30;

/// LZO's documented worst case for incompressible input; this encoder stays well below it
/// (literal runs cost 1 + n/255 bytes of headers, plus 3 for the end marker).
pub const fn worst_case(n: usize) -> usize {
    n + n / 16 + 64 + 3
}

/// Compressor state: the hash table, reused across calls. Entries hold `generation + position`,
/// and an entry below the current generation belongs to an earlier input, so the table never
/// needs clearing between 4 KiB blocks (clearing 64 KiB would cost more than compressing one).
pub struct Lzo1x1 {
    // A fixed-size array, so the compiler sees that a hash (< 2^HASH_BITS) is always in bounds.
    table: Box<[u32; 1 << HASH_BITS]>,
    generation: u32,
}

impl Default for Lzo1x1 {
    fn default() -> Self {
        Self::new()
    }
}

impl Lzo1x1 {
    /// A compressor with an empty table.
    pub fn new() -> Self {
        Lzo1x1 {
            table: Box::new([0; 1 << HASH_BITS]),
            // 0 marks an empty slot, so generations start at 1.
            generation: 1,
        }
    }

    /// Compresses `src` into a complete LZO1X stream. `None` only for inputs over [`MAX_INPUT`].
    pub fn compress(&mut self, src: &[u8]) -> Option<Vec<u8>> {
        let n = src.len();
        if n > MAX_INPUT {
            return None;
        }
        // Every position of this input must be storable above the generation; start over (one
        // clear) when the counter would overflow.
        if (u32::MAX - self.generation) as usize <= n + 1 {
            self.table.fill(0);
            self.generation = 1;
        }
        let base = self.generation;
        self.generation += n as u32 + 1;

        let mut out = Vec::with_capacity(worst_case(n));
        // Literals start here; everything before has been emitted.
        let mut lit = 0usize;
        if n >= 4 {
            let last = n - 4; // last position with 4 bytes to hash
            let mut ip = 0usize;
            while ip <= last {
                let seq = read32(src, ip);
                let slot = hash(seq);
                let cand = self.table[slot];
                self.table[slot] = base + ip as u32;
                if cand >= base {
                    // Same input: cand - base < ip, so the distance is at least 1.
                    let c = (cand - base) as usize;
                    let distance = ip - c;
                    if distance <= MAX_DISTANCE && read32(src, c) == seq {
                        // Extend backwards over pending literals: each byte moved from a
                        // literal into the match saves a byte of output.
                        let (mut start, mut from) = (ip, c);
                        while start > lit && from > 0 && src[start - 1] == src[from - 1] {
                            start -= 1;
                            from -= 1;
                        }
                        let len = (ip - start) + 4 + common_len(src, c + 4, ip + 4);
                        put_literals(&mut out, &src[lit..start]);
                        put_match(&mut out, len, distance);
                        ip = start + len;
                        lit = ip;
                        continue;
                    }
                }
                // LZO1X-1's skip: the longer the run of literals, the larger the step, so
                // incompressible input costs a fraction of a probe per byte. Capped, so that in
                // a 128 KiB unit a compressible stretch after a random one is still found.
                ip += 1 + ((ip - lit) >> 5).min(SKIP_MAX);
            }
        }
        put_literals(&mut out, &src[lit..]);
        // End of stream: an M4 with distance 16384 and length 3.
        out.extend_from_slice(&[0x11, 0, 0]);
        Some(out)
    }
}

#[inline(always)]
fn hash(seq: u32) -> usize {
    // Multiplicative (Fibonacci) hashing: the top bits mix all four bytes.
    (seq.wrapping_mul(0x9e37_79b1) >> (32 - HASH_BITS)) as usize
}

#[inline(always)]
fn read32(s: &[u8], i: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&s[i..i + 4]);
    u32::from_le_bytes(b)
}

#[inline(always)]
fn read64(s: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[i..i + 8]);
    u64::from_le_bytes(b)
}

/// How many bytes from `a` equal those from `b` (a < b), up to the end of `s`. Eight at a time:
/// the first differing byte is the lowest set byte of the XOR (little-endian reads).
#[inline(always)]
fn common_len(s: &[u8], a: usize, b: usize) -> usize {
    let n = s.len();
    let mut k = 0;
    while b + k + 8 <= n {
        let x = read64(s, a + k) ^ read64(s, b + k);
        if x != 0 {
            return k + (x.trailing_zeros() / 8) as usize;
        }
        k += 8;
    }
    while b + k < n && s[a + k] == s[b + k] {
        k += 1;
    }
    k
}

/// A length beyond what an instruction holds: a zero byte per 255, then the rest (1..=255; the
/// decoder reads a non-zero byte as the end of the count).
fn put_count(out: &mut Vec<u8>, mut rest: usize) {
    while rest > 255 {
        out.push(0);
        rest -= 255;
    }
    out.push(rest as u8);
}

/// Emits a literal run. A run is always followed by a match or the end marker, and a run after a
/// match never follows another run, which is what makes the short forms unambiguous.
fn put_literals(out: &mut Vec<u8>, lits: &[u8]) {
    let n = lits.len();
    if n == 0 {
        return;
    }
    if out.is_empty() && n <= 238 {
        // The stream's first byte may carry a literal count directly (17 + n).
        out.push(17 + n as u8);
    } else if n <= 3 {
        // Carried in the previous match's 2 spare bits (the byte before its last). Only reached
        // after a match: a first run of 1..3 takes the branch above.
        let at = out.len() - 2;
        out[at] |= n as u8;
    } else if n <= 18 {
        out.push((n - 3) as u8);
    } else {
        out.push(0);
        put_count(out, n - 18);
    }
    out.extend_from_slice(lits);
}

/// Emits a match of `len` >= 4 bytes at `distance` 1..=[`MAX_DISTANCE`], in the shortest form.
/// The low 2 bits of the byte before last stay 0 for a following short literal run.
fn put_match(out: &mut Vec<u8>, len: usize, distance: usize) {
    debug_assert!(len >= 4 && (1..=MAX_DISTANCE).contains(&distance));
    if len <= 8 && distance <= 0x800 {
        // M2: 2 bytes.
        let d = distance - 1;
        out.push((((len - 1) << 5) | ((d & 7) << 2)) as u8);
        out.push((d >> 3) as u8);
    } else if distance <= 0x4000 {
        // M3: 3 bytes for up to 33.
        let d = distance - 1;
        if len <= 33 {
            out.push(0x20 | (len - 2) as u8);
        } else {
            out.push(0x20);
            put_count(out, len - 33);
        }
        out.push(((d & 0x3f) << 2) as u8);
        out.push((d >> 6) as u8);
    } else {
        // M4: distance 16385..=49151; its high bit sits in the instruction. d is never 0 here
        // (that is the end marker).
        let d = distance - 0x4000;
        let h = ((d & 0x4000) >> 11) as u8;
        if len <= 9 {
            out.push(0x10 | h | (len - 2) as u8);
        } else {
            out.push(0x10 | h);
            put_count(out, len - 9);
        }
        out.push(((d & 0x3f) << 2) as u8);
        out.push(((d >> 6) & 0xff) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// Decodes with the engine's decoder (lzokay-native) and with an independently written one
    /// (the `lzo` crate, a dev-dependency only), and checks both give back `data`.
    fn check(c: &mut Lzo1x1, data: &[u8]) -> Vec<u8> {
        let z = c.compress(data).expect("input under MAX_INPUT");
        assert!(
            z.len() <= worst_case(data.len()),
            "{} bytes in, {} out: over the LZO bound",
            data.len(),
            z.len()
        );
        let back = lzokay_native::decompress_all(&z, Some(data.len())).unwrap_or_else(|e| {
            panic!(
                "lzokay-native rejects our stream of {} bytes: {e}",
                data.len()
            )
        });
        assert!(back == data, "lzokay-native: {} bytes differ", data.len());
        let mut out = vec![0u8; data.len()];
        let got = lzo::decompress_into(&z, &mut out).unwrap_or_else(|e| {
            panic!(
                "lzo crate rejects our stream of {} bytes: {e:?}",
                data.len()
            )
        });
        assert_eq!(got, data.len(), "lzo crate: wrong length");
        assert!(out == data, "lzo crate: {} bytes differ", data.len());
        z
    }

    fn text(n: usize, seed: u64) -> Vec<u8> {
        let words = [
            "the ",
            "block ",
            "device ",
            "compresses ",
            "zbd ",
            "extent ",
            "map ",
            "of ",
            "and ",
            "writes ",
            "4096 ",
            "\n",
            "checkpoint ",
            "cleaner ",
            "a ",
            "LZO1X ",
        ];
        let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut v = Vec::with_capacity(n + 16);
        while v.len() < n {
            v.extend_from_slice(words[r.random_range(0..words.len())].as_bytes());
        }
        v.truncate(n);
        v
    }

    fn random(n: usize, seed: u64) -> Vec<u8> {
        let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
        (0..n).map(|_| r.random()).collect()
    }

    /// Text, random bytes, zeros and repeats interleaved, so matches of every form (M2, M3, M4,
    /// long lengths) and literal runs of every form sit next to each other.
    fn mixed(n: usize, seed: u64) -> Vec<u8> {
        let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut v = Vec::with_capacity(n + 70_000);
        while v.len() < n {
            let k = r.random_range(1..600usize);
            match r.random_range(0..5) {
                0 => v.extend(text(k, r.random())),
                1 => v.extend(random(k, r.random())),
                2 => v.extend(std::iter::repeat_n(r.random::<u8>(), k)),
                3 if !v.is_empty() => {
                    // Copy from up to 60 KiB back: exercises every distance class and the
                    // 48 KiB limit.
                    let from = v.len().saturating_sub(r.random_range(1..60_000usize));
                    let k = k.min(v.len() - from);
                    let piece = v[from..from + k].to_vec();
                    v.extend(piece);
                }
                _ => v.extend(std::iter::repeat_n(0u8, k * 8)),
            }
        }
        v.truncate(n);
        v
    }

    #[test]
    fn round_trips_every_length_and_kind() {
        let mut c = Lzo1x1::new();
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([
            511, 512, 1000, 2047, 2048, 2049, 4095, 4096, 4097, 8192, 16383, 16384,
        ]);
        lens.extend([
            16385, 32768, 49151, 49152, 49153, 65536, 65537, 98304, 131072,
        ]);
        for (i, &n) in lens.iter().enumerate() {
            let seed = i as u64;
            check(&mut c, &vec![0u8; n]);
            check(&mut c, &random(n, seed));
            check(&mut c, &text(n, seed));
            check(&mut c, &mixed(n, seed));
        }
    }

    #[test]
    fn compresses_what_it_should() {
        let mut c = Lzo1x1::new();
        // A zero unit of 128 KiB: one long match, a few hundred bytes of length count.
        let z = check(&mut c, &vec![0u8; 128 << 10]);
        assert!(z.len() < 600, "zeros: {} bytes", z.len());
        // Text of a few words repeats constantly: well under half.
        let z = check(&mut c, &text(4096, 7));
        assert!(z.len() < 2048, "text: {} bytes", z.len());
        // Random bytes do not compress; the stream stays one literal run plus a few bytes.
        let z = check(&mut c, &random(4096, 7));
        assert!(z.len() <= 4096 + 20, "random: {} bytes", z.len());
    }

    #[test]
    fn matches_reach_48k_but_not_further() {
        // A random block repeated after text filler: at 40 KiB the copy costs a few bytes (an
        // M4 match), at 56 KiB it is out of LZO1X's reach and costs what fresh random bytes do.
        let mut c = Lzo1x1::new();
        for (gap, reach) in [(40 << 10, true), (56 << 10, false)] {
            let a = random(8192, 1);
            let fresh = random(8192, 2);
            let mut with_copy = a.clone();
            with_copy.extend(text(gap - a.len(), 3));
            let mut with_fresh = with_copy.clone();
            with_copy.extend(&a);
            with_fresh.extend(&fresh);
            let copy = check(&mut c, &with_copy).len() as i64;
            let other = check(&mut c, &with_fresh).len() as i64;
            if reach {
                assert!(other - copy > 8000, "copy at {gap}: {copy} vs {other}");
            } else {
                assert!(
                    (other - copy).abs() < 100,
                    "copy at {gap}: {copy} vs {other}"
                );
            }
        }
    }

    #[test]
    fn table_reuse_across_inputs_is_safe() {
        // A table full of positions from a longer earlier input must not leak into a shorter
        // one (stale entries would point past its end or at other bytes).
        let mut c = Lzo1x1::new();
        let big = mixed(128 << 10, 3);
        check(&mut c, &big);
        for n in [4096, 10, 4] {
            check(&mut c, &big[..n]);
            check(&mut c, &text(n, 9));
        }
        // Generation wrap: force the counter near its end, then compress.
        c.generation = u32::MAX - 5000;
        check(&mut c, &big[..4096]);
        check(&mut c, &big[..4096]);
        assert!(c.generation < 10_000);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn proptest_round_trip(
            data in prop::collection::vec(
                prop_oneof![3 => Just(0u8), 3 => 0u8..4, 1 => any::<u8>()], 0..20_000),
            prefix in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            // Small alphabets give many short, overlapping matches; the random prefix moves
            // the first match and the literal forms around.
            let mut v = prefix;
            v.extend(data);
            let mut c = Lzo1x1::new();
            check(&mut c, &v);
        }
    }
}
