//! Where the store reads the time.
//!
//! The durable store reads a clock for two things only: the time an append
//! without a timestamp of its own (the single-sequence `append`) counts as
//! its key's last activity, and the "now" an expiration sweep compares
//! activities with. Both readings are decisions of the live store, and
//! both reach the log: the first as a clock record, the second as the
//! records naming the keys that expired. Recovery replays those records
//! and never reads a clock, so a directory replayed on any machine at any
//! later time gives exactly the state the live store had.
//!
//! Tests and simulations inject a [`ManualClock`] through
//! [`StoreOptions::clock`](crate::StoreOptions::clock); the default is
//! [`SystemClock`], the wall clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch
/// (Kafka's timestamp convention).
///
/// The store reads it under its lock, once per append call and once per
/// expiration sweep, so it must be cheap and must not block.
pub trait Clock: Send + Sync {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The wall clock (`SystemTime::now()`); the store's default. A wall clock
/// can step backwards: the store never logs a time older than one it has
/// logged (an append's time is the larger of the two), so activities
/// never go back with it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            // Before 1970: negative milliseconds.
            Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
        }
    }
}

/// A clock that moves only when told to: for tests and simulations.
/// Clones share one time, so a test keeps a clone and moves the store's
/// clock from outside.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use producer_state::{Clock, ManualClock, StoreOptions};
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let opts = StoreOptions::default().clock(Arc::new(clock.clone()));
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(clock.now_ms(), 1_700_000_001_000);
/// # let _ = opts;
/// ```
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `ms` milliseconds since the Unix epoch.
    pub fn new(ms: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(ms)))
    }

    /// Sets the time (it may go backwards).
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `by` (saturating at `i64::MAX`).
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            });
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now_ms()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_is_shared_by_its_clones_and_saturates() {
        let a = ManualClock::new(5);
        let b = a.clone();
        b.advance(Duration::from_millis(7));
        assert_eq!(a.now_ms(), 12);
        a.set(-3);
        assert_eq!(b.now_ms(), -3);
        a.set(i64::MAX - 1);
        a.advance(Duration::from_secs(10));
        assert_eq!(b.now_ms(), i64::MAX);
    }

    #[test]
    fn the_system_clock_is_after_2023() {
        assert!(SystemClock.now_ms() > 1_700_000_000_000);
    }
}
