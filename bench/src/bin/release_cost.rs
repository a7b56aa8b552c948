//! `release_cost`: what a release's multi-line order costs against a purchase
//! on a plain event, in the same run.
//!
//! Three rows a round, interleaved so that the machine's load falls on each
//! alike: one-unit purchases on a plain event (`Engine::purchase`, batched as
//! the service runs it), one-line orders on a release (`Engine::buy_lines`)
//! and two-line orders (one unit in each of two pools). Every row has the
//! same bucket count, `--orders` requests with fresh request ids, by 10,000
//! users, `--concurrency` at a time, a stock that never runs out, and no
//! per-user limit. A row's figures: requests a second, and CPU time a request
//! of this process (the engine and the load generator) and of the Redis
//! servers (`/proc/<pid>/stat`; the pids from `INFO server`, so Redis must
//! run on this machine), each as a ratio to the plain row of its round.
//!
//! Then the refusal: a release whose second pool cannot serve an order
//! (1 unit left, 2 asked), at each of `--refuse-buckets` (the first pool's and
//! the second's bucket count): `--refusals` two-line orders, each truly
//! refused, and the script calls (round trips) and Redis commands a refusal
//! costs (`INFO commandstats`, every master), which must not grow with the
//! bucket count. Nothing else may use the Redis meanwhile: its counts are
//! the server's.
//!
//! `cargo run --release -p shardstock-bench --bin release_cost -- [--redis URL
//! | --cluster] [--buckets 16] [--orders 50000] [--rounds 3]
//! [--concurrency 64] [--refuse-buckets 4,64,256] [--refusals 400]`

use std::sync::Arc;
use std::time::Instant;

use fred::interfaces::ClientLike;
use shardstock::domain::ids::{EventId, RequestId, UserId};
use shardstock::domain::model::EventSpec;
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::engine::{LinesRefusal, LinesRequest, PurchaseRequest};
use shardstock::store::redis::{RedisOptions, RedisStore};
use shardstock::{Engine, EngineOptions};
use shardstock_bench::cluster::LocalCluster;
use shardstock_bench::cost::cpu::{Cpu, Ticks};
use shardstock_bench::engine::connect_fresh;
use tokio::sync::Semaphore;

/// What a release's order costs against a plain purchase.
#[derive(clap::Parser)]
struct Args {
    /// The Redis to run on (its server must run on this machine).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Run on a 3-master Redis Cluster started for the run instead.
    #[arg(long)]
    cluster: bool,
    /// Buckets of the plain event and of each pool.
    #[arg(long, default_value_t = 16)]
    buckets: u32,
    /// Requests a row.
    #[arg(long, default_value_t = 50_000)]
    orders: usize,
    /// Rounds of the three rows.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Bucket counts of the refusal rows.
    #[arg(long, value_delimiter = ',', default_value = "4,64,256")]
    refuse_buckets: Vec<u32>,
    /// Refused orders a refusal row.
    #[arg(long, default_value_t = 400)]
    refusals: usize,
}

/// The kinds of request a row sends.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    OneLine,
    TwoLines,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Plain => "purchase, plain event",
            Kind::OneLine => "release order, 1 line",
            Kind::TwoLines => "release order, 2 lines",
        }
    }
}

/// One row's figures.
struct Row {
    kind: Kind,
    round: usize,
    per_s: f64,
    engine_us: f64,
    redis_us: f64,
}

/// The Redis servers' pids and a way to sum their script and command calls.
struct Servers {
    pids: Vec<u32>,
    ports: Vec<u16>,
}

impl Servers {
    fn cpu(&self) -> Ticks {
        Ticks(self.pids.iter().map(|&p| Cpu::of(p).0).sum())
    }

    /// Script calls (`EVALSHA`: one round trip each) and every command
    /// (those scripts run included) the servers have served
    /// (`INFO commandstats`).
    fn calls(&self) -> (u64, u64) {
        let mut scripts = 0;
        let mut all = 0;
        for &p in &self.ports {
            for line in shardstock_bench::cluster::redis_cli(p, &["info", "commandstats"]).lines() {
                let Some(n) = line
                    .split("calls=")
                    .nth(1)
                    .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
                else {
                    continue;
                };
                all += n;
                if line.starts_with("cmdstat_evalsha:") {
                    scripts += n;
                }
            }
        }
        (scripts, all)
    }
}

