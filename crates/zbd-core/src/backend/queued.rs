//! The I/O layer below the engine: a [`Storage`] wrapper that queues writes and discards to a
//! small pool of I/O threads, so that the engine's writes return at once (the bytes are copied)
//! and several device writes are in flight at a time, while reads go straight to the device.
//!
//! Rules it keeps (docs/design.md, "I/O layer"):
//! - `sync` waits for every write and discard issued before it, then syncs the storage below.
//! - An error is never lost: the first write error since the last sync fails the next `sync`.
//!   The failed write stays queued (reads still see it) and every later `sync` retries it
//!   first, failing for as long as it fails, so no sync claims durability of a write that did
//!   not reach the storage. The engine puts its fence (`fence.rs`) above this layer: the first
//!   failed sync fails the volume and no later sync gets here, so a retry that succeeds never
//!   un-fails it (the volume stays failed until reopened).
//! - A read sees every write queued before it: it reads the device, then lays the queued bytes of
//!   the range over what it read (so it never waits for a write).
//! - Operations on overlapping ranges run in issue order: the later one waits for the earlier.
//! - The bytes queued are bounded: a writer waits when the queue is full.
//! - A storage call that panics fails its operation with an I/O error; the thread lives on.
//!
//! A test mode ([`IoOptions::reorder_seed`]) uses no threads: it holds writes and discards and
//! issues them, in a seeded random order, when a sync, a full queue or an overlapping operation
//! needs them, so crash tests replay exactly while writes complete out of issue order.

use crate::backend::Storage;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Default I/O threads: writes of different extents overlap on the device; most of their time is
/// spent waiting, so a few more threads than cores are cheap.
pub const IO_THREADS_DEFAULT: usize = 4;
/// Default bound on bytes queued and not yet written.
pub const QUEUE_BYTES_DEFAULT: usize = 32 << 20;
/// Each this many bytes waiting for an I/O thread wake one more sleeping thread. Waking a thread
/// per 32 KiB segment cost ~8 % of a one-core write in RAM (the wake-up and the switch on the
/// writer's core); a thread that is awake keeps taking work until the queue is empty, so a
/// backlog still gets every thread, and anyone who waits on the queue (sync, an overlapping or
/// blocked write, drop) wakes what it needs at once.
const WAKE_BYTES: usize = 256 << 10;
/// What a discard counts toward `WAKE_BYTES`.
const DISCARD_WEIGHT: usize = 4 << 10;

/// How the engine issues storage writes.
#[derive(Clone, Debug)]
pub struct IoOptions {
    /// I/O threads; 0 with no `reorder_seed` means every write is done by the caller, in order.
    pub threads: usize,
    /// Bytes queued before writers wait.
    pub queue_bytes: usize,
    /// Tests: no threads; hold writes and issue them in a random order from this seed.
    pub reorder_seed: Option<u64>,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            threads: IO_THREADS_DEFAULT,
            queue_bytes: QUEUE_BYTES_DEFAULT,
            reorder_seed: None,
        }
    }
}

impl IoOptions {
    /// Every write done by the caller, in order, before `write_at` returns.
    pub fn synchronous() -> Self {
        IoOptions {
            threads: 0,
            ..IoOptions::default()
        }
    }

    /// Test mode: writes held and issued in a random order from `seed` (see module doc).
    pub fn reordered(seed: u64) -> Self {
        IoOptions {
            threads: 0,
            reorder_seed: Some(seed),
            ..IoOptions::default()
        }
    }

    /// Whether these options queue at all.
    pub fn queues(&self) -> bool {
        self.threads > 0 || self.reorder_seed.is_some()
    }
}

/// One queued operation.
struct Op {
    offset: u64,
    len: u64,
    /// Bytes to write (shared with the caller when it wrote them with `write_shared`); `None`
    /// for a discard.
    data: Option<Arc<[u8]>>,
}

