//! The cleaner's choice of victims: a pure function of the extents' accounting (state in,
//! choice out), so it can be tested and changed without the engine.

use crate::extents::{ExtentInfo, ExtentState};
use crate::format::{RECORD_BYTES, SECTOR_BYTES, SEGMENT_HEADER_BYTES};
use std::cmp::Ordering;

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
    let u = f64::from(x.live_bytes()) / extent_bytes;
    let age = (f64::from((now as u32).wrapping_sub(x.stamp()))) + 1.0;
    (1.0 - u) * age / (1.0 + u)
}

/// Bytes an extent's live blocks take in an output extent (payload and records).
fn footprint(x: &ExtentInfo) -> usize {
    // v2 segments carry their record table twice (v1 once: the estimate errs on the safe side).
    x.live_bytes() as usize + x.live_blocks() as usize * 2 * RECORD_BYTES
}

/// Candidates ranked before the greedy loop runs: 32 times the victims a pass takes, so the
/// loop ends within them unless it skips nearly all of them (candidates that would need more
/// outputs than the pass may use).
const RANKED: usize = 4096;

/// A candidate: its key (lower is better) and extent. Ordered by key, then extent: a total
/// order, so every way of sorting candidates gives the same sequence.
type Candidate = (f64, u32);

fn order(a: &Candidate, b: &Candidate) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
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
    choose_ranking(extents, busy, now, extent_bytes, mode, outputs_max, RANKED).0
}

/// How [`choose_ranking`] found its answer (tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The greedy loop ended within the ranked candidates, or they were all of them.
    Ranked,
    /// The loop ran through the ranked candidates, and no other fits the outputs left.
    NothingElseFits,
    /// The loop ran through the ranked candidates: every candidate sorted, and the loop again.
    FullSort,
}

/// [`choose_victims`] ranking the best `ranked` candidates only: one pass over the extents
/// keeps them in a buffer of twice that, cut back to its best half (`select_nth_unstable_by`)
/// whenever it fills, and a candidate ranked after the last one kept is not added at all. Those
/// are sorted and the greedy loop runs over them; what it would do over every candidate sorted
/// is the same unless it runs past them without reaching its goal, and even then unless some
/// other candidate still fits the outputs left (the smallest footprint of those cut is kept
/// for that). Only then are all candidates sorted.
fn choose_ranking(
    extents: &[ExtentInfo],
    busy: &[u32],
    now: u64,
    extent_bytes: usize,
    mode: Mode,
    outputs_max: usize,
    ranked: usize,
) -> (Vec<u32>, Path) {
    let usable = extent_bytes - 2 * SEGMENT_HEADER_BYTES - SECTOR_BYTES;
    let mut busy = busy.to_vec();
    busy.sort_unstable();
    let candidates = || {
        extents
            .iter()
            .enumerate()
            .filter(|(i, x)| {
                x.state() == ExtentState::Closed
                    && footprint(x) < usable
                    && busy.binary_search(&(*i as u32)).is_err()
            })
            .map(|(i, x)| {
                let key = match mode {
                    Mode::Incremental => -cost_benefit(x, extent_bytes as f64, now),
                    Mode::Compact => f64::from(x.live_bytes()),
                };
                (key, i as u32)
            })
    };
    let ranked = ranked.max(1);
    let mut best: Vec<Candidate> = Vec::with_capacity(2 * ranked);
    // The worst candidate kept by the last cut, and the smallest footprint of those left out.
    let mut bar: Option<Candidate> = None;
    let mut cut_min: Option<usize> = None;
    let cut = |best: &mut Vec<Candidate>, cut_min: &mut Option<usize>| {
        best.select_nth_unstable_by(ranked - 1, order);
        for &(_, v) in &best[ranked..] {
            let f = footprint(&extents[v as usize]);
            *cut_min = Some(cut_min.map_or(f, |m| m.min(f)));
        }
        best.truncate(ranked);
        best[ranked - 1]
    };
    for c in candidates() {
        if bar.is_some_and(|b| order(&c, &b) == Ordering::Greater) {
            let f = footprint(&extents[c.1 as usize]);
            cut_min = Some(cut_min.map_or(f, |m| m.min(f)));
            continue;
        }
        best.push(c);
        if best.len() == 2 * ranked {
            bar = Some(cut(&mut best, &mut cut_min));
        }
    }
    if best.len() > ranked {
        cut(&mut best, &mut cut_min);
    }
    best.sort_unstable_by(order);
    let (victims, need, done) = greedy(&best, extents, usable, mode, outputs_max);
    let Some(cut_min) = cut_min.filter(|_| !done) else {
        return (victims, Path::Ranked);
    };
    // A candidate joins only if `need + footprint` fits `outputs_max` outputs.
    if cut_min > outputs_max.saturating_mul(usable).saturating_sub(need) {
        return (victims, Path::NothingElseFits);
    }
    let mut all: Vec<Candidate> = candidates().collect();
    all.sort_unstable_by(order);
    (
        greedy(&all, extents, usable, mode, outputs_max).0,
        Path::FullSort,
    )
}

