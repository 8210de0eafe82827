//! Trained dictionaries: small blocks compress far better when the compressor starts from content
//! typical of the volume. A dictionary is trained (zstd's trainer) from a sample of 4 KiB blocks,
//! kept in memory with its digested forms (zstd CDict/DDict) so each block pays only for its own
//! bytes, and stored on disk in a self-checking encoding ([`Dictionary::encode`]).
//!
//! The same trained bytes serve lz4 (as an external dictionary: lz4 uses at most the last 64 KiB
//! of it) and zstd (full dictionary with entropy tables). zlib and lzo take no dictionary here:
//! flate2's pure-Rust backend has no preset dictionary and lzokay has none.
//!
//! Where the encoded form is stored, how many copies and when it is retired is the engine's
//! business (docs/savings.md); this module only guarantees that a damaged encoding is an error,
//! never a different dictionary.

use super::{id, Codec};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::Arc;
use zstd::zstd_safe;

/// Magic of an encoded dictionary.
pub const MAGIC: [u8; 8] = *b"ZBDDICT1";
/// Version of the encoding below.
pub const ENCODING_VERSION: u16 = 1;
/// Bytes of the encoded header before the content.
pub const HEADER_BYTES: usize = 40;
/// Largest dictionary content accepted (training and decoding).
pub const CONTENT_BYTES_MAX: usize = 1 << 20;
/// Smallest useful dictionary; zstd's trainer refuses much less.
pub const CONTENT_BYTES_MIN: usize = 1024;
/// lz4 matches reach back at most 64 KiB, so only that much of a dictionary is used by lz4.
pub const LZ4_WINDOW_BYTES: usize = 64 * 1024;

/// A dictionary id as stored in a record (u16; 0 = no dictionary).
pub type DictId = u16;

/// One trained dictionary with its digested forms.
///
/// Encoded form (little-endian, [`HEADER_BYTES`] + content):
///
/// | offset | type | field |
/// |---|---|---|
/// | 0 | [u8; 8] | magic `ZBDDICT1` |
/// | 8 | u16 | dictionary id (1..=65535; records refer to it) |
/// | 10 | u16 | encoding version (1) |
/// | 12 | u8 | codec id it was trained for (1 lz4, 2 zstd); both can use it |
/// | 13 | u8 | flags (0) |
/// | 14 | u16 | reserved (0) |
/// | 16 | u32 | content length |
/// | 20 | u32 | CRC32C of the content |
/// | 24 | u64 | volume write sequence when it was trained |
/// | 32 | u32 | CRC32C of bytes 0..32 |
/// | 36 | u32 | reserved (0) |
/// | 40 | content | the trained bytes |
pub struct Dictionary {
    id: DictId,
    codec_id: u8,
    trained_seq: u64,
    content: Vec<u8>,
    /// CRC32C of `encode()`: with id and training sequence, what item checksums are seeded with.
    encoded_crc: u32,
    ddict: zstd_safe::DDict<'static>,
    // One digested compressor dictionary per level used (a volume uses one level; the bench a few).
    cdicts: Mutex<Vec<(i32, Arc<zstd_safe::CDict<'static>>)>>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("id", &self.id)
            .field("codec_id", &self.codec_id)
            .field("trained_seq", &self.trained_seq)
            .field("bytes", &self.content.len())
            .finish()
    }
}

