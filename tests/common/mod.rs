//! Test harness: real backends only.
//!
//! - `standalone()`: the machine's Redis on 127.0.0.1:6379 (each test uses its
//!   own event ids, so tests share it safely).
//! - `RedisServer::start()`: a private `redis-server` on a free port, for tests
//!   that flush scripts, count commands or restart the server.
//! - `cluster()`: a 3-master Redis Cluster on free ports, started once per test
//!   binary with `redis-server --cluster-enabled yes` + `redis-cli --cluster create`.
//!
//! Private servers run under a tiny `sh` watchdog that kills them when the test
//! process is gone, so nothing outlives `cargo test` (not even after a panic or
//! a kill -9). When a backend is missing the tests fail loudly with the command
//! that starts it; they never skip.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::store::redis::RedisOptions;
use shardstock::{Engine, EngineOptions, MemoryStore, RedisStore};

pub const START_REDIS: &str = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save \"\" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log";
pub const START_POSTGRES: &str =
    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start";

/// A unique event id for this test run.
pub fn event_id(prefix: &str) -> EventId {
    EventId::parse(format!("{prefix}-{:08x}", rand::random::<u32>())).unwrap()
}

pub fn user(name: impl Into<String>) -> UserId {
    UserId::parse(name.into()).unwrap()
}

pub fn spec(id: &EventId, stock: u64, buckets: u32) -> EventSpec {
    EventSpec {
        id: id.clone(),
        stock,
        buckets,
        per_user_limit: None,
        max_per_order: DEFAULT_MAX_PER_ORDER,
        starts_at: None,
        ends_at: None,
    }
}

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

/// This test process's key namespace on a shared Redis: its events, and only
/// its events, are what its flushers and gauges see.
pub fn namespace() -> String {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep_dead_namespaces);
    format!("t{}", std::process::id())
}

/// Deletes the keys earlier test processes left on the shared Redis (their
/// namespace is `t<pid>`; a pid without a /proc entry is gone).
fn sweep_dead_namespaces() {
    let Ok(out) = Command::new("redis-cli")
        .args(["--scan", "--pattern", "t[0-9]*:*"])
        .output()
    else {
        return;
    };
    let keys = String::from_utf8_lossy(&out.stdout).into_owned();
    let dead: Vec<&str> = keys
        .lines()
        .filter(|k| {
            let pid = k[1..].split(':').next().unwrap_or_default();
            !Path::new(&format!("/proc/{pid}")).exists()
        })
        .collect();
    for chunk in dead.chunks(500) {
        let _ = Command::new("redis-cli").arg("del").args(chunk).output();
    }
}

pub fn redis_options(url: &str) -> RedisOptions {
    let mut opts = RedisOptions::new(url);
    opts.namespace = namespace();
    opts
}

pub async fn connect(url: &str) -> RedisStore {
    RedisStore::connect(&redis_options(url))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Redis at {url}: {e}"))
}

/// The machine's Redis (127.0.0.1:6379).
pub async fn standalone() -> Engine<RedisStore> {
    let url = "redis://127.0.0.1:6379";
    let store = RedisStore::connect(&redis_options(url))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Redis is not answering on 127.0.0.1:6379 ({e}); start it with:\n  {START_REDIS}"
            )
        });
    Engine::new(store, EngineOptions::default())
}

/// This test process's PostgreSQL database (created by the ledger on first
/// connect). Databases of earlier runs are dropped the first time.
pub fn pg_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let psql = |sql: &str| {
            Command::new("psql")
                .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-tA", "-c", sql])
                .output()
        };
        let out = psql("SELECT datname FROM pg_database WHERE datname LIKE 'shardstock_t_%'")
            .unwrap_or_else(|e| panic!("psql failed ({e}); install postgresql-client"));
        assert!(
            out.status.success(),
            "PostgreSQL is not answering on 127.0.0.1:5432 ({}); start it with:\n  {START_POSTGRES}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let mine = format!("shardstock_t_{}", std::process::id());
        for old in String::from_utf8_lossy(&out.stdout).lines().filter(|d| *d != mine) {
            // Best effort: a database still in use by another run stays.
            let _ = psql(&format!("DROP DATABASE IF EXISTS \"{old}\""));
        }
        let created = psql(&format!("CREATE DATABASE \"{mine}\"")).expect("psql");
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
        format!("postgres://postgres@127.0.0.1:5432/{mine}")
    })
    .clone()
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

