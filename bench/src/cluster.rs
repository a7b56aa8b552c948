//! A throwaway 3-master Redis Cluster on free ports, for `--compare` and the
//! tests — this crate's and the service's, which reach it as a dev-dependency:
//! `redis-server --cluster-enabled yes` ×3 + `redis-cli --cluster create`.
//! Also the process helpers those share: free ports, scratch directories,
//! private `redis-server`s.
//!
//! Each server runs under a small `sh` watchdog that kills it when the process
//! that started it is gone, so nothing outlives a benchmark or a test run —
//! not even after a panic or a SIGKILL. `Drop` shuts the nodes down.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BenchError;

/// A port whose cluster-bus twin (port + 10000) is free too.
///
/// Both lie below the kernel's ephemeral range (32768 and up on Linux), so an
/// outgoing connection cannot take the port between this check and the
/// server's bind — a busy test run opens thousands of those (a CI run saw a
/// node never answer after `bind(0)` had handed out an ephemeral port). No
/// port is handed out twice in one process.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = rand::random_range(10_000..22_000u16);
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        let given = given.get_or_insert_with(HashSet::new);
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok()
        {
            given.insert(port);
            return port;
        }
    }
}

/// Starts `redis-server args…` in `dir` under a watchdog.
pub fn spawn_redis(dir: &Path, args: &str) -> Result<Child, BenchError> {
    let me = std::process::id();
    let script = format!(
        "redis-server {args} --dir {dir} --daemonize no --logfile {dir}/redis.log & r=$!; \
         trap 'kill $r 2>/dev/null' TERM; \
         while kill -0 {me} 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 0.5; done; \
         kill $r 2>/dev/null; wait $r",
        dir = dir.display()
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            BenchError::Unavailable(format!("cannot start redis-server ({e}); install Redis 7"))
        })
}

/// `redis-cli -p port args…`, its standard output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Waits until `ok` or fails after `timeout`.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> bool,
) -> Result<(), BenchError> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > timeout {
            return Err(BenchError::Unavailable(format!(
                "timed out waiting for {what}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A scratch directory under the system's temp dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "shardstock-{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A 3-master Redis Cluster on free ports.
pub struct LocalCluster {
    pub ports: Vec<u16>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl LocalCluster {
    /// Starts one, on fresh ports up to three times: a node that never
    /// answers (its port taken after all) costs a retry, not the run.
    pub fn start() -> Result<Self, BenchError> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start() {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("three tries"))
    }

    fn try_start() -> Result<Self, BenchError> {
        let dir = scratch_dir("cluster");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut children = Vec::new();
        for p in &ports {
            let node = dir.join(p.to_string());
            std::fs::create_dir_all(&node).map_err(|e| BenchError::Unavailable(e.to_string()))?;
            children.push(spawn_redis(
                &node,
                &format!(
                    "--port {p} --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
                     --cluster-node-timeout 2000 --save '' --appendonly no"
                ),
            )?);
        }
        let cluster = Self {
            ports,
            children,
            dir,
        };
        for &p in &cluster.ports {
            wait_until("a cluster node to answer", Duration::from_secs(10), || {
                redis_cli(p, &["ping"]).trim() == "PONG"
            })?;
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|e| BenchError::Unavailable(format!("redis-cli --cluster create: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Unavailable(format!(
                "cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        for &p in &cluster.ports {
            wait_until("cluster_state:ok", Duration::from_secs(20), || {
                redis_cli(p, &["cluster", "info"]).contains("cluster_state:ok")
            })?;
        }
        Ok(cluster)
    }

    /// `redis-cluster://…` for fred.
    pub fn url(&self) -> String {
        let rest: Vec<String> = self.ports[1..]
            .iter()
            .map(|p| format!("node=127.0.0.1:{p}"))
            .collect();
        format!(
            "redis-cluster://127.0.0.1:{}?{}",
            self.ports[0],
            rest.join("&")
        )
    }

    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        redis_cli(self.ports[node], args)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for (p, c) in self.ports.iter().zip(&mut self.children) {
            let _ = redis_cli(*p, &["shutdown", "nosave"]);
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
