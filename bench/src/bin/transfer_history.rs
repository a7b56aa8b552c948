//! `transfer_history`: does a bucket's Redis time grow with the transfers
//! its event ever made?
//!
//! Every short take (`take.lua`, the saga's probe) and every bucket read
//! (`bucket_state.lua`: views, gauges, the event-wide sold-out check, the
//! rebalancer's plans) reads the bucket's transfer journal whole, and the
//! audit reads its applied set whole. They used to keep an entry for every
//! transfer the event ever made. This times both steps in Redis (`INFO
//! commandstats`, `evalsha` µs a call, on a private `redis-server` nothing
//! else uses), makes `--transfers` transfers with rebalancer rounds a few ms
//! apart (each under its own token, as the leader's rounds are), and times
//! them again; then prints the journal and applied-set lengths.
//!
//! `cargo run --release -p shardstock-bench --bin transfer_history --
//! [--transfers 10000] [--reads 5000]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardstock::control::flusher::FlushOptions;
use shardstock::control::rebalancer::{Move, Policy, RebalanceOptions, Rebalancer};
use shardstock::domain::ids::{EventId, OrderId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::EventSpec;
use shardstock::ledger::Ledger;
use shardstock::store::redis::RedisOptions;
use shardstock::store::{Buckets, TakeArgs};
use shardstock::{Engine, EngineOptions, RedisStore};
use shardstock_bench::cluster::{free_port, redis_cli, scratch_dir, spawn_redis, wait_until};

/// Redis time of the reads that walk a bucket's transfer state, before and
/// after many transfers.
#[derive(clap::Parser)]
struct Args {
    /// Transfers made between the two timings.
    #[arg(long, default_value_t = 10_000)]
    transfers: u64,
    /// Calls of each step per timing.
    #[arg(long, default_value_t = 5_000)]
    reads: u32,
}

const BUCKETS: u32 = 4;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = clap::Parser::parse();
    let port = free_port();
    let dir = scratch_dir("transfer-history");
    let _server = spawn_redis(
        &dir,
        &format!("--port {port} --bind 127.0.0.1 --save '' --appendonly no"),
    )?;
    wait_until("redis-server to answer", Duration::from_secs(10), || {
        redis_cli(port, &["ping"]).trim() == "PONG"
    })?;
    let store =
        RedisStore::connect(&RedisOptions::new(format!("redis://127.0.0.1:{port}"))).await?;
    let engine = Arc::new(Engine::new(store, EngineOptions::default()));
    let ledger = Ledger::connect(&format!("sqlite://{}/ledger.db", dir.display()), 2).await?;
    let event = EventId::parse("history")?;
    engine
        .create_event(EventSpec {
            id: event.clone(),
            stock: 400,
            buckets: BUCKETS,
            per_user_limit: None,
            max_per_order: 1_000,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
            tokens: None,
            draw: None,
        })
        .await?;
    let bucket = BucketRef::new(&event, 0, 0);

    let before = timings(&engine, &bucket, port, args.reads, "before").await?;
    let started = Instant::now();
    let made = transfers(&engine, &ledger, &event, args.transfers).await?;
    let took = started.elapsed();
    let after = timings(&engine, &bucket, port, args.reads, "after").await?;
    let keys = bucket.keys();
    let hlen = |key: &str| redis_cli(port, &["hlen", key]).trim().to_owned();
    println!("{made} transfers in {:.1} s", took.as_secs_f64());
    println!("| step | µs a call before | after | after ÷ before |");
    println!("|---|---:|---:|---:|");
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        println!("| {name} | {b:.2} | {a:.2} | {:.2} |", a / b);
    }
    println!(
        "journal (xfer) {} entries, applied set (xin) {} entries in bucket 0",
        hlen(&keys.xfer),
        hlen(&keys.xin)
    );
    Ok(())
}

/// `evalsha` µs a call of `bucket_state` and of a short `take`, each alone.
async fn timings(
    engine: &Engine<RedisStore>,
    bucket: &BucketRef,
    port: u16,
    reads: u32,
    when: &str,
) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let store = engine.store();
    let mut out = Vec::new();
    redis_cli(port, &["config", "resetstat"]);
    for _ in 0..reads {
        store.bucket_state(bucket).await?;
    }
    out.push(("bucket_state", evalsha_us(port)?));
    redis_cli(port, &["config", "resetstat"]);
    let user = UserId::parse("prober")?;
    for i in 0..reads {
        // More than the bucket holds: a short take, which sums the journal.
        let args = TakeArgs {
            rid: format!("prober/{when}-{i}"),
            pass: 1,
            user: user.clone(),
            qty: 1_000,
            order_id: OrderId::generate(&bucket.event, 1),
            home: 1,
            marker_ttl_ms: 60_000,
            pay_by: None,
            keep_taken: false,
        };
        store.take(bucket, 0, &args).await?;
    }
    out.push(("take (short)", evalsha_us(port)?));
    Ok(out)
}

/// µs a call of `evalsha` since the last `CONFIG RESETSTAT`.
fn evalsha_us(port: u16) -> anyhow::Result<f64> {
    let stats = redis_cli(port, &["info", "commandstats"]);
    let line = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .ok_or_else(|| anyhow::anyhow!("no evalsha in INFO commandstats"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        line.split(&[':', ','][..])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in {line}"))
    };
    Ok(field("usec=")? / field("calls=")?)
}

/// Rebalancer rounds, each moving one unit around the ring of buckets.
async fn transfers(
    engine: &Arc<Engine<RedisStore>>,
    ledger: &Ledger,
    event: &EventId,
    total: u64,
) -> anyhow::Result<u64> {
    let opts = RebalanceOptions {
        resizing: Default::default(),
        interval: Duration::from_millis(5),
        lease_ttl_ms: 2_000,
        policy: Policy {
            horizon_s: 1.0,
            skew_threshold: 1.5,
            gather_below: 0.1,
            max_moves: BUCKETS as usize,
        },
    };
    let flush = FlushOptions {
        batch: 500,
        workers: 1,
        idle: Duration::from_millis(10),
        claim_idle_ms: 1_000,
    };
    let mut leader = Rebalancer::new(engine.clone(), ledger.clone(), flush, opts);
    let ring: Vec<Move> = (0..BUCKETS)
        .map(|b| Move {
            from: b,
            to: (b + 1) % BUCKETS,
            units: 1,
        })
        .collect();
    let mut made = 0;
    while made < total {
        let meta = engine.reload(event).await?;
        let Some(mut planned) = leader.plan(&meta).await? else {
            continue;
        };
        planned.moves = ring.clone();
        made += leader.execute(&meta, planned).await?.transfers;
    }
    Ok(made)
}
