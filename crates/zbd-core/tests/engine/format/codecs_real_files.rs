//! Codec round-trips on real files of this machine: text, ELF binaries and already-compressed
//! files, block by block for every codec, then through a volume per codec.

use crate::common::*;
use std::path::{Path, PathBuf};
use zbd_core::{codec, Codec, CreateOptions};

const PER_KIND_BYTES: usize = 2 << 20;

/// Up to `PER_KIND_BYTES` of 4 KiB blocks from files matching `pick`, under `dirs`.
fn gather(dirs: &[&str], pick: &dyn Fn(&Path, &[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
    while let Some(p) = stack.pop() {
        if out.len() >= PER_KIND_BYTES {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                let mut entries: Vec<PathBuf> =
                    rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
                entries.sort();
                stack.extend(entries.into_iter().rev());
            }
        } else if meta.is_file() && meta.len() >= 4096 && meta.len() < 64 << 20 {
            if let Ok(data) = std::fs::read(&p) {
                if pick(&p, &data) {
                    let n = (data.len() / 4096 * 4096).min(256 << 10);
                    out.extend_from_slice(&data[..n]);
                }
            }
        }
    }
    out.truncate(out.len().min(PER_KIND_BYTES) / 4096 * 4096);
    out
}

fn corpora() -> Vec<(&'static str, Vec<u8>)> {
    let text = gather(
        &["/usr/share/doc", "/usr/share/common-licenses", "/etc"],
        &|p, d| {
            p.extension().is_none_or(|e| e != "gz")
                && d.iter()
                    .take(4096)
                    .all(|&b| b == b'\n' || b == b'\t' || (32..127).contains(&b))
        },
    );
    let elf = gather(&["/usr/bin", "/usr/lib/x86_64-linux-gnu"], &|_, d| {
        d.starts_with(b"\x7fELF")
    });
    let gz = gather(&["/usr/share/doc", "/usr/share/man"], &|p, d| {
        p.extension().is_some_and(|e| e == "gz") && d.starts_with(&[0x1f, 0x8b])
    });
    vec![("text", text), ("elf", elf), ("gz", gz)]
}

#[test]
fn every_codec_round_trips_real_files() {
    let mut kinds = 0;
    for (name, data) in corpora() {
        if data.is_empty() {
            eprintln!("skipping {name}: no such files on this machine");
            continue;
        }
        kinds += 1;
        for c in Codec::all_defaults() {
            let mut out = vec![0u8; 4096];
            let mut packed = 0usize;
            for block in data.chunks_exact(4096) {
                match c.compress(block) {
                    Some(z) => {
                        packed += z.len();
                        assert!(
                            codec::decompress(c.id(), &z, &mut out).is_some(),
                            "{name} {c}: decode failed"
                        );
                        assert!(out == block, "{name} {c}: round trip differs");
                    }
                    None => packed += 4096,
                }
            }
            eprintln!(
                "{name:>5} {c:<8} {:.1} % saved",
                100.0 * (1.0 - packed as f64 / data.len() as f64)
            );
        }
    }
    assert!(
        kinds >= 2,
        "found fewer than two kinds of real files to test with"
    );
}

#[test]
fn volumes_store_real_files_with_every_codec() {
    let all: Vec<u8> = corpora()
        .into_iter()
        .flat_map(|(_, d)| d.into_iter().take(512 << 10))
        .collect();
    assert!(!all.is_empty());
    let size = (all.len() as u64).div_ceil(1 << 20) * (1 << 20);
    for c in Codec::all_defaults() {
        let opts = CreateOptions {
            codec: c,
            ..CreateOptions::new(size)
        };
        let (_disk, vol) = sim_volume(&opts);
        vol.write(0, &all, false).expect("write");
        let mut back = vec![0u8; all.len()];
        vol.read(0, &mut back).expect("read");
        assert!(back == all, "{c}: volume round trip differs");
        let s = vol.stats();
        if c == Codec::None {
            assert_eq!(s.raw_blocks, s.data_blocks);
        } else {
            assert!(
                s.physical_bytes_live < s.logical_bytes_in_use,
                "{c}: no savings at all on real files"
            );
        }
    }
}