/// Trains dictionary content of at most `size` bytes from `samples` (typically 4 KiB blocks).
///
/// zstd wants roughly 100x the dictionary size in samples; fewer still works, with less gain.
/// All-zero samples carry nothing (the engine stores zero blocks as a map state) and are skipped.
pub fn train<S: AsRef<[u8]>>(samples: &[S], size: usize) -> Result<Vec<u8>> {
    if !(CONTENT_BYTES_MIN..=CONTENT_BYTES_MAX).contains(&size) {
        return Err(Error::Invalid(format!(
            "dictionary size {size}: expected {CONTENT_BYTES_MIN}..={CONTENT_BYTES_MAX} bytes"
        )));
    }
    let useful: Vec<&[u8]> = samples
        .iter()
        .map(AsRef::as_ref)
        .filter(|s| s.iter().any(|&b| b != 0))
        .collect();
    let total: usize = useful.iter().map(|s| s.len()).sum();
    // The trainer needs a few samples and more data than the dictionary it builds.
    if useful.len() < 8 || total < 2 * size {
        return Err(Error::Invalid(format!(
            "dictionary training: {} non-zero samples, {total} bytes: need >= 8 samples and >= {} bytes",
            useful.len(),
            2 * size
        )));
    }
    zstd::dict::from_samples(&useful, size)
        .map_err(|e| Error::Invalid(format!("dictionary training failed: {e}")))
}

