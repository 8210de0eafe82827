//! Thin provisioning as a server runs it (docs/design.md, "Thin provisioning"): the space
//! reserve's size, the warning threshold on the data area, and what a write does when the data
//! area is full. The engine keeps the reserve and queues writes (`Volume::write_or_wait`); this
//! module chooses the numbers, watches the threshold and reports them (`zbd stat`, metrics).

use crate::served::ServedVolume;
use anyhow::{bail, Result};
use std::sync::Weak;
use std::time::Duration;
use zbd_core::Space;

/// Default warning threshold: % of the data area's writable part (below) holding live (stored)
/// data and map pages.
pub const WARN_USED_PCT_DEFAULT: u8 = 80;
/// Default of `--when-full-timeout`: how long a queued write waits for room (dm-thin's
/// `no_space_timeout` is 60 s too).
pub const WHEN_FULL_TIMEOUT_SECONDS_DEFAULT: u64 = 60;
/// The default reserve is this fraction of the data area (ZFS keeps 1/32 of a pool as "slop
/// space" for the same reason: operations that free space need some to run)...
const RESERVE_FRACTION: u64 = 32;
/// ... at least this much: ext4 makes a 16 MiB journal on a filesystem of 512 MiB..1 GiB, and
/// its replay after ENOSPC writes at most that much, mostly over blocks it wrote before...
const RESERVE_BYTES_MIN: u64 = 16 << 20;
/// ... at most this much ...
const RESERVE_BYTES_MAX: u64 = 64 << 30;
/// ... and never more than this fraction of a small data area.
const RESERVE_FRACTION_MAX: u64 = 8;
/// How often the server looks at the data area for the warning threshold.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// What a write does when the data area is full (`zbd serve --when-full`), as dm-thin's
/// `error_if_no_space`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenFull {
    /// Fail with ENOSPC at once.
    Error,
    /// Wait (up to --when-full-timeout) for the cleaner or a trim to make room, then ENOSPC.
    Queue,
}

/// The thin-provisioning settings of an open volume.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Warn when live data and map pages reach this % of the writable part of the data area.
    pub warn_used_pct: u8,
    /// Space reserve, bytes (0: none).
    pub reserve_bytes: u64,
    /// What a write does when the data area is full.
    pub when_full: WhenFull,
    /// How long a queued write waits.
    pub when_full_timeout: Duration,
    /// Settings of a server (false: the defaults a server would use, for an offline `zbd stat`).
    pub served: bool,
}

impl Settings {
    /// The defaults `zbd serve` uses for a data area of `data_area_bytes`.
    pub fn defaults(data_area_bytes: u64) -> Settings {
        Settings {
            warn_used_pct: WARN_USED_PCT_DEFAULT,
            reserve_bytes: default_reserve_bytes(data_area_bytes),
            when_full: WhenFull::Error,
            when_full_timeout: Duration::from_secs(WHEN_FULL_TIMEOUT_SECONDS_DEFAULT),
            served: false,
        }
    }
}

/// The reserve `zbd serve` keeps unless told otherwise: 1/32 of the data area, 16 MiB..64 GiB,
/// at most 1/8 of it.
pub fn default_reserve_bytes(data_area_bytes: u64) -> u64 {
    (data_area_bytes / RESERVE_FRACTION)
        .clamp(RESERVE_BYTES_MIN, RESERVE_BYTES_MAX)
        .min(data_area_bytes / RESERVE_FRACTION_MAX)
}

/// Parses `--reserve`: `auto`, a size (`16M`, `0`) or a share of the data area (`5%`).
pub fn parse_reserve(text: &str, data_area_bytes: u64) -> Result<u64> {
    if text == "auto" {
        return Ok(default_reserve_bytes(data_area_bytes));
    }
    if let Some(pct) = text.strip_suffix('%') {
        match pct.trim().parse::<u8>() {
            Ok(p) if p <= 50 => return Ok(data_area_bytes * u64::from(p) / 100),
            _ => bail!("--reserve '{text}': a percentage must be 0% to 50%"),
        }
    }
    let bytes = crate::commands::size_arg("--reserve", text)?;
    if bytes > data_area_bytes / 2 {
        bail!(
            "--reserve '{text}': more than half the data area ({})",
            crate::commands::human(data_area_bytes)
        );
    }
    Ok(bytes)
}