/// A user id whose home bucket is `bucket` among `n`.
pub fn user_homed_at(bucket: u32, n: u32, salt: &str) -> String {
    (0..)
        .map(|i| format!("u-{salt}-{i}"))
        .find(|u| {
            shardstock::domain::routing::home(
                shardstock::domain::routing::user_hash(&user(u.as_str())),
                n,
            ) == bucket
        })
        .unwrap()
}

/// A fresh SQLite file for one app.
pub fn sqlite_url() -> String {
    format!("sqlite://{}/ledger.db", temp_dir("sqlite").display())
}

/// An engine on the shared test Cluster.
pub async fn cluster() -> Engine<RedisStore> {
    let url = shared_cluster().url();
    Engine::new(connect(&url).await, EngineOptions::default())
}

pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        require("redis-cli");
        RedisCluster::start().expect("start a 3-master Redis Cluster")
    })
}

fn require(binary: &str) {
    let ok = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{binary}` is not installed; install Redis 7 (Debian: apt-get install redis-server)"
    );
}

pub use shardstock_bench::cluster::free_port;
use shardstock_bench::cluster::{redis_cli, scratch_dir as temp_dir};

fn spawn_redis(dir: &Path, args: &str) -> Child {
    require("redis-server");
    shardstock_bench::cluster::spawn_redis(dir, args).expect("spawn redis-server")
}

fn wait_until(what: &str, timeout: Duration, ok: impl FnMut() -> bool) {
    shardstock_bench::cluster::wait_until(what, timeout, ok).unwrap();
}

/// A private standalone redis-server.
pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    extra: String,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with("--save '' --appendonly no")
    }

    /// Starts with extra `redis-server` arguments (e.g. AOF settings).
    pub fn start_with(extra: &str) -> Self {
        let mut s = Self {
            port: free_port(),
            dir: temp_dir("redis"),
            extra: extra.to_owned(),
            child: None,
        };
        s.boot();
        s
    }

    fn boot(&mut self) {
        let args = format!("--port {} --bind 127.0.0.1 {}", self.port, self.extra);
        self.child = Some(spawn_redis(&self.dir, &args));
        let port = self.port;
        wait_until("redis-server to answer", Duration::from_secs(10), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Stops the server (SHUTDOWN NOSAVE unless `save`), keeping its directory.
    pub fn stop(&mut self, save: bool) {
        let _ = self.cli(&["shutdown", if save { "save" } else { "nosave" }]);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop(false);
        self.boot();
    }

    /// Kills the server with SIGKILL (no shutdown, no final save), then starts
    /// it again on the same port and directory: what a crash and a supervisor do.
    pub fn crash_and_restart(&mut self) {
        let info = self.cli(&["info", "server"]);
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .expect("INFO server has process_id")
            .trim()
            .to_owned();
        let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
        assert!(killed.success());
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        let port = self.port;
        wait_until(
            "the killed server to go away",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        );
        self.boot();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop(false);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The 3-master test Cluster.
pub type RedisCluster = shardstock_bench::cluster::LocalCluster;

/// Runs each listed `async fn name<S: Store>(engine: Engine<S>)` against the
/// memory store, the machine's Redis and the test Cluster (home steps batched,
/// the default), and again on memory and Redis with batching off.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::standalone().await).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::cluster().await).await;
                }
            )*
        }
        /// The same tests without group commit of the home step.
        mod unbatched_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let engine = shardstock::Engine::new(shardstock::MemoryStore::new(), $crate::common::unbatched());
                    super::$name(engine).await;
                }
            )*
        }
        mod unbatched_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let store = $crate::common::standalone().await.store().clone();
                    super::$name(shardstock::Engine::new(store, $crate::common::unbatched())).await;
                }
            )*
        }
    };
}