impl Dictionary {
    /// Wraps trained `content` as dictionary `id` for `codec` (lz4 or zstd).
    pub fn new(id: DictId, codec: Codec, trained_seq: u64, content: Vec<u8>) -> Result<Self> {
        if id == 0 {
            return Err(Error::Invalid("dictionary id 0 means 'none'".into()));
        }
        if !Self::supports(codec) {
            return Err(Error::Invalid(format!("codec {codec} takes no dictionary")));
        }
        if content.is_empty() || content.len() > CONTENT_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "dictionary of {} bytes: expected 1..={CONTENT_BYTES_MAX}",
                content.len()
            )));
        }
        Ok(Self::build(id, codec.id(), trained_seq, content))
    }

    fn build(id: DictId, codec_id: u8, trained_seq: u64, content: Vec<u8>) -> Self {
        // create_ddict copies the content; a dictionary without the zstd magic is used as raw
        // content, so any bytes are accepted (and damaged ones never reach here: CRC first).
        let ddict = zstd_safe::create_ddict(&content);
        let mut d = Dictionary {
            id,
            codec_id,
            trained_seq,
            content,
            encoded_crc: 0,
            ddict,
            cdicts: Mutex::new(Vec::new()),
        };
        d.encoded_crc = crc32c::crc32c(&d.encode());
        d
    }

    /// Whether `codec` can use a dictionary.
    pub fn supports(codec: Codec) -> bool {
        matches!(codec, Codec::Lz4 | Codec::Zstd(_))
    }

    /// Whether the stored codec id can use a dictionary.
    pub fn supports_id(codec_id: u8) -> bool {
        codec_id == id::LZ4 || codec_id == id::ZSTD
    }

    /// The id records use to name this dictionary.
    pub fn id(&self) -> DictId {
        self.id
    }

    /// Codec id it was trained for.
    pub fn codec_id(&self) -> u8 {
        self.codec_id
    }

    /// Volume write sequence at training time.
    pub fn trained_seq(&self) -> u64 {
        self.trained_seq
    }

    /// What item checksums name it by (`format::ItemSeed`): id, CRC of the encoded form (equal
    /// to its directory entry's) and training sequence.
    pub fn identity(&self) -> crate::format::DictIdentity {
        crate::format::DictIdentity {
            id: self.id,
            crc: self.encoded_crc,
            trained_seq: self.trained_seq,
        }
    }

    /// The trained bytes.
    pub fn content(&self) -> &[u8] {
        &self.content
    }

    /// The part lz4 can reach: the last 64 KiB (zstd's trainer puts the most useful content last).
    pub fn lz4_content(&self) -> &[u8] {
        let n = self.content.len();
        &self.content[n.saturating_sub(LZ4_WINDOW_BYTES)..]
    }

    fn cdict(&self, level: i32) -> Arc<zstd_safe::CDict<'static>> {
        let mut c = self.cdicts.lock();
        if let Some((_, d)) = c.iter().find(|(l, _)| *l == level) {
            return Arc::clone(d);
        }
        let d = Arc::new(zstd_safe::create_cdict(&self.content, level));
        c.push((level, Arc::clone(&d)));
        d
    }

    /// Encoded form with both checksums (see the type's documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.content.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&ENCODING_VERSION.to_le_bytes());
        out.push(self.codec_id);
        out.push(0);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.content.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&self.content).to_le_bytes());
        out.extend_from_slice(&self.trained_seq.to_le_bytes());
        let hcrc = crc32c::crc32c(&out[..32]);
        out.extend_from_slice(&hcrc.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_BYTES);
        out.extend_from_slice(&self.content);
        out
    }

    /// Decodes an encoded dictionary. Trailing bytes past the content (padding to a sector) are
    /// ignored. Any damage is `CorruptMetadata` naming what failed; never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::CorruptMetadata(format!("dictionary: {what}"));
        let header = bytes
            .get(..HEADER_BYTES)
            .ok_or_else(|| bad("truncated header"))?;
        let u16_at = |o: usize| u16::from_le_bytes([header[o], header[o + 1]]);
        let u32_at =
            |o: usize| u32::from_le_bytes([header[o], header[o + 1], header[o + 2], header[o + 3]]);
        if header[..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        if crc32c::crc32c(&header[..32]) != u32_at(32) {
            return Err(bad("header checksum mismatch"));
        }
        let version = u16_at(10);
        if version != ENCODING_VERSION {
            return Err(bad(&format!("unknown encoding version {version}")));
        }
        let id = u16_at(8);
        let codec_id = header[12];
        // Reserved fields must be zero: the header checksum does not cover bytes 36..40.
        let reserved_clear = header[13] == 0 && u16_at(14) == 0 && u32_at(36) == 0;
        if id == 0 || !Self::supports_id(codec_id) || !reserved_clear {
            return Err(bad("invalid header fields"));
        }
        let len = u32_at(16) as usize;
        if len == 0 || len > CONTENT_BYTES_MAX {
            return Err(bad(&format!("content length {len} out of range")));
        }
        let content = bytes
            .get(HEADER_BYTES..HEADER_BYTES + len)
            .ok_or_else(|| bad("truncated content"))?;
        if crc32c::crc32c(content) != u32_at(20) {
            return Err(bad("content checksum mismatch"));
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&header[24..32]);
        Ok(Self::build(
            id,
            codec_id,
            u64::from_le_bytes(seq),
            content.to_vec(),
        ))
    }

    /// Compresses `data` with `codec` (which must be lz4 or zstd) and this dictionary.
    /// `None` when the codec takes no dictionary or compression failed: the caller stores raw.
    pub fn compress(&self, codec: Codec, data: &[u8]) -> Option<Vec<u8>> {
        match codec {
            Codec::Lz4 => Some(lz4_flex::block::compress_with_dict(
                data,
                self.lz4_content(),
            )),
            Codec::Zstd(level) => {
                let cdict = self.cdict(level);
                ZSTD_CCTX.with(|c| {
                    let mut c = c.borrow_mut();
                    let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
                    c.compress_using_cdict(&mut out, data, &cdict).ok()?;
                    Some(out)
                })
            }
            _ => None,
        }
    }

    /// Decodes `stored` (codec `codec_id`, compressed with this dictionary) into exactly
    /// `out.len()` bytes. `None` on any failure, wrong length included.
    pub fn decompress(&self, codec_id: u8, stored: &[u8], out: &mut [u8]) -> Option<()> {
        let n = match codec_id {
            id::LZ4 => {
                lz4_flex::block::decompress_into_with_dict(stored, out, self.lz4_content()).ok()?
            }
            id::ZSTD => ZSTD_DCTX.with(|d| {
                d.borrow_mut()
                    .decompress_using_ddict(out, stored, &self.ddict)
                    .ok()
            })?,
            _ => return None,
        };
        (n == out.len()).then_some(())
    }

    /// Decodes only the first `out.len()` bytes of a zstd unit compressed with this dictionary;
    /// decoding stops once `out` is full.
    pub(super) fn decompress_zstd_prefix(&self, stored: &[u8], out: &mut [u8]) -> Option<()> {
        ZSTD_DCTX.with(|d| {
            let mut d = d.borrow_mut();
            d.ref_ddict(&self.ddict).ok()?;
            let r = super::unit::zstd_stream_prefix(&mut d, stored, out);
            // Drop the dictionary reference: the context is shared by every dictionary.
            let _ = d.reset(zstd_safe::ResetDirective::SessionAndParameters);
            r
        })
    }
}

