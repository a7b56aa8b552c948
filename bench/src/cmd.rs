//! The `shardstock-bench` command line: one strategy, or `--compare` them all.

use std::path::PathBuf;

use clap::Parser;

use crate::baselines::{DEFAULT_PG_URL, DEFAULT_REDIS_URL};
use crate::compare::{CompareOptions, compare, markdown};
use crate::cost::{CostOptions, Peer, Row, http_cost, serve_peer};
use crate::http::{Setup, service_binary};
use crate::{
    EngineStrategy, HttpStrategy, PgConditionalUpdate, PgForUpdate, PgVersionCas,
    RedisDecrRollback, RedisLuaSingleKey, Report, Strategy, Workload, run,
};

/// The flash-sale load generator for shardstock.
///
/// Runs a flash-sale workload against one strategy, or (--compare) against
/// all of them — the PostgreSQL and single-key Redis baselines, the shardstock
/// engine on Redis and on a Redis Cluster, the service over HTTP — and
/// measures the raw Redis ceiling in the same run, writing BENCHMARKS.md.
#[derive(Debug, Parser)]
#[command(name = "shardstock-bench", version, about, long_about)]
pub struct BenchArgs {
    /// S: units of stock (the default sells out about 80% of the way through).
    #[arg(long, default_value_t = 100_000)]
    pub stock: u64,
    /// U: distinct users.
    #[arg(long, default_value_t = 1_000_000)]
    pub users: u64,
    /// Zipf exponent over users (uniform when absent).
    #[arg(long)]
    pub zipf: Option<f64>,
    /// A: purchase attempts.
    #[arg(long, default_value_t = 100_000)]
    pub attempts: u64,
    /// C: concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Quantity mix as units:weight pairs.
    #[arg(long, default_value = "1:0.8,2:0.15,3:0.05", value_parser = parse_mix)]
    pub quantities: QuantityMix,
    /// Share of attempts re-sending an earlier request id.
    #[arg(long, default_value_t = 0.05)]
    pub retry_rate: f64,
    /// Units one user may hold.
    #[arg(long)]
    pub per_user_limit: Option<u32>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// pg-for-update, pg-conditional-update, pg-version-cas, redis-decr-rollback,
    /// redis-lua-single-key, engine, http (the service binary on Redis and
    /// PostgreSQL), http-embedded (the service binary as the quickstart runs
    /// it: the embedded store, SQLite in a scratch file; no Redis, no
    /// PostgreSQL).
    #[arg(long, default_value = "engine")]
    pub strategy: String,
    /// Run the HTTP load against a service already running at this URL
    /// (e.g. http://10.0.0.5:8080) instead of starting one: the bench creates
    /// its event there with --admin-token, and closes it at the end.
    #[arg(long, value_name = "URL", requires = "admin_token",
          conflicts_with_all = ["strategy", "compare", "http_cost"])]
    pub target: Option<String>,
    /// The target's admin token (`server.admin_token`), for --target.
    #[arg(long, env = "SHARDSTOCK_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Buckets for the engine and http strategies.
    #[arg(long, default_value_t = 16)]
    pub buckets: u32,
    /// The engine without group commit.
    #[arg(long)]
    pub unbatched: bool,
    /// The engine's durability setting: acknowledge a purchase once it is on
    /// this many replicas (WAIT per batch; the Redis needs them).
    #[arg(long, default_value_t = 0)]
    pub min_replicas: u32,
    /// The engine with holds (`hold_seconds`): this share (0..=1) of the
    /// held orders is confirmed, each by a task of its own.
    #[arg(long)]
    pub holds: Option<f64>,
    /// Run every strategy and write the comparison (see --out).
    #[arg(long)]
    pub compare: bool,
    /// Where --compare writes its Markdown report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Machine-readable output (JSON on stdout, no progress bar).
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = DEFAULT_REDIS_URL)]
    pub redis: String,
    /// A Redis Cluster URL for the engine (the cluster row of --compare starts
    /// a local 3-master cluster when absent).
    #[arg(long)]
    pub cluster: Option<String>,
    #[arg(long, default_value = DEFAULT_PG_URL)]
    pub pg: String,
    /// Requests per redis-benchmark run for the ceiling.
    #[arg(long, default_value_t = 200_000)]
    pub ceiling_requests: u64,
    /// The `shardstock` binary the http strategy runs (default: the one next
    /// to this binary, which `cargo build` puts there).
    #[arg(long, env = "SHARDSTOCK_BIN")]
    pub service: Option<PathBuf>,
    /// Measure what a purchase over HTTP costs in CPU time per process
    /// (server, Redis, PostgreSQL) next to hand-written axum + Lua endpoints;
    /// prints a Markdown table (see BENCHMARKS.md).
    #[arg(long)]
    pub http_cost: bool,
    /// Measured requests per --http-cost row (after a warm-up of a tenth).
    #[arg(long, default_value_t = 100_000)]
    pub cost_requests: u64,
    /// Which rows --http-cost runs (default: all, peers first), e.g.
    /// `--cost-rows bare,embedded` to compare the embedded service with
    /// the bare endpoint only.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub cost_rows: Vec<RowName>,
    /// Also run the Redis + PostgreSQL row of --http-cost for this many
    /// seconds, comparing its last 10 s with its first.
    #[arg(long)]
    pub cost_duration: Option<u64>,
    /// The service's worker threads in --http-cost's shardstock rows
    /// (`serve --worker-threads`; default: the service's own, one per core).
    #[arg(long)]
    pub service_threads: Option<usize>,
    /// The peers' worker threads in --http-cost: 1 (the default) runs a peer
    /// on one thread (a current-thread runtime), more on a multi-thread
    /// runtime of that many workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub peer_threads: u16,
    /// Serve a peer endpoint of --http-cost (internal: the runner starts it).
    #[arg(long, hide = true, value_enum)]
    pub serve_peer: Option<Peer>,
    /// Where --serve-peer listens.
    #[arg(long, hide = true, default_value = "127.0.0.1:0")]
    pub listen: String,
}

