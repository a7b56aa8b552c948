//! # shardstock
//!
//! Sells hot stock (flash sales, ticket drops, limited releases) at very high
//! request rates without ever overselling and without answering "sold out"
//! while a unit is left. Each event's stock is split into N buckets, each under
//! its own Redis hash tag so a hot event spreads over a Redis Cluster; a buyer
//! is routed to `hash(user) % N` and the ring is probed when that bucket is short.
//!
//! # Layout
//! - [`config`]: the TOML settings and their validation.
//! - [`metrics`]: every metric name, in one place.
//! - [`ids`]: validated identifiers (everything that reaches a key or a URL).
//! - [`routing`]: the stable routing hash, home bucket and probe ring (pure).
//! - [`keys`]: the Redis key layout and hash tags (pure).
//! - [`model`]: events, records, orders: the domain types and their encodings.
//! - [`store`]: the `Store` trait of per-bucket atomic steps, and its two
//!   backends, `memory` (embedded) and `redis` (Lua scripts from `lua/`).
//! - [`engine`]: the purchase fast path and saga, cancels, views — written once
//!   above `Store`.
//! - [`mover`]: fenced, journaled transfers between buckets (consolidation).
//! - [`ledger`]: the database (PostgreSQL or SQLite) behind Redis: orders,
//!   totals and the final guard, one code path through sqlx `Any`.
//! - [`flusher`]: bucket order streams → the ledger, exactly once.
//! - [`lifecycle`]: create in both stores, close a sale, rebuild lost state.
//! - [`audit`]: the conservation check across buckets, streams and ledger.
//! - [`rebalancer`]: one fenced leader per event: skew control, fragment
//!   gathering, the end of a sale.
//! - [`reshard`]: moving a live event to another bucket count.
//! - [`http`]: the axum API of `API.md`, problem+json errors, guards.
//! - [`gauges`]: the background task that keeps bucket gauges fresh.
//! - [`app`]: `Application`: build from settings, run until stopped.
//! - [`cli`]: the clap command line the binary parses.
//! - [`bench`]: the benchmark harness (workload, runner, report), the five
//!   baselines (PostgreSQL and single-key Redis) and the raw Redis ceiling.

/// Build and run the service.
pub mod app;
/// The conservation audit.
pub mod audit;
/// The benchmark harness, its baseline strategies and the Redis ceiling.
pub mod bench;
/// The command line.
pub mod cli;
/// Settings from `config/*.toml`.
pub mod config;
/// Routing, the purchase saga, cancels and views above the store.
pub mod engine;
/// Stream records into the ledger.
pub mod flusher;
/// Background refresh of the bucket gauges.
pub mod gauges;
/// The HTTP API.
pub mod http;
/// Validated identifiers.
pub mod ids;
/// The Redis key layout.
pub mod keys;
/// The order ledger.
pub mod ledger;
/// Event lifecycle across store and ledger.
pub mod lifecycle;
/// Metric names and descriptions.
pub mod metrics;
/// Domain types and their stored encodings.
pub mod model;
/// Fenced, journaled transfers of units between buckets.
pub mod mover;
/// The per-event leader that keeps buckets balanced.
pub mod rebalancer;
/// Live resharding.
pub mod reshard;
/// Stable routing: home bucket and probe ring.
pub mod routing;
/// The store trait and its memory and Redis backends.
pub mod store;

pub use engine::{Engine, EngineError, EngineOptions};
pub use store::{MemoryStore, RedisStore, Store, StoreError};
