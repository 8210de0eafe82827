//! `zbd bench cleaner`: cost of cleaning. Random 4 KiB overwrites of compressible blocks at a
//! given live fraction of the data area: throughput relative to writing into an empty volume,
//! and write amplification (device bytes / host bytes, cleaner share shown apart). A second run
//! records throughput over time while the background cleaner starts and stops (CSV).

use anyhow::{anyhow, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use zbd_core::{CreateOptions, FileStorage, OpenOptions, Volume};

const BS: usize = 4096;

/// A block lz4 stores in about 2 KiB (half random, half zeros), like typical mixed data.
fn block(rng: &mut SmallRng) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    let n = rng.random_range(1500..2600);
    rng.fill(&mut b[..n]);
    b
}

fn volume(
    dir: &Path,
    name: &str,
    capacity: u64,
    background: bool,
    metadata_pages: bool,
) -> Result<(PathBuf, Volume)> {
    let path = dir.join(name);
    let opts = CreateOptions {
        capacity_bytes: Some(capacity),
        metadata_pages,
        ..super::bench::file_volume(capacity * 4)
    };
    let sb = zbd_core::layout::plan(&opts)?;
    let open = OpenOptions {
        background_cleaner: background,
        ..OpenOptions::default()
    };
    let vol = Volume::create_with(
        Box::new(FileStorage::create(&path, sb.total_bytes())?),
        &opts,
        open,
    )?;
    Ok((path, vol))
}

struct Level {
    live_pct: u64,
    mb_s: f64,
    wa: f64,
    cleaner_share: f64,
    /// Writes that cleaned with every other request waiting, and writes that found space
    /// short and cleaned with the lock released (`Stats`).
    locked: u64,
    space_short: u64,
}

/// Fills to `live_pct` % of the data area, then overwrites randomly `factor` x capacity.
fn level(dir: &Path, capacity: u64, live_pct: u64, factor: u64, pages: bool) -> Result<Level> {
    let (path, vol) = volume(dir, "level.zbd", capacity, false, pages)?;
    let mut rng = SmallRng::seed_from_u64(live_pct);
    let mut blocks = 0u64;
    // Of the data area data may use: a bit-10 volume's carved metadata extents lie inside it.
    let s = vol.stats();
    let carved = s.metadata_bytes - vol.superblock().metadata_bytes();
    let target = (s.data_area_bytes - carved) * live_pct / 100;
    while vol.stats().physical_bytes_live < target {
        for _ in 0..256 {
            vol.write(blocks * BS as u64, &block(&mut rng), false)?;
            blocks += 1;
        }
    }
    // Empty volume: first writes spread over the whole logical space (nothing to clean).
    let span = if live_pct == 0 {
        vol.size_bytes() / BS as u64
    } else {
        blocks
    };
    let before = vol.stats().counters;
    // The empty volume gets 70 % of its capacity written once; the others `factor` x capacity.
    let n = if live_pct == 0 {
        capacity * 7 / 10 / 2100
    } else {
        factor * capacity / 2048
    };
    let t = Instant::now();
    for _ in 0..n {
        let lba = rng.random_range(0..span);
        vol.write(lba * BS as u64, &block(&mut rng), false)?;
    }
    vol.flush()?;
    let secs = t.elapsed().as_secs_f64();
    let stats = vol.stats();
    let after = stats.counters;
    drop(vol);
    std::fs::remove_file(&path)?;
    let host = (after.host_bytes_written - before.host_bytes_written) as f64;
    let cleaner = (after.cleaner_bytes_written - before.cleaner_bytes_written) as f64;
    let device = (after.data_bytes_written + after.metadata_bytes_written
        - before.data_bytes_written
        - before.metadata_bytes_written) as f64
        + cleaner;
    Ok(Level {
        live_pct,
        mb_s: n as f64 * BS as f64 / secs / 1e6,
        wa: device / host,
        cleaner_share: cleaner / device.max(1.0),
        locked: stats.locked_cleanings,
        space_short: stats.space_short_rounds,
    })
}

