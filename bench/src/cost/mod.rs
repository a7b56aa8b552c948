//! `--http-cost`: what one purchase over HTTP costs, in CPU time of each
//! process, next to the hand-written endpoints it competes with.
//!
//! Each row is a real HTTP server in its own process, driven by the same load
//! (`load`): one-unit purchases by random users with fresh request ids. Around
//! the measured part the CPU time of the server, of Redis (a private
//! `redis-server` started for the run, so nothing else runs on it) and of
//! every PostgreSQL process is read from `/proc` ([`cpu`]); for shardstock the
//! "after" reading waits until the flusher has written every order to the
//! database, so the ledger's cost is in the row. Rows:
//! - the peers ([`peer`]): bare axum, axum + single-key Lua, the same + XADD;
//! - shardstock on the embedded store with SQLite;
//! - shardstock on Redis (N buckets) with PostgreSQL;
//! - the same on a `token` event, each purchase carrying an access token
//!   the load signs (`redis-pg-token`), and on a `draw` event, each request
//!   a new entry (`redis-pg-entry`): what admission control adds.
//!
//! CPU µs per purchase does not depend on how many cores were free, so the
//! ratios between rows of one run hold on a shared machine; requests per
//! second do not, and are shown for what they are. With `--cost-duration` the
//! Redis + PostgreSQL row also runs sustained, comparing its last 10 s with
//! its first and sampling the flush lag.

pub mod cpu;
pub mod load;
pub mod peer;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use self::cpu::{Cpu, Ticks};
use self::load::{Load, Request, Until, drive};
pub use self::peer::{Peer, serve_peer};
use crate::cluster::{free_port, redis_cli, scratch_dir, spawn_redis, wait_until};

const TOKEN: &str = "bench-cost-token";
/// Enough stock that no row sells out.
const STOCK: u64 = 1_000_000_000;

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    Peer(Peer),
    /// shardstock, embedded store + SQLite.
    Embedded,
    /// shardstock, Redis + PostgreSQL.
    RedisPg,
    /// The same, on a `token` event: every purchase carries its user's token.
    RedisPgToken,
    /// The same, on a `draw` event in its entry window: every request enters
    /// a new user.
    RedisPgEntry,
}

impl Row {
    /// Every row, peers first.
    pub const ALL: [Row; 5] = [
        Row::Peer(Peer::Bare),
        Row::Peer(Peer::Lua),
        Row::Peer(Peer::LuaXadd),
        Row::Embedded,
        Row::RedisPg,
    ];

    fn label(self, buckets: u32) -> String {
        match self {
            Row::Peer(p) => p.label().to_owned(),
            Row::Embedded => "shardstock, embedded store + SQLite".to_owned(),
            Row::RedisPg => format!("shardstock, Redis ({buckets} buckets) + PostgreSQL"),
            Row::RedisPgToken => {
                format!("shardstock, Redis ({buckets} buckets) + PostgreSQL, token purchases")
            }
            Row::RedisPgEntry => {
                format!("shardstock, Redis ({buckets} buckets) + PostgreSQL, draw entries")
            }
        }
    }

    /// A shardstock row on Redis and PostgreSQL.
    fn on_redis_pg(self) -> bool {
        matches!(self, Row::RedisPg | Row::RedisPgToken | Row::RedisPgEntry)
    }

    /// What the row's load sends.
    fn load(self) -> Request {
        match self {
            Row::RedisPgToken => Request::TokenPurchase {
                key: TOKEN_KEY.to_owned(),
            },
            Row::RedisPgEntry => Request::Entry,
            _ => Request::Purchase,
        }
    }
}

/// The `token_keys` of the token and draw rows' events.
const TOKEN_KEY: &str = "bench-cost-token-key-0123456789";
/// The token rows' allowance: random users of a million repeat, and each
/// repeat must buy as an open event's would.
const TOKEN_ALLOWANCE: u32 = 1000;

