//! A parallel map in which the calling thread does its share.
//!
//! A write compresses the units of its request on every core, and a read decodes them the
//! same way. rayon's parallel iterators, called from a thread outside rayon's pool (an NBD
//! connection thread, a bench client), hand all the work to the pool and park the caller
//! until it is done: on two cores the caller sleeps while the pool's two threads work, and
//! between requests those threads spin looking for more (issue 13's profile: 20 % of both
//! cores idle or yielding during sequential writes). Here the caller claims items itself from a
//! shared counter while helpers on the pool claim from the same counter; a helper that starts
//! late, because the pool is busy with another request's items, finds nothing left and returns
//! at once. With as many callers as cores, each mostly does its own items.
//!
//! A caller counts from the start of its request to its end ([`busy`], taken by the volume's
//! read and write), not only while it is inside `map`: two clients on two cores each spend part
//! of every request outside `map` (placing units under the state lock, handing segments to
//! the storage), and a helper woken in that gap only steals the other client's core (stop 22:
//! 2-thread lz4 writes 15 % faster without such helpers).

use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads inside a request ([`busy`]) or inside [`map`] now, across the process.
static CALLERS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is counted in [`CALLERS`] now (requests nest: a partial-block write
    /// reads the block it patches).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Applies `f` to every item, in parallel, on the calling thread and up to one helper per core
/// that no other caller is using; returns the results in the order of `items`. Fewer than
/// `min_items` items run on the calling thread alone (waking a helper costs more than it saves),
/// and so do all items when there are as many callers as cores: then every core already has its
/// caller, and waking helpers only costs (a sixth of two cores' time on 128 KiB reads).
pub fn map<I: Send, T: Send>(items: Vec<I>, min_items: usize, f: impl Fn(I) -> T + Sync) -> Vec<T> {
    let n = items.len();
    if n < min_items.max(2) {
        return items.into_iter().map(f).collect();
    }
    let _caller = busy();
    // rayon's pool has one thread per core this process may use (affinity counted).
    let idle = rayon::current_num_threads().saturating_sub(CALLERS.load(Ordering::Relaxed));
    let helpers = idle.min(n - 1);
    if helpers == 0 {
        return items.into_iter().map(f).collect();
    }
    // One slot per item: its input until claimed, then its result. Each slot is taken by the
    // one thread that claimed its index, so its lock is never contended.
    let slots: Vec<Mutex<Slot<I, T>>> = items
        .into_iter()
        .map(|i| Mutex::new(Slot::Input(i)))
        .collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = slots.get(k) else { break };
        let input = std::mem::replace(&mut *slot.lock(), Slot::Taken);
        if let Slot::Input(i) = input {
            let out = f(i);
            *slot.lock() = Slot::Output(out);
        }
    };
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| work());
        }
        work();
    });
    slots
        .into_iter()
        .map(|s| match s.into_inner() {
            Slot::Output(t) => t,
            // in_place_scope returns only once every spawned helper has returned, and every
            // index below `n` was claimed by a thread that ran `work` to the end.
            Slot::Input(_) | Slot::Taken => unreachable!("par::map: an item was left undone"),
        })
        .collect()
}

/// Counts the calling thread in [`CALLERS`] until the guard is dropped (also on unwind); a
/// thread already counted is not counted twice.
pub fn busy() -> Caller {
    if COUNTED.with(Cell::get) {
        return Caller(false, std::marker::PhantomData);
    }
    COUNTED.with(|c| c.set(true));
    CALLERS.fetch_add(1, Ordering::Relaxed);
    Caller(true, std::marker::PhantomData)
}

/// See [`busy`]; `true` when this guard did the counting. Not `Send`: dropped on another
/// thread it would clear that thread's count.
pub struct Caller(bool, std::marker::PhantomData<*const ()>);

impl Drop for Caller {
    fn drop(&mut self) {
        if self.0 {
            CALLERS.fetch_sub(1, Ordering::Relaxed);
            COUNTED.with(|c| c.set(false));
        }
    }
}

enum Slot<I, T> {
    Input(I),
    Taken,
    Output(T),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_and_each_item_runs_once() {
        let runs = AtomicUsize::new(0);
        for n in [0, 1, 2, 3, 17, 1000] {
            runs.store(0, Ordering::Relaxed);
            let out = map((0..n).collect(), 2, |i: usize| {
                runs.fetch_add(1, Ordering::Relaxed);
                i * 3
            });
            assert_eq!(out, (0..n).map(|i| i * 3).collect::<Vec<_>>());
            assert_eq!(runs.load(Ordering::Relaxed), n);
        }
    }