impl Op {
    fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// What it counts toward `WAKE_BYTES`.
    fn weight(&self) -> usize {
        self.data.as_ref().map_or(DISCARD_WEIGHT, |d| d.len())
    }
}

#[derive(Default)]
struct Queue {
    next_id: u64,
    /// Every operation not yet completed, by issue id.
    pending: BTreeMap<u64, Arc<Op>>,
    /// Pending operations by offset (they never overlap each other): id.
    by_offset: BTreeMap<u64, u64>,
    /// Ids not yet taken by a worker (threads) or not yet issued (reorder mode), in issue order.
    waiting: VecDeque<u64>,
    /// Weight (`Op::weight`) of the operations in `waiting`.
    unissued: usize,
    /// Workers waiting for work, and wake-ups sent to them not yet taken.
    sleeping: usize,
    wakes: usize,
    /// Threads waiting for queued operations to complete (sync, drop, a blocked write): while
    /// there is one, every waiting operation gets a thread.
    urgent: usize,
    /// Bytes of data pending.
    bytes: usize,
    /// Pending writes that failed, to be retried by the next sync (ids, issue order).
    failed: Vec<u64>,
    /// First write error (kind, message) not yet reported by a sync.
    error: Option<(io::ErrorKind, String)>,
    stop: bool,
    rng: Option<SmallRng>,
}

impl Queue {
    /// Ids of pending operations overlapping `[offset, end)`, in issue order.
    fn overlapping(&self, offset: u64, end: u64) -> Vec<u64> {
        let mut ids: Vec<u64> = Vec::new();
        if let Some((_, &id)) = self.by_offset.range(..offset).next_back() {
            if self.pending[&id].end() > offset {
                ids.push(id);
            }
        }
        ids.extend(self.by_offset.range(offset..end).map(|(_, &id)| id));
        ids.sort_unstable();
        ids
    }

    fn complete(&mut self, id: u64, result: Result<()>) {
        let Some(op) = self.pending.get(&id) else {
            return;
        };
        // Discards are best effort (docs/format.md): their errors are dropped.
        if let (Err(e), Some(_)) = (&result, &op.data) {
            if self.error.is_none() {
                self.error = Some((kind_of(e), e.to_string()));
            }
            self.failed.push(id);
            return;
        }
        if let Some(op) = self.pending.remove(&id) {
            self.by_offset.remove(&op.offset);
            self.bytes -= op.data.as_ref().map_or(0, |d| d.len());
        }
    }

    /// Whether an operation issued before `mark` is still running or waiting (failed ones are
    /// done until retried).
    fn busy_before(&self, mark: u64) -> bool {
        self.pending
            .range(..mark)
            .any(|(id, _)| !self.failed.contains(id))
    }

    /// The unreported error, as the error of the sync that reports it.
    fn take_error(&mut self) -> Result<()> {
        match self.error.take() {
            None => Ok(()),
            Some((kind, msg)) => Err(Error::Io(io::Error::new(
                kind,
                format!("a queued write failed: {msg}"),
            ))),
        }
    }
}

fn kind_of(e: &Error) -> io::ErrorKind {
    match e {
        Error::Io(e) => e.kind(),
        _ => io::ErrorKind::Other,
    }
}

struct Shared<S> {
    storage: S,
    queue: Mutex<Queue>,
    /// Workers wait here for work.
    work: Condvar,
    /// Writers, syncs and reorder-mode issuers wait here for completions.
    done: Condvar,
    queue_bytes: usize,
    reorder: bool,
    /// I/O threads (0 in reorder mode).
    threads: usize,
}