/// Throughput over time at 55 % live with the background cleaner (watermarks 10 / 25 %), bursts
/// of random overwrites separated by idle periods: free space falls below the low watermark, the
/// cleaner brings it back to the high one (during bursts and idle time) and stops.
fn series(dir: &Path, capacity: u64, factor: u64, csv: &Path, pages: bool) -> Result<()> {
    let (path, vol) = volume(dir, "series.zbd", capacity, true, pages)?;
    let mut rng = SmallRng::seed_from_u64(99);
    let mut f = std::fs::File::create(csv).map_err(|e| anyhow!("--csv {}: {e}", csv.display()))?;
    writeln!(
        f,
        "seconds,host_mb_s,free_extents_pct,cleaner_runs,cleaner_mib_moved"
    )?;
    let blocks = capacity * 55 / 100 / 2100;
    for i in 0..blocks {
        vol.write(i * BS as u64, &block(&mut rng), false)?;
    }
    let t0 = Instant::now();
    let sample = |f: &mut std::fs::File, written: u64, since: f64| -> Result<f64> {
        let now = t0.elapsed().as_secs_f64();
        let s = vol.stats();
        let mb_s = written as f64 * BS as f64 / (now - since).max(1e-6) / 1e6;
        let free = 100.0 * s.extents_free as f64 / s.extents_total as f64;
        writeln!(
            f,
            "{now:.3},{mb_s:.1},{free:.1},{},{}",
            s.counters.cleaner_runs,
            s.counters.cleaner_bytes_moved >> 20
        )?;
        Ok(now)
    };
    let burst = capacity / 4 / 2100;
    let mut last = 0.0;
    for _ in 0..factor * 2 {
        let mut n = 0;
        for _ in 0..burst {
            let lba = rng.random_range(0..blocks);
            vol.write(lba * BS as u64, &block(&mut rng), false)?;
            n += 1;
            if n == 1000 {
                last = sample(&mut f, n, last)?;
                n = 0;
            }
        }
        for _ in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            last = sample(&mut f, 0, last)?;
        }
    }
    drop(vol);
    std::fs::remove_file(&path)?;
    Ok(())
}

/// Plots the series as SVG: host MB/s (blue, left scale) and free extents % (orange, 0..100 %,
/// dashed lines at the default 10 % / 25 % watermarks) over seconds.
fn plot(csv: &Path, svg: &Path) -> Result<()> {
    let text = std::fs::read_to_string(csv)?;
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').filter_map(|v| v.parse().ok()).collect())
        .filter(|r: &Vec<f64>| r.len() >= 3)
        .collect();
    let (w, h, m) = (800.0, 300.0, 40.0);
    let t_max = rows.iter().map(|r| r[0]).fold(1e-9, f64::max);
    let mb_max = rows.iter().map(|r| r[1]).fold(1e-9, f64::max);
    let x = |t: f64| m + t / t_max * (w - 2.0 * m);
    let y = |v: f64, max: f64| h - m - v / max * (h - 2.0 * m);
    let line = |col: usize, max: f64| {
        rows.iter()
            .map(|r| format!("{:.1},{:.1}", x(r[0]), y(r[col], max)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut o = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    o += &format!("<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n");
    for pct in [10.0, 25.0] {
        o += &format!("<line x1=\"{m}\" x2=\"{}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"orange\" stroke-dasharray=\"4 4\"/>\n", w - m, y(pct, 100.0));
    }
    o += &format!(
        "<polyline fill=\"none\" stroke=\"steelblue\" points=\"{}\"/>\n",
        line(1, mb_max)
    );
    o += &format!(
        "<polyline fill=\"none\" stroke=\"darkorange\" stroke-width=\"2\" points=\"{}\"/>\n",
        line(2, 100.0)
    );
    o += &format!("<text x=\"{m}\" y=\"20\">host MB/s (blue, max {mb_max:.0}) and free extents % (orange, 0-100 %; dashed: 10 / 25 % watermarks)</text>\n");
    o += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{t_max:.1} s</text>\n</svg>\n",
        w - m,
        h - 10.0
    );
    std::fs::write(svg, o).map_err(|e| anyhow!("{}: {e}", svg.display()))?;
    Ok(())
}

pub fn run(
    capacity: u64,
    factor: u64,
    csv: Option<PathBuf>,
    pages: bool,
    dir: &Path,
) -> Result<ExitCode> {
    let mut rows = Vec::new();
    for pct in [0u64, 50, 75, 90] {
        let r = level(dir, capacity, pct, factor, pages);
        rows.push(r.map_err(|e| anyhow!("{pct} % live: {e}"))?);
    }
    let empty = rows[0].mb_s;
    println!("4 KiB random overwrites, ~2 KiB stored per block, data area {} MiB, {factor}x capacity per level", capacity >> 20);
    println!(
        "{:<8} {:>10} {:>10} {:>8} {:>14} {:>15} {:>12}",
        "live", "MB/s", "x empty", "WA", "cleaner share", "locked cleans", "space short"
    );
    for r in &rows {
        println!(
            "{:<8} {:>10.0} {:>10.2} {:>8.2} {:>13.0}% {:>15} {:>12}",
            format!("{} %", r.live_pct),
            r.mb_s,
            r.mb_s / empty,
            r.wa,
            100.0 * r.cleaner_share,
            r.locked,
            r.space_short
        );
    }
    if let Some(csv) = csv {
        series(dir, capacity, factor, &csv, pages)?;
        let svg = csv.with_extension("svg");
        plot(&csv, &svg)?;
        println!(
            "time series written to {} (plot: {})",
            csv.display(),
            svg.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
