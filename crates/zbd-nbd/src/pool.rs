//! A fixed set of worker threads fed by one bounded queue shared by all connections. The bound
//! gives back-pressure: a connection reader that finds the queue full waits, and so stops
//! reading from its socket.

use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Sender};

pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

pub(crate) struct WorkerPool {
    sender: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    pub(crate) fn new(threads: usize, queue_jobs_max: usize) -> std::io::Result<Self> {
        let (sender, receiver) = bounded::<Job>(queue_jobs_max);
        let mut workers = Vec::with_capacity(threads);
        for index in 0..threads.max(1) {
            let receiver = receiver.clone();
            let worker = std::thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn(move || {
                    // Ends when every sender is gone and the queue is drained.
                    for job in receiver {
                        job();
                    }
                })?;
            workers.push(worker);
        }
        Ok(WorkerPool {
            sender: Some(sender),
            workers,
        })
    }

    /// A handle connection readers use to queue jobs.
    pub(crate) fn sender(&self) -> Option<Sender<Job>> {
        self.sender.clone()
    }

    /// Lets queued jobs finish, then joins the workers.
    pub(crate) fn join(mut self) {
        self.sender = None;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::error!("an NBD worker thread panicked");
            }
        }
    }
}
