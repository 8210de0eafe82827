//! Block codecs. Each stored block records its codec, so a volume can mix codecs (e.g. after a
//! codec change on open); only the writer's choice is a volume setting.

pub mod dict;
pub mod lzo1x1;
pub mod unit;

use crate::error::{Error, Result};
use serde::Serialize;
use std::cell::RefCell;
use std::fmt;

/// A codec and its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
pub enum Codec {
    /// Stored as is (the paper's pass-through mode; still packed, checksummed, zero-detected).
    None,
    /// LZ4 block format (lz4_flex), the default.
    #[default]
    Lz4,
    /// Zstandard at a level (1..=22, negative = fast modes).
    Zstd(i32),
    /// zlib (deflate with zlib header) at a level 1..=9.
    Zlib(u32),
    /// LZO1X, fast encoder of the LZO1X-1 class ([`lzo1x1`]), like the kernel's `lzo` that the
    /// ZBD paper measured. Written `lzo` (or `lzo:1`).
    Lzo,
    /// LZO1X, slow high-ratio encoder (lzokay-native, LZO1X-999-like): `lzo:999`. Same stream
    /// format and codec id as [`Codec::Lzo`]; only the writer differs.
    Lzo999,
}

/// On-disk codec identifiers (format.md, "codec ids"). `RAW` marks a block that the volume's codec
/// did not shrink enough and that is stored verbatim.
pub mod id {
    /// Verbatim bytes.
    pub const RAW: u8 = 0;
    /// LZ4 block.
    pub const LZ4: u8 = 1;
    /// Zstandard frame.
    pub const ZSTD: u8 = 2;
    /// zlib stream.
    pub const ZLIB: u8 = 3;
    /// LZO1X stream.
    pub const LZO: u8 = 4;
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => write!(f, "none"),
            Codec::Lz4 => write!(f, "lz4"),
            Codec::Zstd(l) => write!(f, "zstd:{l}"),
            Codec::Zlib(l) => write!(f, "zlib:{l}"),
            Codec::Lzo => write!(f, "lzo"),
            Codec::Lzo999 => write!(f, "lzo:999"),
        }
    }
}

impl std::str::FromStr for Codec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let bad = || {
            Error::Invalid(format!(
                "codec '{s}': expected lz4, zstd[:1..22], zlib[:1..9], lzo[:1|999] or none"
            ))
        };
        let parse_level = |l: &str| l.parse::<i32>().map_err(|_| bad());
        let codec = match (name.to_ascii_lowercase().as_str(), level) {
            ("none", None) => Codec::None,
            ("lz4", None) => Codec::Lz4,
            ("lzo", None) => Codec::Lzo,
            ("lzo", Some("1")) => Codec::Lzo,
            ("lzo", Some("999")) => Codec::Lzo999,
            ("zstd", None) => Codec::Zstd(3),
            ("zstd", Some(l)) => {
                let l = parse_level(l)?;
                if !(-7..=22).contains(&l) || l == 0 {
                    return Err(bad());
                }
                Codec::Zstd(l)
            }
            ("zlib", None) => Codec::Zlib(1),
            ("zlib", Some(l)) => {
                let l = parse_level(l)?;
                if !(1..=9).contains(&l) {
                    return Err(bad());
                }
                Codec::Zlib(l as u32)
            }
            _ => return Err(bad()),
        };
        Ok(codec)
    }
}

impl Codec {
    /// Every codec at its default level, for benchmarks.
    pub fn all_defaults() -> Vec<Codec> {
        vec![
            Codec::None,
            Codec::Lz4,
            Codec::Lzo,
            Codec::Lzo999,
            Codec::Zstd(1),
            Codec::Zstd(3),
            Codec::Zlib(1),
            Codec::Zlib(6),
        ]
    }