/// Used bytes as a % of the data area. Used: live data and the extents carved for map pages
/// (with snapshots, 11 % of the area in `scripts/snapshot-versions-full.sh`: counting live
/// data alone, ENOSPC came before the 80 % warning).
pub fn used_pct(used_bytes: u64, data_area_bytes: u64) -> f64 {
    if data_area_bytes == 0 {
        0.0
    } else {
        100.0 * used_bytes as f64 / data_area_bytes as f64
    }
}

/// Live data and map pages as % of what writes may fill (the threshold's measure) and as %
/// of the whole data area.
fn used_shares(space: &Space) -> (f64, f64) {
    let used_bytes = space.live_bytes + space.metadata_extent_bytes;
    (
        used_pct(used_bytes, space.writable_bytes),
        used_pct(used_bytes, space.data_area_bytes),
    )
}

/// `zbd stat`'s thin-provisioning figures (`thin` in `--json`).
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct Report {
    /// Live (stored) data and map pages carved from it, as a % of the data area.
    pub data_area_used_pct: f64,
    /// Bytes of the data area host writes may fill: less the reserve and the cleaner's last
    /// extent. Used reaches it at ENOSPC.
    pub writable_bytes: u64,
    /// Live data and map pages as a % of `writable_bytes`.
    pub writable_used_pct: f64,
    /// The warning threshold, a % of `writable_bytes` (on a large data area the reserve is a
    /// few %; on a small one a large share, and a share of the whole area would come
    /// after ENOSPC).
    pub warn_used_pct: u8,
    /// Whether `writable_used_pct` is at or above the threshold.
    pub above_warn: bool,
    /// Space reserve, bytes (offline: what `zbd serve` would keep by default).
    pub reserve_bytes: u64,
    /// Whether the reserve is lent to writes (the volume opened full; see docs/operations.md).
    pub reserve_lent: bool,
    pub when_full: WhenFull,
    pub when_full_timeout_seconds: u64,
    /// Whether these are a server's settings (false: the defaults of `zbd serve`).
    pub served: bool,
}

impl Report {
    pub fn of(space: &Space, s: &Settings) -> Report {
        let (writable, area) = used_shares(space);
        Report {
            data_area_used_pct: area,
            writable_bytes: space.writable_bytes,
            writable_used_pct: writable,
            warn_used_pct: s.warn_used_pct,
            above_warn: writable >= f64::from(s.warn_used_pct),
            reserve_bytes: s.reserve_bytes,
            reserve_lent: space.reserve_lent,
            when_full: s.when_full,
            when_full_timeout_seconds: s.when_full_timeout.as_secs(),
            served: s.served,
        }
    }

    pub fn of_stats(stats: &zbd_core::Stats, s: &Settings) -> Report {
        let space = Space {
            live_bytes: stats.physical_bytes_live,
            data_area_bytes: stats.data_area_bytes,
            metadata_extent_bytes: stats.metadata_extent_bytes,
            extents_free: stats.extents_free,
            reserve_bytes: stats.reserve_bytes,
            reserve_lent: stats.reserve_lent,
            writable_bytes: stats.writable_bytes,
        };
        Report::of(&space, s)
    }
}

/// Remembers which side of the warning threshold the data area was on, so that crossing it
/// logs one line each way (and again after falling back and crossing again). The served
/// volume keeps it under a lock held while the line is logged (`ServedVolume::watch_space`).
#[derive(Default)]
pub struct Threshold {
    above: bool,
}