/// A row of --http-cost, for clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RowName {
    Bare,
    Lua,
    LuaXadd,
    Embedded,
    RedisPg,
    RedisPgToken,
    RedisPgEntry,
}

impl From<RowName> for Row {
    fn from(r: RowName) -> Self {
        match r {
            RowName::Bare => Row::Peer(Peer::Bare),
            RowName::Lua => Row::Peer(Peer::Lua),
            RowName::LuaXadd => Row::Peer(Peer::LuaXadd),
            RowName::Embedded => Row::Embedded,
            RowName::RedisPg => Row::RedisPg,
            RowName::RedisPgToken => Row::RedisPgToken,
            RowName::RedisPgEntry => Row::RedisPgEntry,
        }
    }
}

/// A quantity mix for clap.
#[derive(Debug, Clone)]
pub struct QuantityMix(pub Vec<(u32, f64)>);

fn parse_mix(s: &str) -> Result<QuantityMix, String> {
    s.split(',')
        .map(|pair| {
            let (q, w) = pair
                .split_once(':')
                .ok_or_else(|| format!("{pair:?} is not units:weight"))?;
            Ok((
                q.trim().parse().map_err(|e| format!("{q:?}: {e}"))?,
                w.trim().parse().map_err(|e| format!("{w:?}: {e}"))?,
            ))
        })
        .collect::<Result<_, String>>()
        .map(QuantityMix)
}

impl BenchArgs {
    pub fn workload(&self) -> Workload {
        Workload {
            stock: self.stock,
            users: self.users,
            zipf: self.zipf,
            attempts: self.attempts,
            concurrency: self.concurrency,
            quantities: self.quantities.0.clone(),
            retry_rate: self.retry_rate,
            per_user_limit: self.per_user_limit,
            seed: self.seed,
        }
    }
}

async fn one<S: Strategy>(s: &S, w: &Workload, json: bool) -> anyhow::Result<Report> {
    run(s, w, !json).await
}

