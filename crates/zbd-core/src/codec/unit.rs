//! Multi-block compression units: N consecutive 4 KiB logical blocks compressed as one stream,
//! while the map keeps 4 KiB granularity (each block of a unit points at the unit and knows its
//! index in it). A read of one block decodes no more than its unit: zstd stops as soon as the
//! block is out (blocks after it are never decoded); the other codecs decode the whole unit.
//!
//! Units are formed only from runs of non-zero blocks (zero blocks stay a map state) and end at
//! LBAs that are multiples of the unit size, so a rewrite of an aligned range by the filesystem
//! replaces whole units ([`plan_units`]). What the engine does with them: docs/savings.md.

use super::dict::{DictId, Dictionary, ZSTD_DCTX};
use super::{id, Codec};
use crate::error::{Error, Result};
use crate::format::MAP_ENTRIES_PER_PAGE;
use std::ops::Range;
use zstd::zstd_safe;

/// Logical block size.
pub const BLOCK_BYTES: usize = 4096;
/// Largest unit this module handles (128 KiB: btrfs's chunk size, for comparisons). The engine's
/// own limit is lower (docs/savings.md: a stored unit must fit in one extent).
pub const UNIT_BLOCKS_MAX: usize = 32;
/// A unit stays compressed only if that saves at least one sector (the engine's rule for blocks).
pub const SECTOR_BYTES: usize = 512;

/// A unit as the engine would store it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredUnit {
    /// Codec id of `bytes` ([`id::RAW`] when compression did not pay).
    pub codec_id: u8,
    /// Dictionary used (0 = none).
    pub dict_id: DictId,
    /// Logical blocks in the unit.
    pub blocks: u16,
    /// Stored bytes.
    pub bytes: Vec<u8>,
}

/// Compresses `data` (1..=[`UNIT_BLOCKS_MAX`] whole blocks) as one unit with `codec`, and `dict`
/// when given. The result is raw when compression saves less than a sector, so a unit never
/// stores more than `none` would.
pub fn compress_unit(codec: Codec, dict: Option<&Dictionary>, data: &[u8]) -> Result<StoredUnit> {
    let blocks = data.len() / BLOCK_BYTES;
    if !data.len().is_multiple_of(BLOCK_BYTES) || !(1..=UNIT_BLOCKS_MAX).contains(&blocks) {
        return Err(Error::Invalid(format!(
            "unit of {} bytes: expected 1..={UNIT_BLOCKS_MAX} whole 4 KiB blocks",
            data.len()
        )));
    }
    let z = match dict {
        Some(d) if !Dictionary::supports(codec) => {
            return Err(Error::Invalid(format!(
                "codec {codec} takes no dictionary (dictionary {})",
                d.id()
            )))
        }
        Some(d) => d.compress(codec, data),
        None => codec.compress(data),
    };
    Ok(match z {
        Some(z) if z.len() + SECTOR_BYTES <= data.len() => StoredUnit {
            codec_id: codec.id(),
            dict_id: dict.map_or(0, Dictionary::id),
            blocks: blocks as u16,
            bytes: z,
        },
        _ => StoredUnit {
            codec_id: id::RAW,
            dict_id: 0,
            blocks: blocks as u16,
            bytes: data.to_vec(),
        },
    })
}

/// The dictionary a unit needs, checked against the one given. `None` = mismatch.
fn dict_for<'d>(unit: &StoredUnit, dict: Option<&'d Dictionary>) -> Option<Option<&'d Dictionary>> {
    match (unit.dict_id, dict) {
        (0, _) => Some(None),
        (want, Some(d)) if d.id() == want && Dictionary::supports_id(unit.codec_id) => {
            Some(Some(d))
        }
        _ => None,
    }
}

/// Decodes a whole unit into `out` (exactly `blocks * 4096` bytes). `dict` must be the unit's
/// dictionary when it has one. `None` on any failure; the caller reports the unit's blocks as
/// corrupt.
pub fn decompress_unit(unit: &StoredUnit, dict: Option<&Dictionary>, out: &mut [u8]) -> Option<()> {
    if out.len() != usize::from(unit.blocks) * BLOCK_BYTES || unit.blocks == 0 {
        return None;
    }
    match dict_for(unit, dict)? {
        Some(d) => d.decompress(unit.codec_id, &unit.bytes, out),
        None => super::decompress(unit.codec_id, &unit.bytes, out),
    }
}

/// Decodes block `index` of `unit` into `out` (4096 bytes), decoding no more than the unit and,
/// for zstd, nothing past the block. `scratch` is reused between calls to avoid allocations.
pub fn read_block(
    unit: &StoredUnit,
    dict: Option<&Dictionary>,
    index: usize,
    scratch: &mut Vec<u8>,
    out: &mut [u8],
) -> Option<()> {
    let d = dict_for(unit, dict)?;
    read_stored_block(
        unit.codec_id,
        d,
        &unit.bytes,
        usize::from(unit.blocks),
        index,
        scratch,
        out,
    )
}

