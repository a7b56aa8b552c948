//! Request guards: the admin bearer token and the rate limits.
//!
//! The token is compared in constant time (`subtle`), so response timing does
//! not reveal how much of a guess was right. Rate limits (seed 000's first
//! layer: refuse floods before they reach the store) are GCRA token buckets
//! from `governor`: one for the whole instance and one per user; both are off
//! unless configured.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::config::RateLimitSettings;
use crate::domain::ids::UserId;

/// Checks `Authorization: Bearer <token>` against the configured token; with
/// no token configured every admin request is refused.
pub fn require_admin(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Err(ApiError::Unauthorized);
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// The configured rate limits.
pub struct RateLimits {
    global: Option<DefaultDirectRateLimiter>,
    per_user: Option<DefaultKeyedRateLimiter<UserId>>,
    clock: DefaultClock,
}

fn quota(per_sec: u32, burst: Option<u32>) -> Option<Quota> {
    let rate = NonZeroU32::new(per_sec)?;
    let burst = burst.and_then(NonZeroU32::new).unwrap_or(rate);
    Some(Quota::per_second(rate).allow_burst(burst))
}

impl RateLimits {
    pub fn new(s: &RateLimitSettings) -> Self {
        Self {
            global: quota(s.global_per_sec, s.burst).map(RateLimiter::direct),
            per_user: quota(s.per_user_per_sec, s.burst).map(RateLimiter::keyed),
            clock: DefaultClock::default(),
        }
    }

    /// Refuses the request when the instance or the user is over the rate.
    pub fn check(&self, user: &UserId) -> Result<(), ApiError> {
        let now = self.clock.now();
        let wait = |d: Duration| ApiError::RateLimited {
            retry_after_s: d.as_secs_f64().ceil().max(1.0) as u64,
        };
        if let Some(per_user) = &self.per_user
            && let Err(not_until) = per_user.check_key(user)
        {
            metrics::counter!(crate::metrics::RATE_LIMITED, "scope" => "user").increment(1);
            return Err(wait(not_until.wait_time_from(now)));
        }
        if let Some(global) = &self.global
            && let Err(not_until) = global.check()
        {
            metrics::counter!(crate::metrics::RATE_LIMITED, "scope" => "global").increment(1);
            return Err(wait(not_until.wait_time_from(now)));
        }
        Ok(())
    }

    /// Forgets users idle long enough to be back at a full bucket.
    pub fn forget_idle(&self) {
        if let Some(per_user) = &self.per_user {
            per_user.retain_recent();
            per_user.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_needs_the_exact_token() {
        let mut h = HeaderMap::new();
        assert!(require_admin(Some("s3cret"), &h).is_err());
        h.insert(header::AUTHORIZATION, "Bearer s3cre".parse().unwrap());
        assert!(require_admin(Some("s3cret"), &h).is_err());
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(require_admin(Some("s3cret"), &h).is_ok());
        assert!(
            require_admin(None, &h).is_err(),
            "no token configured: refused"
        );
    }

    #[test]
    fn a_user_over_the_rate_is_refused_with_a_retry_after() {
        let limits = RateLimits::new(&RateLimitSettings {
            per_user_per_sec: 2,
            global_per_sec: 0,
            burst: None,
        });
        let u = UserId::parse("u-1").unwrap();
        assert!(limits.check(&u).is_ok());
        assert!(limits.check(&u).is_ok());
        assert!(matches!(
            limits.check(&u),
            Err(ApiError::RateLimited { retry_after_s: 1 })
        ));
        assert!(limits.check(&UserId::parse("u-2").unwrap()).is_ok());
    }
}
