//! Flusher throughput: order records per second from the buckets' streams into
//! PostgreSQL, against a baseline measured in the same run — a plain multi-row
//! INSERT of the same number of rows (no idempotency, no order rows, no totals),
//! i.e. what the database does with the least work.
//!
//! `cargo bench --bench flusher -- [--orders N] [--batch B] [--workers W] [--redis URL] [--pg URL]`
//! The records come from real purchases through the engine (memory store, or
//! Redis with `--redis`); only the flush is timed.

use std::sync::Arc;
use std::time::Instant;

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::engine::{Clock, PurchaseRequest};
use shardstock::ledger::Ledger;
use shardstock::store::redis::RedisOptions;
use shardstock::store::{MemoryStore, RedisStore, Store};
use shardstock::{Engine, EngineOptions};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

struct Args {
    orders: u64,
    batch: usize,
    workers: usize,
    redis: Option<String>,
    pg: String,
}

fn args() -> Args {
    let mut a = Args {
        orders: 100_000,
        batch: 1_000,
        workers: 4,
        redis: None,
        pg: "postgres://postgres@127.0.0.1:5432/shardstock_bench_flush".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--orders" => a.orders = it.next().unwrap().parse().unwrap(),
            "--batch" => a.batch = it.next().unwrap().parse().unwrap(),
            "--workers" => a.workers = it.next().unwrap().parse().unwrap(),
            "--redis" => a.redis = it.next(),
            "--pg" => a.pg = it.next().unwrap(),
            _ => {} // cargo bench passes --bench
        }
    }
    a
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

async fn flush<S: Store>(store: S, a: &Args) -> f64 {
    let ledger = Ledger::connect(&a.pg, 8)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    let engine = Arc::new(Engine::new(store, EngineOptions::default()));
    let event = EventId::parse(format!("flushbench-{:08x}", rand::random::<u32>())).unwrap();
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
    shardstock::control::lifecycle::create(&engine, &ledger, spec)
        .await
        .unwrap();
    sell(&engine, &event, a.orders).await;
    let meta = engine.meta(&event).await.unwrap();
    let opts = FlushOptions {
        batch: a.batch,
        workers: a.workers,
        idle: std::time::Duration::from_millis(5),
        claim_idle_ms: 60_000,
    };
    let mut flusher = Flusher::new(engine.clone(), ledger.clone(), "bench".into(), opts);
    let start = Instant::now();
    flusher
        .drain_parallel(&meta.all_buckets(), &CancellationToken::new())
        .await
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let t = ledger.totals(&event).await.unwrap().unwrap();
    assert_eq!(t.sold, a.orders, "every order flushed");
    a.orders as f64 / secs
}

/// The same number of rows, same width, plain multi-row INSERTs of `batch` rows.
async fn baseline(a: &Args) -> f64 {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&a.pg)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_plain (a TEXT, b BIGINT, c BIGINT, d TEXT, e TEXT, f TEXT, g TEXT, h BIGINT, i BIGINT, j BIGINT, k TEXT, l BIGINT)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("TRUNCATE bench_plain")
        .execute(&pool)
        .await
        .unwrap();
    let start = Instant::now();
    let mut done = 0u64;
    while done < a.orders {
        let n = (a.orders - done).min(a.batch as u64).min(500) as usize;
        let mut qb = sqlx::QueryBuilder::new(
            "INSERT INTO bench_plain (a, b, c, d, e, f, g, h, i, j, k, l) ",
        );
        qb.push_values(0..n, |mut row, i| {
            let x = (done + i as u64) as i64;
            row.push_bind("s#0#0")
                .push_bind(Clock::system().now_ms())
                .push_bind(x)
                .push_bind("event")
                .push_bind("o")
                .push_bind(format!("event.{x:016x}.{x:016x}"))
                .push_bind(format!("u-{x}"))
                .push_bind(1i64)
                .push_bind(0i64)
                .push_bind(0i64)
                .push_bind("")
                .push_bind(x);
        });
        qb.build().execute(&pool).await.unwrap();
        done += n as u64;
    }
    a.orders as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let a = args();
    // Creates the database (and the ledger's tables) on first use.
    Ledger::connect(&a.pg, 1)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    let plain = baseline(&a).await;
    let from_memory = flush(MemoryStore::new(), &a).await;
    println!(
        "flusher benchmark: {} orders, batch {}, {} workers",
        a.orders, a.batch, a.workers
    );
    println!("  baseline: plain multi-row INSERT      {plain:>10.0} rows/s   1.00x");
    println!(
        "  flusher, memory store -> PostgreSQL   {from_memory:>10.0} orders/s {:.2}x",
        from_memory / plain
    );
    if let Some(url) = &a.redis {
        let store = RedisStore::connect(&RedisOptions::new(url.clone()))
            .await
            .expect("Redis");
        let from_redis = flush(store, &a).await;
        println!(
            "  flusher, Redis streams -> PostgreSQL  {from_redis:>10.0} orders/s {:.2}x",
            from_redis / plain
        );
    }
}
