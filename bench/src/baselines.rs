//! The five baselines shardstock is measured against, from the articles that
//! motivate it, each a [`Strategy`](crate::Strategy) in the same harness:
//!
//! | strategy | source | how |
//! | --- | --- | --- |
//! | [`PgForUpdate`] `pg-for-update` | seed 002 §2 | row lock, check, update, insert order |
//! | [`PgConditionalUpdate`] `pg-conditional-update` | seed 004 | `UPDATE … WHERE stock >= q` + order, one statement |
//! | [`PgVersionCas`] `pg-version-cas` | seed 002 §3 | read version, CAS update, bounded retries |
//! | [`RedisDecrRollback`] `redis-decr-rollback` | seed 000 method 1 | `DECRBY`, `INCRBY` back when negative |
//! | [`RedisLuaSingleKey`] `redis-lua-single-key` | seed 002 §4 | one Lua check-and-decrement on one key |
//!
//! Baselines answer only `Bought` or `SoldOut` (or `Error`): they implement
//! neither per-user limits nor idempotent request ids — the articles' versions
//! do not either — so a workload's `per_user_limit` is ignored and a retried
//! request id buys again. Compare them with shardstock on workloads without
//! retries or limits, or read their rows knowing this.
//!
//! Every instance works on its own row or key, named from the strategy and a
//! random run id (`bench_inventory.id = 'pg-for-update-3f9a…'`,
//! `bench:{redis-decr-rollback-3f9a…}:stock`), so runs in parallel — tests,
//! two engineers — never meet.

mod pg;
mod redis_single;

pub use pg::{DEFAULT_PG_URL, PgConditionalUpdate, PgForUpdate, PgVersionCas};
/// A fred client with the baselines' reconnect policy and command timeout.
pub use redis_single::connect as connect_redis;
pub use redis_single::{DEFAULT_REDIS_URL, RedisDecrRollback, RedisLuaSingleKey, SINGLE_KEY_LUA};

/// The command that starts the machine's Redis, for error messages.
pub const START_REDIS: &str = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save \"\" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log";
/// The command that starts the machine's PostgreSQL, for error messages.
pub const START_POSTGRES: &str =
    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start";

/// `<strategy>-<16 hex digits>`: unique per instance.
fn run_id(strategy: &str) -> String {
    format!("{strategy}-{:016x}", rand::random::<u64>())
}