/// Runs the command.
pub async fn command(a: BenchArgs) -> anyhow::Result<()> {
    let w = a.workload();
    w.validate()?;
    // Found before any row runs: the HTTP row comes last in a comparison.
    let service = || service_binary(a.service.as_deref());
    if let Some(peer) = a.serve_peer {
        return Ok(serve_peer(peer, &a.listen, &a.redis).await?);
    }
    if a.http_cost {
        let command = format!(
            "shardstock-bench {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        let opts = CostOptions {
            requests: a.cost_requests,
            warmup: (a.cost_requests / 10).max(1_000),
            concurrency: a.concurrency,
            buckets: a.buckets,
            pg: a.pg.clone(),
            service: service()?,
            bench: std::env::current_exe()?,
            rows: if a.cost_rows.is_empty() {
                Row::ALL.to_vec()
            } else {
                a.cost_rows.iter().map(|&r| r.into()).collect()
            },
            sustained: a.cost_duration.map(std::time::Duration::from_secs),
            service_threads: a.service_threads,
            peer_threads: a.peer_threads,
        };
        let cost = http_cost(&opts).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&cost)?);
        } else {
            print!("{}", crate::cost::markdown(&cost, &command));
        }
        return Ok(());
    }
    if a.compare {
        let command = format!(
            "shardstock-bench {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        );
        let opts = CompareOptions {
            workload: w,
            redis: a.redis.clone(),
            pg: a.pg.clone(),
            cluster: a.cluster.clone(),
            ceiling_requests: a.ceiling_requests,
            out: Some(a.out.clone()),
            binary: service()?,
            progress: !a.json,
            command: command.clone(),
        };
        let cmp = compare(&opts).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&cmp)?);
        } else {
            print!("{}", markdown(&cmp, &command));
            eprintln!("written to {}", a.out.display());
        }
        return Ok(());
    }
    let c = w.concurrency;
    let report = if let Some(url) = &a.target {
        let token = a.admin_token.as_deref().unwrap_or_default();
        let s = HttpStrategy::target(url, token, a.buckets, c).await?;
        one(&s, &w, a.json).await?
    } else {
        by_name(&a, &w).await?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    anyhow::ensure!(
        !report.broken_claim(),
        "the strategy broke its promise: {}",
        report.verdict
    );
    Ok(())
}

/// The strategy `--strategy` names, run once.
async fn by_name(a: &BenchArgs, w: &Workload) -> anyhow::Result<Report> {
    let c = w.concurrency;
    Ok(match a.strategy.as_str() {
        "pg-for-update" => one(&PgForUpdate::connect(&a.pg, c).await?, w, a.json).await?,
        "pg-conditional-update" => {
            one(&PgConditionalUpdate::connect(&a.pg, c).await?, w, a.json).await?
        }
        "pg-version-cas" => one(&PgVersionCas::connect(&a.pg, c).await?, w, a.json).await?,
        "redis-decr-rollback" => {
            one(&RedisDecrRollback::connect(&a.redis).await?, w, a.json).await?
        }
        "redis-lua-single-key" => {
            one(&RedisLuaSingleKey::connect(&a.redis).await?, w, a.json).await?
        }
        "engine" => {
            let url = a.cluster.as_deref().unwrap_or(&a.redis);
            let batch = (!a.unbatched).then_some(64);
            let mut s = EngineStrategy::connect_with(url, a.buckets, batch, a.min_replicas).await?;
            if let Some(share) = a.holds {
                s = s.with_holds(share);
            }
            one(&s, w, a.json).await?
        }
        "http" | "http-embedded" => {
            let setup = if a.strategy == "http" {
                Setup::Redis {
                    redis: a.redis.clone(),
                    database: a.pg.clone(),
                }
            } else {
                Setup::Embedded
            };
            let binary = service_binary(a.service.as_deref())?;
            let s = HttpStrategy::start(&binary, &setup, a.buckets, c).await?;
            one(&s, w, a.json).await?
        }
        other => anyhow::bail!("unknown strategy {other:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_needs_an_admin_token_and_runs_alone() {
        let parse = |args: &[&str]| {
            BenchArgs::try_parse_from(["shardstock-bench"].iter().chain(args)).map_err(|e| e.kind())
        };
        let a = parse(&["--target", "http://127.0.0.1:8080", "--admin-token", "t"]).unwrap();
        assert_eq!(a.target.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(a.admin_token.as_deref(), Some("t"));
        // The token may come from the environment instead; only without it
        // is a missing flag an error.
        if std::env::var_os("SHARDSTOCK_ADMIN_TOKEN").is_none() {
            assert_eq!(
                parse(&["--target", "http://127.0.0.1:8080"]).unwrap_err(),
                clap::error::ErrorKind::MissingRequiredArgument
            );
        }
        for other in [
            &["--compare"][..],
            &["--http-cost"],
            &["--strategy", "engine"],
        ] {
            let mut args = vec!["--target", "http://x", "--admin-token", "t"];
            args.extend(other);
            assert_eq!(
                parse(&args).unwrap_err(),
                clap::error::ErrorKind::ArgumentConflict,
                "{other:?}"
            );
        }
    }
}