impl Threshold {
    /// The line to log if `space` crossed the threshold since the last call.
    pub fn crossed(&mut self, space: &Space, warn_used_pct: u8) -> Option<String> {
        let (used, area) = used_shares(space);
        let above = used >= f64::from(warn_used_pct);
        if std::mem::replace(&mut self.above, above) == above {
            return None;
        }
        let human = crate::commands::human;
        Some(if above {
            format!(
                "zbd: warning: data area {used:.1} % used ({} live data and {} map pages of the \
                 {} writes may fill, {:.1} % of the {} area), above the {warn_used_pct} % \
                 threshold; writes fail with ENOSPC when the free space falls to the reserve \
                 ({}) and the cleaner's: trim or delete snapshots (which frees their data and \
                 the map extents they emptied), or zbd grow --capacity (docs/operations.md, \
                 \"Thin provisioning\")",
                human(space.live_bytes),
                human(space.metadata_extent_bytes),
                human(space.writable_bytes),
                area,
                human(space.data_area_bytes),
                human(space.reserve_bytes)
            )
        } else {
            format!("zbd: data area {used:.1} % used, back below the {warn_used_pct} % threshold")
        })
    }
}

/// Watches the data area while the volume is served (and across an online grow, which
/// changes it): one log line when the warning threshold is crossed either way
/// (`ServedVolume::watch_space`). Holds the served volume weakly: the thread ends once the
/// server drops it.
pub fn spawn_watch(served: Weak<ServedVolume>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("zbd-thin".into())
        .spawn(move || loop {
            let Some(served) = served.upgrade() else {
                return;
            };
            served.watch_space();
            drop(served);
            std::thread::park_timeout(WATCH_PERIOD);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(live: u64) -> Space {
        Space {
            live_bytes: live,
            data_area_bytes: 1000,
            metadata_extent_bytes: 0,
            extents_free: 0,
            reserve_bytes: 0,
            reserve_lent: false,
            writable_bytes: 1000,
        }
    }

    #[test]
    fn threshold_logs_once_each_way() {
        let mut t = Threshold::default();
        assert_eq!(t.crossed(&space(500), 80), None);
        assert!(t
            .crossed(&space(800), 80)
            .is_some_and(|l| l.contains("80 % threshold")));
        assert_eq!(t.crossed(&space(900), 80), None);
        assert!(t
            .crossed(&space(100), 80)
            .is_some_and(|l| l.contains("back below")));
        assert_eq!(t.crossed(&space(100), 80), None);
        assert!(t.crossed(&space(850), 80).is_some());
    }

    #[test]
    fn map_pages_carved_from_the_data_area_count_as_used() {
        let mut t = Threshold::default();
        let mut s = space(700);
        assert_eq!(t.crossed(&s, 80), None);
        s.metadata_extent_bytes = 110;
        let line = t.crossed(&s, 80).expect("crossed");
        assert!(line.contains("81.0 % used"), "{line}");
        assert!(line.contains("110 B map pages"), "{line}");
    }

    /// The threshold is a share of what writes may fill: with a fifth of a small data area
    /// kept free for the cleaner and the reserve, 70 % of the area is 87.5 % of that.
    #[test]
    fn the_threshold_is_a_share_of_what_writes_may_fill() {
        let mut t = Threshold::default();
        let mut s = space(600);
        s.writable_bytes = 800;
        assert_eq!(t.crossed(&s, 80), None, "600 of 800 is 75 %");
        s.live_bytes = 700;
        let line = t.crossed(&s, 80).expect("700 of 800 writable crosses 80 %");
        assert!(line.contains("87.5 % used"), "{line}");
        assert!(line.contains("70.0 % of the"), "{line}");
        let r = Report::of(&s, &Settings::defaults(1000));
        assert!(
            r.above_warn && (r.writable_used_pct - 87.5).abs() < 1e-9,
            "{r:?}"
        );
        assert!((r.data_area_used_pct - 70.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn reserve_defaults_and_parses() {
        assert_eq!(default_reserve_bytes(128 << 20), 16 << 20);
        assert_eq!(default_reserve_bytes(64 << 20), 8 << 20);
        assert_eq!(default_reserve_bytes(1 << 40), 32 << 30);
        assert_eq!(default_reserve_bytes(8 << 40), 64 << 30);
        assert_eq!(parse_reserve("0", 1 << 30).ok(), Some(0));
        assert_eq!(parse_reserve("10%", 1000).ok(), Some(100));
        assert_eq!(parse_reserve("4M", 1 << 30).ok(), Some(4 << 20));
        assert!(parse_reserve("60%", 1 << 30).is_err());
        assert!(parse_reserve("1G", 1 << 30).is_err());
    }
}
