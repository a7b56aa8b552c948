//! The engine's clock: where every time a sale depends on comes from.
//!
//! A sale window, the lifetime of a sold-out mark and the timestamps written
//! into records and the ledger are read from the [`Clock`] the engine carries,
//! never from the system clock directly, so a test can put an event past its
//! window by advancing a [`ManualClock`] instead of sleeping. Production runs
//! on [`Clock::system`]. Lease TTLs and stream claim times are not on this
//! clock: Redis (and the memory store's mirror of it) expires those on its own
//! time, as it must for instances that died.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds, read from the system clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// A source of Unix time in milliseconds; cheap to clone (a manual clock's
/// clones share one hand).
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system clock.
    #[default]
    System,
    /// A clock that moves only when told to (tests).
    Manual(ManualClock),
}

impl Clock {
    /// The system clock (what the service runs on).
    pub fn system() -> Self {
        Self::System
    }

    /// Unix time in milliseconds.
    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => now_ms(),
            Self::Manual(m) => m.now_ms(),
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(m: ManualClock) -> Self {
        Self::Manual(m)
    }
}

/// A clock that stands still until it is set or advanced. Clones share the
/// same time, so a test keeps one and hands another to the engine.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `ms` (Unix milliseconds).
    pub fn at(ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(ms)))
    }

    /// A clock standing at the system's time now: timestamps stay plausible.
    pub fn starting_now() -> Self {
        Self::at(now_ms())
    }

    pub fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Puts the clock at `ms`.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_move_with_it() {
        let hand = ManualClock::at(1_000);
        let clock = Clock::from(hand.clone());
        assert_eq!(clock.now_ms(), 1_000);
        hand.advance(Duration::from_millis(250));
        assert_eq!(clock.clone().now_ms(), 1_250);
        hand.set(10);
        assert_eq!(clock.now_ms(), 10);
    }

    #[test]
    fn the_system_clock_reads_unix_time() {
        let before = now_ms();
        let read = Clock::system().now_ms();
        assert!(read >= before && read - before < 60_000);
    }
}
