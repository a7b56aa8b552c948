//! `outbox_flush`: does order events out slow the flusher?
//!
//! Sells N orders through the engine (Redis streams by default, `--memory`
//! for the embedded store), then times the flusher draining them into
//! PostgreSQL, three ways, interleaved round by round on one fresh database:
//! - `off`: order events off (the default: no outbox statement);
//! - `outbox`: order events on, no relay (the changes are written in the
//!   flush transaction and wait);
//! - `relay`: order events on and the JetStream relay publishing them to
//!   NATS while the flusher runs (its cursor starts at the outbox's head, so
//!   it publishes exactly this round's changes).
//!
//! Per way: orders flushed a second (wall clock, the flusher's four workers),
//! and CPU per order from `/proc` (this process, which runs the flusher and
//! the relay, plus every postgres process). For `relay`, also the seconds
//! from the flush's start until the relay had published the last change.
//! The figure the "relay on ≥ 0.9× relay off" criterion reads is `relay` over
//! `outbox`, the median of the rounds; `relay` over `off` is what order events
//! cost the flusher in all.
//!
//! Needs Redis on 127.0.0.1:6379 (unless `--memory`), PostgreSQL on
//! 127.0.0.1:5432 and NATS with JetStream on 127.0.0.1:4222.
//!
//! `cargo run --release -p shardstock-bench --bin outbox_flush -- [--orders N]
//! [--rounds R] [--batch B] [--workers W] [--memory] [--redis URL] [--pg URL]
//! [--nats URL]` (`--batch` 4,000 and `--workers` 4 unless given: the
//! service's defaults)

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::relay::{Relay, RelayOptions};
use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::engine::PurchaseRequest;
use shardstock::ledger::Ledger;
use shardstock::store::redis::RedisOptions;
use shardstock::store::{MemoryStore, RedisStore, Store};
use shardstock::{Engine, EngineOptions};
use shardstock_bench::cost::cpu::{Cpu, Ticks};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use tokio_util::sync::CancellationToken;

struct Args {
    orders: u64,
    rounds: usize,
    batch: usize,
    workers: usize,
    memory: bool,
    redis: String,
    pg: String,
    nats: String,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        orders: 50_000,
        rounds: 3,
        // The service's default `database.flush_batch`.
        batch: 4_000,
        workers: 4,
        memory: false,
        redis: "redis://127.0.0.1:6379".into(),
        pg: "postgres://postgres@127.0.0.1:5432".into(),
        nats: "nats://127.0.0.1:4222".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--orders" => a.orders = value()?.parse()?,
            "--rounds" => a.rounds = value()?.parse()?,
            "--batch" => a.batch = value()?.parse()?,
            "--workers" => a.workers = value()?.parse()?,
            "--memory" => a.memory = true,
            "--redis" => a.redis = value()?,
            "--pg" => a.pg = value()?.trim_end_matches('/').to_owned(),
            "--nats" => a.nats = value()?,
            "-h" | "--help" => {
                println!(
                    "outbox_flush [--orders N] [--rounds R] [--batch B] [--workers W] [--memory] [--redis URL] [--pg URL] [--nats URL]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(a.orders > 0 && a.rounds > 0 && a.batch > 0 && a.workers > 0);
    Ok(a)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Off,
    Outbox,
    Relay,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Off => "off",
            Way::Outbox => "outbox",
            Way::Relay => "relay",
        }
    }
}

/// One flush, measured.
struct Run {
    per_sec: f64,
    /// This process's CPU and every postgres process's, µs an order.
    own_us: f64,
    pg_us: f64,
    /// `relay`: seconds from the flush's start to the last change published.
    published_s: Option<f64>,
}

