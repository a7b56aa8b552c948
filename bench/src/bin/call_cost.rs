//! `call_cost`: what a grouped purchase call costs Redis, split into its
//! parts (issue 12).
//!
//! On one Redis server the batcher sends a lane's purchases as one
//! `purchase_groups.lua` call holding one group per bucket (`Buckets::
//! purchase_groups`). Such a call costs Redis a fixed part per call (the
//! command's trip through the event loop, the script's setup), a part per
//! group (the bucket's ten keys, its reads and its writes: `MGET`, `HMGET`,
//! `XADD`, two `HSET`s, `DECRBY`, `INCRBY`) and a part per purchase (its
//! arguments, its hash fields and stream field, its reply). This program
//! sends calls of fixed shapes — `G` groups of `P` purchases each, every
//! purchase bought on the fast path (fresh request ids, no limit, stock to
//! spare) — through the store's own argument building, on a fresh event,
//! and reads Redis's CPU time (`INFO cpu`: `used_cpu_user` + `used_cpu_sys`)
//! before and after each shape. It prints the µs a purchase of every shape
//! and a least-squares fit of `µs a call = per call + G × per group +
//! G·P × per purchase` over all of them. (Its sibling
//! `bench/callgrind/script_cost.sh` counts instructions instead of time, for
//! one shape and a script's text under test, repeatable on a busy machine;
//! this one times the shapes through the store's code and splits them.)
//!
//! Redis's CPU is the whole process's, so run it on a Redis of its own
//! (nothing else calling it) for figures that mean something:
//!
//! `redis-server --port 46400 --save '' --appendonly no --daemonize yes`
//! `cargo run --release -p shardstock-bench --bin call_cost -- --redis
//! redis://127.0.0.1:46400 [--shapes 1x1,1x4,1x16,4x2,8x1,16x1] [--purchases
//! 50000] [--in-flight 4] [--runs 3]`

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use shardstock::domain::ids::{EventId, OrderId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::EventSpec;
use shardstock::domain::routing::{home, user_hash};
use shardstock::store::redis::{RedisOptions, RedisStore};
use shardstock::store::{Buckets, Events, PurchaseEntry, PurchaseReply};
use shardstock::{Engine, EngineOptions};
use shardstock_bench::engine::connect_fresh;

/// What a grouped purchase call costs Redis, by call, group and purchase.
#[derive(clap::Parser)]
struct Args {
    /// The Redis to run on (best a private one: its whole CPU time is read).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Call shapes, `GxP`: G groups (buckets) of P purchases each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1x1,1x4,1x16,4x2,8x1,16x1"
    )]
    shapes: Vec<String>,
    /// Purchases a shape sends (its calls: this ÷ G·P).
    #[arg(long, default_value_t = 50_000)]
    purchases: usize,
    /// Calls in flight at once (as the batcher's lanes keep several).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    in_flight: u16,
    /// Each shape this many times, in turn (the machine drifts).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// Redis's CPU seconds so far (`INFO cpu`).
async fn redis_cpu(store: &RedisStore) -> anyhow::Result<f64> {
    use fred::interfaces::ClientLike;
    let info: String = store
        .client()
        .info(Some(fred::types::InfoKind::Cpu))
        .await?;
    let field = |name: &str| -> anyhow::Result<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("INFO cpu has no {name}"))
    };
    Ok(field("used_cpu_user:")? + field("used_cpu_sys:")?)
}

/// `GxP` → (G, P).
fn shape(s: &str) -> anyhow::Result<(usize, usize)> {
    let (g, p) = s
        .split_once('x')
        .ok_or_else(|| anyhow::anyhow!("a shape is GxP, not {s:?}"))?;
    let (g, p): (usize, usize) = (g.parse()?, p.parse()?);
    anyhow::ensure!(
        g >= 1 && p >= 1,
        "a shape has at least one group of one: {s:?}"
    );
    Ok((g, p))
}

/// Least squares for `y = X β` by the normal equations (3 unknowns).
fn fit(rows: &[([f64; 3], f64)]) -> Option<[f64; 3]> {
    let mut a = [[0.0f64; 4]; 3];
    for (x, y) in rows {
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] += x[i] * x[j];
            }
            a[i][3] += x[i] * y;
        }
    }
    // Gauss–Jordan with partial pivoting.
    for c in 0..3 {
        let p = (c..3).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        a.swap(c, p);
        if a[c][c].abs() < 1e-12 {
            return None;
        }
        let pivot = a[c];
        for (r, row) in a.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, p) in row[c..].iter_mut().zip(&pivot[c..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some([a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]])
}

