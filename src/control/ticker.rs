//! The pace of the background loops: a round every period until the one
//! shutdown signal fires.
//!
//! Every periodic task (gauges, both sweepers, the flusher's lag gauge, the
//! periodic audits, the app's housekeeping) waits the same way: a
//! `tokio::time::interval` whose missed ticks are delayed, not bursted (a
//! round that ran long, or a runtime that stalled, is followed by one round,
//! then the pace resumes), raced against the stop token. Written once here;
//! what a round does, and how it survives its failures, stays with its task.

use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Ticks every period until `stop` fires:
/// `while ticker.tick().await { round }`.
pub(crate) struct Ticker {
    interval: Interval,
    stop: CancellationToken,
}

impl Ticker {
    /// The first tick is at once, as `tokio::time::interval`'s.
    pub fn new(period: Duration, stop: &CancellationToken) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            interval,
            stop: stop.clone(),
        }
    }

    /// Waits for the next tick: `true` when it is time for a round, `false`
    /// once `stop` fired (then the loop ends; no round starts after it).
    pub async fn tick(&mut self) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_round_is_at_once_and_a_stop_ends_the_wait() {
        let stop = CancellationToken::new();
        let mut ticker = Ticker::new(Duration::from_secs(3600), &stop);
        // At once, not an hour from now.
        assert!(ticker.tick().await);
        let stopper = stop.clone();
        tokio::spawn(async move { stopper.cancel() });
        // The next tick is an hour away: the stop ends the wait instead.
        assert!(!ticker.tick().await);
        // And every wait after it.
        assert!(!ticker.tick().await);
    }
}