async fn sell<S: Store>(engine: &Arc<Engine<S>>, event: &EventId, orders: u64) {
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (engine, event) = (engine.clone(), event.clone());
            tokio::spawn(async move {
                for i in (t..orders).step_by(32) {
                    let req = PurchaseRequest {
                        event: event.clone(),
                        user: UserId::parse(format!("u-{i}")).unwrap(),
                        quantity: 1,
                        request_id: None,
                        access_token: None,
                    };
                    engine.purchase(&req).await.unwrap().result.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

async fn outbox_head(url: &str) -> anyhow::Result<i64> {
    let mut conn = PgConnection::connect(url).await?;
    Ok(
        sqlx::query_scalar("SELECT seq FROM outbox_head WHERE id = 1")
            .fetch_one(&mut conn)
            .await?,
    )
}

/// The last change written (numbers may skip: the head can be past it).
async fn last_change(url: &str) -> anyhow::Result<i64> {
    let mut conn = PgConnection::connect(url).await?;
    Ok(
        sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM outbox_changes")
            .fetch_one(&mut conn)
            .await?,
    )
}

async fn once<S: Store>(
    store: S,
    a: &Args,
    url: &str,
    way: Way,
    round: usize,
) -> anyhow::Result<Run> {
    let ledger = Ledger::connect(url, (a.workers + 2) as u32)
        .await?
        .with_outbox(way != Way::Off);
    let engine = Arc::new(Engine::new(store, EngineOptions::default()));
    let event = EventId::parse(format!(
        "outboxflush-{}-{round}-{:08x}",
        way.name(),
        rand::random::<u32>()
    ))?;
    let spec = EventSpec {
        id: event.clone(),
        stock: a.orders,
        buckets: 16,
        per_user_limit: None,
        max_per_order: DEFAULT_MAX_PER_ORDER,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        auto_buckets: None,
        tokens: None,
        draw: None,
    };
    shardstock::control::lifecycle::create(&engine, &ledger, spec).await?;
    sell(&engine, &event, a.orders).await;
    let meta = engine.meta(&event).await?;

    let stop = CancellationToken::new();
    let stream = format!("outboxflush{}", std::process::id());
    let relay = if way == Way::Relay {
        // Start at the head: this round's changes are the relay's whole work.
        let head = outbox_head(url).await?;
        let target = shardstock::control::relay::target(&stream);
        ledger.mark_outbox(&target, head, 0, 0).await?;
        let opts = RelayOptions {
            nats_url: a.nats.clone(),
            stream: stream.clone(),
            subject_prefix: stream.clone(),
            duplicate_window: Duration::from_secs(120),
            batch: 512,
            interval: Duration::from_millis(100),
            lease_ttl_ms: 3_000,
            publish_timeout: Duration::from_secs(5),
        };
        let mut relay = Relay::new(engine.clone(), ledger.clone(), opts);
        // A first round connects and creates the stream before the clock starts.
        relay.round().await?;
        Some((tokio::spawn(relay.run(stop.clone())), target))
    } else {
        None
    };

    let opts = FlushOptions {
        batch: a.batch,
        workers: a.workers,
        idle: Duration::from_millis(5),
        claim_idle_ms: 60_000,
    };
    let mut flusher = Flusher::new(engine.clone(), ledger.clone(), "bench".into(), opts);
    let (own0, pg0) = (Cpu::of(std::process::id()), Cpu::postgres());
    let start = Instant::now();
    flusher
        .drain_parallel(&meta.all_buckets(), &CancellationToken::new())
        .await?;
    let secs = start.elapsed().as_secs_f64();
    let (own, pg): (Ticks, Ticks) = (Cpu::of(std::process::id()) - own0, Cpu::postgres() - pg0);
    let totals = ledger.totals(&event).await?.expect("the event's totals");
    anyhow::ensure!(
        totals.sold == a.orders,
        "sold {} of {}",
        totals.sold,
        a.orders
    );

    let published_s = match relay {
        None => None,
        Some((task, target)) => {
            let last = last_change(url).await?;
            while ledger.outbox_cursor(&target).await? < last {
                anyhow::ensure!(
                    start.elapsed() < Duration::from_secs(300),
                    "the relay did not publish this round's changes in 300 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let s = start.elapsed().as_secs_f64();
            stop.cancel();
            task.await?;
            Some(s)
        }
    };
    Ok(Run {
        per_sec: a.orders as f64 / secs,
        own_us: own.micros_per(a.orders),
        pg_us: pg.micros_per(a.orders),
        published_s,
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let db = format!("shardstock_outbox_flush_{}", std::process::id());
    let mut admin = PgConnection::connect(&format!("{}/postgres", a.pg)).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db}")))
        .execute(&mut admin)
        .await?;
    let url = format!("{}/{db}", a.pg);
    // Creates and migrates the database.
    drop(Ledger::connect(&url, 1).await?);

    let ways = [Way::Off, Way::Outbox, Way::Relay];
    let mut runs: Vec<(Way, Run)> = Vec::new();
    for round in 0..a.rounds {
        // Each round starts with another way, so none always runs first.
        for k in 0..ways.len() {
            let way = ways[(round + k) % ways.len()];
            let run = if a.memory {
                once(MemoryStore::new(), &a, &url, way, round).await?
            } else {
                let store = RedisStore::connect(&RedisOptions::new(a.redis.clone())).await?;
                once(store, &a, &url, way, round).await?
            };
            println!(
                "round {round} {:<6} {:>9.0} orders/s  own {:>5.1} µs  postgres {:>5.1} µs{}",
                way.name(),
                run.per_sec,
                run.own_us,
                run.pg_us,
                run.published_s
                    .map_or(String::new(), |s| format!("  all published at {s:.2} s"))
            );
            runs.push((way, run));
        }
    }
    let of = |w: Way, f: fn(&Run) -> f64| {
        median(
            runs.iter()
                .filter(|(x, _)| *x == w)
                .map(|(_, r)| f(r))
                .collect(),
        )
    };
    println!(
        "\noutbox_flush: {} orders, {} rounds, batch {}, {} workers, {} (medians)",
        a.orders,
        a.rounds,
        a.batch,
        a.workers,
        if a.memory {
            "memory store"
        } else {
            "Redis streams"
        }
    );
    println!("| way | orders/s | ratio to off | own µs/order | postgres µs/order |");
    println!("|---|---:|---:|---:|---:|");
    let off = of(Way::Off, |r| r.per_sec);
    for w in ways {
        println!(
            "| {} | {:.0} | {:.2} | {:.1} | {:.1} |",
            w.name(),
            of(w, |r| r.per_sec),
            of(w, |r| r.per_sec) / off,
            of(w, |r| r.own_us),
            of(w, |r| r.pg_us)
        );
    }
    println!(
        "relay on / relay off (order events on both): {:.2}; last change published {:.2} s after the flush began (median)",
        of(Way::Relay, |r| r.per_sec) / of(Way::Outbox, |r| r.per_sec),
        of(Way::Relay, |r| r.published_s.unwrap_or(0.0))
    );
    drop(admin);
    let mut admin = PgConnection::connect(&format!("{}/postgres", a.pg)).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    Ok(())
}
