//! One memory budget for the request buffers of every connection together.
//!
//! A connection takes its share before it allocates a WRITE payload or a READ reply and gives it
//! back once the reply is sent. Taking happens on the thread that holds the connection's read
//! side, so while the budget is spent that connection reads nothing more from its socket: the
//! client waits (TCP or socket-buffer backpressure), it is never dropped. Waiters are served in
//! arrival order, so a large request is not starved by a stream of small ones.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The server-wide budget of bytes held by requests in flight.
#[derive(Debug)]
pub struct InflightBudget {
    limit_bytes: u64,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    held_bytes: u64,
    /// Tickets handed out to waiters and the one whose turn it is: FIFO without a queue.
    next_ticket: u64,
    serving: u64,
}

impl State {
    fn waiting(&self) -> u64 {
        self.next_ticket - self.serving
    }
}

/// Bytes taken from an [`InflightBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Grant<'a> {
    budget: &'a InflightBudget,
    bytes: u64,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut state = self.budget.lock();
        state.held_bytes -= self.bytes;
        if state.waiting() > 0 {
            self.budget.freed.notify_all();
        }
    }
}

impl InflightBudget {
    pub fn new(limit_bytes: u64) -> Self {
        InflightBudget {
            limit_bytes,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Bytes held by requests in flight right now.
    pub fn held_bytes(&self) -> u64 {
        self.lock().held_bytes
    }

    /// Requests waiting for bytes right now (at most one per connection).
    pub fn waiting(&self) -> u64 {
        self.lock().waiting()
    }

    /// A poisoned lock only means a thread panicked between two plain integer updates, which
    /// cannot leave them torn, so the state is still good.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `bytes`, waiting until they are free and every earlier waiter has been served.
    /// `None` if `bytes` exceeds the whole budget (it could never be granted).
    pub fn acquire(&self, bytes: u64) -> Option<Grant<'_>> {
        if bytes > self.limit_bytes {
            return None;
        }
        let mut state = self.lock();
        let fits = |state: &State| state.held_bytes + bytes <= self.limit_bytes;
        if state.waiting() == 0 && fits(&state) {
            state.held_bytes += bytes;
            return Some(Grant {
                budget: self,
                bytes,
            });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        while state.serving != ticket || !fits(&state) {
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.held_bytes += bytes;
        state.serving += 1;
        // The next waiter may fit too.
        self.freed.notify_all();
        Some(Grant {
            budget: self,
            bytes,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn grants_up_to_the_limit_and_returns_on_drop() {
        let budget = InflightBudget::new(100);
        let a = budget.acquire(60).unwrap();
        let b = budget.acquire(40).unwrap();
        assert_eq!(budget.held_bytes(), 100);
        assert!(budget.acquire(101).is_none());
        drop(a);
        assert_eq!(budget.held_bytes(), 40);
        drop(b);
        assert_eq!(budget.held_bytes(), 0);
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let budget = InflightBudget::new(100);
        // 30 bytes would fit beside `first` at once; only arrival order makes them wait.
        let first = budget.acquire(50).unwrap();
        let (done, order) = mpsc::channel();
        std::thread::scope(|scope| {
            // A big request arrives first and waits, then a small one that fits right away.
            let big_done = done.clone();
            let budget = &budget;
            scope.spawn(move || {
                let grant = budget.acquire(80).unwrap();
                big_done.send(80).unwrap();
                drop(grant);
            });
            while budget.waiting() < 1 {
                std::thread::yield_now();
            }
            scope.spawn(move || {
                let _grant = budget.acquire(30).unwrap();
                done.send(30).unwrap();
            });
            while budget.waiting() < 2 {
                std::thread::yield_now();
            }
            drop(first);
        });
        let served: Vec<u64> = order.iter().collect();
        assert_eq!(served, vec![80, 30]);
        assert_eq!(budget.held_bytes(), 0);
    }
}