    /// On-disk id of this codec.
    pub fn id(self) -> u8 {
        match self {
            Codec::None => id::RAW,
            Codec::Lz4 => id::LZ4,
            Codec::Zstd(_) => id::ZSTD,
            Codec::Zlib(_) => id::ZLIB,
            Codec::Lzo | Codec::Lzo999 => id::LZO,
        }
    }

    /// Level stored in the superblock (0 for codecs without levels).
    pub fn level(self) -> i32 {
        match self {
            Codec::Zstd(l) => l,
            Codec::Zlib(l) => l as i32,
            // 0 (not 1) for the fast encoder: volumes written before it existed store 0, and
            // open them with the new default.
            Codec::Lzo999 => 999,
            _ => 0,
        }
    }

    /// Rebuilds a codec from the superblock's id and level.
    pub fn from_id(codec_id: u8, level: i32) -> Result<Codec> {
        Ok(match codec_id {
            id::RAW => Codec::None,
            id::LZ4 => Codec::Lz4,
            id::ZSTD => Codec::Zstd(level),
            id::ZLIB => Codec::Zlib(level.clamp(1, 9) as u32),
            id::LZO if level == 999 => Codec::Lzo999,
            id::LZO => Codec::Lzo,
            other => return Err(Error::NotAVolume(format!("unknown codec id {other}"))),
        })
    }

    /// Compresses `data`. Returns `None` when the codec is `None` or compression failed; callers
    /// then store the block raw.
    pub fn compress(self, data: &[u8]) -> Option<Vec<u8>> {
        match self {
            Codec::None => None,
            Codec::Lz4 => Some(lz4_flex::block::compress(data)),
            Codec::Zstd(level) => ZSTD_C.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|(l, _)| *l != level) {
                    *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
                }
                c.as_mut()?.1.compress(data).ok()
            }),
            Codec::Zlib(level) => ZLIB_C.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|(l, _)| *l != level) {
                    *c = Some((
                        level,
                        flate2::Compress::new(flate2::Compression::new(level), true),
                    ));
                }
                let z = &mut c.as_mut()?.1;
                z.reset();
                let mut out = Vec::with_capacity(data.len() + 64);
                let status = z
                    .compress_vec(data, &mut out, flate2::FlushCompress::Finish)
                    .ok()?;
                (status == flate2::Status::StreamEnd).then_some(out)
            }),
            Codec::Lzo => LZO_FAST.with(|c| c.borrow_mut().compress(data)),
            Codec::Lzo999 => {
                LZO_DICT.with(|d| lzokay_native::compress_with_dict(data, &mut d.borrow_mut()).ok())
            }
        }
    }
}

thread_local! {
    // Codec contexts are large; allocating one per 4 KiB block would dominate the cost.
    static LZO_DICT: RefCell<lzokay_native::Dict> = RefCell::new(lzokay_native::Dict::new());
    static LZO_FAST: RefCell<lzo1x1::Lzo1x1> = RefCell::new(lzo1x1::Lzo1x1::new());
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static ZLIB_C: RefCell<Option<(u32, flate2::Compress)>> = const { RefCell::new(None) };
    static ZLIB_D: RefCell<flate2::Decompress> = RefCell::new(flate2::Decompress::new(true));
}

