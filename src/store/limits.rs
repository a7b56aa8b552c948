//! A buyer's rate, shared by every instance: one GCRA step a purchase.
//!
//! The per-user rate limit (`rate_limit.per_user_per_sec`) is checked here,
//! in the store, so N instances allow a user the configured rate, not N times
//! it. On Redis it is one script under the user's own hash tag (users spread
//! over a Cluster's masters), timed by Redis's clock so instances whose
//! clocks differ agree; the embedded store keeps the same state in process.
//! The whole-instance rate (`global_per_sec`) stays per instance (`http::guard`).

use std::time::Duration;

use crate::domain::ids::UserId;

/// A rate: `per_sec` requests a second, `burst` of them at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_sec: u32,
    pub burst: u32,
}

impl Rate {
    /// The GCRA's emission interval, µs.
    pub(crate) fn interval_us(&self) -> u64 {
        1_000_000 / u64::from(self.per_sec.max(1))
    }

    /// How far ahead of now a user's theoretical arrival time may run, µs.
    pub(crate) fn tolerance_us(&self) -> u64 {
        self.interval_us() * u64::from(self.burst.max(1) - 1)
    }
}

/// The answer of [`Limits::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Over the rate: this long until the next request is admitted.
    Wait(Duration),
}

section! {
    /// The shared rate of each buyer.
    pub trait Limits => forward_limits {
        /// One request of `user` at `rate`: admitted (and counted), or how long
        /// to wait (`lua/rate_admit.lua`).
        fn admit(user: &UserId, rate: Rate) -> Admit;
    }
    also {
    }
}

/// The GCRA step on a theoretical arrival time `tat` (µs, `None`: none yet)
/// at `now`: the new one when admitted, else the µs to wait. The memory
/// store runs it; `lua/rate_admit.lua` is the same arithmetic.
pub(crate) fn gcra(tat: Option<u64>, now: u64, rate: Rate) -> Result<u64, u64> {
    let tat = tat.unwrap_or(now).max(now);
    let allow_at = tat.saturating_sub(rate.tolerance_us());
    if now < allow_at {
        return Err(allow_at - now);
    }
    Ok(tat + rate.interval_us())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_then_the_rate() {
        let rate = Rate {
            per_sec: 2,
            burst: 2,
        };
        let first = gcra(None, 0, rate).unwrap();
        let second = gcra(Some(first), 0, rate).unwrap();
        assert_eq!(gcra(Some(second), 0, rate), Err(500_000));
        assert!(gcra(Some(second), 500_000, rate).is_ok());
    }
}