fn servers(ports: Vec<u16>) -> anyhow::Result<Servers> {
    let pids = ports
        .iter()
        .map(|&p| {
            shardstock_bench::cluster::redis_cli(p, &["info", "server"])
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("no process_id from the Redis on port {p}"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Servers { pids, ports })
}

fn id(s: String) -> anyhow::Result<EventId> {
    EventId::parse(s).map_err(anyhow::Error::msg)
}

fn release_spec(id: EventId, pools: &[(&str, u64, u32)]) -> anyhow::Result<ReleaseSpec> {
    Ok(ReleaseSpec {
        id,
        pools: pools
            .iter()
            .map(|&(name, stock, buckets)| {
                Ok(PoolSpec {
                    name: EventId::parse(name).map_err(anyhow::Error::msg)?,
                    stock,
                    buckets,
                    auto_buckets: None,
                })
            })
            .collect::<anyhow::Result<_>>()?,
        per_user_limit: None,
        max_per_order: 4,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        homes: 16,
    })
}

/// One row: `a.orders` requests of `kind`, `a.concurrency` at a time.
async fn row(
    engine: &Arc<Engine<RedisStore>>,
    servers: &Servers,
    a: &Args,
    kind: Kind,
    round: usize,
    target: &EventId,
) -> anyhow::Result<Row> {
    let gate = Arc::new(Semaphore::new(a.concurrency as usize));
    let (cpu0, redis0) = (Cpu::of(std::process::id()), servers.cpu());
    let started = Instant::now();
    let tasks: Vec<_> = (0..a.orders)
        .map(|i| {
            let (engine, gate, target) = (engine.clone(), gate.clone(), target.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("gate open");
                let user = UserId::parse(format!("u{}", i % 10_000)).expect("a valid user id");
                let request_id = Some(
                    RequestId::parse(format!("r{round}-{}-{i}", kind as u8))
                        .expect("a valid request id"),
                );
                match kind {
                    Kind::Plain => engine
                        .purchase(&PurchaseRequest {
                            event: target,
                            user,
                            quantity: 1,
                            request_id,
                            access_token: None,
                        })
                        .await
                        .map(|o| o.result.is_ok()),
                    Kind::OneLine | Kind::TwoLines => {
                        let mut lines = vec![(EventId::parse("a").expect("an id"), 1)];
                        if kind == Kind::TwoLines {
                            lines.push((EventId::parse("b").expect("an id"), 1));
                        }
                        engine
                            .buy_lines(&LinesRequest {
                                release: target,
                                user,
                                lines,
                                request_id,
                            })
                            .await
                            .map(|o| o.result.is_ok())
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        anyhow::ensure!(
            t.await??,
            "a request was refused (the stock never runs out)"
        );
    }
    let wall = started.elapsed().as_secs_f64();
    let n = a.orders as u64;
    Ok(Row {
        kind,
        round,
        per_s: a.orders as f64 / wall,
        engine_us: (Cpu::of(std::process::id()) - cpu0).micros_per(n),
        redis_us: (servers.cpu() - redis0).micros_per(n),
    })
}

/// Redis calls a two-line order costs when its second pool is short, at
/// `buckets` buckets a pool.
async fn refusal(
    engine: &Arc<Engine<RedisStore>>,
    servers: &Servers,
    a: &Args,
    buckets: u32,
) -> anyhow::Result<(f64, f64)> {
    let release = id(format!("ref{buckets}"))?;
    engine
        .create_release(release_spec(
            release.clone(),
            &[("a", 1_000_000, buckets), ("b", 1, buckets)],
        )?)
        .await?;
    let gate = Arc::new(Semaphore::new(a.concurrency as usize));
    let before = servers.calls();
    let tasks: Vec<_> = (0..a.refusals)
        .map(|i| {
            let (engine, gate, release) = (engine.clone(), gate.clone(), release.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("gate open");
                engine
                    .buy_lines(&LinesRequest {
                        release,
                        user: UserId::parse(format!("x{i}")).expect("a valid user id"),
                        lines: vec![
                            (EventId::parse("a").expect("an id"), 1),
                            (EventId::parse("b").expect("an id"), 2),
                        ],
                        request_id: Some(RequestId::parse(format!("x{i}")).expect("an id")),
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        match t.await??.result {
            Err(LinesRefusal::SoldOut { short }) if short.len() == 1 => {}
            other => anyhow::bail!("a refusal was answered {other:?}"),
        }
    }
    // The INFO calls of the two reads count themselves: one a server each.
    let after = servers.calls();
    let n = a.refusals as f64;
    let all = after.1 - before.1 - servers.ports.len() as u64;
    Ok(((after.0 - before.0) as f64 / n, all as f64 / n))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = <Args as clap::Parser>::parse();
    anyhow::ensure!(a.orders > 0 && a.rounds > 0, "nothing to run");
    let cluster = if a.cluster {
        Some(LocalCluster::start()?)
    } else {
        None
    };
    let (url, ports) = match &cluster {
        Some(c) => (c.url(), c.ports.clone()),
        None => {
            let port = a
                .redis
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse().ok())
                .unwrap_or(6379);
            (a.redis.clone(), vec![port])
        }
    };
    let servers = servers(ports)?;
    let store = connect_fresh(RedisOptions::new(&url), "relcost").await?;
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    let stock = (a.orders * a.rounds * 2) as u64;
    let plain = id("plain".into())?;
    engine
        .create_event(EventSpec {
            id: plain.clone(),
            stock,
            buckets: a.buckets,
            per_user_limit: None,
            max_per_order: 4,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
            tokens: None,
            draw: None,
        })
        .await?;
    let release = id("rel".into())?;
    engine
        .create_release(release_spec(
            release.clone(),
            &[("a", stock, a.buckets), ("b", stock, a.buckets)],
        )?)
        .await?;
    let mut rows = Vec::new();
    for round in 1..=a.rounds {
        for kind in [Kind::Plain, Kind::OneLine, Kind::TwoLines] {
            let target = if kind == Kind::Plain {
                &plain
            } else {
                &release
            };
            let r = row(&engine, &servers, &a, kind, round, target).await?;
            eprintln!("round {round}: {}: {:.0}/s", kind.label(), r.per_s);
            rows.push(r);
        }
    }
    let mut refusals = Vec::new();
    for &n in &a.refuse_buckets {
        refusals.push((n, refusal(&engine, &servers, &a, n).await?));
    }
    let _ = store.client().quit().await;
    drop(cluster);

    println!(
        "{} requests a row, {} at a time, {} buckets, {} (engine, batched as the service runs it):\n",
        a.orders,
        a.concurrency,
        a.buckets,
        if a.cluster {
            "a 3-master Redis Cluster"
        } else {
            "one Redis"
        }
    );
    println!(
        "| round | row | requests/s | × plain | engine µs | Redis µs | CPU µs (both) | CPU × plain |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.round == r.round && b.kind == Kind::Plain)
            .expect("every round has a plain row");
        let cpu = r.engine_us + r.redis_us;
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} |",
            r.round,
            r.kind.label(),
            r.per_s,
            r.per_s / base.per_s,
            r.engine_us,
            r.redis_us,
            cpu,
            cpu / (base.engine_us + base.redis_us)
        );
    }
    println!(
        "\nA two-line order refused at its second pool (1 unit left, 2 asked), {} orders:\n",
        a.refusals
    );
    println!(
        "| buckets a pool | script calls a refusal | Redis commands a refusal (in scripts too) |"
    );
    println!("|---:|---:|---:|");
    for (n, (scripts, all)) in &refusals {
        println!("| {n} | {scripts:.1} | {all:.1} |");
    }
    Ok(())
}
