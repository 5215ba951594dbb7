//! The local compile slots (`--jobs`), handed out by priority rather than first come, first served.
//!
//! Most local compiles must run: every job in local mode, a cache-only miss, a job the cluster gave
//! up on, a job that does not race a cluster that keeps losing (`health.rs`). Those come first, in
//! the order they asked: no one else is working on them, while a race's remote side still is. With
//! `--strategy=racing` the slots left over race jobs the cluster has not finished, and which one a
//! free slot takes decides how much the race gains: the job the cluster will most likely finish
//! last. A job the cluster has not started yet (it is still uploading, or queued) goes before one
//! it is executing, and among those:
//!
//! - not started: the one sent to the cluster last, which reaches a worker last when the cluster is
//!   a queue (so the local slots work from the back of the queue while its workers work from the
//!   front, and the two meet in the middle without compiling the same module twice);
//! - executing: the biggest module, the longest compile.
//!
//! The order is decided when a slot comes free, from each candidate's state at that moment.

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

/// A job racing the cluster, as the slots see it.
#[derive(Debug)]
pub struct Candidate {
    /// The module's size: the best guess of how long its compile takes.
    size: u64,
    /// When the job was sent to the cluster.
    sent: Instant,
    state: AtomicU8,
}

/// Where a candidate is on the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Remote {
    /// Uploading, or queued on the cluster.
    NotStarted = 0,
    /// Running on a worker.
    Executing = 1,
    /// The cluster will not deliver it (it failed, or the link stopped using the cluster): the
    /// job needs its local compile like any other.
    GaveUp = 2,
}

impl Candidate {
    pub fn new(size: u64) -> Arc<Candidate> {
        Arc::new(Candidate {
            size,
            sent: Instant::now(),
            state: AtomicU8::new(Remote::NotStarted as u8),
        })
    }

    pub fn set(&self, state: Remote) {
        self.state.fetch_max(state as u8, Ordering::Relaxed);
    }

    fn state(&self) -> Remote {
        match self.state.load(Ordering::Relaxed) {
            0 => Remote::NotStarted,
            1 => Remote::Executing,
            _ => Remote::GaveUp,
        }
    }
}

/// What a compile waiting for a slot is.
#[derive(Debug, Clone)]
pub enum Claim {
    /// A compile that must run.
    Needed,
    /// A compile racing the cluster.
    Race(Arc<Candidate>),
}

/// The `--jobs` slots of local compiles.
pub struct Slots {
    state: Mutex<State>,
}

struct State {
    free: usize,
    waiting: Vec<Waiter>,
    /// Orders `Needed` claims first come, first served.
    asked: u64,
}

struct Waiter {
    claim: Claim,
    asked: u64,
    grant: oneshot::Sender<Slot>,
}

/// A taken slot, given back when dropped.
pub struct Slot {
    /// None once counted back by hand (see [`Slots::hand_out`]).
    slots: Option<Arc<Slots>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            let mut state = slots.lock();
            state.free += 1;
            slots.hand_out(&mut state);
        }
    }
}

impl Slots {
    pub fn new(count: usize) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                free: count.max(1),
                waiting: Vec::new(),
                asked: 0,
            }),
        })
    }

    /// Waits for a slot for `claim`. Dropping the future gives up the place in the queue. None only
    /// if the slots were dropped meanwhile, which they are not while anyone can ask for one.
    pub async fn take(self: &Arc<Self>, claim: Claim) -> Option<Slot> {
        let (grant, granted) = oneshot::channel();
        {
            let mut state = self.lock();
            state.asked += 1;
            let asked = state.asked;
            state.waiting.push(Waiter {
                claim,
                asked,
                grant,
            });
            self.hand_out(&mut state);
        }
        granted.await.ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives free slots to the waiters that come first, skipping those that stopped waiting.
    fn hand_out(self: &Arc<Self>, state: &mut State) {
        state.waiting.retain(|w| !w.grant.is_closed());
        while state.free > 0 && !state.waiting.is_empty() {
            let first = (0..state.waiting.len())
                .min_by(|&a, &b| order(&state.waiting[a], &state.waiting[b]))
                .unwrap_or(0);
            let waiter = state.waiting.swap_remove(first);
            state.free -= 1;
            let slot = Slot {
                slots: Some(self.clone()),
            };
            if let Err(mut slot) = waiter.grant.send(slot) {
                // It stopped waiting just now: the slot comes back, counted here (its drop would
                // take the lock this function holds).
                slot.slots = None;
                state.free += 1;
            }
        }
    }
}