/// One shape's calls; Redis µs a purchase.
async fn measure(
    a: &Args,
    store: &RedisStore,
    event: &EventId,
    buckets: &[BucketRef],
    (g, p): (usize, usize),
    run: usize,
) -> anyhow::Result<f64> {
    let calls = (a.purchases / (g * p)).max(1);
    // Users homed in each bucket, so a group's purchases are its bucket's own.
    let n = buckets.len() as u32;
    let mut next_user = 0u64;
    let mut user_in = |b: u32| loop {
        next_user += 1;
        let user = UserId::parse(format!("u{run}-{g}x{p}-{next_user}")).expect("a valid user id");
        if home(user_hash(&user), n) == b {
            return user;
        }
    };
    let mut all = Vec::with_capacity(calls);
    for c in 0..calls {
        let groups: Vec<(BucketRef, Vec<PurchaseEntry>)> = (0..g)
            .map(|i| {
                let b = ((c * g + i) % buckets.len()) as u32;
                let entries = (0..p)
                    .map(|_| {
                        let user = user_in(b);
                        PurchaseEntry {
                            rid: format!("{user}/r"),
                            order_id: OrderId::generate(event, user_hash(&user)),
                            user,
                            qty: 1,
                            limit: 0,
                            keep: true,
                            pay_by: None,
                            token: None,
                        }
                    })
                    .collect();
                (buckets[b as usize].clone(), entries)
            })
            .collect();
        all.push(groups);
    }
    let store = Arc::new(store.clone());
    let before = redis_cpu(&store).await?;
    let now_ms = shardstock::engine::Clock::system().now_ms();
    let mut replies = stream::iter(all)
        .map(|groups| {
            let store = store.clone();
            async move { store.purchase_groups(now_ms, &groups).await }
        })
        .buffer_unordered(usize::from(a.in_flight));
    while let Some(groups) = replies.next().await {
        for group in groups {
            for reply in group? {
                anyhow::ensure!(
                    matches!(reply, PurchaseReply::Bought { .. }),
                    "every purchase is bought on the fast path, not {reply:?}"
                );
            }
        }
    }
    let after = redis_cpu(&store).await?;
    Ok((after - before) * 1e6 / (calls * g * p) as f64)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = <Args as clap::Parser>::parse();
    let shapes = a
        .shapes
        .iter()
        .map(|s| shape(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let most = shapes.iter().map(|&(g, _)| g).max().unwrap_or(1) as u32;
    let store = connect_fresh(RedisOptions::new(&a.redis), "callcost").await?;
    anyhow::ensure!(
        store.groups_buckets(),
        "{} does not group buckets in one call (a Cluster?): run on one Redis server",
        a.redis
    );
    let engine = Engine::new(store.clone(), EngineOptions::default());
    let event = EventId::parse("call-cost").map_err(anyhow::Error::msg)?;
    engine
        .create_event(EventSpec {
            id: event.clone(),
            stock: 1_000_000_000,
            buckets: most,
            per_user_limit: None,
            max_per_order: 1,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
            tokens: None,
            draw: None,
        })
        .await?;
    let meta = store
        .load_meta(&event)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the event was just created"))?;
    let buckets = meta.all_buckets();
    println!(
        "Redis CPU µs a purchase (`INFO cpu`), calls of G groups × P purchases, {} purchases a shape, {} calls in flight:\n",
        a.purchases, a.in_flight
    );
    println!(
        "| shape | {} |",
        (1..=a.runs)
            .map(|r| format!("run {r}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---:|".repeat(a.runs));
    let mut rows = Vec::new();
    let mut table: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    for run in 0..a.runs {
        for (i, &s) in shapes.iter().enumerate() {
            let us = measure(&a, &store, &event, &buckets, s, run).await?;
            let (g, p) = (s.0 as f64, s.1 as f64);
            // µs a call = per call + G × per group + G·P × per purchase.
            rows.push(([1.0, g, g * p], us * g * p));
            table[i].push(us);
        }
    }
    for (s, us) in a.shapes.iter().zip(&table) {
        println!(
            "| {s} | {} |",
            us.iter()
                .map(|u| format!("{u:.2}"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    match fit(&rows) {
        Some([call, group, purchase]) => println!(
            "\nFit over every run: {call:.1} µs a call + {group:.1} µs a group + {purchase:.1} µs a purchase"
        ),
        None => println!("\nNo fit: the shapes do not vary groups and purchases apart"),
    }
    Ok(())
}
