//! `zbd copy`: write a file into a volume at an offset, read it back and compare.
//! A small end-to-end path through the engine for the demo (until the NBD server lands).

use anyhow::{anyhow, bail, Result};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use zbd_core::{FileStorage, OpenOptions, Volume};

/// Arguments of `zbd copy`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file or block device.
    volume: PathBuf,
    /// File to write into the volume.
    input: PathBuf,
    /// Byte offset in the volume.
    #[arg(long, default_value = "0")]
    offset: String,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let offset = super::size_arg("--offset", &a.offset)?;
    let storage =
        FileStorage::open(&a.volume, true).map_err(|e| anyhow!("{}: {e}", a.volume.display()))?;
    let vol = Volume::open(Box::new(storage), OpenOptions::default())
        .map_err(|e| anyhow!("{}: {e}", a.volume.display()))?;
    crate::dedup_index::restore(&vol, Some(&a.volume));
    let mut f = std::fs::File::open(&a.input).map_err(|e| anyhow!("{}: {e}", a.input.display()))?;
    let len = f.metadata()?.len();
    if offset.saturating_add(len) > vol.size_bytes() {
        bail!(
            "{} ({} bytes) does not fit at --offset {offset} in a {}-byte volume",
            a.input.display(),
            len,
            vol.size_bytes()
        );
    }
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = offset;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        vol.write(pos, &buf[..n], false)?;
        pos += n as u64;
    }
    vol.flush()?;
    let wt = t.elapsed();
    let t = Instant::now();
    let mut f = std::fs::File::open(&a.input)?;
    let mut back = vec![0u8; 1 << 20];
    let mut pos = offset;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        vol.read(pos, &mut back[..n])?;
        if back[..n] != buf[..n] {
            bail!(
                "read back differs from {} at volume byte {pos}",
                a.input.display()
            );
        }
        pos += n as u64;
    }
    let rt = t.elapsed();
    vol.close()?;
    crate::dedup_index::save(&vol, Some(&a.volume));
    let mb = len as f64 / 1e6;
    println!(
        "copied {} ({:.1} MB): write {:.0} MB/s, read back and verified {:.0} MB/s",
        a.input.display(),
        mb,
        mb / wt.as_secs_f64(),
        mb / rt.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
