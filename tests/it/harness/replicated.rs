//! `ReplicatedCluster`: a private Redis Cluster of 3 masters, each with one
//! replica, on free ports, for tests that kill a master and watch its replica
//! take over (`tests/it/failover.rs`).
//!
//! The node timeout is short (2 s) so a failover happens within seconds, and
//! long enough that two busy cores do not fail a healthy master. Every wait
//! polls `CLUSTER INFO` / `ROLE` / `INFO replication` with a deadline: a
//! failover on a loaded machine takes as long as it takes, and the test
//! waits for the state it needs, never for a fixed time.
//!
//! `pause` stops a node (SIGSTOP) until its guard is dropped: a replica
//! that falls behind, so a failover loses what its master acknowledged
//! meanwhile. A killed node keeps its directory (its `nodes.conf`): `restart` starts it
//! on the same port, and it rejoins as a replica of the node that replaced it,
//! as a supervisor restarting a crashed master would have it.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use shardstock_bench::cluster::{free_port, redis_cli, scratch_dir, spawn_redis};

use super::{process_id, wait_until};

/// How long a node may stay silent before the others fail it.
pub const NODE_TIMEOUT_MS: u64 = 2_000;

/// One node: its port, directory and process (the `sh` watchdog around it).
struct Node {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn boot(&mut self) {
        let args = format!(
            "--port {} --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
             --cluster-node-timeout {NODE_TIMEOUT_MS} --save '' --appendonly no",
            self.port
        );
        self.child = Some(spawn_redis(&self.dir, &args).expect("spawn a cluster node"));
        let port = self.port;
        wait_until("a cluster node to answer", Duration::from_secs(20), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        });
    }
}

/// 3 masters + 3 replicas (stopped when dropped).
pub struct ReplicatedCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl ReplicatedCluster {
    pub fn start() -> Self {
        let dir = scratch_dir("cluster-replicated");
        let mut nodes: Vec<Node> = (0..6)
            .map(|_| {
                let port = free_port();
                let node_dir = dir.join(port.to_string());
                std::fs::create_dir_all(&node_dir).unwrap();
                Node {
                    port,
                    dir: node_dir,
                    child: None,
                }
            })
            .collect();
        for n in &mut nodes {
            n.boot();
        }
        let cluster = Self { nodes, dir };
        let addrs: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis-cluster://…` naming every node, as an operator would configure it.
    pub fn url(&self) -> String {
        let ports = self.ports();
        let rest: Vec<String> = ports[1..]
            .iter()
            .map(|p| format!("node=127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://127.0.0.1:{}?{}", ports[0], rest.join("&"))
    }

    /// The nodes that answer `ROLE` as master, and as replica.
    pub fn roles(&self) -> (Vec<u16>, Vec<u16>) {
        let mut masters = Vec::new();
        let mut replicas = Vec::new();
        for p in self.ports() {
            match redis_cli(p, &["role"]).lines().next().map(str::trim) {
                Some("master") => masters.push(p),
                Some("slave") => replicas.push(p),
                _ => {}
            }
        }
        (masters, replicas)
    }

    /// The replica of the master on `port`, by its own `INFO replication`.
    pub fn replica_of(&self, master: u16) -> Option<u16> {
        self.ports().into_iter().find(|&p| {
            let info = redis_cli(p, &["info", "replication"]);
            let of = format!("master_port:{master}");
            info.contains("role:slave") && info.lines().any(|l| l.trim() == of)
        })
    }

    /// Waits until every running node sees `cluster_state:ok`, there are 3
    /// masters, each with a replica whose link is up and in sync.
    pub fn wait_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = self.unhealthy();
            let Some(problem) = problem else { return };
            assert!(
                Instant::now() < deadline,
                "the Cluster was not healthy within {timeout:?}: {problem}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What is not healthy yet, if anything.
    fn unhealthy(&self) -> Option<String> {
        for p in self.ports() {
            let info = redis_cli(p, &["cluster", "info"]);
            if !info.contains("cluster_state:ok") {
                return Some(format!(
                    "node {p}: {}",
                    info.lines().next().unwrap_or("no answer")
                ));
            }
        }
        let (masters, replicas) = self.roles();
        if masters.len() != 3 || replicas.len() != 3 {
            return Some(format!("masters {masters:?}, replicas {replicas:?}"));
        }
        for r in replicas {
            let info = redis_cli(r, &["info", "replication"]);
            if !info.contains("master_link_status:up") || info.contains("master_sync_in_progress:1")
            {
                return Some(format!("replica {r} not in sync"));
            }
        }
        for m in masters {
            if !redis_cli(m, &["info", "replication"]).contains("connected_slaves:1") {
                return Some(format!("master {m} has no connected replica"));
            }
        }
        None
    }

    /// Kills the master on `port` with SIGKILL (no shutdown, no last word to
    /// its replica) and returns at once.
    pub fn kill(&mut self, port: u16) {
        let pid = process_id(&redis_cli(port, &["info", "server"]));
        assert!(
            Command::new("kill")
                .args(["-9", &pid])
                .status()
                .unwrap()
                .success()
        );
        let node = self.nodes.iter_mut().find(|n| n.port == port).unwrap();
        if let Some(mut c) = node.child.take() {
            let _ = c.wait();
        }
        wait_until(
            "the killed node to go away",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        );
    }

    /// Waits until `replica` is a master and every node but `dead` sees the
    /// Cluster ok: the failover is done. The replica takes over by itself once
    /// the others fail its master (node timeout); past `force_after`, the
    /// test forces it with `CLUSTER FAILOVER TAKEOVER`, as an operator would.
    /// Returns how long the failover took.
    pub fn await_failover(&self, dead: u16, replica: u16, force_after: Duration) -> Duration {
        let began = Instant::now();
        let deadline = began + Duration::from_secs(60);
        let mut forced = false;
        loop {
            let promoted =
                redis_cli(replica, &["role"]).lines().next().map(str::trim) == Some("master");
            let ok = self
                .ports()
                .into_iter()
                .filter(|&p| p != dead)
                .all(|p| redis_cli(p, &["cluster", "info"]).contains("cluster_state:ok"));
            if promoted && ok {
                return began.elapsed();
            }
            if !promoted && !forced && began.elapsed() > force_after {
                println!("failover: forcing CLUSTER FAILOVER TAKEOVER on {replica}");
                let _ = redis_cli(replica, &["cluster", "failover", "takeover"]);
                forced = true;
            }
            assert!(
                Instant::now() < deadline,
                "no failover to {replica} within 60 s: {}",
                redis_cli(replica, &["cluster", "nodes"])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the node on `port` (SIGSTOP) until the guard is dropped: a
    /// replica that falls behind its master, as one across a slow network.
    pub fn pause(&self, port: u16) -> Paused {
        let pid = process_id(&redis_cli(port, &["info", "server"]));
        assert!(
            Command::new("kill")
                .args(["-STOP", &pid])
                .status()
                .unwrap()
                .success()
        );
        Paused(pid)
    }

    /// Starts a killed node again on its port and directory; it rejoins as a
    /// replica of the node that took its slots.
    pub fn restart(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).unwrap();
        node.boot();
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = redis_cli(n.port, &["shutdown", "nosave"]);
            if let Some(mut c) = n.child.take() {
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A stopped node, continued (SIGCONT) when dropped.
pub struct Paused(String);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}
