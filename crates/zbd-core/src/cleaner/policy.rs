//! The cleaner's choice of victims: a pure function of the extents' accounting (state in,
//! choice out), so it can be tested and changed without the engine.

use crate::extents::{ExtentInfo, ExtentState};
use crate::format::{RECORD_BYTES, SECTOR_BYTES, SEGMENT_HEADER_BYTES};

/// How a pass chooses its victims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Background / foreground cleaning: cost-benefit, stop at the gain target.
    Incremental,
    /// Offline compaction: least live first, as many as one pass allows.
    Compact,
}

/// Net extents an incremental pass aims to free.
const PASS_GAIN_TARGET: usize = 8;
/// Victims per pass at most.
const PASS_VICTIMS_MAX: usize = 128;
fn cost_benefit(x: &ExtentInfo, extent_bytes: f64, now: u64) -> f64 {
    let u = f64::from(x.live_bytes) / extent_bytes;
    let age = (f64::from((now as u32).wrapping_sub(x.stamp))) + 1.0;
    (1.0 - u) * age / (1.0 + u)
}

/// Bytes an extent's live blocks take in an output extent (payload and records).
fn footprint(x: &ExtentInfo) -> usize {
    // v2 segments carry their record table twice (v1 once: the estimate errs on the safe side).
    x.live_bytes as usize + x.live_blocks as usize * 2 * RECORD_BYTES
}

/// Chooses the victims of a pass, best first, from the extents' accounting alone: `busy` are
/// victims of a pass in progress, `now` the write sequence (for age).
pub(super) fn choose_victims(
    extents: &[ExtentInfo],
    busy: &[u32],
    now: u64,
    extent_bytes: usize,
    mode: Mode,
    outputs_max: usize,
) -> Vec<u32> {
    let usable = extent_bytes - 2 * SEGMENT_HEADER_BYTES - SECTOR_BYTES;
    let mut cands: Vec<(f64, u32)> = extents
        .iter()
        .enumerate()
        .filter(|(i, x)| {
            x.state == ExtentState::Closed && footprint(x) < usable && !busy.contains(&(*i as u32))
        })
        .map(|(i, x)| {
            let key = match mode {
                Mode::Incremental => -cost_benefit(x, extent_bytes as f64, now),
                Mode::Compact => f64::from(x.live_bytes),
            };
            (key, i as u32)
        })
        .collect();
    cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut victims = Vec::new();
    let mut need = 0usize;
    for &(_, v) in &cands {
        let add = footprint(&extents[v as usize]);
        if (need + add).div_ceil(usable) > outputs_max {
            continue;
        }
        victims.push(v);
        need += add;
        let gain = victims.len().saturating_sub(need.div_ceil(usable));
        if (mode == Mode::Incremental && gain >= PASS_GAIN_TARGET)
            || victims.len() >= PASS_VICTIMS_MAX
        {
            break;
        }
    }
    victims
}