    #[test]
    fn items_may_be_mutable_borrows() {
        let mut data = [0u8; 64];
        let parts: Vec<(usize, &mut [u8])> = data.chunks_mut(4).enumerate().collect();
        let _ = map(parts, 2, |(k, p)| p.fill(k as u8));
        for (k, p) in data.chunks(4).enumerate() {
            assert!(p.iter().all(|&b| b == k as u8));
        }
    }

    /// A panicking item reaches the caller, on whichever thread it ran, and leaves no caller
    /// counted: were `Caller` not dropped on unwind, every later map would run without helpers.
    #[test]
    fn a_panic_reaches_the_caller_and_does_not_stay_counted() {
        const ROUNDS: usize = 64;
        let caller = std::thread::current().id();
        let mut helped = 0;
        for round in 0..ROUNDS {
            let on_helper = std::sync::atomic::AtomicBool::new(false);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                map((0..64).collect(), 2, |i: usize| {
                    if std::thread::current().id() != caller {
                        on_helper.store(true, Ordering::SeqCst);
                        panic!("item {i} on a helper");
                    }
                    // Every other round the caller panics too.
                    assert!(round % 2 == 0 || i != 63, "item {i} on the caller");
                    i
                })
            }));
            let helper_ran = on_helper.load(Ordering::SeqCst);
            helped += usize::from(helper_ran);
            assert_eq!(
                r.is_err(),
                helper_ran || round % 2 == 1,
                "round {round}: a panic was lost, or one came from nowhere"
            );
        }
        // Other tests of this binary may be inside `map` now, a few at most.
        assert!(
            CALLERS.load(Ordering::Relaxed) < ROUNDS / 2,
            "callers stay counted after panics"
        );
        let out = map((0..100).collect(), 2, |i: usize| i + 1);
        assert_eq!(out, (1..101).collect::<Vec<_>>());
        eprintln!("helpers took items in {helped} of {ROUNDS} rounds");
    }

    /// A thread inside a request counts as a caller while it is outside `map` too: with a
    /// two-thread pool and another thread busy, a map runs all its items on its caller.
    #[test]
    fn a_busy_thread_elsewhere_keeps_helpers_away() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let (entered, go) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let on_helpers = std::thread::scope(|s| {
            s.spawn(|| {
                let _busy = busy();
                entered.wait();
                go.wait();
            });
            entered.wait();
            let on_helpers = pool.install(|| {
                let caller = std::thread::current().id();
                // Items long enough that a woken helper would surely take some.
                let out = map((0..200).collect(), 2, |_: usize| {
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(50) {
                        std::hint::spin_loop();
                    }
                    std::thread::current().id() == caller
                });
                out.iter().filter(|on_caller| !**on_caller).count()
            });
            go.wait();
            on_helpers
        });
        assert_eq!(on_helpers, 0, "helpers ran beside a busy thread");
    }

    #[test]
    fn nested_busy_counts_a_thread_once_and_until_the_outer_guard_ends() {
        let counted = || COUNTED.with(Cell::get);
        assert!(!counted());
        let outer = busy();
        let inner = busy();
        assert!(counted());
        drop(inner);
        assert!(
            counted(),
            "the inner guard ended the count of the outer request"
        );
        drop(outer);
        assert!(!counted());
    }

    /// Maps inside the items of a map, on the pool's own threads (where a waiting scope runs
    /// other items on the same stack) and from outside: every result comes back, nothing
    /// hangs, and each thread is counted after an inner map exactly as before it.
    #[test]
    fn nested_maps_on_pool_threads_finish_and_leave_counts_as_they_were() {
        let counted = || COUNTED.with(Cell::get);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let nested = || {
            map((0..16).collect(), 2, |i: usize| {
                let before = counted();
                let inner = map((0..16).collect(), 2, |j: usize| {
                    let before = counted();
                    let sum: usize = map((0..8).collect(), 2, |k: usize| k).iter().sum();
                    assert_eq!(counted(), before, "innermost map changed the count");
                    j + sum
                });
                assert_eq!(counted(), before, "inner map changed the count");
                inner.iter().sum::<usize>() + i
            })
        };
        let want: Vec<usize> = (0..16)
            .map(|i| (0..16).map(|j| j + 28).sum::<usize>() + i)
            .collect();
        assert_eq!(pool.install(nested), want);
        assert_eq!(nested(), want);
        assert!(!counted(), "the caller stays counted");
    }

    /// With one thread in the pool (one core, or a process pinned to one), everything runs on
    /// the caller and nothing waits for a helper.
    #[test]
    fn one_core_runs_every_item_on_the_caller() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        pool.install(|| {
            let caller = std::thread::current().id();
            let out = map((0..50).collect(), 2, |i: usize| {
                assert_eq!(std::thread::current().id(), caller, "item {i} on a helper");
                i * 2
            });
            assert_eq!(out, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        });
    }
}
