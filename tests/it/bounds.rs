//! Every accepted setting at its bounds: what the configuration accepts must
//! work, at the largest value as at the smallest.
//!
//! - One call of the largest batch (`batching.max_batch`, 1000) split over
//!   two buckets in one `purchase_groups` call, with a per-user limit and
//!   holds: every entry buys. Lua's `unpack` takes about 8000 values, and
//!   the script copied a group's arguments with it (~9000 for 1000 entries
//!   with holds): the call failed after the first group had bought, and
//!   every buyer got an error.
//! - A backlog longer than that in one bucket's stream (a database outage)
//!   flushed with the largest batch (`database.flush_batch`, 10000): every
//!   record acknowledged and trimmed. The acknowledgement unpacked every id
//!   at once and failed for ever, so the stream never drained.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::lifecycle;
use shardstock::domain::keys::BucketRef;
use shardstock::engine::PurchaseRequest;
use shardstock::{Engine, EngineOptions};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::Faulty;
use crate::harness::{event_id, ledger_for, namespace, spec, standalone, user_homed_at};

const SUITE: &str = "bounds";

/// 999 buyers homed at bucket 0 and one at bucket 1 of a standalone Redis,
/// all in one lane and one call (`purchase_groups`, a group a bucket), the
/// 999 with every column a purchase can carry (8 values each, 9 with holds).
async fn one_call_of_the_largest_batch(holds: bool) {
    const BUYERS: u32 = 1_000;
    let store = standalone(SUITE).await.store().clone();
    let counted = Faulty::plain(store).grouping();
    let opts = EngineOptions {
        max_batch: Some(BUYERS as usize),
        shared_lanes: 1,
        batch_wait: Duration::from_millis(500),
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::new(counted.clone(), opts));
    let id = event_id("largest-batch");
    let mut s = spec(&id, 2 * u64::from(BUYERS), 2);
    s.per_user_limit = Some(5);
    s.hold_seconds = holds.then_some(600);
    engine.create_event(s).await.unwrap();
    let buys = (0..BUYERS).map(|i| {
        let engine = engine.clone();
        let home = u32::from(i == 0);
        let req = PurchaseRequest {
            event: id.clone(),
            user: crate::harness::user(user_homed_at(home, 2, &format!("b{i}-"))),
            quantity: 1,
            // Without request ids the call goes entry by entry, with every
            // column: the most arguments a purchase can carry.
            request_id: None,
        };
        async move { engine.purchase(&req).await }
    });
    let answers = futures::future::join_all(buys).await;
    let failed: Vec<_> = answers
        .iter()
        .filter(|a| !matches!(a, Ok(o) if o.result.is_ok()))
        .collect();
    assert!(
        failed.is_empty(),
        "holds {holds}: {} of {BUYERS} did not buy, e.g. {:?}",
        failed.len(),
        failed[0]
    );
    assert!(
        counted.calls("purchase_groups") <= 3,
        "the buyers shared a call or two: {} calls",
        counted.calls("purchase_groups")
    );
    let view = engine.view(&id).await.unwrap();
    assert_eq!(view.sold, u64::from(BUYERS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_call_of_the_largest_batch_over_two_buckets_buys_every_entry() {
    one_call_of_the_largest_batch(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_call_of_the_largest_batch_with_holds_buys_every_entry() {
    one_call_of_the_largest_batch(true).await;
}

/// 9,000 records waiting in one bucket's stream, flushed with batches of
/// 10,000: all in the ledger, acknowledged and trimmed, the stream empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_past_unpacks_limit_is_acknowledged_and_trimmed() {
    const BACKLOG: u64 = 9_000;
    let engine = Arc::new(standalone(SUITE).await);
    let ledger = ledger_for("redis").await;
    let id = event_id("backlog");
    lifecycle::create(&engine, &ledger, spec(&id, BACKLOG, 1))
        .await
        .unwrap();
    // Unbatched calls, one record each: the stream holds 9,000 entries.
    let unbatched = Arc::new(Engine::new(
        engine.store().clone(),
        crate::harness::unbatched(),
    ));
    let buys = (0..BACKLOG).map(|i| {
        let engine = unbatched.clone();
        let req = PurchaseRequest {
            event: id.clone(),
            user: crate::harness::user(format!("u{i}")),
            quantity: 1,
            request_id: None,
        };
        async move { engine.purchase(&req).await.unwrap().result.unwrap() }
    });
    futures::stream::iter(buys)
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let bucket = BucketRef::new(&id, 0, 0);
    let key = bucket.keys_in(&namespace(SUITE)).orders;
    let xlen = || {
        shardstock_bench::cluster::redis_cli(6379, &["xlen", &key])
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert!(xlen() > 8_000, "a backlog past unpack's limit: {}", xlen());
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        "largest-batch".into(),
        FlushOptions {
            batch: 10_000,
            workers: 1,
            idle: Duration::from_millis(10),
            claim_idle_ms: 60_000,
        },
    );
    let stop = CancellationToken::new();
    let flushed = flusher.flush_once(&[bucket.clone()], &stop).await.unwrap();
    assert!(
        flushed as u64 >= BACKLOG / 2,
        "one read took the backlog: {flushed}"
    );
    tokio::time::timeout(Duration::from_secs(60), flusher.drain(&[bucket], &stop))
        .await
        .expect("the stream drains")
        .unwrap();
    assert_eq!(xlen(), 0, "every record acknowledged and trimmed");
    let totals = ledger.totals(&id).await.unwrap().unwrap();
    assert_eq!(totals.sold, BACKLOG);
}
