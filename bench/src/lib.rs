//! # shardstock-bench
//!
//! The flash-sale load generator: one workload, many strategies, one honest
//! report. A [`Strategy`] is a way to sell stock (shardstock itself, or one of
//! the [`baselines`] from the articles it is measured against). [`run`] drives
//! it with a [`Workload`] — C concurrent clients, U users (uniform or Zipf), a
//! quantity mix and idempotent retries — and checks the books afterwards: a
//! [`Report`] gives throughput, latency percentiles, and a verdict on
//! overselling and underselling.
//!
//! A workspace member of its own, so the service (the `shardstock` package)
//! carries none of this code nor its dependencies; it uses the service only
//! through the `shardstock` library (the engine strategy) and binary (the
//! HTTP strategy).
//!
//! # Layout
//! - [`workload`]: [`Workload`] and its validation.
//! - [`strategy`]: the [`Strategy`] trait and the [`Outcome`] of an attempt.
//! - [`picker`]: which user, how many units and which request id attempt `i`
//!   sends (pure, deterministic from the seed).
//! - [`runner`]: [`run`] — prepare, drive, measure.
//! - [`report`]: [`Report`], its verdict, `Display` and JSON.
//! - [`baselines`]: the PostgreSQL and single-key Redis strategies.
//! - [`engine`], [`http`]: shardstock as strategies — the engine in process,
//!   and the service over HTTP: the binary on Redis and PostgreSQL or on the
//!   embedded store and SQLite, or a service already running at a URL.
//! - [`ceiling`]: the raw Redis ceiling measured with `redis-benchmark`.
//! - [`cluster`]: a throwaway local Redis Cluster, free ports, scratch dirs.
//! - [`compare`]: every strategy on one workload, written to `BENCHMARKS.md`.
//! - [`cost`]: `--http-cost`, CPU time per purchase over HTTP of each
//!   process, against hand-written axum + Lua peers.
//! - [`cmd`]: the command line of the `shardstock-bench` binary.

/// PostgreSQL and single-key Redis: the five strategies shardstock is measured against.
pub mod baselines;
/// The raw Redis ceiling (`redis-benchmark`).
pub mod ceiling;
/// A local 3-master Redis Cluster and process helpers.
pub mod cluster;
/// The command line.
pub mod cmd;
/// `--compare`: every strategy, one table.
pub mod compare;
/// CPU per purchase over HTTP, against hand-written peers.
pub mod cost;
/// The shardstock engine in process, as a strategy.
pub mod engine;
/// The shardstock service over HTTP, as a strategy.
pub mod http;
/// What attempt `i` sends.
pub mod picker;
/// What a run measured, and the verdict.
pub mod report;
/// Prepare, drive, measure.
pub mod runner;
/// The strategy trait and the outcome of an attempt.
pub mod strategy;
/// What to throw at a strategy.
pub mod workload;

pub use baselines::{
    PgConditionalUpdate, PgForUpdate, PgVersionCas, RedisDecrRollback, RedisLuaSingleKey,
};
pub use ceiling::redis_ceiling;
pub use engine::EngineStrategy;
pub use http::HttpStrategy;
pub use picker::{Attempt, Picker};
pub use report::Report;
pub use runner::run;
pub use strategy::{Outcome, Strategy};
pub use workload::Workload;

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
