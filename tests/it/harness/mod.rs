//! The harness every suite shares. Real backends only: nothing is mocked.
//!
//! - `fixtures`: unique event ids, users, specs, purchase requests (`req`).
//! - `backends`: engines on memory, the machine's Redis and the test Cluster;
//!   a Redis namespace per suite; this process's PostgreSQL database;
//!   `on_every_backend!`, the one backend matrix (engines, or apps with
//!   `app:`).
//! - `servers`: private `redis-server`s and the shared 3-master Cluster.
//! - `replicated`: a private Cluster of 3 masters with a replica each, whose
//!   masters a test kills and whose failovers it waits for.
//! - `app`: `TestApp`, the real application on port 0.
//! - `service`: the `shardstock` binary as a child process.
//! - `tools`: Chromium, Prometheus and promtool, installed on first use
//!   (`.ci/tools.sh`).
//! - `wait`: waiting for a condition with a deadline, never for a fixed time.
//! - `faulty`: `Faulty`, a store wrapper that fails, delays or times out
//!   steps from a seed, before or after they apply.
//! - `oracle`: a closed sale checked from the database alone.
//! - `sale`: `Sale`, clients buying over HTTP until stopped: the load a test
//!   crashes, cuts or restarts things under.
//! - `proxy`: `DbProxy`, a TCP proxy a test cuts and restores (a database outage).
//! - `stacks`: large stacks for the suites whose futures nest deep.

mod app;
mod backends;
pub mod faulty;
mod fixtures;
pub mod oracle;
mod proxy;
mod replicated;
mod sale;
mod servers;
mod service;
mod stacks;
mod tools;
mod wait;

pub use app::{Backend, TOKEN, TestApp, eid, problem, sample, settings, settings_in};
pub(crate) use backends::on_every_backend;
pub use backends::{
    START_REDIS, cluster, connect, ledger_for, memory, namespace, pg_pool, pg_url, sqlite_url,
    standalone, suite_of, unbatched,
};
pub use fixtures::{event_id, purchase_final, req, spec, user, user_homed_at};
pub use proxy::DbProxy;
pub use replicated::ReplicatedCluster;
pub use sale::{Sale, answered};
pub use servers::{RedisCluster, RedisServer, free_port, process_id, shared_cluster};
pub use service::Service;
pub use stacks::{block_on_large_stacks, on_large_stacks};
pub use tools::ensure_test_tools;
pub use wait::{eventually, wait_until};
