//! `last_unit`: what refusing an order costs when the event cannot serve it.
//!
//! The shape of issue 13 item 6: an event whose last unit sits in one of many
//! buckets, and a crowd of buyers asking for 2 units each. Every one of them
//! must be refused, truly ("sold out": fewer than 2 units in the whole
//! event), and a refusal must cost O(1) round trips, not a probe of every
//! bucket, and leave next to nothing in Redis. Then one buyer of 1 unit gets
//! the last unit (the refusals were not a false sold-out).
//!
//! For each bucket count asked for (the same run, so the figures compare as
//! ratios), a fresh event on the given Redis: `--orders` purchases of
//! `--qty` units by distinct users with request ids, `--concurrency` at a
//! time, through the engine (batched, as the service runs it). Prints the
//! latency percentiles, the store's script calls per refusal (Redis
//! `INFO commandstats`), and the bytes the refusals left in Redis
//! (`used_memory` before and after).
//!
//! `cargo run --release -p shardstock-bench --bin last_unit -- [--redis URL]
//! [--buckets 4,256] [--orders 400] [--qty 2] [--concurrency 64]`

use std::sync::Arc;
use std::time::Instant;

use fred::interfaces::ClientLike;
use hdrhistogram::Histogram;
use shardstock::domain::ids::{EventId, RequestId, UserId};
use shardstock::domain::model::EventSpec;
use shardstock::engine::{PurchaseRequest, Refusal};
use shardstock::store::redis::{RedisOptions, RedisStore};
use shardstock::{Engine, EngineOptions};
use shardstock_bench::engine::connect_fresh;
use tokio::sync::Semaphore;

/// What refusing an order costs when the event cannot serve it.
#[derive(clap::Parser)]
struct Args {
    /// The Redis to run on.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Bucket counts, each a fresh event; the first is the ratios' baseline.
    #[arg(long, value_delimiter = ',', default_value = "4,256")]
    buckets: Vec<u32>,
    /// Purchases, by distinct users.
    #[arg(long, default_value_t = 400)]
    orders: usize,
    /// Units per purchase (one unit is left, so at least 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..))]
    qty: u32,
    /// Purchases in flight at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
}

/// One bucket count's figures.
struct Row {
    buckets: u32,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    calls_per_refusal: f64,
    bytes_per_refusal: i64,
    refused: usize,
}

/// Total script and command calls Redis has served (`INFO commandstats`).
async fn redis_calls(store: &RedisStore) -> anyhow::Result<u64> {
    let info: String = store
        .client()
        .info(Some(fred::types::InfoKind::CommandStats))
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum())
}

async fn used_memory(store: &RedisStore) -> anyhow::Result<i64> {
    let info: String = store
        .client()
        .info(Some(fred::types::InfoKind::Memory))
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO memory has no used_memory"))
}

async fn run(a: &Args, buckets: u32) -> anyhow::Result<Row> {
    let store = connect_fresh(RedisOptions::new(&a.redis), "lastunit").await?;
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    let id = EventId::parse(format!("last-{buckets}")).map_err(anyhow::Error::msg)?;
    engine
        .create_event(EventSpec {
            id: id.clone(),
            stock: 1,
            buckets,
            per_user_limit: None,
            max_per_order: a.qty,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
            tokens: None,
            draw: None,
        })
        .await?;
    let calls_before = redis_calls(&store).await?;
    let memory_before = used_memory(&store).await?;
    let gate = Arc::new(Semaphore::new(a.concurrency as usize));
    let started = Instant::now();
    let tasks: Vec<_> = (0..a.orders)
        .map(|i| {
            let (engine, gate, id, qty) = (engine.clone(), gate.clone(), id.clone(), a.qty);
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("gate open");
                let req = PurchaseRequest {
                    event: id,
                    user: UserId::parse(format!("buyer-{i}")).expect("a valid user id"),
                    quantity: qty,
                    request_id: Some(RequestId::parse(format!("r{i}")).expect("a valid id")),
                    access_token: None,
                };
                let sent = Instant::now();
                let out = engine.purchase(&req).await;
                (sent.elapsed(), out)
            })
        })
        .collect();
    let mut latency = Histogram::<u64>::new(3)?;
    let mut refused = 0;
    for t in tasks {
        let (took, out) = t.await?;
        latency.record(took.as_micros() as u64)?;
        match out?.result {
            Err(Refusal::SoldOut { remaining }) if remaining < u64::from(a.qty) => refused += 1,
            other => anyhow::bail!("an order of {} was answered {other:?}", a.qty),
        }
    }
    let wall = started.elapsed();
    let calls = redis_calls(&store).await? - calls_before - 2;
    let memory = used_memory(&store).await? - memory_before;
    // The refusals were true: the last unit still sells.
    let last = engine
        .purchase(&PurchaseRequest {
            event: id.clone(),
            user: UserId::parse("the-last-buyer").map_err(anyhow::Error::msg)?,
            quantity: 1,
            request_id: None,
            access_token: None,
        })
        .await?;
    anyhow::ensure!(last.result.is_ok(), "the last unit did not sell: {last:?}");
    let _ = store.client().quit().await;
    eprintln!(
        "n={buckets}: {} orders in {:.2} s",
        a.orders,
        wall.as_secs_f64()
    );
    let ms = |q| latency.value_at_quantile(q) as f64 / 1e3;
    Ok(Row {
        buckets,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: latency.max() as f64 / 1e3,
        calls_per_refusal: calls as f64 / refused as f64,
        bytes_per_refusal: memory / refused as i64,
        refused,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = <Args as clap::Parser>::parse();
    anyhow::ensure!(a.orders > 0 && !a.buckets.is_empty(), "nothing to run");
    let mut rows = Vec::new();
    for &n in &a.buckets {
        rows.push(run(&a, n).await?);
    }
    let base = &rows[0];
    println!(
        "{} orders of {} units, 1 unit left, {} at a time (Redis {}):\n",
        a.orders, a.qty, a.concurrency, a.redis
    );
    println!(
        "| buckets | refused | p50 ms | p99 ms | max ms | Redis calls per refusal | bytes left per refusal | p99 × n={} |",
        base.buckets
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.2}× |",
            r.buckets,
            r.refused,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.calls_per_refusal,
            r.bytes_per_refusal,
            r.p99_ms / base.p99_ms
        );
    }
    Ok(())
}
