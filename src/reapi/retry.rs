//! When and how long to wait before trying an RPC again.
//!
//! Remote clusters shed load and restart; a build must ride that out without hammering them and
//! without hanging forever. Transient codes are retried with exponential backoff and jitter (or the
//! delay the server asks for in a `google.rpc.RetryInfo`), bounded both by a retry count and by the
//! call's overall deadline. Every RPC this client makes is idempotent (reads, content-addressed
//! writes, and Execute of a given action), so DEADLINE_EXCEEDED and ABORTED are retried as well.
//! A call the server answers UNAUTHENTICATED is repeated, without waiting, once the credential
//! helper has supplied new credentials.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use super::credentials::Credentials;
use super::error::is_transient;

/// Times one call is repeated with new credentials after UNAUTHENTICATED.
const MAX_REAUTHENTICATIONS: u32 = 2;

/// How often and how patiently to retry.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The backoff before the first retry; it doubles with each further one.
    pub base_delay: Duration,
    /// The backoff never grows beyond this.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// The policy used with `max_retries` and default delays (100 ms doubling up to 10 s).
    pub fn new(max_retries: u32) -> Self {
        RetryPolicy {
            max_retries,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
        }
    }

    /// The wait before retry number `retry` (0-based): "equal jitter", a uniformly random point in
    /// the upper half of the exponential window, so that many clients failing together spread out
    /// but none retries immediately.
    pub fn backoff(&self, retry: u32) -> Duration {
        let window = self
            .base_delay
            .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .min(self.max_delay);
        let half = window / 2;
        half + half.mul_f64(rand::random_range(0.0..=1.0))
    }
}

/// The delay the server asked for with a `google.rpc.RetryInfo` detail, if any.
pub fn server_delay(status: &Status) -> Option<Duration> {
    status.get_details_retry_info()?.retry_delay
}

/// The retry state of one logical call: how many retries were spent and when it must end.
pub(crate) struct Attempts<'a> {
    policy: &'a RetryPolicy,
    deadline: Instant,
    retries: u32,
    counter: &'a AtomicU64,
    /// The credentials the call carries, and which fetch of them.
    credentials: Option<(&'a Credentials, u64)>,
    reauthentications: u32,
    /// The last answer was UNAUTHENTICATED.
    refused: bool,
}

/// A call that ends without its credentials refused (succeeded, or failed for another reason)
/// vouches for them: if they are refused later, asking the helper again is worth it.
impl Drop for Attempts<'_> {
    fn drop(&mut self) {
        if let Some((credentials, generation)) = self.credentials
            && !self.refused
        {
            credentials.accepted(generation);
        }
    }
}

impl<'a> Attempts<'a> {
    /// Starts a call that must finish by `deadline`; each retry is added to `counter`.
    pub(crate) fn new(policy: &'a RetryPolicy, deadline: Instant, counter: &'a AtomicU64) -> Self {
        Attempts {
            policy,
            deadline,
            retries: 0,
            counter,
            credentials: None,
            reauthentications: 0,
            refused: false,
        }
    }

    /// Lets the call be repeated with new credentials from `credentials` after UNAUTHENTICATED.
    pub(crate) fn authenticating(mut self, credentials: &'a Credentials) -> Self {
        self.credentials = Some((credentials, credentials.generation()));
        self
    }

    /// Time left before the deadline, `None` once it has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// Retries spent so far.
    pub(crate) fn retries(&self) -> u32 {
        self.retries
    }

    /// Forgets spent retries after the call made progress (a long Execute whose stream the server
    /// ends now and then must not run out of retries).
    pub(crate) fn reset(&mut self) {
        self.retries = 0;
    }

