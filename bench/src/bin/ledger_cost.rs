//! `ledger_cost`: what one flushed order costs PostgreSQL.
//!
//! Applies N synthetic order records through `Ledger::apply` — the flusher's
//! write, nothing else — in batches of each size asked for, each size into a
//! fresh PostgreSQL database (created, migrated, dropped after), and prints
//! the database's CPU per order and the orders per second.
//!
//! The CPU is read from `/proc/<pid>/stat` (utime + stime) of the postgres
//! processes before and after the run, so it does not depend on how many
//! cores were free: the backends serving this run's database (their
//! `cmdline` names it), and separately every postgres process of the server
//! (that adds the WAL writer, checkpointer and background writer, and anything
//! else the server did meanwhile — on a shared machine, other clients).
//!
//! The records look like a sale's: 16 bucket streams of one event, stream ids
//! rising, order ids as the service makes them (`OrderId::generate`), one
//! unit each, batches mixing the streams as the flusher's rounds do. The
//! program uses only `Ledger::connect`, `register_event`, `apply` and
//! `OrderId::generate`, so the same file measures any revision (with that
//! revision's order ids).
//!
//! With `--sqlite DIR` the same records go into a fresh SQLite file in DIR
//! instead, and the CPU is this process's own (SQLite runs inside it, as in
//! the embedded service; the records are made before the first reading).
//!
//! `cargo run --release -p shardstock-bench --bin ledger_cost -- [--orders N]
//! [--batches 100,500,2000] [--workers W] [--pg postgres://… | --sqlite DIR]`

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use shardstock::domain::ids::{EventId, OrderId};
use shardstock::domain::model::EventSpec;
use shardstock::domain::stream::{RecordKind, StreamEntry, StreamId};
use shardstock::ledger::{FlushRecord, Ledger};
use shardstock_bench::cost::cpu::Cpu;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

struct Args {
    orders: usize,
    batches: Vec<usize>,
    workers: usize,
    streams: u32,
    pg: String,
    sqlite: Option<std::path::PathBuf>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        orders: 200_000,
        batches: vec![100, 500, 2000],
        workers: 1,
        streams: 16,
        pg: "postgres://postgres@127.0.0.1:5432".into(),
        sqlite: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--orders" => a.orders = value()?.parse()?,
            "--batches" => {
                a.batches = value()?
                    .split(',')
                    .map(|b| b.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--workers" => a.workers = value()?.parse()?,
            "--streams" => a.streams = value()?.parse()?,
            "--pg" => a.pg = value()?.trim_end_matches('/').to_owned(),
            "--sqlite" => a.sqlite = Some(value()?.into()),
            "-h" | "--help" => {
                println!(
                    "ledger_cost [--orders N] [--batches 100,500,2000] [--workers W] [--streams S] [--pg URL | --sqlite DIR]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(a.workers > 0 && a.streams > 0 && !a.batches.contains(&0));
    Ok(a)
}

/// CPU ticks (utime + stime) of every postgres process, by pid, with its cmdline.
fn postgres_cpu() -> HashMap<u32, (u64, String)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so split after the ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 of the whole line are the 12th and 13th after the comm.
        let ticks = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?));
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        if let Some(ticks) = ticks {
            out.insert(pid, (ticks, cmdline));
        }
    }
    out
}

/// CPU seconds spent between two readings: (this database's backends, all).
fn spent(
    before: &HashMap<u32, (u64, String)>,
    after: &HashMap<u32, (u64, String)>,
    db: &str,
) -> (f64, f64) {
    let tick = 1.0 / 100.0; // USER_HZ is 100 on Linux
    let (mut mine, mut all) = (0u64, 0u64);
    for (pid, (ticks, cmdline)) in after {
        let was = before.get(pid).map_or(0, |(t, _)| *t);
        let d = ticks.saturating_sub(was);
        all += d;
        if cmdline.split_whitespace().any(|w| w == db) {
            mine += d;
        }
    }
    (mine as f64 * tick, all as f64 * tick)
}