thread_local! {
    // Contexts are large; one per thread, reused for every block (as in the parent module).
    static ZSTD_CCTX: RefCell<zstd_safe::CCtx<'static>> = RefCell::new(zstd_safe::CCtx::create());
    pub(super) static ZSTD_DCTX: RefCell<zstd_safe::DCtx<'static>> = RefCell::new(zstd_safe::DCtx::create());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_blocks(n: usize, seed: u32) -> Vec<Vec<u8>> {
        // Records that share a vocabulary and layout, like files of one kind.
        (0..n)
            .map(|i| {
                let mut b = Vec::with_capacity(4096);
                let mut k = (i as u32).wrapping_mul(2654435761) ^ seed;
                while b.len() < 4096 {
                    k = k.wrapping_mul(1103515245).wrapping_add(12345);
                    let line = format!(
                        "record {:08} user=u{:04} state={} path=/srv/data/{:x}/file.txt\n",
                        k % 100_000_000,
                        (k >> 8) % 977,
                        ["active", "idle", "closed", "failed"][(k >> 20) as usize % 4],
                        k >> 12
                    );
                    b.extend_from_slice(line.as_bytes());
                }
                b.truncate(4096);
                b
            })
            .collect()
    }

    fn trained(codec: Codec) -> Dictionary {
        let content = train(&text_blocks(400, 1), 16 * 1024).expect("train");
        Dictionary::new(7, codec, 99, content).expect("dict")
    }

    #[test]
    fn dictionary_helps_and_round_trips() {
        for codec in [Codec::Lz4, Codec::Zstd(1)] {
            let d = trained(codec);
            // Measured on blocks the trainer never saw.
            let held_out = text_blocks(50, 2);
            let (mut with, mut without) = (0, 0);
            for b in &held_out {
                let z = d.compress(codec, b).expect("compress");
                with += z.len();
                without += codec.compress(b).expect("plain").len();
                let mut out = vec![0u8; 4096];
                d.decompress(codec.id(), &z, &mut out).expect("decode");
                assert_eq!(&out, b, "{codec}");
                let mut short = vec![0u8; 4095];
                assert!(d.decompress(codec.id(), &z, &mut short).is_none());
            }
            assert!(with < without, "{codec}: {with} >= {without}");
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let d = trained(Codec::Zstd(1));
        let mut e = d.encode();
        e.extend_from_slice(&[0u8; 100]); // sector padding is ignored
        let back = Dictionary::decode(&e).expect("decode");
        assert_eq!(back.id(), 7);
        assert_eq!(back.codec_id(), id::ZSTD);
        assert_eq!(back.trained_seq(), 99);
        assert_eq!(back.content(), d.content());
    }

    #[test]
    fn any_flipped_bit_or_truncation_is_an_error() {
        let d = trained(Codec::Zstd(1));
        let e = d.encode();
        // Every bit of the header and a spread of content bits.
        let bits: Vec<usize> = (0..HEADER_BYTES * 8)
            .chain((HEADER_BYTES * 8..e.len() * 8).step_by(331))
            .collect();
        for bit in bits {
            let mut bad = e.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Dictionary::decode(&bad).is_err(),
                "bit {bit} flipped and still decoded"
            );
        }
        for cut in [0, 8, HEADER_BYTES - 1, HEADER_BYTES, e.len() - 1] {
            assert!(Dictionary::decode(&e[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(train(&text_blocks(3, 1), 16 * 1024).is_err());
        assert!(train(&text_blocks(100, 1), 10).is_err());
        assert!(Dictionary::new(0, Codec::Zstd(1), 0, vec![1; 100]).is_err());
        assert!(Dictionary::new(1, Codec::Zlib(1), 0, vec![1; 100]).is_err());
    }
}
