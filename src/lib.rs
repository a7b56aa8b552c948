//! # shardstock
//!
//! Sells hot stock (flash sales, ticket drops, limited releases) at very high
//! request rates without ever overselling and without answering "sold out"
//! while a unit is left. Each event's stock is split into N buckets, each under
//! its own Redis hash tag so a hot event spreads over a Redis Cluster; a buyer
//! is routed to `hash(user) % N` and the ring is probed when that bucket is short.
//!
//! # Layout
//! The layers import one way: `domain` ← `store` ← `engine` ← `control` ←
//! `http`, `app`. The `ledger` sits beside the store (it imports `domain`
//! only) and is joined to it by `control`.
//! - [`domain`]: ids, the key layout, routing and the model (pure).
//! - [`store`]: the `Store` trait of per-bucket atomic steps, and its two
//!   backends, `memory` (embedded) and `redis` (Lua scripts from `lua/`).
//! - [`ledger`]: the database (PostgreSQL or SQLite) behind Redis: orders,
//!   totals and the final guard, one code path through sqlx `Any`.
//! - [`engine`]: the purchase fast path and saga, cancels, views, and the
//!   mover (fenced transfers a saga uses to gather fragments) — written once
//!   above `Store`.
//! - [`control`]: close, rebuild, reshard, the rebalancer, the flusher, the
//!   audit and the gauges: the work beyond the hot path.
//! - [`http`]: the axum API of `API.md`, problem+json errors, guards.
//! - [`app`]: `Application`: build from settings, run until stopped.
//! - [`config`], [`metrics`], [`cli`]: settings, metric names, the command line.
//!
//! The load generator that measures all this is a workspace member of its own,
//! `bench/` (the `shardstock-bench` package and binary): the service carries
//! none of its code or dependencies.

/// Build and run the service.
pub mod app;
/// The command line.
pub mod cli;
/// Settings from `config/*.toml`.
pub mod config;
/// Close, reshard, rebalance, flush, audit: the work beyond the hot path.
pub mod control;
/// Ids, keys, routing and the model: pure, imported by every layer.
pub mod domain;
/// The purchase saga, cancels, views and the mover, above the store.
pub mod engine;
/// The HTTP API.
pub mod http;
/// The order ledger.
pub mod ledger;
/// Metric names and descriptions.
pub mod metrics;
/// The store trait and its memory and Redis backends.
pub mod store;

pub use engine::{Engine, EngineError, EngineOptions};
pub use store::{MemoryStore, RedisStore, Store, StoreError};