/// What to run.
#[derive(Debug, Clone)]
pub struct CostOptions {
    /// Measured requests per row (after the warm-up).
    pub requests: u64,
    pub warmup: u64,
    pub concurrency: usize,
    pub buckets: u32,
    /// A PostgreSQL URL; each shardstock row gets a fresh database beside it.
    pub pg: String,
    /// The `shardstock` binary.
    pub service: PathBuf,
    /// This binary, which serves the peers (`--serve-peer`).
    pub bench: PathBuf,
    pub rows: Vec<Row>,
    /// Also run the Redis + PostgreSQL row sustained for this long.
    pub sustained: Option<Duration>,
    /// The service's worker threads (`--worker-threads`); `None`: its default.
    pub service_threads: Option<usize>,
    /// The peers' worker threads (1: a current-thread runtime).
    pub peer_threads: u16,
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CostRow {
    pub label: String,
    pub requests: u64,
    pub created: u64,
    pub errors: u64,
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub server_us: f64,
    pub redis_us: Option<f64>,
    pub pg_us: Option<f64>,
    /// From the end of the load until every order was in the database.
    pub drain_ms: Option<u64>,
    /// Redis commands per purchase and µs inside Redis per purchase, by
    /// command (`INFO commandstats` over the measured part, drain included),
    /// the costliest first.
    pub redis_commands: Vec<CommandCost>,
}

/// One command's share of a row's Redis time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommandCost {
    pub command: String,
    pub calls_per_purchase: f64,
    pub us_per_purchase: f64,
}

/// `INFO commandstats` as (command, calls, µs), scripts' inner commands included.
fn commandstats(port: u16) -> Vec<(String, u64, u64)> {
    redis_cli(port, &["info", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), field("calls")?, field("usec")?))
        })
        .collect()
}

impl CostRow {
    pub fn total_us(&self) -> f64 {
        self.server_us + self.redis_us.unwrap_or(0.0) + self.pg_us.unwrap_or(0.0)
    }
}

/// A sustained run of the Redis + PostgreSQL row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sustained {
    pub seconds: u64,
    pub first_10s: f64,
    pub last_10s: f64,
    /// The largest flush lag sampled during the run, in orders and in
    /// seconds of sales at the run's mean rate.
    pub max_lag_orders: u64,
    pub max_lag_seconds: f64,
}

/// The whole measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cost {
    pub rows: Vec<CostRow>,
    pub sustained: Option<Sustained>,
    /// The service's worker threads (`None`: one per core) and the peers'.
    pub service_threads: Option<usize>,
    pub peer_threads: u16,
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private `redis-server` for the run.
struct PrivateRedis {
    _watchdog: Proc,
    port: u16,
    pid: u32,
}

impl PrivateRedis {
    fn start() -> anyhow::Result<Self> {
        let port = free_port();
        let dir = scratch_dir("cost-redis");
        let watchdog = Proc(spawn_redis(
            &dir,
            &format!("--port {port} --bind 127.0.0.1 --save '' --appendonly no"),
        )?);
        wait_until("the private redis-server", Duration::from_secs(10), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        })?;
        let info = redis_cli(port, &["info", "server"]);
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .context("no process_id in INFO server")?;
        Ok(Self {
            _watchdog: watchdog,
            port,
            pid,
        })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// The server is shut down before its watchdog is killed: a watchdog killed
/// first (SIGKILL, which its `trap` cannot catch) left the server running,
/// and every `--http-cost` run left one idle `redis-server` behind.
impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = redis_cli(self.port, &["shutdown", "nosave"]);
    }
}