/// Decodes a stored block of codec `codec_id` into exactly `out.len()` bytes.
/// Any failure (wrong length included) is reported as `None`; the caller turns it into a
/// `Corrupt` error for the right block.
pub fn decompress(codec_id: u8, stored: &[u8], out: &mut [u8]) -> Option<()> {
    match codec_id {
        id::RAW => {
            if stored.len() != out.len() {
                return None;
            }
            out.copy_from_slice(stored);
        }
        id::LZ4 => {
            let n = lz4_flex::block::decompress_into(stored, out).ok()?;
            if n != out.len() {
                return None;
            }
        }
        id::ZSTD => {
            let n = ZSTD_D.with(|d| {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new().ok()?);
                }
                d.as_mut()?.decompress_to_buffer(stored, out).ok()
            })?;
            if n != out.len() {
                return None;
            }
        }
        id::ZLIB => {
            ZLIB_D.with(|d| {
                let mut d = d.borrow_mut();
                d.reset(true);
                let status = d
                    .decompress(stored, out, flate2::FlushDecompress::Finish)
                    .ok()?;
                // The stream must end exactly at the block's end.
                (status == flate2::Status::StreamEnd && d.total_out() == out.len() as u64)
                    .then_some(())
            })?;
        }
        id::LZO => {
            let v = lzokay_native::decompress_all(stored, Some(out.len())).ok()?;
            if v.len() != out.len() {
                return None;
            }
            out.copy_from_slice(&v);
        }
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_and_levels() {
        assert_eq!("lz4".parse::<Codec>().ok(), Some(Codec::Lz4));
        assert_eq!("zstd:5".parse::<Codec>().ok(), Some(Codec::Zstd(5)));
        assert_eq!("zlib".parse::<Codec>().ok(), Some(Codec::Zlib(1)));
        assert!("zlib:12".parse::<Codec>().is_err());
        assert!("gzip".parse::<Codec>().is_err());
        assert_eq!("lzo".parse::<Codec>().ok(), Some(Codec::Lzo));
        assert_eq!("lzo:1".parse::<Codec>().ok(), Some(Codec::Lzo));
        assert_eq!("lzo:999".parse::<Codec>().ok(), Some(Codec::Lzo999));
        assert!("lzo:9".parse::<Codec>().is_err());
    }

    /// Every codec survives Display -> parse and id/level -> from_id (what the superblock keeps),
    /// and both lzo encoders share the on-disk id. A volume written before the fast encoder
    /// existed stores level 0 and opens as `lzo`.
    #[test]
    fn names_and_superblock_fields_round_trip() {
        for c in Codec::all_defaults() {
            assert_eq!(c.to_string().parse::<Codec>().ok(), Some(c), "{c}");
            assert_eq!(Codec::from_id(c.id(), c.level()).ok(), Some(c), "{c}");
        }
        assert_eq!(Codec::Lzo.id(), id::LZO);
        assert_eq!(Codec::Lzo999.id(), id::LZO);
        assert_eq!(Codec::from_id(id::LZO, 0).ok(), Some(Codec::Lzo));
    }

    /// Both lzo encoders' streams decode with the one LZO1X decoder, whichever wrote them; random
    /// data compresses to more than it costs raw, so the engine (which keeps a compressed block
    /// only if it saves a sector) stores it raw.
    #[test]
    fn lzo_encoders_interoperate_and_incompressible_data_falls_back() {
        let text: Vec<u8> = b"zbd compresses 4 KiB blocks with lzo; "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let fast = Codec::Lzo.compress(&text).expect("lzo");
        let slow = Codec::Lzo999.compress(&text).expect("lzo:999");
        for z in [&fast, &slow] {
            let mut out = vec![0u8; 4096];
            assert!(decompress(id::LZO, z, &mut out).is_some());
            assert_eq!(out, text);
        }
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(30);
        let random: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        let unit = unit::compress_unit(Codec::Lzo, None, &random).expect("unit");
        assert_eq!(unit.codec_id, id::RAW);
        assert_eq!(unit.bytes, random);
    }

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i % 251) as u8 ^ (i / 512) as u8)
            .collect();
        for c in Codec::all_defaults() {
            let Some(z) = c.compress(&data) else { continue };
            let mut out = vec![0u8; 4096];
            assert!(decompress(c.id(), &z, &mut out).is_some(), "{c}");
            assert_eq!(out, data, "{c}");
            // A damaged stream never decodes into the wrong length silently.
            let mut short = vec![0u8; 4095];
            assert!(decompress(c.id(), &z, &mut short).is_none(), "{c}");
        }
    }
}
