//! `shardstock-bench --compare`: every strategy on one workload, the raw Redis
//! ceiling measured in the same run, and `BENCHMARKS.md` written from it.
//!
//! Rows are run one at a time (each with the machine to itself). Each row also
//! reads as a ratio of what Redis itself does here: `redis-benchmark` running
//! EVALSHA of the single-key script at the same client count, unpipelined and
//! with `-P 16`. For the engine rows on standalone Redis the script calls are
//! counted (`INFO commandstats`), which shows how many purchases each call
//! carried with group commit.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::baselines::{
    PgConditionalUpdate, PgForUpdate, PgVersionCas, RedisDecrRollback, RedisLuaSingleKey,
};
use crate::cluster::LocalCluster;
use crate::http::Setup;
use crate::{EngineStrategy, HttpStrategy, Report, Strategy, Workload, redis_ceiling, run};

/// What to compare, and where to write.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    pub workload: Workload,
    pub redis: String,
    pub pg: String,
    /// A Cluster to use; `None` starts a local 3-master one for the run.
    pub cluster: Option<String>,
    pub ceiling_requests: u64,
    pub out: Option<PathBuf>,
    /// The `shardstock` binary (for the HTTP row), see [`service_binary`](crate::http::service_binary).
    pub binary: PathBuf,
    pub progress: bool,
    /// The command as typed, for the report.
    pub command: String,
}

/// One row of the table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub report: Report,
    /// EVALSHA calls the row made (engine rows on standalone Redis).
    pub script_calls: Option<u64>,
}

/// The whole comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    pub ceiling_unpipelined: f64,
    pub ceiling_pipelined: f64,
    pub machine: String,
    pub workload: Workload,
}

fn host_port(url: &str) -> (String, u16) {
    let rest = url.split("://").nth(1).unwrap_or("127.0.0.1:6379");
    let hp = rest.split(['/', '?']).next().unwrap_or("127.0.0.1:6379");
    let (h, p) = hp.rsplit_once(':').unwrap_or((hp, "6379"));
    (h.to_owned(), p.parse().unwrap_or(6379))
}

fn evalsha_calls(host: &str, port: u16) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", host, "-p", &port.to_string(), "info", "commandstats"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn row<S: Strategy>(
    s: &S,
    w: &Workload,
    progress: bool,
    count_at: Option<(&str, u16)>,
) -> anyhow::Result<Row> {
    let before = count_at.map(|(h, p)| evalsha_calls(h, p));
    let report = run(s, w, progress).await?;
    let script_calls = count_at
        .zip(before)
        .map(|((h, p), b)| evalsha_calls(h, p).saturating_sub(b));
    Ok(Row {
        report,
        script_calls,
    })
}

/// Runs every strategy and the ceiling; writes the report when asked.
pub async fn compare(o: &CompareOptions) -> anyhow::Result<Comparison> {
    let w = &o.workload;
    w.validate()?;
    let (host, port) = host_port(&o.redis);
    let c = w.concurrency;
    let mut ceilings = [0.0; 2];
    for (i, pipeline) in [1usize, 16].into_iter().enumerate() {
        let (h, n) = (host.clone(), o.ceiling_requests);
        ceilings[i] =
            tokio::task::spawn_blocking(move || redis_ceiling(&h, port, c, n, pipeline)).await??;
    }
    let mut rows = Vec::new();
    {
        let s = PgForUpdate::connect(&o.pg, c).await?;
        rows.push(row(&s, w, o.progress, None).await?);
        s.close().await;
    }
    {
        let s = PgConditionalUpdate::connect(&o.pg, c).await?;
        rows.push(row(&s, w, o.progress, None).await?);
        s.close().await;
    }
    {
        let s = PgVersionCas::connect(&o.pg, c).await?;
        rows.push(row(&s, w, o.progress, None).await?);
        s.close().await;
    }
    rows.push(
        row(
            &RedisDecrRollback::connect(&o.redis).await?,
            w,
            o.progress,
            None,
        )
        .await?,
    );
    rows.push(
        row(
            &RedisLuaSingleKey::connect(&o.redis).await?,
            w,
            o.progress,
            Some((&host, port)),
        )
        .await?,
    );
    for batch in [None, Some(64)] {
        for buckets in [1, 4, 16] {
            let s = EngineStrategy::connect(&o.redis, buckets, batch).await?;
            rows.push(row(&s, w, o.progress, Some((&host, port))).await?);
        }
    }
    let local = match &o.cluster {
        Some(_) => None,
        None => Some(tokio::task::spawn_blocking(LocalCluster::start).await??),
    };
    let cluster_url = o
        .cluster
        .clone()
        .unwrap_or_else(|| local.as_ref().map(LocalCluster::url).unwrap_or_default());
    for batch in [None, Some(64)] {
        let s = EngineStrategy::connect(&cluster_url, 16, batch).await?;
        rows.push(row(&s, w, o.progress, None).await?);
        s.close().await;
    }
    drop(local);
    {
        let setup = Setup::Redis {
            redis: o.redis.clone(),
            database: o.pg.clone(),
        };
        let s = HttpStrategy::start(&o.binary, &setup, 16, c).await?;
        rows.push(row(&s, w, o.progress, Some((&host, port))).await?);
    }
    let cmp = Comparison {
        rows,
        ceiling_unpipelined: ceilings[0],
        ceiling_pipelined: ceilings[1],
        machine: machine(),
        workload: w.clone(),
    };
    if let Some(path) = &o.out {
        std::fs::write(path, markdown(&cmp, &o.command))?;
    }
    Ok(cmp)
}

