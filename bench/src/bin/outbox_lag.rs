//! `outbox_lag`: how long an order change takes to reach a NATS consumer.
//!
//! Subscribes to `<prefix>.>` on NATS (a plain subscription sees every
//! message the relay publishes into the JetStream stream, as it is stored),
//! and for each `order.created` records the time from the purchase (the
//! change's `at_ms`, the take's time in the store) to its arrival here: the
//! flusher's lag, the outbox, the relay and NATS together. Ends once
//! `--expect` creations arrived, or after `--idle` seconds without a message
//! once the first arrived, and prints the count and p50 / p99 / max in
//! seconds as one line (`bench/outbox_lag.sh` runs it beside a sale).
//!
//! With `--pg URL` (the service's database) it also splits the lag in two:
//! it polls the outbox's highest `seq` every 5 ms, so a change's commit is
//! seen within a poll (changes become visible in `seq` order), and prints
//! purchase → committed (the flusher) and committed → consumer (the relay
//! and NATS) the same way.
//!
//! `cargo run --release -p shardstock-bench --bin outbox_lag -- --prefix P
//! [--nats URL] [--pg URL] [--expect N] [--idle S]`

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use hdrhistogram::Histogram;

struct Args {
    nats: String,
    pg: Option<String>,
    prefix: String,
    expect: u64,
    idle: Duration,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        nats: "nats://127.0.0.1:4222".into(),
        pg: None,
        prefix: String::new(),
        expect: u64::MAX,
        idle: Duration::from_secs(10),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--nats" => a.nats = value()?,
            "--pg" => a.pg = Some(value()?),
            "--prefix" => a.prefix = value()?,
            "--expect" => a.expect = value()?.parse()?,
            "--idle" => a.idle = Duration::from_secs_f64(value()?.parse()?),
            "-h" | "--help" => {
                println!("outbox_lag --prefix P [--nats URL] [--pg URL] [--expect N] [--idle S]");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(
        !a.prefix.is_empty(),
        "--prefix is required (the service's [outbox] subject_prefix)"
    );
    Ok(a)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// When each `seq` was first seen committed: (highest seq, ms), rising.
type Seen = Arc<Mutex<Vec<(i64, i64)>>>;

/// Polls the outbox's highest `seq` every 5 ms until `stop`.
async fn watch_commits(url: String, seen: Seen, stop: tokio_util::sync::CancellationToken) {
    use sqlx::Connection;
    let Ok(mut conn) = sqlx::postgres::PgConnection::connect(&url).await else {
        eprintln!("outbox_lag: cannot connect to {url}; no split");
        return;
    };
    let mut last = 0;
    while !stop.is_cancelled() {
        if let Ok(seq) =
            sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(seq), 0) FROM outbox_changes")
                .fetch_one(&mut conn)
                .await
            && seq > last
        {
            last = seq;
            seen.lock().unwrap().push((seq, now_ms()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let client = async_nats::connect(a.nats.as_str()).await?;
    let mut sub = client.subscribe(format!("{}.>", a.prefix)).await?;
    // Ready: the caller starts the sale once it reads this line.
    println!("subscribed to {}.>", a.prefix);
    let seen: Seen = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher =
        a.pg.clone()
            .map(|url| tokio::spawn(watch_commits(url, seen.clone(), stop.clone())));
    // (seq, purchased, arrived) of each order.created.
    let mut arrivals: Vec<(i64, i64, i64)> = Vec::new();
    let mut lag = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
    let (mut created, mut others) = (0u64, 0u64);
    while created < a.expect {
        let wait = if created + others == 0 {
            Duration::from_secs(600)
        } else {
            a.idle
        };
        let Ok(Some(msg)) = tokio::time::timeout(wait, sub.next()).await else {
            break;
        };
        let arrived = now_ms();
        let body: serde_json::Value = serde_json::from_slice(&msg.payload)?;
        if body["type"] == "order.created" {
            let at = body["at_ms"].as_i64().unwrap_or(arrived);
            lag.record((arrived - at).max(1) as u64)?;
            arrivals.push((body["seq"].as_i64().unwrap_or(0), at, arrived));
            created += 1;
        } else {
            others += 1;
        }
    }
    let s = |q: f64| lag.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "outbox_lag: {created} order.created ({others} other changes); purchase to consumer p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        s(0.5),
        s(0.99),
        lag.max() as f64 / 1000.0
    );
    stop.cancel();
    if let Some(watcher) = watcher {
        watcher.await?;
        let seen = seen.lock().unwrap();
        let mut flush = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
        let mut relay = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
        for &(seq, at, arrived) in &arrivals {
            let i = seen.partition_point(|&(s, _)| s < seq);
            let Some(&(_, committed)) = seen.get(i) else {
                continue;
            };
            flush.record((committed - at).max(1) as u64)?;
            relay.record((arrived - committed).max(1) as u64)?;
        }
        let q = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "outbox_lag split ({} seen committed): purchase to commit p50 {:.3} s, p99 {:.3} s; commit to consumer p50 {:.3} s, p99 {:.3} s (each within the 5 ms poll)",
            flush.len(),
            q(&flush, 0.5),
            q(&flush, 0.99),
            q(&relay, 0.5),
            q(&relay, 0.99)
        );
    }
    Ok(())
}
