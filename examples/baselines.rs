//! Runs the five baselines and the raw Redis ceiling on one workload, until
//! `shardstock bench` exists to do it (then this example can go):
//!
//! ```text
//! cargo run --release --example baselines -- --stock 10000 --attempts 50000 --concurrency 64
//! cargo run --release --example baselines -- --only redis --stock 1000000 --attempts 500000
//! ```
//!
//! Prints each report (or, with `--json`, one JSON array), then the ceiling
//! unpipelined and with `-P 16` at the same client count.

use clap::Parser;
use shardstock::bench::baselines::{DEFAULT_PG_URL, DEFAULT_REDIS_URL};
use shardstock::bench::{
    PgConditionalUpdate, PgForUpdate, PgVersionCas, RedisDecrRollback, RedisLuaSingleKey, Report,
    Workload, redis_ceiling, run,
};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    stock: u64,
    #[arg(long, default_value_t = 100_000)]
    users: u64,
    /// Zipf exponent over users; uniform when absent.
    #[arg(long)]
    zipf: Option<f64>,
    #[arg(long, default_value_t = 50_000)]
    attempts: u64,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Requests per `redis-benchmark` run (0 skips the ceiling).
    #[arg(long, default_value_t = 200_000)]
    ceiling_requests: u64,
    #[arg(long, default_value = DEFAULT_PG_URL)]
    pg: String,
    #[arg(long, default_value = DEFAULT_REDIS_URL)]
    redis: String,
    #[arg(long)]
    json: bool,
    /// Run only the strategies whose name contains this (e.g. `redis`, `pg`).
    #[arg(long, default_value = "")]
    only: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let w = Workload {
        stock: args.stock,
        users: args.users,
        zipf: args.zipf,
        attempts: args.attempts,
        concurrency: args.concurrency,
        seed: args.seed,
        ..Workload::default()
    };
    let progress = !args.json;
    let c = w.concurrency;
    // One at a time, each PostgreSQL pool closed before the next opens: two
    // pools of 64 exceed PostgreSQL's default max_connections of 100.
    let mut reports: Vec<Report> = Vec::new();
    let wanted = |name: &str| name.contains(&args.only);
    if wanted("pg-for-update") {
        let s = PgForUpdate::connect(&args.pg, c).await?;
        reports.push(run(&s, &w, progress).await?);
        s.close().await;
    }
    if wanted("pg-conditional-update") {
        let s = PgConditionalUpdate::connect(&args.pg, c).await?;
        reports.push(run(&s, &w, progress).await?);
        s.close().await;
    }
    if wanted("pg-version-cas") {
        let s = PgVersionCas::connect(&args.pg, c).await?;
        reports.push(run(&s, &w, progress).await?);
        s.close().await;
    }
    if wanted("redis-decr-rollback") {
        let s = RedisDecrRollback::connect(&args.redis).await?;
        reports.push(run(&s, &w, progress).await?);
    }
    if wanted("redis-lua-single-key") {
        let s = RedisLuaSingleKey::connect(&args.redis).await?;
        reports.push(run(&s, &w, progress).await?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        for r in &reports {
            println!("{r}\n");
        }
    }
    if args.ceiling_requests > 0 {
        let n = args.ceiling_requests;
        for pipeline in [1, 16] {
            let rps = tokio::task::spawn_blocking(move || {
                redis_ceiling("127.0.0.1", 6379, c, n, pipeline)
            })
            .await??;
            eprintln!(
                "raw Redis ceiling (redis-benchmark EVALSHA, {c} clients, -P {pipeline}): {rps:.0} requests/s"
            );
        }
    }
    Ok(())
}