/// Which of two waiters takes a free slot first (`Less`: `a`).
fn order(a: &Waiter, b: &Waiter) -> CmpOrdering {
    match (&a.claim, &b.claim) {
        (Claim::Needed, Claim::Needed) => a.asked.cmp(&b.asked),
        (Claim::Needed, Claim::Race(_)) => CmpOrdering::Less,
        (Claim::Race(_), Claim::Needed) => CmpOrdering::Greater,
        (Claim::Race(x), Claim::Race(y)) => race_order(x, y).then(a.asked.cmp(&b.asked)),
    }
}

/// Which of two racing jobs the cluster most likely finishes last (`Less`: `x`), see the module's
/// documentation.
fn race_order(x: &Candidate, y: &Candidate) -> CmpOrdering {
    let (sx, sy) = (x.state(), y.state());
    if sx != sy {
        // GaveUp, then NotStarted, then Executing.
        let rank = |s: Remote| match s {
            Remote::GaveUp => 0,
            Remote::NotStarted => 1,
            Remote::Executing => 2,
        };
        return rank(sx).cmp(&rank(sy));
    }
    match sx {
        Remote::NotStarted => y.sent.cmp(&x.sent),
        Remote::Executing | Remote::GaveUp => y.size.cmp(&x.size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Asks for a slot with each claim in turn (each waiting), then frees the one slot taken
    /// before, and returns the claims' indices in the order they got the slot.
    async fn served_order(claims: Vec<Claim>) -> Vec<usize> {
        let slots = Slots::new(1);
        let first = slots.take(Claim::Needed).await.unwrap();
        let (done, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            let (pool, done) = (slots.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let slot = pool.take(claim).await.unwrap();
                done.send(i).unwrap();
                drop(slot);
            }));
            // Let the task join the queue before the next one.
            while slots.lock().waiting.len() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        drop(done);
        let mut served = Vec::new();
        while let Some(i) = order.recv().await {
            served.push(i);
        }
        served
    }

    #[tokio::test]
    async fn needed_compiles_come_first_then_races_the_cluster_finishes_last() {
        let old = Candidate::new(10);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let new = Candidate::new(5);
        let big = Candidate::new(1000);
        big.set(Remote::Executing);
        let small = Candidate::new(1);
        small.set(Remote::Executing);
        let failed = Candidate::new(1);
        failed.set(Remote::GaveUp);
        let order = served_order(vec![
            Claim::Race(small),
            Claim::Race(old),
            Claim::Needed,
            Claim::Race(big),
            Claim::Race(new),
            Claim::Race(failed),
            Claim::Needed,
        ])
        .await;
        // Needed in order; a job the cluster gave up on; not started, sent last first; executing,
        // biggest first.
        assert_eq!(order, vec![2, 6, 5, 4, 1, 3, 0]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_frees_its_place() {
        let slots = Slots::new(1);
        let held = slots.take(Claim::Needed).await.unwrap();
        let gone = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(Claim::Race(Candidate::new(1))).await.is_some() }
        });
        while slots.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        // The slot went back to the pool rather than to the waiter that left.
        assert_eq!(slots.lock().free, 1);
        assert!(slots.take(Claim::Needed).await.is_some());
    }

    #[test]
    fn a_state_never_goes_back() {
        let candidate = Candidate::new(1);
        candidate.set(Remote::GaveUp);
        candidate.set(Remote::Executing);
        assert_eq!(candidate.state(), Remote::GaveUp);
    }
}
