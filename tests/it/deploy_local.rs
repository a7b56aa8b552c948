//! The observability contract, proven against a real Prometheus: the local
//! topology of `deploy/local/up.sh` (a 3-master Redis Cluster, each master with a
//! replica and the service waiting for it, PostgreSQL, two service replicas,
//! Prometheus scraping them) runs a sale across both
//! replicas; then every expression of the Grafana dashboard and the left side
//! of every alert rule must return data (`deploy/local/query_check.py`), and
//! `promtool` must accept the configuration and the rules.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const INSTALL: &str = "bash deploy/local/install.sh";

/// Stops the topology whatever happens to the test.
struct Topology {
    run_dir: PathBuf,
    env: HashMap<String, String>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(Path::new(REPO).join("deploy/local/down.sh"))
            .env("RUN_DIR", &self.run_dir)
            .status();
    }
}

fn require(path: &str, what: &str) {
    assert!(
        Path::new(path).exists()
            || Command::new("which")
                .arg(path)
                .output()
                .is_ok_and(|o| o.status.success()),
        "{what} is missing; install it with:\n  {INSTALL}"
    );
}

/// The first of `n` consecutive ports that are free, each with its Redis
/// Cluster bus port (10,000 above), all below the ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), from a random start so that
/// runs side by side seldom try the same ones.
fn quiet_ports(n: u16) -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("read /proc/sys/net/ipv4/ip_local_port_range");
    let low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the ephemeral range's low end");
    let (first, last) = (10_000, low.saturating_sub(10_000 + n));
    assert!(
        first < last,
        "no room below the ephemeral range ({range}) for {n} ports and their bus ports"
    );
    for _ in 0..1_000 {
        let base = rand::random_range(first..last);
        let free = (base..base + n).all(|p| {
            [p, p + 10_000]
                .iter()
                .all(|&q| std::net::TcpListener::bind(("127.0.0.1", q)).is_ok())
        });
        if free {
            return base;
        }
    }
    panic!("no {n} free ports in a row below {low} after 1,000 tries");
}

