//! Private Redis servers and the 3-master test Cluster.
//!
//! - `RedisServer::start()`: a private `redis-server` on a free port, for tests
//!   that flush scripts, count commands, stop, crash or restart the server —
//!   never the shared one, since every suite now runs in the same process.
//! - `shared_cluster()`: a 3-master Redis Cluster on free ports, started once
//!   per test process with `redis-server --cluster-enabled yes` +
//!   `redis-cli --cluster create`, shared by every suite's Cluster tests
//!   (namespaces keep them apart). A test that disturbs a Cluster starts its
//!   own `RedisCluster`.
//!
//! Servers run under a tiny `sh` watchdog that kills them when the test
//! process is gone, so nothing outlives `cargo test` (not even after a panic or
//! a kill -9). The process plumbing is the bench's (`shardstock_bench::cluster`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub use shardstock_bench::cluster::{free_port, scratch_dir};
use shardstock_bench::cluster::{redis_cli, spawn_redis};

use super::wait_until;

/// A 3-master Cluster on free ports (stopped when dropped).
pub type RedisCluster = shardstock_bench::cluster::LocalCluster;

/// The Cluster every suite's Cluster tests share, started on first use.
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
            dir: scratch_dir("redis"),
            extra: extra.to_owned(),
            child: None,
        };
        s.boot();
        s
    }

    fn boot(&mut self) {
        require("redis-server");
        let args = format!("--port {} --bind 127.0.0.1 {}", self.port, self.extra);
        self.child = Some(spawn_redis(&self.dir, &args).expect("spawn redis-server"));
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

    /// The server's process id (to signal it).
    pub fn pid(&self) -> String {
        process_id(&self.cli(&["info", "server"]))
    }

    /// Stops the server (SHUTDOWN NOSAVE unless `save`), keeping its directory.
    pub fn stop(&mut self, save: bool) {
        let _ = self.cli(&["shutdown", if save { "save" } else { "nosave" }]);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Kills the server with SIGKILL (no shutdown, no final save), then starts
    /// it again on the same port and directory: what a crash and a supervisor do.
    pub fn crash_and_restart(&mut self) {
        self.crash_and_restart_after(|_| {});
    }

    /// [`RedisServer::crash_and_restart`], running `meanwhile` on the
    /// server's directory while it is down (e.g. to cut its AOF back to what
    /// a host crash would have left on disk).
    pub fn crash_and_restart_after(&mut self, meanwhile: impl FnOnce(&std::path::Path)) {
        let pid = self.pid();
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
        meanwhile(&self.dir);
        self.boot();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop(false);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The process id in the text of `INFO server`.
pub fn process_id(info_server: &str) -> String {
    info_server
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("INFO server has process_id")
        .trim()
        .to_owned()
}