/// Cores, CPU model and memory of this machine.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")
                    .map(|m| m.trim().trim_end_matches(" kB").parse::<f64>().ok())
            })
        })
        .flatten()
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!("{cores} cores ({cpu}), {mem_gib:.0} GiB")
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The report as Markdown: one table, the machine, the command, the ceiling.
pub fn markdown(c: &Comparison, command: &str) -> String {
    let w = &c.workload;
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Produced by one command, `{command}`, on {}.\n",
        c.machine
    );
    let users = match w.zipf {
        Some(z) => format!("Zipf users (exponent {z})"),
        None => "uniform users".into(),
    };
    let mix: Vec<String> = w
        .quantities
        .iter()
        .map(|(q, p)| format!("{q}×{p}"))
        .collect();
    let _ = writeln!(
        s,
        "Workload (the same for every row): S = {} units, U = {} {users}, A = {} attempts from C = {} concurrent clients, \
         quantities {}, {:.0}% retries of an earlier request id, seed {}.\n",
        w.stock,
        w.users,
        w.attempts,
        w.concurrency,
        mix.join(" / "),
        w.retry_rate * 100.0,
        w.seed
    );
    let _ = writeln!(
        s,
        "Raw Redis ceiling, measured in the same run: `redis-benchmark` EVALSHA of the single-key script with {} clients — \
         **{:.0}/s unpipelined**, **{:.0}/s with `-P 16`**. The `× ceiling` columns divide each row's purchases/s by these.\n",
        w.concurrency, c.ceiling_unpipelined, c.ceiling_pipelined
    );
    let _ = writeln!(
        s,
        "| strategy | purchases/s | attempts/s | p50 ms | p99 ms | p99.9 ms | × ceiling | × ceiling -P16 | purchases per script call | verdict |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for row in &c.rows {
        let r = &row.report;
        let per_call = match row.script_calls {
            Some(calls) if calls > 0 => format!("{:.1}", r.purchases_ok as f64 / calls as f64),
            _ => "".into(),
        };
        let verdict = if r.claims_no_oversell {
            r.verdict.clone()
        } else {
            format!("{} (naive)", r.verdict)
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {:.2} | {:.2} | {per_call} | {verdict} |",
            r.strategy,
            r.purchases_per_s,
            r.attempts_per_s,
            ms(r.p50_us),
            ms(r.p99_us),
            ms(r.p999_us),
            r.purchases_per_s / c.ceiling_unpipelined.max(1.0),
            r.purchases_per_s / c.ceiling_pipelined.max(1.0),
        );
    }
    let _ = writeln!(
        s,
        "\nHow to read it: *purchases/s* counts successful purchases (the sale sells out, after which attempts are \
         answered sold-out); *verdict* checks the books after the run — `clean` means no unit oversold and none left \
         unsold while a buyer was refused. The PostgreSQL rows are seed 002's §2–3 and seed 004's conditional update; \
         the Redis rows seed 000's DECR with rollback and seed 002's single-key Lua script. `shardstock-redis-nN` is the \
         engine with N buckets on standalone Redis, `-cluster-` on a 3-master Redis Cluster started for the run, \
         `-http-` the real service over HTTP with a separate client (it also writes every order to PostgreSQL). \
         *unbatched* sends every purchase in its own script call; *batched* groups the purchases of a bucket that \
         arrive while a call is in flight (`purchases per script call`). The single-key Redis rows pipeline over \
         one connection and only check and decrement; an engine purchase also writes its order record, its index \
         entry and its idempotency record in the same atomic step — `docs/PROFILE.md` shows where the time goes. \
         The machine is shared and noisy: compare rows of one run, not runs.\n"
    );
    s
}