    /// Decides whether to try again after `status`; if so, waits the backoff first. Returns false
    /// when the status is permanent, the retries are spent, or the wait would pass the deadline.
    pub(crate) async fn retry_after(&mut self, status: &Status) -> bool {
        self.refused = status.code() == Code::Unauthenticated;
        if self.refused {
            return self.reauthenticate().await;
        }
        if !is_transient(status.code()) || self.retries >= self.policy.max_retries {
            return false;
        }
        let delay = server_delay(status).unwrap_or_else(|| self.policy.backoff(self.retries));
        if Instant::now() + delay >= self.deadline {
            return false;
        }
        tracing::info!(
            code = ?status.code(),
            reason = status.message(),
            delay_ms = delay.as_millis(),
            retry = self.retries + 1,
            "retrying a remote call"
        );
        tokio::time::sleep(delay).await;
        self.retries += 1;
        self.counter.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl Attempts<'_> {
    /// After UNAUTHENTICATED: whether new credentials are there to try (the helper ran again).
    async fn reauthenticate(&mut self) -> bool {
        let Some((credentials, seen)) = self.credentials else {
            return false;
        };
        if self.reauthentications >= MAX_REAUTHENTICATIONS {
            return false;
        }
        match credentials.refresh_after_rejection(seen).await {
            Some(generation) => {
                self.credentials = Some((credentials, generation));
                self.reauthentications += 1;
                true
            }
            None => false,
        }
    }
}

/// Runs `call` until it succeeds, fails permanently, or runs out of retries or time. `call` gets
/// the time left, to send as the RPC's own deadline; it is also cut off locally at the deadline.
pub(crate) async fn run<T, F, Fut>(attempts: &mut Attempts<'_>, mut call: F) -> Result<T, Status>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    loop {
        let Some(remaining) = attempts.remaining() else {
            return Err(deadline_passed());
        };
        let status = match tokio::time::timeout(remaining, call(remaining)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(status)) => status,
            Err(_) => deadline_passed(),
        };
        if !attempts.retry_after(&status).await {
            return Err(status);
        }
    }
}

/// The status of a call that ran out of time on the client side.
pub(crate) fn deadline_passed() -> Status {
    Status::deadline_exceeded("the call's deadline passed (client side)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use tonic_types::{ErrorDetails, StatusExt};

    #[test]
    fn backoff_stays_in_its_window() {
        let policy = RetryPolicy::new(10);
        for retry in 0..40 {
            let window =
                (policy.base_delay * 2u32.saturating_pow(retry.min(20))).min(policy.max_delay);
            for _ in 0..50 {
                let d = policy.backoff(retry);
                assert!(
                    d >= window / 2 && d <= window,
                    "retry {retry}: {d:?} outside {window:?}"
                );
            }
        }
    }

    #[test]
    fn retry_info_sets_the_delay() {
        let status = tonic::Status::with_error_details(
            Code::ResourceExhausted,
            "slow down",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
        );
        assert_eq!(server_delay(&status), Some(Duration::from_millis(1500)));
        assert_eq!(server_delay(&Status::unavailable("x")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn run_retries_transient_then_succeeds() {
        let policy = RetryPolicy::new(3);
        let counter = AtomicU64::new(0);
        let calls = AtomicU32::new(0);
        let mut attempts =
            Attempts::new(&policy, Instant::now() + Duration::from_secs(60), &counter);
        let result = run(&mut attempts, |_| async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(Status::unavailable("down")),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(attempts.retries(), 2);
        assert_eq!(counter.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn run_gives_up_on_permanent_count_and_deadline() {
        let policy = RetryPolicy::new(3);
        let counter = AtomicU64::new(0);
        let far = Instant::now() + Duration::from_secs(600);

        let calls = AtomicU32::new(0);
        let mut attempts = Attempts::new(&policy, far, &counter);
        let err = run(&mut attempts, |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Status::permission_denied("no"))
        })
        .await
        .unwrap_err();
        assert_eq!(
            (err.code(), calls.load(Ordering::SeqCst)),
            (Code::PermissionDenied, 1)
        );

        let calls = AtomicU32::new(0);
        let mut attempts = Attempts::new(&policy, far, &counter);
        let err = run(&mut attempts, |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Status::unavailable("down"))
        })
        .await
        .unwrap_err();
        assert_eq!(
            (err.code(), calls.load(Ordering::SeqCst)),
            (Code::Unavailable, 4)
        );

        // A server asking for a delay past the deadline ends the call at once.
        let mut attempts =
            Attempts::new(&policy, Instant::now() + Duration::from_secs(1), &counter);
        let err = run(&mut attempts, |_| async {
            Err::<(), _>(Status::with_error_details(
                Code::Unavailable,
                "later",
                ErrorDetails::with_retry_info(Some(Duration::from_secs(5))),
            ))
        })
        .await
        .unwrap_err();
        assert_eq!((err.code(), attempts.retries()), (Code::Unavailable, 0));

        // A hanging call is cut off at the deadline.
        let mut attempts =
            Attempts::new(&policy, Instant::now() + Duration::from_secs(2), &counter);
        let err = run(&mut attempts, |_| {
            std::future::pending::<Result<(), Status>>()
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
    }
}
