//! Whether a job of the remote strategy asks the action cache before it executes.
//!
//! Execute looks the Action up in the action cache itself (REAPI's `skip_cache_lookup` is false),
//! so a GetActionResult before it only saves the upload of a hit's few kilobytes, and in a cold
//! link, where every lookup misses, it is a wasted call per job. So once [`COLD_LINK_MISSES`]
//! lookups in a row missed, jobs skip it; a hit (of a lookup, or one Execute reports) turns the
//! lookups back on.
//!
//! Until a lookup has hit, at most [`COLD_LINK_MISSES`] lookups are asked at once, counting the
//! misses so far: a link starts hundreds of jobs at once (`--remote-jobs`), and each would look up
//! before the first answer came back, so a cold link made ~230 lookups, not 16. The others wait
//! for an answer: a hit lets every job look up (an all-hit relink waits one round trip, once), a
//! miss lets none more, and after the 16th miss every job skips the lookup.

use std::sync::Mutex;

use tokio::sync::Notify;

use crate::trace;

/// After this many action-cache misses in a row, jobs of the remote strategy skip GetActionResult.
const COLD_LINK_MISSES: u32 = 16;

#[derive(Debug, Default)]
struct State {
    /// Lookups that missed since the last hit.
    misses_in_a_row: u32,
    /// Whether the latest answer was a hit (or Execute reported one): lookups are not limited.
    hitting: bool,
    /// Lookups asked and not answered yet.
    in_flight: u32,
}

impl State {
    /// Some(whether to look up), or None to wait for an answer.
    fn decide(&mut self) -> Option<bool> {
        if self.misses_in_a_row >= COLD_LINK_MISSES {
            return Some(false);
        }
        if self.hitting || self.in_flight + self.misses_in_a_row < COLD_LINK_MISSES {
            self.in_flight += 1;
            return Some(true);
        }
        None
    }

    fn hit(&mut self) {
        self.misses_in_a_row = 0;
        self.hitting = true;
    }

    fn missed(&mut self) {
        self.misses_in_a_row += 1;
        self.hitting = false;
    }
}

/// The link's lookups so far, shared by its jobs.
#[derive(Debug, Default)]
pub struct Lookups {
    state: Mutex<State>,
    answered: Notify,
}

/// A lookup being asked: tell [`Lookup::hit`] or [`Lookup::missed`]; dropped without either (the
/// lookup failed, or its job was cancelled), it counts as neither.
pub struct Lookup<'a> {
    lookups: &'a Lookups,
}

impl Lookups {
    /// A lookup to ask, or None when the job should go straight to Execute; waits while the
    /// lookups asked may all miss.
    pub async fn start(&self) -> Option<Lookup<'_>> {
        let mut phase = None;
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Registered before the state is read, so that no answer is missed in between.
            answered.as_mut().enable();
            match self.update(State::decide) {
                Some(true) => return Some(Lookup { lookups: self }),
                Some(false) => return None,
                None => {
                    phase.get_or_insert_with(|| trace::phase("waiting for the first lookups"));
                    answered.await;
                }
            }
        }
    }

    /// Execute found the Action in the action cache: lookups are worth asking again.
    pub fn execute_hit(&self) {
        self.update(State::hit);
        self.answered.notify_waiters();
    }

    fn update<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut state)
    }
}

impl Lookup<'_> {
    /// The lookup found the result.
    pub fn hit(self) {
        self.lookups.update(State::hit);
    }

    /// The lookup found nothing usable.
    pub fn missed(self) {
        self.lookups.update(State::missed);
    }
}

impl Drop for Lookup<'_> {
    fn drop(&mut self) {
        self.lookups.update(|state| state.in_flight -= 1);
        self.lookups.answered.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As many lookups as may be asked before an answer; each test answers them its own way.
    async fn all_that_may_be_asked(lookups: &Lookups) -> Vec<Lookup<'_>> {
        let asked = futures::future::join_all((0..COLD_LINK_MISSES).map(|_| lookups.start()));
        asked
            .await
            .into_iter()
            .map(|l| l.expect("a lookup"))
            .collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_cold_link_asks_sixteen_lookups_and_then_none() {
        let lookups = Lookups::default();
        let mut asked = all_that_may_be_asked(&lookups).await;
        // The seventeenth waits for an answer.
        let next = lookups.start();
        tokio::pin!(next);
        assert!(futures::poll!(next.as_mut()).is_pending());
        // One miss: still waiting, as the lookups in flight may all miss too.
        asked.pop().expect("asked").missed();
        assert!(futures::poll!(next.as_mut()).is_pending());
        for lookup in asked {
            lookup.missed();
        }
        assert!(next.await.is_none(), "16 misses in a row: no more lookups");
        assert!(lookups.start().await.is_none());
        // A hit that Execute reports turns them back on.
        lookups.execute_hit();
        assert!(lookups.start().await.is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hit_lets_every_job_look_up() {
        let lookups = Lookups::default();
        let mut asked = all_that_may_be_asked(&lookups).await;
        let waiting = lookups.start();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        asked.pop().expect("asked").hit();
        let more = waiting.await.expect("a lookup after a hit");
        // Beyond the limit while hitting.
        let all: Vec<_> = futures::future::join_all((0..100).map(|_| lookups.start())).await;
        assert!(all.iter().all(Option::is_some));
        drop((more, all, asked));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_or_cancelled_lookup_frees_its_place() {
        let lookups = Lookups::default();
        let asked = all_that_may_be_asked(&lookups).await;
        let waiting = lookups.start();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(asked);
        assert!(waiting.await.is_some());
    }
}