/// [`read_block`] on the parts of a unit as the engine keeps them (stored bytes in place, codec
/// and block count from the map entry); `dict` is the unit's dictionary, already checked.
pub fn read_stored_block(
    codec_id: u8,
    dict: Option<&Dictionary>,
    stored: &[u8],
    blocks: usize,
    index: usize,
    scratch: &mut Vec<u8>,
    out: &mut [u8],
) -> Option<()> {
    if index >= blocks || out.len() != BLOCK_BYTES {
        return None;
    }
    let full = blocks * BLOCK_BYTES;
    let want = (index + 1) * BLOCK_BYTES;
    match codec_id {
        id::RAW => {
            if stored.len() != full {
                return None;
            }
            out.copy_from_slice(&stored[index * BLOCK_BYTES..want]);
            return Some(());
        }
        // The last block needs the whole stream: the exact-length check of a full decode is free.
        id::ZSTD if want < full => {
            scratch.resize(want, 0);
            match dict {
                Some(d) => d.decompress_zstd_prefix(stored, scratch)?,
                None => ZSTD_DCTX.with(|c| {
                    let mut c = c.borrow_mut();
                    let r = zstd_stream_prefix(&mut c, stored, scratch);
                    let _ = c.reset(zstd_safe::ResetDirective::SessionAndParameters);
                    r
                })?,
            }
        }
        _ => {
            scratch.resize(full, 0);
            match dict {
                Some(d) => d.decompress(codec_id, stored, scratch)?,
                None => super::decompress(codec_id, stored, scratch)?,
            }
        }
    }
    out.copy_from_slice(&scratch[index * BLOCK_BYTES..want]);
    Some(())
}

/// Streams `stored` (one zstd frame) until `out` is full. The engine checks the CRC of the stored
/// bytes before decoding, so a correct prefix of a checked stream is correct data.
pub(super) fn zstd_stream_prefix(
    d: &mut zstd_safe::DCtx<'static>,
    stored: &[u8],
    out: &mut [u8],
) -> Option<()> {
    let want = out.len();
    let mut input = zstd_safe::InBuffer::around(stored);
    let mut output = zstd_safe::OutBuffer::around(out);
    loop {
        let before = (input.pos(), output.pos());
        let hint = d.decompress_stream(&mut output, &mut input).ok()?;
        if output.pos() == want {
            return Some(());
        }
        // Frame ended, or no progress: the stream holds less than `out` needs.
        if hint == 0 || before == (input.pos(), output.pos()) {
            return None;
        }
    }
}