impl<S: Storage> Shared<S> {
    /// Reorder mode: issues every held operation, in a random order, from the calling thread.
    fn issue_held(&self, q: &mut parking_lot::MutexGuard<'_, Queue>) {
        let mut ids: Vec<u64> = q.waiting.drain(..).collect();
        q.unissued = 0;
        if ids.is_empty() {
            return;
        }
        if let Some(rng) = q.rng.as_mut() {
            ids.shuffle(rng);
        }
        let ops: Vec<(u64, Arc<Op>)> = ids
            .iter()
            .map(|id| (*id, Arc::clone(&q.pending[id])))
            .collect();
        for (id, op) in ops {
            let r = parking_lot::MutexGuard::unlocked(q, || self.run(&op));
            q.complete(id, r);
        }
        self.done.notify_all();
    }

    /// Retries failed writes, in issue order, from the calling thread; the first that fails
    /// again stops the retry and is returned (it stays failed).
    fn retry_failed(&self, q: &mut parking_lot::MutexGuard<'_, Queue>) -> Result<()> {
        while !q.failed.is_empty() {
            let id = q.failed.remove(0);
            let Some(op) = q.pending.get(&id).map(Arc::clone) else {
                continue;
            };
            let r = parking_lot::MutexGuard::unlocked(q, || self.run(&op));
            if let Err(e) = r {
                q.failed.insert(0, id);
                return Err(e);
            }
            q.complete(id, Ok(()));
            self.done.notify_all();
        }
        Ok(())
    }

    /// Runs one operation on the storage. A panic in the storage is that operation's I/O error:
    /// unwinding out of a worker would leave it counted as awake (so later work woke no thread)
    /// and its operation pending for ever (so every sync and the drop hung). As an error, the
    /// write fails like any other: the next sync reports it (tripping the engine's fence) and
    /// it is retried.
    fn run(&self, op: &Op) -> Result<()> {
        let call = std::panic::AssertUnwindSafe(|| match &op.data {
            Some(d) => self.storage.write_at(op.offset, d),
            None => self.storage.discard(op.offset, op.len),
        });
        std::panic::catch_unwind(call).unwrap_or_else(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_string());
            let kind = if op.data.is_some() {
                "write"
            } else {
                "discard"
            };
            Err(Error::Io(io::Error::other(format!(
                "the storage panicked in a {kind} at {}: {what}",
                op.offset
            ))))
        })
    }

    fn worker(&self) {
        let mut q = self.queue.lock();
        loop {
            if let Some(id) = q.waiting.pop_front() {
                let op = Arc::clone(&q.pending[&id]);
                q.unissued -= op.weight();
                let r = parking_lot::MutexGuard::unlocked(&mut q, || self.run(&op));
                q.complete(id, r);
                self.done.notify_all();
                continue;
            }
            if q.stop {
                return;
            }
            q.sleeping += 1;
            while q.wakes == 0 && !q.stop {
                self.work.wait(&mut q);
            }
            q.wakes = q.wakes.saturating_sub(1);
            q.sleeping -= 1;
        }
    }

    /// Tells every worker to stop once the queue is empty, and waits until they have.
    fn stop_workers(&self, workers: Vec<JoinHandle<()>>) {
        self.queue.lock().stop = true;
        self.work.notify_all();
        for h in workers {
            let _ = h.join();
        }
    }

    /// Wakes sleeping workers for the work waiting: one per `WAKE_BYTES`, or one per operation
    /// while someone waits on the queue. Called with the queue locked, after anything that adds
    /// work or a waiter.
    fn wake_workers(&self, q: &mut Queue) {
        if self.reorder {
            return;
        }
        let wanted = if q.urgent > 0 {
            q.waiting.len()
        } else {
            q.unissued / WAKE_BYTES
        }
        .min(self.threads);
        let mut awake = self.threads - q.sleeping + q.wakes;
        while awake < wanted && q.wakes < q.sleeping {
            q.wakes += 1;
            awake += 1;
            self.work.notify_one();
        }
    }

    /// Waits for a completion as someone who needs the queue to make progress.
    fn wait_done(&self, q: &mut parking_lot::MutexGuard<'_, Queue>) {
        q.urgent += 1;
        self.wake_workers(q);
        self.done.wait(q);
        q.urgent -= 1;
    }

    /// Queues `op` after every overlapping operation has completed and there is room.
    fn enqueue(&self, op: Op) -> Result<()> {
        let mut q = self.queue.lock();
        let bytes = op.data.as_ref().map_or(0, |d| d.len());
        loop {
            let overlap = q.overlapping(op.offset, op.end());
            let full = q.bytes > 0 && q.bytes + bytes > self.queue_bytes;
            if overlap.is_empty() && !full {
                break;
            }
            // Failed writes wait for a retry that only a sync (or we) would make.
            if !q.failed.is_empty() && (full || overlap.iter().any(|id| q.failed.contains(id))) {
                self.retry_failed(&mut q)?;
                continue;
            }
            // Reorder mode issues what it holds; what another thread is issuing it waits for.
            if self.reorder && !q.waiting.is_empty() {
                self.issue_held(&mut q);
            } else {
                self.wait_done(&mut q);
            }
        }
        let id = q.next_id;
        q.next_id += 1;
        q.bytes += bytes;
        q.unissued += op.weight();
        q.by_offset.insert(op.offset, id);
        q.pending.insert(id, Arc::new(op));
        q.waiting.push_back(id);
        self.wake_workers(&mut q);
        Ok(())
    }
}