fn up() -> Topology {
    crate::harness::ensure_test_tools();
    require(
        "/usr/bin/prometheus",
        "Prometheus (Debian's prometheus package)",
    );
    require("promtool", "promtool (Debian's prometheus package)");
    let run_dir = std::env::temp_dir().join(format!("shardstock-topology-{}", std::process::id()));
    let config = run_dir.with_extension("toml");
    std::fs::write(
        &config,
        "[server]\ngauges_interval_ms = 500\n\
         [database]\naudit_interval_ms = 1000\nclaim_idle_ms = 1000\nflush_block_ms = 20\n\
         [rebalancer]\ninterval_ms = 100\nlease_ttl_ms = 1000\n\
         [[events]]\nid = \"dash\"\nstock = 20000\nbuckets = 8\nper_user_limit = 4\nmax_per_order = 2\n\
         [[releases]]\nid = \"drop\"\nper_user_limit = 4\npools = [{ id = \"s42\", stock = 500, buckets = 4 }, \
         { id = \"s43\", stock = 500, buckets = 4 }]\n",
    )
    .unwrap();
    // Every port of the topology below the kernel's ephemeral range: up.sh
    // checks that a port has no listener, then the process binds it a moment
    // later, and a port in that range can be taken meanwhile as the local
    // port of any outgoing connection (the suite's other tests open hundreds;
    // CI once saw shardstock-2 exit at start). Eleven in a row: eight Redis
    // servers (each with its bus port 10000 above), two services, Prometheus.
    let base = quiet_ports(11);
    let out = Command::new("bash")
        .arg(Path::new(REPO).join("deploy/local/up.sh"))
        .envs([
            ("RUN_DIR", run_dir.display().to_string()),
            (
                "SHARDSTOCK_BIN",
                env!("CARGO_BIN_EXE_shardstock").to_owned(),
            ),
            ("CONFIG", config.display().to_string()),
            (
                "DB_NAME",
                format!("shardstock_it_topology_{}", std::process::id()),
            ),
            ("RESET_DB", "1".to_owned()),
            ("REDIS_BASE_PORT", base.to_string()),
            ("BASE_PORT", (base + 8).to_string()),
            ("PROM_PORT", (base + 10).to_string()),
        ])
        .output()
        .unwrap();
    let mut topology = Topology {
        run_dir: run_dir.clone(),
        env: HashMap::new(),
    };
    assert!(
        out.status.success(),
        "deploy/local/up.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    topology.env = std::fs::read_to_string(run_dir.join("env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect();
    topology
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dashboard_and_alert_expression_has_data_after_a_sale() {
    let t = up();
    let services: Vec<String> = t.env["SERVICE_URLS"]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(services.len(), 2, "two replicas");
    let token = t.env["ADMIN_TOKEN"].clone();
    let client = reqwest::Client::new();
    // A sale across both replicas: purchases (some replayed, some cancelled),
    // a rebalance and a reshard, so every counter moves.
    let mut orders = Vec::new();
    for i in 0..400 {
        let base = &services[i % 2];
        let body = json!({"user_id": format!("u-{}", i % 150), "quantity": 1 + i % 2, "request_id": format!("r-{}", i % 380)});
        let r = client
            .post(format!("{base}/v1/events/dash/purchases"))
            .json(&body)
            .send()
            .await
            .unwrap();
        if r.status() == 201 {
            let order: Value = r.json().await.unwrap();
            orders.push(order["order_id"].as_str().unwrap().to_owned());
        }
    }
    assert!(orders.len() > 200, "{} purchases succeeded", orders.len());
    // Release orders of one or two lines, so the release panels have pools
    // and order outcomes to show.
    let mut bought = 0;
    for i in 0..40 {
        let base = &services[i % 2];
        let mut lines = vec![json!({"pool": "s42", "quantity": 1})];
        if i % 2 == 1 {
            lines.push(json!({"pool": "s43", "quantity": 1}));
        }
        let body =
            json!({"user_id": format!("r-{i}"), "lines": lines, "request_id": format!("ro-{i}")});
        let r = client
            .post(format!("{base}/v1/releases/drop/orders"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert!(status == 201, "{status}: {}", r.text().await.unwrap());
        bought += 1;
    }
    assert_eq!(bought, 40);
    for oid in orders.iter().step_by(20) {
        let r = client
            .post(format!("{}/v1/orders/{oid}/cancel", services[1]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = client
        .post(format!("{}/v1/events/dash/rebalance", services[0]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = client
        .put(format!("{}/v1/events/dash/buckets", services[1]))
        .bearer_auth(&token)
        .json(&json!({"buckets": 12}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Scrapes every second, audits every second, and rate() needs two
    // samples: asked again until every expression has data. If one never
    // does, the failure names the expressions of the last report (a passing
    // test's output is not shown, and a long one is cut in CI's summary).
    let prometheus = &t.env["PROMETHEUS_URL"];
    let mut last = String::new();
    let answered = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let check = tokio::process::Command::new("python3")
                .arg(Path::new(REPO).join("deploy/local/query_check.py"))
                .arg(prometheus)
                .output()
                .await
                .unwrap();
            if check.status.success() {
                return;
            }
            last = format!(
                "{}\n{}",
                String::from_utf8_lossy(&check.stdout)
                    .lines()
                    .filter(|l| !l.starts_with("ok "))
                    .collect::<Vec<_>>()
                    .join("\n"),
                String::from_utf8_lossy(&check.stderr)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        answered.is_ok(),
        "after 90 s some dashboard or alert expressions still had no data; the last check said:\n{last}"
    );
    for args in [
        vec![
            "check".to_owned(),
            "config".to_owned(),
            t.run_dir
                .join("prometheus/prometheus.yml")
                .display()
                .to_string(),
        ],
        vec![
            "check".to_owned(),
            "rules".to_owned(),
            format!("{REPO}/deploy/prometheus/alerts.yml"),
        ],
    ] {
        let out = Command::new("promtool").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