/// The sale's records: order `i` is sold from stream `i % streams`.
fn records(event: &EventId, orders: usize, streams: u32) -> Vec<FlushRecord> {
    let start_ms = 1_750_000_000_000u64;
    (0..orders)
        .map(|i| {
            let bucket = (i as u32) % streams;
            let user = format!("u-{}", rand::random::<u32>() % 1_000_000);
            let n = i as u64;
            FlushRecord {
                stream: format!("{event}#0#{bucket}"),
                event: event.to_string(),
                entry: StreamEntry {
                    // One order per stream and millisecond: ids rise in each stream.
                    id: StreamId {
                        ms: start_ms + n / u64::from(streams),
                        seq: 0,
                    },
                    kind: RecordKind::Order,
                    order_id: OrderId::generate(event, rand::random()).to_string(),
                    user: user.clone(),
                    qty: 1,
                    bucket,
                    home: bucket,
                    rid: format!("{user}/r-{n}"),
                    at_ms: (start_ms + n / u64::from(streams)) as i64,
                    pay_by: None,
                    part: 0,
                },
            }
        })
        .collect()
}

struct Row {
    batch: usize,
    backend_us: f64,
    all_us: f64,
    per_sec: f64,
}

async fn one(a: &Args, batch: usize) -> anyhow::Result<Row> {
    let db = format!("shardstock_ledger_cost_{}_{batch}", std::process::id());
    let (url, mut conn) = match &a.sqlite {
        Some(dir) => {
            let file = dir.join(format!("{db}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
            (format!("sqlite://{}", file.display()), None)
        }
        None => {
            let admin = format!("{}/postgres", a.pg);
            let mut conn = PgConnection::connect(&admin).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db}")))
                .execute(&mut conn)
                .await?;
            (format!("{}/{db}", a.pg), Some(conn))
        }
    };
    let ledger = Ledger::connect(&url, a.workers as u32).await?;
    let event = EventId::parse("ledger-cost".to_owned())?;
    let spec = EventSpec {
        id: event.clone(),
        stock: a.orders as u64,
        buckets: a.streams,
        per_user_limit: None,
        max_per_order: 1,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        auto_buckets: None,
        tokens: None,
        draw: None,
    };
    ledger.register_event(&spec, 0).await?;
    let all = records(&event, a.orders, a.streams);
    // Each batch is a run of consecutive sales, as a flusher round reads them.
    let batches: Arc<Vec<Vec<FlushRecord>>> =
        Arc::new(all.chunks(batch).map(<[FlushRecord]>::to_vec).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let before = postgres_cpu();
    let own_before = Cpu::of(std::process::id());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.workers {
        let (ledger, batches, next) = (ledger.clone(), batches.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(b) = batches.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                ledger.apply(b, 0).await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let secs = started.elapsed().as_secs_f64();
    let after = postgres_cpu();
    let own = (Cpu::of(std::process::id()) - own_before)
        .as_duration()
        .as_secs_f64();
    let totals = ledger.totals(&event).await?.expect("the event's totals");
    anyhow::ensure!(
        totals.sold == a.orders as u64,
        "sold {} of {}",
        totals.sold,
        a.orders
    );
    drop(ledger);
    let n = a.orders as f64;
    let Some(conn) = conn.as_mut() else {
        return Ok(Row {
            batch,
            backend_us: own * 1e6 / n,
            all_us: own * 1e6 / n,
            per_sec: n / secs,
        });
    };
    let (mine, every) = spent(&before, &after, &db);
    // Dropping waits for the pool's backends to leave.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .execute(conn)
    .await?;
    Ok(Row {
        batch,
        backend_us: mine * 1e6 / n,
        all_us: every * 1e6 / n,
        per_sec: n / secs,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    match &a.sqlite {
        Some(dir) => {
            println!(
                "ledger_cost: {} orders, {} streams, {} worker(s), SQLite in {}",
                a.orders,
                a.streams,
                a.workers,
                dir.display()
            );
            println!("| batch | this process's CPU µs/order | (same) | orders/s |");
        }
        None => {
            println!(
                "ledger_cost: {} orders, {} streams, {} worker(s), PostgreSQL {}",
                a.orders, a.streams, a.workers, a.pg
            );
            println!("| batch | PG backend CPU µs/order | all postgres CPU µs/order | orders/s |");
        }
    }
    println!("|---:|---:|---:|---:|");
    for &batch in &a.batches {
        let r = one(&a, batch).await?;
        println!(
            "| {} | {:.1} | {:.1} | {:.0} |",
            r.batch, r.backend_us, r.all_us, r.per_sec
        );
    }
    Ok(())
}