/// A [`Storage`] whose writes and discards are queued to I/O threads (see module doc).
pub struct QueuedStorage<S: Storage + 'static> {
    shared: Arc<Shared<S>>,
    workers: Vec<JoinHandle<()>>,
}

impl<S: Storage + 'static> QueuedStorage<S> {
    /// Wraps `storage`; `opts.queues()` must hold (else use `storage` directly).
    pub fn new(storage: S, opts: &IoOptions) -> Result<Self> {
        Self::with_spawn(storage, opts, |name, body| {
            std::thread::Builder::new().name(name).spawn(body)
        })
    }

    /// [`QueuedStorage::new`], starting each I/O thread with `spawn` (tests inject failures).
    fn with_spawn(
        storage: S,
        opts: &IoOptions,
        mut spawn: impl FnMut(String, Box<dyn FnOnce() + Send>) -> io::Result<JoinHandle<()>>,
    ) -> Result<Self> {
        let reorder = opts.reorder_seed.is_some();
        let threads = if reorder { 0 } else { opts.threads.max(1) };
        let shared = Arc::new(Shared {
            storage,
            queue: Mutex::new(Queue {
                rng: opts.reorder_seed.map(SmallRng::seed_from_u64),
                ..Queue::default()
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            queue_bytes: opts.queue_bytes.max(1),
            reorder,
            threads,
        });
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let s = Arc::clone(&shared);
            match spawn(format!("zbd-io-{i}"), Box::new(move || s.worker())) {
                Ok(h) => workers.push(h),
                Err(e) => {
                    // The threads already started would sleep for ever, holding the storage.
                    shared.stop_workers(workers);
                    return Err(Error::Io(e));
                }
            }
        }
        Ok(QueuedStorage { shared, workers })
    }

    /// The storage below.
    pub fn inner(&self) -> &S {
        &self.shared.storage
    }

    /// Waits until every operation issued so far has completed.
    fn drain(&self) {
        let s = &self.shared;
        let mut q = s.queue.lock();
        let mark = q.next_id;
        if s.reorder {
            s.issue_held(&mut q);
        }
        while q.busy_before(mark) {
            s.wait_done(&mut q);
        }
    }
}

