//! Engines on every backend, the namespaces that keep suites apart on the
//! shared Redis, the databases beside them, and `on_every_backend!` (the one
//! backend matrix: engines, engines each in a namespace of its own, apps).
//!
//! - `memory()`: the embedded store, fresh per test.
//! - `standalone(suite)`: the machine's Redis on 127.0.0.1:6379 (each test
//!   uses its own event ids, so tests share it safely).
//! - `cluster(suite)`: the 3-master test Cluster (see `servers`), started
//!   once per test process.
//!
//! When a backend is missing the tests fail loudly with the command that
//! starts it; they never skip.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use shardstock::store::redis::RedisOptions;
use shardstock::{Engine, EngineOptions, MemoryStore, RedisStore};

use super::servers::{scratch_dir, shared_cluster};

pub const START_REDIS: &str = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save \"\" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log";
pub const START_POSTGRES: &str =
    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start";

pub fn memory() -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(), EngineOptions::default())
}

/// Engine options without group commit (every purchase its own script call).
pub fn unbatched() -> EngineOptions {
    EngineOptions {
        max_batch: None,
        ..EngineOptions::default()
    }
}

/// The suite a test belongs to: the first module under the test crate
/// (`it::ledger::redis` → `ledger`). Pass `module_path!()`.
pub fn suite_of(module_path: &str) -> &str {
    module_path.split("::").nth(1).unwrap_or("it")
}

/// The key namespace of `suite` on a shared Redis: `it<pid>-<suite>`.
///
/// One per suite, as when each suite was its own test binary: an app's
/// background loops (rebalancer, flusher, gauges) walk every event of their
/// namespace, so in one shared namespace an API test's app would lead the
/// rebalancer tests' events and flush the ledger tests' records mid-audit.
/// (`it`, not the `t<pid>` of the old per-binary harness: that one's sweep,
/// still run by older checkouts on the same machine, reads anything after
/// `t` up to the `:` as a pid and deletes what it cannot find in /proc.)
pub fn namespace(suite: &str) -> String {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep_dead_namespaces);
    format!("it{}-{suite}", std::process::id())
}

/// Whether the test process `pid` is gone.
fn is_dead(pid: &str) -> bool {
    !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a key of a test namespace (`it<pid>-…:` or the old `t<pid>:`).
fn pid_of(key: &str) -> &str {
    let rest = key.trim_start_matches("it").trim_start_matches('t');
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    &rest[..digits]
}

/// Deletes the keys earlier test processes left on the shared Redis: only
/// those of processes that are gone, so runs in other checkouts are safe.
fn sweep_dead_namespaces() {
    for pattern in ["it[0-9]*-*:*", "t[0-9]*:*"] {
        let Ok(out) = Command::new("redis-cli")
            .args(["--scan", "--pattern", pattern])
            .output()
        else {
            return;
        };
        let keys = String::from_utf8_lossy(&out.stdout).into_owned();
        let dead: Vec<&str> = keys.lines().filter(|k| is_dead(pid_of(k))).collect();
        for chunk in dead.chunks(500) {
            let _ = Command::new("redis-cli").arg("del").args(chunk).output();
        }
    }
}

pub fn redis_options(url: &str, suite: &str) -> RedisOptions {
    let mut opts = RedisOptions::new(url);
    opts.namespace = namespace(suite);
    opts
}

/// A store on the Redis at `url`, in `suite`'s namespace.
pub async fn connect(url: &str, suite: &str) -> RedisStore {
    RedisStore::connect(&redis_options(url, suite))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Redis at {url}: {e}"))
}

/// An engine on the machine's Redis (127.0.0.1:6379), in `suite`'s namespace.
pub async fn standalone(suite: &str) -> Engine<RedisStore> {
    let url = "redis://127.0.0.1:6379";
    let store = RedisStore::connect(&redis_options(url, suite))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Redis is not answering on 127.0.0.1:6379 ({e}); start it with:\n  {START_REDIS}"
            )
        });
    Engine::new(store, EngineOptions::default())
}

/// An engine on the shared test Cluster, in `suite`'s namespace.
pub async fn cluster(suite: &str) -> Engine<RedisStore> {
    let url = shared_cluster().url();
    Engine::new(connect(&url, suite).await, EngineOptions::default())
}

/// This test process's PostgreSQL database (created by the ledger on first
/// connect). Databases of earlier, finished runs are dropped the first time.
pub fn pg_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let psql = |sql: &str| {
            Command::new("psql")
                .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-tA", "-c", sql])
                .output()
        };
        // Ours are `shardstock_it_…`; `shardstock_t_…` are the old harness's.
        let out = psql(
            "SELECT datname FROM pg_database \
             WHERE datname LIKE 'shardstock\\_it\\_%' OR datname LIKE 'shardstock\\_t\\_%'",
        )
        .unwrap_or_else(|e| panic!("psql failed ({e}); install postgresql-client"));
        assert!(
            out.status.success(),
            "PostgreSQL is not answering on 127.0.0.1:5432 ({}); start it with:\n  {START_POSTGRES}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let mine = format!("shardstock_it_{}", std::process::id());
        // Only the databases of runs that are gone: a database another run
        // (another checkout's `cargo test`) created but has not connected to
        // yet would otherwise be dropped under it. (The old harness dropped
        // every `shardstock_t_…` but its own: hence the new prefix.)
        let finished = |db: &&str| is_dead(db.rsplit('_').next().unwrap_or_default());
        for old in String::from_utf8_lossy(&out.stdout).lines().filter(finished) {
            let _ = psql(&format!("DROP DATABASE IF EXISTS \"{old}\""));
        }
        let created = psql(&format!("CREATE DATABASE \"{mine}\"")).expect("psql");
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
        format!("postgres://postgres@127.0.0.1:5432/{mine}")
    })
    .clone()
}