/// Takes candidates in order while their live blocks fit `outputs_max` outputs, until the pass
/// would gain `PASS_GAIN_TARGET` extents (incremental) or has `PASS_VICTIMS_MAX` victims: the
/// victims, the output bytes they need and whether it stopped at that goal.
fn greedy(
    sorted: &[Candidate],
    extents: &[ExtentInfo],
    usable: usize,
    mode: Mode,
    outputs_max: usize,
) -> (Vec<u32>, usize, bool) {
    let mut victims = Vec::new();
    let mut need = 0usize;
    for &(_, v) in sorted {
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
            return (victims, need, true);
        }
    }
    (victims, need, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `choose_victims` as it was before it ranked only the best candidates: every candidate
    /// collected and sorted, then the greedy loop. The reference the new one must match.
    fn reference(
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
                x.state() == ExtentState::Closed
                    && footprint(x) < usable
                    && !busy.contains(&(*i as u32))
            })
            .map(|(i, x)| {
                let key = match mode {
                    Mode::Incremental => -cost_benefit(x, extent_bytes as f64, now),
                    Mode::Compact => f64::from(x.live_bytes()),
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

    fn state() -> impl Strategy<Value = ExtentState> {
        prop_oneof![
            1 => Just(ExtentState::Free),
            1 => Just(ExtentState::Open),
            6 => Just(ExtentState::Closed),
            1 => Just(ExtentState::PendingFree),
        ]
    }

    /// An extent: live share in 1/1000 of the extent (a few values often, so keys tie), live
    /// blocks, age (a few values often, likewise).
    fn entry() -> impl Strategy<Value = (ExtentState, u32, u32, u32)> {
        (
            state(),
            prop_oneof![0u32..1000, (0u32..4).prop_map(|k| k * 250)],
            0u32..40,
            prop_oneof![any::<u32>(), (0u32..3).prop_map(|k| k * 1000)],
        )
    }

    fn table(entries: &[(ExtentState, u32, u32, u32)], extent_bytes: usize) -> Vec<ExtentInfo> {
        entries
            .iter()
            .map(|&(state, per_mille, live_blocks, stamp)| {
                let live_bytes = (extent_bytes as u64 * u64::from(per_mille) / 1000) as u32;
                ExtentInfo::new(state, live_bytes, live_blocks, stamp)
            })
            .collect()
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Incremental), Just(Mode::Compact)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Over random tables, modes, busy sets and output limits, and any number of ranked
        /// candidates (small, so that cuts, the "nothing else fits" end and the full sort all
        /// happen), the choice is exactly the reference's.
        #[test]
        fn ranking_chooses_what_sorting_everything_chose(
            entries in proptest::collection::vec(entry(), 0..400),
            extent_bytes in prop_oneof![Just(8usize << 10), Just(32 << 10), Just(128 << 10)],
            now in any::<u64>(),
            mode in mode(),
            busy in proptest::collection::vec(0u32..420, 0..24),
            outputs_max in 0usize..72,
            ranked in 1usize..48,
        ) {
            let extents = table(&entries, extent_bytes);
            let want = reference(&extents, &busy, now, extent_bytes, mode, outputs_max);
            let (got, _) =
                choose_ranking(&extents, &busy, now, extent_bytes, mode, outputs_max, ranked);
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(
                choose_victims(&extents, &busy, now, extent_bytes, mode, outputs_max),
                want
            );
        }
    }

    fn closed(live_bytes: u32, live_blocks: u32, stamp: u32) -> ExtentInfo {
        ExtentInfo::new(ExtentState::Closed, live_bytes, live_blocks, stamp)
    }

    const EB: usize = 128 << 10;

    /// Each way to the answer is taken where it should be, with the reference's answer.
    #[test]
    fn each_path_gives_the_reference_answer() {
        let check = |extents: &[ExtentInfo], mode: Mode, outputs_max: usize, path: Path| {
            let want = reference(extents, &[], 1 << 30, EB, mode, outputs_max);
            let got = choose_ranking(extents, &[], 1 << 30, EB, mode, outputs_max, 256);
            assert_eq!(got, (want, path), "{mode:?}, {outputs_max} outputs");
        };
        // Mostly dead extents: the goal is reached within the best 256.
        let empty: Vec<ExtentInfo> = (0..5000)
            .map(|i| closed(4096 + i * 7 % 20_000, 3, i))
            .collect();
        check(&empty, Mode::Incremental, 64, Path::Ranked);
        check(&empty, Mode::Compact, 64, Path::Ranked);
        // Nearly full extents: the outputs fill before the goal and nothing smaller is left.
        let full: Vec<ExtentInfo> = (0..5000)
            .map(|i| closed(120_000 + i * 13 % 8000, 40, i))
            .collect();
        check(&full, Mode::Incremental, 64, Path::NothingElseFits);
        check(&full, Mode::Compact, 64, Path::NothingElseFits);
        // The same, with one small extent far down the ranking (young): it may still fit.
        let mut young = full.clone();
        young[4321] = closed(30_000, 10, (1 << 30) - 1);
        check(&young, Mode::Incremental, 64, Path::FullSort);
    }

    /// A candidate left out of the ranking whose footprint fills the outputs left exactly is
    /// still taken (the boundary of the "nothing else fits" end).
    #[test]
    fn a_candidate_that_exactly_fills_the_outputs_left_is_taken() {
        let usable = EB - 2 * SEGMENT_HEADER_BYTES - SECTOR_BYTES;
        let now = 1u64 << 30;
        // Old and fuller first; young, ranked after it, filling the one output exactly.
        let first = closed(70_000, 1, 0);
        let fill = (usable - footprint(&first)) as u32;
        let extents = [first, closed(fill - 2 * RECORD_BYTES as u32, 1, now as u32)];
        let want = reference(&extents, &[], now, EB, Mode::Incremental, 1);
        assert_eq!(want, [0, 1]);
        assert_eq!(
            choose_ranking(&extents, &[], now, EB, Mode::Incremental, 1, 1),
            (want, Path::FullSort)
        );
        // One byte more and it no longer fits: no sort needed.
        let extents = [
            first,
            closed(fill + 1 - 2 * RECORD_BYTES as u32, 1, now as u32),
        ];
        assert_eq!(
            choose_ranking(&extents, &[], now, EB, Mode::Incremental, 1, 1),
            (vec![0], Path::NothingElseFits)
        );
    }

    /// At the real ranking width, on a table wider than its buffer, with busy extents.
    #[test]
    fn the_default_ranking_matches_on_a_large_table() {
        let mut x: u64 = 99;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        let extents: Vec<ExtentInfo> = (0..40_000)
            .map(|_| {
                let live = next() % EB as u32;
                let mut e = closed(live, live / 2048 + 1, next());
                if next() % 10 == 0 {
                    e = e.with_state(ExtentState::Free);
                }
                e
            })
            .collect();
        let busy: Vec<u32> = (0..200).map(|_| next() % 40_000).collect();
        for mode in [Mode::Incremental, Mode::Compact] {
            for outputs_max in [1, 8, 64] {
                assert_eq!(
                    choose_victims(&extents, &busy, 12345, EB, mode, outputs_max),
                    reference(&extents, &busy, 12345, EB, mode, outputs_max),
                    "{mode:?}, {outputs_max} outputs"
                );
            }
        }
    }
}