/// Splits the blocks of a write starting at `first_lba` into units of at most `unit_blocks`:
/// only runs of non-zero blocks (`nonzero[i]`) form units, and a unit never crosses an LBA that
/// is a multiple of `unit_blocks` or of a map page's 255 entries. Returns index ranges into the
/// write; zero blocks are in none.
///
/// Why map pages: with shared blocks (docs/design.md, "Map trees, pages and pairs") a unit that
/// spans two leaves makes a change to one leaf a change to its neighbour too; cutting there
/// costs one shorter unit per 255 blocks.
pub fn plan_units(first_lba: u64, nonzero: &[bool], unit_blocks: usize) -> Vec<Range<usize>> {
    let n = unit_blocks.clamp(1, UNIT_BLOCKS_MAX);
    let mut units = Vec::new();
    let mut start: Option<usize> = None;
    for (i, &nz) in nonzero.iter().enumerate() {
        let lba = first_lba + i as u64;
        let aligned =
            lba.is_multiple_of(n as u64) || lba.is_multiple_of(MAP_ENTRIES_PER_PAGE as u64);
        if let Some(s) = start {
            if !nz || aligned {
                units.push(s..i);
                start = None;
            }
        }
        if nz && start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        units.push(s..nonzero.len());
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::dict::{train, Dictionary};

    /// Real files of this repository (sources and docs), cut into 4 KiB blocks: what a
    /// filesystem on zbd holds.
    fn repo_blocks() -> Vec<Vec<u8>> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut data = Vec::new();
        for dir in ["src", "../../docs", "../zbd/src/commands"] {
            let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
                .expect("repo dir")
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            for f in files {
                let mut b = std::fs::read(f).expect("read");
                b.resize(b.len().div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
                data.extend_from_slice(&b);
            }
        }
        data.chunks_exact(BLOCK_BYTES).map(<[u8]>::to_vec).collect()
    }

    fn codecs() -> [Codec; 4] {
        [Codec::Lz4, Codec::Zstd(1), Codec::Zlib(1), Codec::Lzo]
    }

    #[test]
    fn units_decode_exactly_to_their_blocks() {
        let blocks = repo_blocks();
        assert!(blocks.len() >= 64, "only {} blocks", blocks.len());
        let mut scratch = Vec::new();
        let mut one = vec![0u8; BLOCK_BYTES];
        for codec in codecs() {
            for n in [1, 2, 4, 16, 32] {
                for group in blocks.chunks(n).take(40) {
                    let data = group.concat();
                    let u = compress_unit(codec, None, &data).expect("compress");
                    assert!(u.bytes.len() <= data.len());
                    let mut out = vec![0u8; data.len()];
                    decompress_unit(&u, None, &mut out).expect("decode");
                    assert_eq!(out, data, "{codec} x{n}");
                    for (k, b) in group.iter().enumerate() {
                        read_block(&u, None, k, &mut scratch, &mut one).expect("block");
                        assert_eq!(&one, b, "{codec} x{n} block {k}");
                    }
                    assert!(read_block(&u, None, group.len(), &mut scratch, &mut one).is_none());
                    // Asking for more or fewer blocks than the unit holds is an error.
                    let mut wrong = vec![0u8; data.len() + BLOCK_BYTES];
                    assert!(decompress_unit(&u, None, &mut wrong).is_none());
                }
            }
        }
    }

    #[test]
    fn bigger_units_and_dictionaries_save_space_on_real_files() {
        let blocks = repo_blocks();
        // Train on every 4th block, measure the others (disjoint).
        let sample: Vec<&Vec<u8>> = blocks.iter().step_by(4).collect();
        let held: Vec<u8> = blocks
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 4 != 0)
            .flat_map(|(_, b)| b.iter().copied())
            .collect();
        let content = train(&sample, 16 * 1024).expect("train");
        let dict = Dictionary::new(3, Codec::Zstd(1), 0, content).expect("dict");
        let size = |n: usize, d: Option<&Dictionary>| -> usize {
            held.chunks(n * BLOCK_BYTES)
                .map(|c| {
                    let u = compress_unit(Codec::Zstd(1), d, c).expect("unit");
                    let mut out = vec![0u8; c.len()];
                    decompress_unit(&u, d, &mut out).expect("decode");
                    assert_eq!(out, c);
                    u.bytes.len()
                })
                .sum()
        };
        let (b1, b16, d1) = (size(1, None), size(16, None), size(1, Some(&dict)));
        assert!(b16 < b1, "16-block units {b16} vs per-block {b1}");
        assert!(d1 < b1, "dictionary {d1} vs none {b1}");
        // A dictionary unit without its dictionary (or with another) never decodes.
        let u = compress_unit(Codec::Zstd(1), Some(&dict), &held[..8192]).expect("unit");
        assert_eq!(u.dict_id, 3);
        let mut out = vec![0u8; 8192];
        assert!(decompress_unit(&u, None, &mut out).is_none());
        let other = Dictionary::new(4, Codec::Zstd(1), 0, dict.content().to_vec()).expect("d");
        assert!(decompress_unit(&u, Some(&other), &mut out).is_none());
    }

    #[test]
    fn incompressible_units_stay_raw_and_bad_sizes_are_errors() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4 * BLOCK_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for codec in codecs() {
            let u = compress_unit(codec, None, &noise).expect("unit");
            assert_eq!((u.codec_id, u.bytes.len()), (id::RAW, noise.len()));
        }
        assert!(compress_unit(Codec::Lz4, None, &noise[..100]).is_err());
        assert!(compress_unit(Codec::Lz4, None, &[]).is_err());
        assert!(compress_unit(Codec::Lz4, None, &vec![1; 33 * BLOCK_BYTES]).is_err());
    }

    #[test]
    fn damaged_units_never_decode_silently_to_the_wrong_length() {
        let data = repo_blocks()[..8].concat();
        for codec in [Codec::Lz4, Codec::Zstd(1), Codec::Zlib(1)] {
            let u = compress_unit(codec, None, &data).expect("unit");
            let mut cut = u.clone();
            cut.bytes.truncate(u.bytes.len() / 2);
            let mut out = vec![0u8; data.len()];
            assert!(decompress_unit(&cut, None, &mut out).is_none(), "{codec}");
            let mut scratch = Vec::new();
            let mut one = vec![0u8; BLOCK_BYTES];
            assert!(
                read_block(&cut, None, 7, &mut scratch, &mut one).is_none(),
                "{codec}"
            );
        }
    }

    #[test]
    fn plan_units_skips_zeros_and_respects_alignment() {
        let nz = [true, true, true, false, true, true, true, true, true, true];
        // Write starts at LBA 6, units of 4: boundaries at LBA 8 and 12 (indexes 2 and 6).
        assert_eq!(plan_units(6, &nz, 4), vec![0..2, 2..3, 4..6, 6..10]);
        assert_eq!(plan_units(0, &[false; 5], 4), Vec::<Range<usize>>::new());
        assert_eq!(plan_units(0, &[true; 3], 1), vec![0..1, 1..2, 2..3]);
        // A map page boundary (LBA 255, 510) cuts a unit too.
        assert_eq!(plan_units(248, &[true; 16], 16), vec![0..7, 7..8, 8..16]);
        for first in [0u64, 200, 250, 509] {
            for u in plan_units(first, &[true; 600], 16) {
                let (a, b) = (first + u.start as u64, first + u.end as u64 - 1);
                assert_eq!(a / 255, b / 255, "unit {a}..={b} spans a map page boundary");
            }
        }
    }
}