/// A pool on this process's PostgreSQL database for a test's own queries,
/// connected without JIT as the ledger connects (`ledger::prepare_url`): the
/// `orders` view's subplans otherwise make the planner compile every order
/// lookup, ~0.5 s each once the database holds a few thousand records
/// (durability's checks of every acknowledged order ran for minutes).
pub async fn pg_pool() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&format!("{}?options=-c%20jit%3Doff", pg_url()))
        .await
        .expect("connect to this process's PostgreSQL database")
}

/// A fresh SQLite file for one app or ledger.
pub fn sqlite_url() -> String {
    format!("sqlite://{}/ledger.db", scratch_dir("sqlite").display())
}

/// A ledger for an engine's backend: a fresh SQLite file beside the memory
/// store, this process's PostgreSQL database beside Redis.
pub async fn ledger_for(kind: &str) -> shardstock::ledger::Ledger {
    let url = if kind == "memory" {
        sqlite_url()
    } else {
        pg_url()
    };
    shardstock::ledger::Ledger::connect(&url, 4).await.unwrap()
}

/// The backend matrix: runs each listed test on every backend it can meet,
/// one module a backend, so a test is named `<suite>::<backend>::<name>`.
///
/// - `on_every_backend!(a, b)`: each `async fn name<S: Store>(engine:
///   Engine<S>)` on the memory store, the machine's Redis and the test
///   Cluster (home steps batched, the default) — modules `memory`, `redis`,
///   `cluster` — and again on memory and Redis with batching off
///   (`unbatched_memory`, `unbatched_redis`). Redis tests use the suite's
///   namespace.
/// - `on_every_backend!(namespace_per_test: a, b)`: the same on `memory`,
///   `redis` and `cluster` (batched only), each Redis test in a key namespace
///   of its own (`<suite>-<random>`), for tests that move an engine's clock
///   over deployment-wide state (the holds' deadline index).
/// - `on_every_backend!(namespace_per_test, unbatched: a, b)`: those tests
///   again on memory and Redis with batching off (`unbatched_memory`,
///   `unbatched_redis`, each Redis test in a namespace of its own); list
///   them under `namespace_per_test:` too.
/// - `on_every_backend!(app: a, b)`: each `async fn name(backend: Backend)`
///   on every backend a `TestApp` runs on: `on_memory` and `on_redis`.
macro_rules! on_every_backend {
    (app: $($name:ident),* $(,)?) => {
        $crate::harness::on_every_backend!(@app on_memory, Memory; $($name),*);
        $crate::harness::on_every_backend!(@app on_redis, Redis; $($name),*);
    };
    (namespace_per_test: $($name:ident),* $(,)?) => {
        $crate::harness::on_every_backend!(@engine memory, |_suite| $crate::harness::memory(); $($name),*);
        $crate::harness::on_every_backend!(@engine redis, |suite| {
            let apart = format!("{suite}-{:08x}", rand::random::<u32>());
            $crate::harness::standalone(&apart).await
        }; $($name),*);
        $crate::harness::on_every_backend!(@engine cluster, |suite| {
            let apart = format!("{suite}-{:08x}", rand::random::<u32>());
            $crate::harness::cluster(&apart).await
        }; $($name),*);
    };
    (namespace_per_test, unbatched: $($name:ident),* $(,)?) => {
        $crate::harness::on_every_backend!(@engine unbatched_memory, |_suite| shardstock::Engine::new(
            shardstock::MemoryStore::new(),
            $crate::harness::unbatched(),
        ); $($name),*);
        $crate::harness::on_every_backend!(@engine unbatched_redis, |suite| {
            let apart = format!("{suite}-{:08x}", rand::random::<u32>());
            shardstock::Engine::new(
                $crate::harness::standalone(&apart).await.store().clone(),
                $crate::harness::unbatched(),
            )
        }; $($name),*);
    };
    (@app $module:ident, $backend:ident; $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::harness::Backend::$backend).await;
                }
            )*
        }
    };
    (@engine $module:ident, |$suite:ident| $engine:expr; $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let $suite = $crate::harness::suite_of(module_path!());
                    super::$name($engine).await;
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        $crate::harness::on_every_backend!(@engine memory, |_suite| $crate::harness::memory(); $($name),*);
        $crate::harness::on_every_backend!(@engine redis, |suite| $crate::harness::standalone(suite).await; $($name),*);
        $crate::harness::on_every_backend!(@engine cluster, |suite| $crate::harness::cluster(suite).await; $($name),*);
        // The same tests without group commit of the home step.
        $crate::harness::on_every_backend!(@engine unbatched_memory, |_suite| shardstock::Engine::new(
            shardstock::MemoryStore::new(),
            $crate::harness::unbatched(),
        ); $($name),*);
        $crate::harness::on_every_backend!(@engine unbatched_redis, |suite| shardstock::Engine::new(
            $crate::harness::standalone(suite).await.store().clone(),
            $crate::harness::unbatched(),
        ); $($name),*);
    };
}
pub(crate) use on_every_backend;
