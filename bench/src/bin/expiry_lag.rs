//! `expiry_lag`: how late an unpaid hold expires while a sale runs at full load.
//!
//! Issue 14 promises that a hold reaching its `pay_by` unconfirmed is back on
//! sale within 1 s, under load. This runs the worst case for the sweeper: an
//! event with `--hold-seconds` where nobody pays, so every purchase becomes
//! an expiry `--hold-seconds` later, and the expired units are bought again
//! at once by the next buyers (a steady state of holds created and expired at
//! the sale's full rate). The expiry sweeper runs in the same process, as it
//! runs in every instance of the service (`control::hold_expiry::run`, default
//! options).
//!
//! A sampler reads, every `--sample-ms`, the earliest deadline still pending
//! in each bucket's own index (`Holds::next_hold`): now minus that deadline,
//! when positive, is how long a due hold has stayed unexpired. Prints the
//! purchases and expiries per second and the percentiles of that lag.
//!
//! `cargo run --release -p shardstock-bench --bin expiry_lag -- [--redis URL]
//! [--buckets 4] [--stock 20000] [--hold-seconds 1] [--seconds 10]
//! [--concurrency 64]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use hdrhistogram::Histogram;
use shardstock::control::hold_expiry::{self, ExpiryOptions};
use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::EventSpec;
use shardstock::engine::PurchaseRequest;
use shardstock::store::Holds;
use shardstock::store::redis::RedisOptions;
use shardstock::{Engine, EngineOptions};
use shardstock_bench::engine::connect_fresh;
use tokio_util::sync::CancellationToken;

/// How late unpaid holds expire under a full-rate sale.
#[derive(clap::Parser)]
struct Args {
    /// The Redis to run on.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    buckets: u32,
    /// Units on sale (each is held, expires and is bought again, many times).
    #[arg(long, default_value_t = 20_000)]
    stock: u64,
    /// The event's pay-by window.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=60))]
    hold_seconds: u32,
    /// How long the sale runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Buyers in flight at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// How often the lag is sampled.
    #[arg(long, default_value_t = 50)]
    sample_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = <Args as clap::Parser>::parse();
    let store = connect_fresh(RedisOptions::new(&a.redis), "expirylag").await?;
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    let id = EventId::parse("expiry-lag").map_err(anyhow::Error::msg)?;
    engine
        .create_event(EventSpec {
            id: id.clone(),
            stock: a.stock,
            buckets: a.buckets,
            per_user_limit: None,
            max_per_order: 1,
            starts_at: None,
            ends_at: None,
            hold_seconds: Some(a.hold_seconds),
            auto_buckets: None,
            tokens: None,
            draw: None,
        })
        .await?;
    let generation = engine.reload(&id).await?.generation;
    let buckets: Vec<BucketRef> = (0..a.buckets)
        .map(|b| BucketRef::new(&id, generation, b))
        .collect();

    let stop = CancellationToken::new();
    let sweeper = tokio::spawn(hold_expiry::run(
        engine.clone(),
        ExpiryOptions::default(),
        stop.clone(),
    ));
    let (held, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let buyers: Vec<_> = (0..a.concurrency)
        .map(|t| {
            let (engine, id, held, refused) =
                (engine.clone(), id.clone(), held.clone(), refused.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    i += 1;
                    let req = PurchaseRequest {
                        event: id.clone(),
                        user: UserId::parse(format!("b{t}-{i}")).expect("a valid user id"),
                        quantity: 1,
                        request_id: None,
                        access_token: None,
                    };
                    match engine.purchase(&req).await?.result {
                        Ok(_) => held.fetch_add(1, Ordering::Relaxed),
                        Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
                anyhow::Ok(())
            })
        })
        .collect();

    // The lag: now minus the earliest deadline still pending, when past.
    let mut lag = Histogram::<u64>::new(3)?;
    let mut tick = tokio::time::interval(Duration::from_millis(a.sample_ms));
    while Instant::now() < deadline {
        tick.tick().await;
        let now = engine.clock().now_ms();
        let mut worst = 0i64;
        for b in &buckets {
            if let Some(at) = store.next_hold(b).await? {
                worst = worst.max(now - at);
            }
        }
        lag.record(worst.max(0) as u64)?;
    }
    for b in buyers {
        b.await??;
    }
    stop.cancel();
    sweeper.await?;
    let view = engine.view(&id).await?;
    let _ = store.client().quit().await;

    let held = held.load(Ordering::Relaxed);
    // Every unit not on sale or held now was held and expired (none is paid).
    let expired = held - view.held;
    let secs = a.seconds as f64;
    println!(
        "{} units, {} buckets, hold {} s, nobody pays, {} buyers, {} s (Redis {}):\n",
        a.stock, a.buckets, a.hold_seconds, a.concurrency, a.seconds, a.redis
    );
    println!(
        "| holds/s | expired/s | refused/s | lag p50 ms | lag p99 ms | lag max ms | samples |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
        held as f64 / secs,
        expired as f64 / secs,
        refused.load(Ordering::Relaxed) as f64 / secs,
        lag.value_at_quantile(0.5),
        lag.value_at_quantile(0.99),
        lag.max(),
        lag.len()
    );
    Ok(())
}
