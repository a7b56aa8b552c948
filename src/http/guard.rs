//! Request guards: the admin bearer token and the rate limits.
//!
//! [`Admin`] is an extractor: an admin handler names it before its body, so
//! the token is checked before the body is read, and an unauthenticated
//! caller learns nothing of the body's schema. The token is compared in
//! constant time (`subtle`), so response timing does not reveal how much of
//! a guess was right. Rate limits (seed 000's first layer: refuse floods
//! before they reach the store) are GCRA token buckets: the whole
//! instance's from `governor`, in process; each user's in the store
//! (`store::Limits`), so replicas share it: N instances allow a user the
//! configured rate, not N times it. Both are off unless configured.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;
use crate::domain::ids::UserId;
use crate::store::{Admit, Rate, Store};

/// Proof that the request carries the admin token. Extracted from the
/// headers alone, and listed before the body in every admin handler: axum
/// runs extractors in the order of the handler's arguments and stops at the
/// first that rejects, so the body is never parsed for a caller without it.
pub(crate) struct Admin;

impl<S: Store> FromRequestParts<AppState<S>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState<S>,
    ) -> Result<Self, Self::Rejection> {
        require_admin(state.admin_token.as_deref(), &parts.headers).map(|()| Self)
    }
}

/// Checks `Authorization: Bearer <token>` against the configured token; with
/// no token configured every admin request is refused, with its own detail.
pub(crate) fn require_admin(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Err(ApiError::AdminDisabled);
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or(ApiError::Unauthorized)?;
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// The token of a `Bearer` credential. The scheme is matched in any case
/// (RFC 9110 §11.1: `bearer`, `BEARER`), and one or more spaces may follow it.
fn bearer_token(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// The rate limits to apply, each `None` when off (`app::options` maps
/// them from `[rate_limit]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitOptions {
    /// Purchases per second for the whole instance.
    pub(crate) global: Option<Rate>,
    /// Purchases per second per user, shared by every instance on one store.
    pub per_user: Option<Rate>,
}

/// The configured rate limits.
pub struct RateLimits {
    global: Option<DefaultDirectRateLimiter>,
    per_user: Option<Rate>,
    clock: DefaultClock,
}

fn quota(rate: Rate) -> Option<Quota> {
    let per_sec = NonZeroU32::new(rate.per_sec)?;
    let burst = NonZeroU32::new(rate.burst).unwrap_or(per_sec);
    Some(Quota::per_second(per_sec).allow_burst(burst))
}

fn wait(d: Duration) -> ApiError {
    ApiError::RateLimited {
        retry_after_s: d.as_secs_f64().ceil().max(1.0) as u64,
    }
}

impl RateLimits {
    pub fn new(opts: &RateLimitOptions) -> Self {
        Self {
            global: opts.global.and_then(quota).map(RateLimiter::direct),
            per_user: opts.per_user.filter(|r| r.per_sec > 0),
            clock: DefaultClock::default(),
        }
    }

    /// Refuses the request when the user (shared by every instance, one
    /// store call) or the instance is over the rate. A store that does not
    /// answer lets the request through: the purchase meets the same store.
    pub async fn check<S: Store>(&self, store: &S, user: &UserId) -> Result<(), ApiError> {
        if let Some(rate) = self.per_user {
            // Boxed: a store call's state would otherwise be part of every
            // purchase's future, limited or not.
            match Box::pin(store.admit(user, rate)).await {
                Ok(Admit::Yes) => {}
                Ok(Admit::Wait(d)) => {
                    metrics::counter!(crate::metrics::RATE_LIMITED, "scope" => "user").increment(1);
                    return Err(wait(d));
                }
                Err(e) => tracing::debug!(error = %e, "the shared rate limit did not answer"),
            }
        }
        if let Some(global) = &self.global
            && let Err(not_until) = global.check()
        {
            metrics::counter!(crate::metrics::RATE_LIMITED, "scope" => "global").increment(1);
            return Err(wait(not_until.wait_time_from(self.clock.now())));
        }
        Ok(())
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
            matches!(require_admin(None, &h), Err(ApiError::AdminDisabled)),
            "no token configured: refused, and told apart from a wrong token"
        );
    }

    #[test]
    fn the_scheme_is_matched_in_any_case() {
        let mut h = HeaderMap::new();
        for accepted in ["bearer s3cret", "BEARER s3cret", "BeArEr  s3cret"] {
            h.insert(header::AUTHORIZATION, accepted.parse().unwrap());
            assert!(require_admin(Some("s3cret"), &h).is_ok(), "{accepted}");
        }
        for refused in ["Bearers3cret", "Basic s3cret", "Bearer", "s3cret"] {
            h.insert(header::AUTHORIZATION, refused.parse().unwrap());
            assert!(
                matches!(
                    require_admin(Some("s3cret"), &h),
                    Err(ApiError::Unauthorized)
                ),
                "{refused}"
            );
        }
    }

    #[tokio::test]
    async fn a_user_over_the_rate_is_refused_with_a_retry_after() {
        let store = crate::store::MemoryStore::new();
        let limits = RateLimits::new(&RateLimitOptions {
            global: None,
            per_user: Some(Rate {
                per_sec: 2,
                burst: 2,
            }),
        });
        let u = UserId::parse("u-1").unwrap();
        assert!(limits.check(&store, &u).await.is_ok());
        assert!(limits.check(&store, &u).await.is_ok());
        assert!(matches!(
            limits.check(&store, &u).await,
            Err(ApiError::RateLimited { retry_after_s: 1 })
        ));
        let other = UserId::parse("u-2").unwrap();
        assert!(limits.check(&store, &other).await.is_ok());
    }
}