impl<S: Storage + 'static> Storage for QueuedStorage<S> {
    fn write_align(&self) -> usize {
        self.shared.storage.write_align()
    }

    fn len_bytes(&self) -> Result<u64> {
        self.shared.storage.len_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut one = [(offset, buf)];
        self.read_many(&mut one).pop().expect("one result per read")
    }

    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        // The queued writes each range overlaps, taken before the reads start.
        let queued: Vec<Vec<Arc<Op>>> = {
            let q = self.shared.queue.lock();
            reads
                .iter()
                .map(|(offset, buf)| {
                    q.overlapping(*offset, offset + buf.len() as u64)
                        .into_iter()
                        .map(|id| Arc::clone(&q.pending[&id]))
                        .collect()
                })
                .collect()
        };
        let mut results = self.shared.storage.read_many(reads);
        // The queued bytes are newer than anything the device may return for a range (whether
        // or not they reached it during our read). Pending operations never overlap each other.
        for (((offset, buf), ops), res) in reads.iter_mut().zip(queued).zip(&mut results) {
            if res.is_err() {
                continue;
            }
            let end = *offset + buf.len() as u64;
            for op in ops {
                let Some(data) = &op.data else { continue };
                let from = op.offset.max(*offset);
                let to = op.end().min(end);
                buf[(from - *offset) as usize..(to - *offset) as usize]
                    .copy_from_slice(&data[(from - op.offset) as usize..(to - op.offset) as usize]);
            }
        }
        results
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_shared(offset, &Arc::from(data))
    }

    fn write_shared(&self, offset: u64, data: &Arc<[u8]>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.shared.enqueue(Op {
            offset,
            len: data.len() as u64,
            data: Some(Arc::clone(data)),
        })
    }

    fn sync(&self) -> Result<()> {
        self.drain();
        {
            let s = &self.shared;
            let mut q = s.queue.lock();
            let reported = q.take_error();
            let retried = s.retry_failed(&mut q);
            reported?;
            retried?;
        }
        self.shared.storage.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.shared.enqueue(Op {
            offset,
            len,
            data: None,
        })
    }
}