/// Runs every row of `o`.
pub async fn http_cost(o: &CostOptions) -> anyhow::Result<Cost> {
    let redis = PrivateRedis::start()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(o.concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut rows = Vec::new();
    for (n, row) in o.rows.iter().enumerate() {
        eprintln!("cost: {}", row.label(o.buckets));
        rows.push(measure(o, *row, &redis, &client, n).await?);
    }
    let sustained = match o.sustained {
        Some(d) => Some(sustained(o, &redis, &client, d).await?),
        None => None,
    };
    Ok(Cost {
        rows,
        sustained,
        service_threads: o.service_threads,
        peer_threads: o.peer_threads,
    })
}

/// A server under test: its process, where it answers, the event it sells.
struct Server {
    proc: Proc,
    base: String,
    event: String,
    shardstock: bool,
    database: Option<String>,
}

async fn start(
    o: &CostOptions,
    row: Row,
    redis: &PrivateRedis,
    client: &reqwest::Client,
    n: usize,
) -> anyhow::Result<Server> {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let base = format!("http://{listen}");
    let event = format!("cost{n}x{:04x}", rand::random::<u16>());
    let (mut cmd, database) = match row {
        Row::Peer(p) => {
            let mut cmd = Command::new(&o.bench);
            let kind = match p {
                Peer::Bare => "bare",
                Peer::Lua => "lua",
                Peer::LuaXadd => "lua-xadd",
            };
            cmd.args(["--serve-peer", kind, "--listen", &listen, "--redis"])
                .arg(redis.url())
                .arg("--peer-threads")
                .arg(o.peer_threads.to_string());
            (cmd, None)
        }
        Row::Embedded | Row::RedisPg | Row::RedisPgToken | Row::RedisPgEntry => {
            let mut cmd = Command::new(&o.service);
            cmd.args(["serve", "--listen", &listen, "--admin-token", TOKEN]);
            if let Some(n) = o.service_threads {
                cmd.arg("--worker-threads").arg(n.to_string());
            }
            let db = if row.on_redis_pg() {
                let name = format!("shardstock_cost_{}_{n}", std::process::id());
                cmd.arg("--redis").arg(redis.url());
                cmd.arg("--database-url").arg(pg_database(&o.pg, &name));
                Some(name)
            } else {
                let file = scratch_dir("cost-sqlite").join("ledger.db");
                cmd.arg("--database-url")
                    .arg(format!("sqlite://{}", file.display()));
                None
            };
            (cmd, db)
        }
    };
    let proc = Proc(
        cmd.env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", row.label(o.buckets)))?,
    );
    let ready = Instant::now();
    loop {
        let up = client.get(format!("{base}/readyz")).send().await;
        if up.map(|r| r.status() == 200).unwrap_or(false) {
            break;
        }
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(30),
            "{} did not become ready",
            row.label(o.buckets)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shardstock = !matches!(row, Row::Peer(_));
    if shardstock {
        let mut body =
            json!({"id": event, "stock": STOCK, "buckets": o.buckets, "max_per_order": 1});
        match row {
            Row::RedisPgToken => {
                body["access"] = json!("token");
                body["token_keys"] = json!([TOKEN_KEY]);
            }
            Row::RedisPgEntry => {
                body["access"] = json!("draw");
                body["token_keys"] = json!([TOKEN_KEY]);
                body["draw"] = json!({"entries_until": "2099-01-01T00:00:00Z"});
            }
            _ => {}
        }
        let r = client
            .post(format!("{base}/v1/events"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 201, "creating the event: {}", r.text().await?);
    } else {
        let key = peer::stock_key(&event);
        redis_cli(redis.port, &["set", &key, &STOCK.to_string()]);
    }
    Ok(Server {
        proc,
        base,
        event,
        shardstock,
        database,
    })
}

/// `url` with its database name replaced by `name`.
fn pg_database(url: &str, name: &str) -> String {
    match url.rsplit_once('/') {
        Some((server, _)) if server.contains("://") && server.matches('/').count() >= 2 => {
            format!("{server}/{name}")
        }
        _ => format!("{url}/{name}"),
    }
}

/// The CPU time of the three processes a row may use.
#[derive(Debug, Clone, Copy)]
struct Reading {
    server: Ticks,
    redis: Ticks,
    pg: Ticks,
}

fn read(server: &Server, redis: &PrivateRedis) -> Reading {
    Reading {
        server: Cpu::of(server.proc.0.id()),
        redis: Cpu::of(redis.pid),
        pg: Cpu::postgres(),
    }
}

async fn measure(
    o: &CostOptions,
    row: Row,
    redis: &PrivateRedis,
    client: &reqwest::Client,
    n: usize,
) -> anyhow::Result<CostRow> {
    let server = start(o, row, redis, client, n).await?;
    let tag = format!("w{n}");
    drive(
        client,
        &server.base,
        &server.event,
        &row.load(),
        o.concurrency,
        Until::Requests(o.warmup),
        &tag,
    )
    .await?;
    drained(client, &server).await?;
    redis_cli(redis.port, &["config", "resetstat"]);
    let before = read(&server, redis);
    let load = drive(
        client,
        &server.base,
        &server.event,
        &row.load(),
        o.concurrency,
        Until::Requests(o.requests),
        &format!("m{n}"),
    )
    .await?;
    let ended = Instant::now();
    drained(client, &server).await?;
    let drain_ms = server
        .shardstock
        .then(|| ended.elapsed().as_millis() as u64);
    let after = read(&server, redis);
    let mut row = summarize(row.label(o.buckets), row, &load, before, after, drain_ms);
    if row.redis_us.is_some() {
        let ops = load.created.max(1) as f64;
        let mut stats = commandstats(redis.port);
        stats.sort_by_key(|(_, _, us)| std::cmp::Reverse(*us));
        row.redis_commands = stats
            .into_iter()
            .map(|(command, calls, us)| CommandCost {
                command,
                calls_per_purchase: calls as f64 / ops,
                us_per_purchase: us as f64 / ops,
            })
            .collect();
    }
    stop(server, &o.pg).await;
    Ok(row)
}

fn summarize(
    label: String,
    row: Row,
    load: &Load,
    before: Reading,
    after: Reading,
    drain_ms: Option<u64>,
) -> CostRow {
    let ops = load.created.max(1);
    let uses_redis = matches!(row, Row::Peer(Peer::Lua | Peer::LuaXadd)) || row.on_redis_pg();
    CostRow {
        label,
        requests: load.requests,
        created: load.created,
        errors: load.errors,
        rate: load.rate(),
        p50_ms: load.latency_us.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: load.latency_us.value_at_quantile(0.99) as f64 / 1e3,
        server_us: (after.server - before.server).micros_per(ops),
        redis_us: uses_redis.then(|| (after.redis - before.redis).micros_per(ops)),
        pg_us: row
            .on_redis_pg()
            .then(|| (after.pg - before.pg).micros_per(ops)),
        drain_ms,
        redis_commands: Vec::new(),
    }
}

/// Waits until a shardstock server's flusher has written every order.
async fn drained(client: &reqwest::Client, server: &Server) -> anyhow::Result<()> {
    if !server.shardstock {
        return Ok(());
    }
    let start = Instant::now();
    loop {
        let audit = audit(client, server).await?;
        if audit["sold_unflushed"].as_u64() == Some(0) {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "the flusher did not catch up in 300 s: {audit}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn audit(client: &reqwest::Client, server: &Server) -> anyhow::Result<Value> {
    Ok(client
        .get(format!("{}/v1/events/{}/audit", server.base, server.event))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .json()
        .await?)
}

/// Stops a server and drops its database.
async fn stop(server: Server, pg: &str) {
    let Server { proc, database, .. } = server;
    drop(proc);
    if let Some(name) = database {
        use sqlx::Connection;
        if let Ok(mut admin) = sqlx::PgConnection::connect(&pg_database(pg, "postgres")).await {
            let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
            let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await;
        }
    }
}

/// The Redis + PostgreSQL row for `d`, sampling the flush lag every 2 s.
async fn sustained(
    o: &CostOptions,
    redis: &PrivateRedis,
    client: &reqwest::Client,
    d: Duration,
) -> anyhow::Result<Sustained> {
    eprintln!("cost: sustained {} s", d.as_secs());
    let server = start(o, Row::RedisPg, redis, client, 99).await?;
    let load = drive(
        client,
        &server.base,
        &server.event,
        &Request::Purchase,
        o.concurrency,
        Until::Elapsed(d),
        "s",
    );
    let max_lag = AtomicU64::new(0);
    let load = tokio::select! {
        load = load => load?,
        _ = async {
            let mut max = 0u64;
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Ok(a) = audit(client, &server).await {
                    max = max.max(a["sold_unflushed"].as_u64().unwrap_or(0));
                    max_lag.store(max, Ordering::Relaxed);
                }
            }
        } => unreachable!(),
    };
    drained(client, &server).await?;
    stop(server, &o.pg).await;
    let secs = load.per_second.len();
    let max_lag_orders = max_lag.load(Ordering::Relaxed);
    let rate = load.created as f64 / load.elapsed.as_secs_f64().max(1e-9);
    Ok(Sustained {
        seconds: secs as u64,
        first_10s: load.window_rate(0, 10),
        last_10s: load.window_rate(secs.saturating_sub(10), secs),
        max_lag_orders,
        max_lag_seconds: max_lag_orders as f64 / rate.max(1e-9),
    })
}

/// The table, with the ratios the issue asks for.
pub fn markdown(cost: &Cost, command: &str) -> String {
    let mut s = String::new();
    s.push_str(&format!("Produced by `{command}`.\n\n"));
    let service = match cost.service_threads {
        None | Some(0) => "one per core".to_owned(),
        Some(n) => n.to_string(),
    };
    let peers = match cost.peer_threads {
        1 => "1 (a current-thread runtime)".to_owned(),
        n => n.to_string(),
    };
    s.push_str(&format!(
        "Worker threads: shardstock {service}, peers {peers}.\n\n"
    ));
    s.push_str("| server | req/s | p50 ms | p99 ms | server CPU µs/purchase | Redis µs | PostgreSQL µs | total µs | drain ms |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let opt = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.1}"));
    for r in &cost.rows {
        s.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.1} | {} | {} | {:.1} | {} |\n",
            r.label,
            r.rate,
            r.p50_ms,
            r.p99_ms,
            r.server_us,
            opt(r.redis_us),
            opt(r.pg_us),
            r.total_us(),
            r.drain_ms.map_or("–".to_owned(), |d| d.to_string()),
        ));
    }
    let find = |f: fn(&str) -> bool| cost.rows.iter().find(|r| f(&r.label));
    let bare = find(|l| l.starts_with("axum, parse"));
    let lua = find(|l| l == "axum + fred + single-key Lua");
    let xadd = find(|l| l.ends_with("+ XADD"));
    let redis = find(|l| l.starts_with("shardstock, Redis") && l.ends_with("+ PostgreSQL"));
    let token = find(|l| l.ends_with(", token purchases"));
    let entry = find(|l| l.ends_with(", draw entries"));
    let embedded = find(|l| l.starts_with("shardstock, embedded"));
    s.push('\n');
    if let (Some(r), Some(x)) = (redis, xadd) {
        s.push_str(&format!(
            "- Redis + PostgreSQL: total CPU per purchase **{:.2}×** the Lua + XADD peer (goal ≤ 1.6)\n",
            r.total_us() / x.total_us().max(1e-9)
        ));
    }
    if let (Some(r), Some(l)) = (redis, lua) {
        s.push_str(&format!(
            "- Redis + PostgreSQL: throughput **{:.2}×** the single-key Lua peer (goal ≥ 0.7)\n",
            r.rate / l.rate.max(1e-9)
        ));
    }
    if let (Some(e), Some(b)) = (embedded, bare) {
        s.push_str(&format!(
            "- embedded: server CPU per purchase **{:.2}×** the bare axum endpoint (goal ≤ 2)\n",
            e.server_us / b.server_us.max(1e-9)
        ));
    }
    if let (Some(t), Some(r)) = (token, redis) {
        s.push_str(&format!(
            "- a token purchase: total CPU **{:.2}×** an open purchase's, throughput **{:.2}×** (goal ≤ 1.15× CPU)\n",
            t.total_us() / r.total_us().max(1e-9),
            t.rate / r.rate.max(1e-9)
        ));
    }
    if let (Some(e), Some(r)) = (entry, redis) {
        s.push_str(&format!(
            "- a draw entry: total CPU **{:.2}×** an open purchase's, throughput **{:.2}×** (goal ≤ 1× CPU)\n",
            e.total_us() / r.total_us().max(1e-9),
            e.rate / r.rate.max(1e-9)
        ));
    }
    if let Some(r) = redis.and_then(|r| r.pg_us) {
        s.push_str(&format!(
            "- PostgreSQL: **{r:.1} µs** of database CPU per order (goal ≤ 5)\n"
        ));
    }
    if let Some(t) = &cost.sustained {
        s.push_str(&format!(
            "- sustained {} s: last 10 s / first 10 s = **{:.2}** ({:.0} → {:.0} req/s; goal ≥ 0.9), largest flush lag sampled {} orders = {:.2} s of sales (goal ≤ 1 s)\n",
            t.seconds,
            t.last_10s / t.first_10s.max(1e-9),
            t.first_10s,
            t.last_10s,
            t.max_lag_orders,
            t.max_lag_seconds
        ));
    }
    for r in cost.rows.iter().filter(|r| !r.redis_commands.is_empty()) {
        let top: Vec<String> = r
            .redis_commands
            .iter()
            .take(8)
            .map(|c| {
                format!(
                    "{} {:.2}×/{:.2} µs",
                    c.command, c.calls_per_purchase, c.us_per_purchase
                )
            })
            .collect();
        s.push_str(&format!(
            "- {}, Redis per purchase (calls/µs, INFO commandstats; script commands also count inside evalsha): {}\n",
            r.label,
            top.join(", ")
        ));
    }
    for r in &cost.rows {
        if r.errors > 0 {
            s.push_str(&format!(
                "- {}: {} errors of {} requests\n",
                r.label, r.errors, r.requests
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_redis_is_gone_once_dropped() {
        let redis =
            PrivateRedis::start().expect("redis-server on the PATH (apt-get install redis-server)");
        let proc = std::path::PathBuf::from(format!("/proc/{}", redis.pid));
        assert!(proc.exists());
        drop(redis);
        wait_until(
            "the private redis-server to exit",
            Duration::from_secs(10),
            || !proc.exists(),
        )
        .expect("the server outlived its handle");
    }

    #[test]
    fn a_database_name_replaces_the_urls() {
        assert_eq!(
            pg_database("postgres://postgres@127.0.0.1:5432/shardstock_bench", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            pg_database("postgres://postgres@127.0.0.1:5432", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
    }
}
