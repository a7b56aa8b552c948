//! The benchmark harness: one workload, many strategies, one honest report.
//!
//! A [`Strategy`] is a way to sell stock (shardstock itself, or one of the
//! [`baselines`] from the articles it is measured against). [`run`] drives it
//! with a [`Workload`] — C concurrent clients, U users (uniform or Zipf), a
//! quantity mix and idempotent retries — and checks the books afterwards: a
//! [`Report`] gives throughput, latency percentiles, and a verdict on
//! overselling and underselling.
//!
//! This module owns the workload, the runner and the report; it knows nothing
//! of any one strategy. Wiring to the CLI (`shardstock bench`) and the
//! shardstock engine, Redis Cluster and HTTP clients as further strategies are
//! left to their own modules.
//!
//! - [`picker`]: which user, how many units and which request id attempt `i`
//!   sends (pure, deterministic from the seed).
//! - [`runner`]: [`run`] — prepare, drive, measure.
//! - [`report`]: [`Report`], its verdict, `Display` and JSON.
//! - [`baselines`]: PostgreSQL and single-key Redis strategies.
//! - [`ceiling`]: the raw Redis ceiling measured with `redis-benchmark`.

pub mod baselines;
pub mod ceiling;
pub mod cluster;
pub mod cmd;
pub mod compare;
pub mod picker;
pub mod report;
pub mod runner;
pub mod shardstock;

use std::future::Future;

use serde::{Deserialize, Serialize};

pub use baselines::{
    PgConditionalUpdate, PgForUpdate, PgVersionCas, RedisDecrRollback, RedisLuaSingleKey,
};
pub use ceiling::redis_ceiling;
pub use picker::{Attempt, Picker};
pub use report::Report;
pub use runner::run;
pub use shardstock::{EngineStrategy, HttpStrategy};

/// Failures of the harness and its baselines (the public entry points return
/// `anyhow`, as strategies written elsewhere bring their own errors).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The workload cannot be run as described.
    #[error("invalid workload: {0}")]
    Workload(String),
    /// A backend could not be reached; the message says how to start it.
    #[error("{0}")]
    Unavailable(String),
    /// PostgreSQL answered with an error.
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] sqlx::Error),
    /// Redis answered with an error (or timed out).
    #[error("Redis: {0}")]
    Redis(#[from] fred::error::Error),
    /// An optimistic strategy lost this many races in a row and gave up.
    #[error("retry budget: {0} version conflicts in a row")]
    RetryBudget(u32),
    /// Redis answered something the baseline does not understand.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// `redis-benchmark` or `redis-cli` failed or printed something unexpected.
    #[error("ceiling: {0}")]
    Ceiling(String),
}

/// What to throw at a strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// S: units of stock at the start.
    pub stock: u64,
    /// U: distinct users.
    pub users: u64,
    /// `None`: users are picked uniformly; `Some(s)`: Zipf with exponent `s`
    /// over the users (user 0 the most active).
    pub zipf: Option<f64>,
    /// A: purchase attempts in total (retries included).
    pub attempts: u64,
    /// C: concurrent clients.
    pub concurrency: usize,
    /// The quantity mix as (units, weight); weights need not sum to 1.
    pub quantities: Vec<(u32, f64)>,
    /// Share of attempts that re-send an earlier attempt (same request id,
    /// user and quantity), as a client retrying after a lost answer would.
    pub retry_rate: f64,
    /// Units one user may hold; strategies without limits ignore it.
    pub per_user_limit: Option<u32>,
    /// Seeds every random choice of the workload.
    pub seed: u64,
}

impl Default for Workload {
    /// A flash sale big enough to sell out: S=10,000, U=100,000, A=50,000,
    /// C=64, mostly single units, no retries.
    fn default() -> Self {
        Self {
            stock: 10_000,
            users: 100_000,
            zipf: None,
            attempts: 50_000,
            concurrency: 64,
            quantities: vec![(1, 0.8), (2, 0.15), (3, 0.05)],
            retry_rate: 0.0,
            per_user_limit: None,
            seed: 42,
        }
    }
}

impl Workload {
    /// Refuses workloads the runner cannot drive (no clients, no users, an
    /// empty or negative quantity mix, a rate outside [0, 1], …).
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Workload(m.to_string()));
        if self.users == 0 {
            return bad("users must be at least 1");
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.retry_rate) {
            return bad("retry_rate must be within [0, 1]");
        }
        if let Some(s) = self.zipf
            && !(s.is_finite() && s >= 0.0)
        {
            return bad("the Zipf exponent must be finite and >= 0");
        }
        if self.quantities.is_empty() {
            return bad("the quantity mix is empty");
        }
        if self.quantities.iter().any(|&(q, _)| q == 0) {
            return bad("quantities must be at least 1");
        }
        if self
            .quantities
            .iter()
            .any(|&(_, w)| !(w.is_finite() && w >= 0.0))
        {
            return bad("quantity weights must be finite and >= 0");
        }
        if self.quantities.iter().all(|&(_, w)| w == 0.0) {
            return bad("the quantity weights sum to 0");
        }
        Ok(())
    }
}

/// The answer to one purchase attempt, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The units are the buyer's.
    Bought { units: u32 },
    /// Not enough stock for this quantity.
    SoldOut,
    /// The user's per-user limit would be exceeded.
    LimitExceeded,
    /// The request id was seen before; the earlier answer stands (its units
    /// were counted when it was `Bought`).
    Replayed,
    /// Anything else: a timeout, a backend error, a retry budget spent.
    Error(String),
}

/// A way to sell stock, driven by [`run`].
///
/// Implementations are shared by all clients of a run (`&self`), so they hold
/// their connections inside (a pool, a pipelining Redis client).
pub trait Strategy: Send + Sync + 'static {
    /// A short, stable name for reports, e.g. `"pg-for-update"`.
    fn name(&self) -> String;
    /// Whether the strategy promises never to sell more than the stock. Naive
    /// strategies answer `false`; the report holds the others to it.
    fn claims_no_oversell(&self) -> bool;
    /// Sets up fresh state with `w.stock` units (and nothing sold).
    fn prepare(&self, w: &Workload) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// One purchase attempt of `qty` units by `user` under `request_id`.
    fn attempt(
        &self,
        user: &str,
        qty: u32,
        request_id: &str,
    ) -> impl Future<Output = Outcome> + Send;
    /// Units left according to the strategy's own store; negative when a naive
    /// strategy oversold.
    fn remaining(&self) -> impl Future<Output = anyhow::Result<i64>> + Send;
    /// Removes what `prepare` and the attempts left behind.
    fn cleanup(&self) -> impl Future<Output = anyhow::Result<()>> + Send {
        async { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workload_is_valid() {
        assert!(Workload::default().validate().is_ok());
    }

    #[test]
    fn a_workload_without_clients_or_quantities_is_refused() {
        let w = Workload {
            concurrency: 0,
            ..Workload::default()
        };
        assert!(w.validate().is_err());
        let w = Workload {
            quantities: vec![(1, 0.0)],
            ..Workload::default()
        };
        assert!(w.validate().is_err());
        let w = Workload {
            retry_rate: 1.5,
            ..Workload::default()
        };
        assert!(w.validate().is_err());
    }
}