impl<S: Storage + 'static> Drop for QueuedStorage<S> {
    fn drop(&mut self) {
        // Queued writes still reach the storage, as a page cache's would after the process died;
        // errors no longer matter to anyone.
        self.drain();
        self.shared.stop_workers(std::mem::take(&mut self.workers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimStorage;
    use rand::Rng;

    fn opts(threads: usize, queue_bytes: usize) -> IoOptions {
        IoOptions {
            threads,
            queue_bytes,
            reorder_seed: None,
        }
    }

    #[test]
    fn reads_see_queued_writes_and_sync_makes_them_durable() {
        for o in [opts(3, 1 << 20), IoOptions::reordered(7)] {
            let disk = Arc::new(SimStorage::new(1 << 16));
            let q = QueuedStorage::new(Arc::clone(&disk), &o).expect("new");
            for i in 0..16u64 {
                q.write_at(i * 1024, &[i as u8 + 1; 1024]).expect("write");
            }
            let mut b = vec![0u8; 3000];
            q.read_at(1500, &mut b).expect("read");
            assert!(b[..548].iter().all(|&x| x == 2));
            assert!(b[548..1572].iter().all(|&x| x == 3));
            assert!(b[1572..2596].iter().all(|&x| x == 4));
            assert!(b[2596..].iter().all(|&x| x == 5));
            q.sync().expect("sync");
            let img = disk.crash_image(&mut SmallRng::seed_from_u64(1));
            for i in 0..16usize {
                assert!(img[i * 1024..(i + 1) * 1024]
                    .iter()
                    .all(|&x| x == i as u8 + 1));
            }
        }
    }

    #[test]
    fn overlapping_writes_land_in_issue_order() {
        for o in [opts(4, 4096), IoOptions::reordered(3)] {
            let disk = Arc::new(SimStorage::new(1 << 14));
            let q = QueuedStorage::new(Arc::clone(&disk), &o).expect("new");
            for v in 1..=50u8 {
                q.write_at(512 * u64::from(v % 3), &[v; 2048])
                    .expect("write");
            }
            q.sync().expect("sync");
            let mut expect = vec![0u8; 1 << 14];
            for v in 1..=50u8 {
                let s = 512 * usize::from(v % 3);
                expect[s..s + 2048].fill(v);
            }
            assert_eq!(disk.current_image(), expect);
        }
    }

    #[test]
    fn a_failed_write_fails_every_sync_until_it_is_written() {
        for o in [opts(2, 1 << 20), IoOptions::reordered(5)] {
            let disk = Arc::new(SimStorage::new(1 << 14));
            let q = QueuedStorage::new(Arc::clone(&disk), &o).expect("new");
            // Past the end: the simulated disk rejects it, every time.
            q.write_at(1 << 14, &[1; 512]).expect("queued");
            q.write_at(0, &[2; 512]).expect("queued");
            assert!(q.sync().is_err(), "sync after a failed write succeeded");
            assert!(q.sync().is_err(), "the failed write was forgotten");
            // Everything else still reached the disk and reads see it.
            let mut b = [0u8; 512];
            q.read_at(0, &mut b).expect("read");
            assert_eq!(b, [2; 512]);
        }
    }

    /// A simulated disk that calls `hook` with the offset of every write before doing it (an
    /// error fails the write).
    struct Hooked<F>(SimStorage, F);

    impl<F: Fn(u64) -> Result<()> + Send + Sync> Storage for Hooked<F> {
        fn len_bytes(&self) -> Result<u64> {
            self.0.len_bytes()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
            (self.1)(offset)?;
            self.0.write_at(offset, data)
        }
        fn sync(&self) -> Result<()> {
            self.0.sync()
        }
        fn discard(&self, offset: u64, len: u64) -> Result<()> {
            self.0.discard(offset, len)
        }
    }

    #[test]
    fn a_transient_write_error_fails_one_sync_then_the_write_is_retried() {
        for o in [opts(2, 1 << 20), IoOptions::reordered(9)] {
            // Fails the first write only.
            let failed = std::sync::atomic::AtomicBool::new(false);
            let disk = Arc::new(Hooked(SimStorage::new(1 << 14), move |_| {
                if failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(Error::Io(io::Error::other("injected")))
                }
            }));
            let q = QueuedStorage::new(Arc::clone(&disk), &o).expect("new");
            q.write_at(4096, &[7; 1024]).expect("queued");
            let mut b = [0u8; 1024];
            q.read_at(4096, &mut b).expect("read");
            assert_eq!(b, [7; 1024], "a failed write vanished from reads");
            assert!(q.sync().is_err(), "the error was lost");
            q.sync().expect("second sync");
            let img = disk.0.crash_image(&mut SmallRng::seed_from_u64(2));
            assert!(
                img[4096..5120].iter().all(|&x| x == 7),
                "retried write not durable"
            );
        }
    }

    /// Returns once every I/O thread waits for work (a state, polled: no thread signals it).
    fn all_asleep<S: Storage>(q: &QueuedStorage<S>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while {
            let s = q.shared.queue.lock();
            s.sleeping - s.wakes < q.shared.threads
        } {
            assert!(
                std::time::Instant::now() < deadline,
                "the I/O threads never went to sleep"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_backlog_is_written_without_a_sync_and_a_small_one_by_drop() {
        let (tx, rx) = std::sync::mpsc::channel();
        let size = 4 * WAKE_BYTES;
        // Reports every write it is given.
        let disk = Arc::new(Hooked(SimStorage::new(size), move |offset| {
            let _ = tx.send(offset);
            Ok(())
        }));
        let q = QueuedStorage::new(Arc::clone(&disk), &opts(2, size)).expect("new");
        // From sleeping threads (a thread still starting up would take the first writes and
        // leave the rest, under WAKE_BYTES, waiting): enough for a thread to wake on its own,
        // so every write arrives, no sync asked.
        all_asleep(&q);
        let n = (WAKE_BYTES / 4096) as u64;
        for i in 0..n {
            q.write_at(i * 4096, &[1; 4096]).expect("write");
        }
        let mut seen: Vec<u64> = (0..n)
            .map(|_| {
                rx.recv_timeout(std::time::Duration::from_secs(120))
                    .expect("a queued write never reached the storage")
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).map(|i| i * 4096).collect::<Vec<_>>());
        // One small write may wait for company; dropping the queue still writes it.
        all_asleep(&q);
        q.write_at(size as u64 - 512, &[9; 512]).expect("write");
        assert!(rx.try_recv().is_err(), "a lone small write woke a thread");
        drop(q);
        assert_eq!(rx.try_recv().ok(), Some(size as u64 - 512));
        assert!(disk.0.current_image()[size - 512..].iter().all(|&x| x == 9));
    }

    /// Writers that each own a region overlap their own writes and discards (so they wait on
    /// the queue), read back, and sync, against every pool size and a queue from one byte to
    /// roomy: nothing hangs, every read sees the writer's model, every sync makes it durable.
    #[test]
    fn stress_overlaps_reads_and_syncs_never_hang_or_lose_a_write() {
        const REGION: usize = 96 << 10;
        const WRITERS: usize = 3;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for threads in [1, 2, 4] {
                for queue_bytes in [1, 3000, 64 << 10, 1 << 20] {
                    let disk = Arc::new(SimStorage::new(REGION * WRITERS));
                    let q = Arc::new(
                        QueuedStorage::new(Arc::clone(&disk), &opts(threads, queue_bytes))
                            .expect("new"),
                    );
                    std::thread::scope(|s| {
                        for w in 0..WRITERS {
                            let (q, disk) = (Arc::clone(&q), Arc::clone(&disk));
                            s.spawn(move || {
                                let base = w * REGION;
                                let mut rng = SmallRng::seed_from_u64(
                                    (threads * 1000 + queue_bytes + w) as u64,
                                );
                                // Known content of the region (None: discarded, anything).
                                let mut model: Vec<Option<u8>> = vec![Some(0); REGION];
                                for step in 0..400u32 {
                                    let off = rng.random_range(0..REGION - 1);
                                    let len = rng.random_range(1..=(REGION - off).min(40 << 10));
                                    match rng.random_range(0..10) {
                                        0..=5 => {
                                            let v = (step % 251) as u8 + 1;
                                            q.write_at((base + off) as u64, &vec![v; len])
                                                .expect("write");
                                            model[off..off + len].fill(Some(v));
                                        }
                                        6 => {
                                            q.discard((base + off) as u64, len as u64)
                                                .expect("discard");
                                            model[off..off + len].fill(None);
                                        }
                                        7 | 8 => {
                                            let mut b = vec![0u8; len];
                                            q.read_at((base + off) as u64, &mut b).expect("read");
                                            for (i, x) in b.iter().enumerate() {
                                                if let Some(m) = model[off + i] {
                                                    assert_eq!(*x, m, "read at {}", base + off + i);
                                                }
                                            }
                                        }
                                        _ => {
                                            q.sync().expect("sync");
                                            let img = disk.crash_image(&mut rng);
                                            for (i, m) in model.iter().enumerate() {
                                                if let Some(m) = m {
                                                    assert_eq!(
                                                        img[base + i],
                                                        *m,
                                                        "synced byte lost"
                                                    );
                                                }
                                            }
                                        }
                                    }
                                }
                            });
                        }
                    });
                }
            }
            tx.send(()).expect("send");
        });
        rx.recv_timeout(std::time::Duration::from_secs(600))
            .expect("a writer failed (see above) or the queue hung");
    }

    #[test]
    fn queue_is_bounded() {
        // A queue of one byte still makes progress (one operation at a time) and loses nothing.
        let disk = Arc::new(SimStorage::new(1 << 16));
        let q = QueuedStorage::new(Arc::clone(&disk), &opts(2, 1)).expect("new");
        for i in 0..64u64 {
            q.write_at(i * 1024, &[i as u8; 1024]).expect("write");
            assert!(q.shared.queue.lock().bytes <= 1024);
        }
        q.sync().expect("sync");
        let img = disk.current_image();
        for i in 0..64usize {
            assert!(img[i * 1024..(i + 1) * 1024].iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn a_thread_that_fails_to_start_leaves_none_running() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let finished = Arc::new(AtomicUsize::new(0));
        let disk = Arc::new(SimStorage::new(1 << 14));
        let mut started = 0;
        let spawned =
            QueuedStorage::with_spawn(Arc::clone(&disk), &opts(4, 1 << 20), |name, body| {
                // The third thread cannot start; the first two must be stopped and joined.
                started += 1;
                if started == 3 {
                    return Err(io::Error::other("injected: cannot spawn"));
                }
                let finished = Arc::clone(&finished);
                std::thread::Builder::new().name(name).spawn(move || {
                    body();
                    finished.fetch_add(1, Ordering::SeqCst);
                })
            });
        assert!(spawned.is_err(), "a failed spawn was not reported");
        // Joined, not just told to stop: both threads have returned, and nothing holds the disk.
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "started I/O threads left running"
        );
        assert_eq!(
            Arc::strong_count(&disk),
            1,
            "an I/O thread still holds the storage"
        );
    }

    #[test]
    fn a_storage_write_that_panics_fails_a_sync_and_the_threads_keep_serving() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // On a thread of its own: a write lost to a dead thread hangs sync and drop for ever.
        std::thread::spawn(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            let (unwound_tx, unwound_rx) = std::sync::mpsc::channel::<()>();
            let size = 4 * WAKE_BYTES;
            let first = Mutex::new(Some(unwound_tx));
            let disk = Arc::new(Hooked(SimStorage::new(size), move |offset| {
                if let Some(unwound) = first.lock().take() {
                    // Dropped by the unwinding: the receiver sees its channel close.
                    let _unwound = unwound;
                    panic!("injected panic in a storage write at {offset}");
                }
                let _ = tx.send(offset);
                Ok(())
            }));
            let q = QueuedStorage::new(Arc::clone(&disk), &opts(2, size)).expect("new");
            all_asleep(&q);
            // Big enough to wake one thread on its own; that thread's write panics.
            q.write_at(0, &vec![1; WAKE_BYTES]).expect("write");
            assert!(unwound_rx.recv().is_err(), "no panic was injected");
            // As much again: the other thread (or the one that panicked, still awake) must write
            // it, no sync asked. Failure is reported before `q` is dropped: drop would hang.
            q.write_at(WAKE_BYTES as u64, &vec![2; WAKE_BYTES])
                .expect("write");
            let seen = rx.recv_timeout(std::time::Duration::from_secs(30)).ok();
            if seen != Some(WAKE_BYTES as u64) {
                let _ = done_tx.send(Err(format!(
                    "a backlog was left queued with no I/O thread woken (saw {seen:?})"
                )));
                return;
            }
            // The panic is an error that the next sync reports; the one after retries the write.
            assert!(
                q.sync().is_err(),
                "a write that panicked was taken as written"
            );
            q.sync().expect("second sync retries the write");
            let img = disk.0.current_image();
            assert!(
                img[..WAKE_BYTES].iter().all(|&x| x == 1),
                "retried write lost"
            );
            assert!(img[WAKE_BYTES..2 * WAKE_BYTES].iter().all(|&x| x == 2));
            drop(q);
            let _ = done_tx.send(Ok(()));
        });
        let outcome = done_rx
            .recv_timeout(std::time::Duration::from_secs(300))
            .expect("failed (see above) or hung");
        if let Err(why) = outcome {
            panic!("{why}");
        }
    }
}
