//! A partial loss: Redis back from an AOF that misses its last writes
//! (issue 15).
//!
//! With `appendfsync everysec`, Redis writes every command to its AOF before
//! answering, and fsyncs once a second: a killed process loses nothing (the
//! page cache survives it), a host crash or power loss loses what was not
//! synced yet. The test makes that happen on one machine: mid-sale it notes
//! how long the AOF is, lets the sale go on until the flusher has written
//! orders made after that point to PostgreSQL, kills Redis with SIGKILL, cuts
//! the AOF back to the noted length (what the disk held at the last fsync),
//! and starts Redis again from it. Redis is back, the event is there — but
//! without the last writes: orders the ledger holds lost their decrements,
//! and the buckets offer their units again; orders answered 201 but not yet
//! flushed exist nowhere any more.
//!
//! - `lost_state = "rebuild"`: the periodic audit finds the units held both
//!   ways within seconds (`shardstock_store_units_lost_total`) and takes them
//!   off sale; the sale goes on; closed, the books balance: every unit an
//!   order in the database holds is sold once.
//! - `lost_state = "refuse"`: the audit finds them and the event is refused
//!   (503 `backend-unavailable`, "recover") until `shardstock recover`, which
//!   takes them off sale; then it sells again, and the books balance.
//!
//! Both count the 201s lost with Redis's last second (in no store any more)
//! and check that each was answered after the cut — the only ones the
//! promise lets go — and that every 201 from before it is in the database.
//! Without the reconciliation the close writes the found units as leftover
//! on top of the orders holding them, and the audit does not balance.
//!
//! The repair's store step (`forfeit`) runs on every backend.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::Engine;
use shardstock::config::{LostState, Settings};
use shardstock::domain::ids::EventId;
use shardstock::domain::keys::BucketRef;
use shardstock::store::Store;

use crate::harness::{
    Backend, RedisServer, Sale, TestApp, eid, event_id, eventually, ledger_for, problem, sample,
    settings_in, spec,
};

const STOCK: u64 = 20_000;
const CLIENTS: usize = 8;
/// How long a step may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);
/// Orders made after the cut that reach the database before the crash.
const FLUSHED_AFTER_CUT: usize = 50;

/// Whether an answer is final: bought, refused, or "nothing deducted" (a
/// 503 without `outcome`: the purchase did not happen).
fn is_final(status: u16, answer: &Value) -> bool {
    status == 201 || status == 409 || (status == 503 && answer.get("outcome").is_none())
}

/// The AOF file Redis appends to now (Redis 7: the last `*.incr.aof` of
/// `appendonlydir`).
fn aof(dir: &Path) -> PathBuf {
    let mut incr: Vec<PathBuf> = std::fs::read_dir(dir.join("appendonlydir"))
        .expect("Redis runs with appendonly yes")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    incr.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('.').nth(2))
            .and_then(|n| n.parse::<u64>().ok())
    });
    incr.pop().expect("an incremental AOF file")
}

/// What a run left to check.
struct Run {
    app: TestApp,
    event: String,
    sale: Sale,
    /// When the AOF was cut: orders answered before are on disk.
    cut_at: Instant,
    settings: Settings,
    /// Keeps the server alive until the end of the test.
    _redis: RedisServer,
}

/// A sale, Redis crashed and restarted from an AOF cut back to what it held
/// a moment before the crash, after orders made since reached the ledger.
async fn sale_through_a_partial_loss(policy: LostState) -> Run {
    let mut redis = RedisServer::start_with("--appendonly yes --appendfsync everysec --save ''");
    let mut settings = settings_in("partial_loss", Backend::Redis);
    settings.store.redis_url = Some(redis.url());
    settings.store.command_timeout_ms = 500;
    settings.database.claim_idle_ms = 500;
    settings.database.flush_block_ms = 20;
    settings.database.audit_interval_ms = 200;
    settings.database.lost_state = Some(policy);
    let app = TestApp::spawn_with(settings.clone()).await;
    let event = eid("aofcut");
    app.create(&event, STOCK, 4, json!({})).await;
    let sale = Sale::start(&app.base, &event, CLIENTS);
    sale.sells(300, "orders before the cut").await;

    // The disk as of now: everything answered so far is in it.
    let file = aof(&redis.dir);
    let length = std::fs::metadata(&file).unwrap().len();
    let cut_at = Instant::now();
    // Orders written before the cut: at most those answered, plus one in
    // flight per client. Once the ledger holds more, some made after the cut
    // are in it.
    let before = sale.bought() + CLIENTS;
    let ledger = ledger_for("redis").await;
    let id = EventId::parse(event.clone()).unwrap();
    eventually(
        "orders made after the cut in the ledger",
        WAIT,
        async || {
            let n = ledger.confirmed_orders(&id).await.unwrap().len();
            (n >= before + FLUSHED_AFTER_CUT).then_some(())
        },
    )
    .await;
    let redis = tokio::task::spawn_blocking(move || {
        redis.crash_and_restart_after(|_| {
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.set_len(length).unwrap();
        });
        redis
    })
    .await
    .unwrap();
    Run {
        app,
        event,
        sale,
        cut_at,
        settings,
        _redis: redis,
    }
}

/// Units the audits found held both ways, so far.
async fn units_lost(app: &TestApp, event: &str) -> f64 {
    sample(
        &app.metrics().await,
        "shardstock_store_units_lost_total",
        &[("event", event)],
    )
    .unwrap_or(0.0)
}

/// Stops the sale, gives every request a final answer, closes the event and
/// checks the books and the 201s.
async fn close_and_check(run: Run) {
    let Run {
        app,
        event,
        sale,
        cut_at,
        ..
    } = run;
    let sent = sale.stop().await;
    let mut acked: HashMap<String, Instant> = HashMap::new();
    for s in &sent {
        let (status, answer, at) = if is_final(s.status, &s.answer) {
            (s.status, s.answer.clone(), s.at)
        } else {
            let (status, answer) = eventually("a final answer", WAIT, async || {
                let r = app
                    .post(&format!("/v1/events/{event}/purchases"), s.body.clone())
                    .await;
                let status = r.status().as_u16();
                let answer: Value = r.json().await.unwrap_or(Value::Null);
                is_final(status, &answer).then_some((status, answer))
            })
            .await;
            (status, answer, Instant::now())
        };
        if status == 201 {
            acked.insert(answer["order_id"].as_str().unwrap().to_owned(), at);
        }
    }
    let closed = app.close(&event).await;
    let audit = app.audit(&event).await;
    let ledger = ledger_for("redis").await;
    let id = EventId::parse(event.clone()).unwrap();
    let confirmed: HashMap<String, u64> = ledger
        .confirmed_orders(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.order_id, o.qty))
        .collect();
    let lost: Vec<(&String, &Instant)> = acked
        .iter()
        .filter(|(o, _)| !confirmed.contains_key(*o))
        .collect();
    let found = units_lost(&app, &event).await;
    println!(
        "partial loss: {} orders answered 201, {} in the database; {found} units found held \
         both by database orders and by buckets; {} acknowledged orders lost with Redis's last \
         writes (in no store any more); closed {closed}; audit {audit}",
        acked.len(),
        confirmed.len(),
        lost.len()
    );
    // Every unit an order in the database holds is sold once.
    assert_eq!(audit["balanced"], true, "{audit}");
    assert_eq!(
        closed["sold"].as_u64().unwrap() + closed["leftover"].as_u64().unwrap(),
        STOCK,
        "{closed}"
    );
    assert_eq!(
        closed["sold"].as_u64().unwrap(),
        confirmed.values().sum::<u64>()
    );
    // Only orders answered after the cut may be lost.
    for (order, at) in &lost {
        assert!(
            **at >= cut_at,
            "{order}, answered {:?} before the cut, is lost",
            cut_at - **at
        );
    }
    assert!(found > 0.0, "the loss was never found");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_back_from_an_aof_missing_its_last_writes_is_repaired_from_the_ledger() {
    let run = sale_through_a_partial_loss(LostState::Rebuild).await;
    let (app, event) = (&run.app, &run.event);
    eventually("the loss found and repaired", WAIT, async || {
        let audit = app.audit(event).await;
        (units_lost(app, event).await > 0.0 && audit["balanced"] == true).then_some(())
    })
    .await;
    run.sale.sells(200, "orders after the repair").await;
    close_and_check(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_back_from_an_aof_missing_its_last_writes_is_refused_until_recovered() {
    let run = sale_through_a_partial_loss(LostState::Refuse).await;
    let (app, event) = (&run.app, &run.event);
    // The sale goes on from what Redis has until the audit finds the loss.
    let r = eventually("the event refused", WAIT, async || {
        let r = app.buy(event, "probe", 1, None).await;
        (r.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(r)
    })
    .await;
    let body = problem(r, 503, "backend-unavailable").await;
    assert!(
        body["detail"].as_str().unwrap().contains("recover"),
        "{body}"
    );
    assert!(
        body.get("outcome").is_none(),
        "nothing was deducted: {body}"
    );
    // A retry of a purchase bought before the cut (its order is in the
    // ledger): the event is quarantined, so the ledger's word is not final
    // yet, and the client is told the outcome is unknown, never refused.
    let first = run.sale.first_bought().expect("orders before the cut");
    let (user, rid) = (
        first["user_id"].as_str().unwrap(),
        first["request_id"].as_str().unwrap(),
    );
    let r = app.buy(event, user, 1, Some(rid)).await;
    let retry = problem(r, 503, "backend-unavailable").await;
    assert_eq!(retry["outcome"], "unknown", "{retry}");
    assert!(
        retry["detail"].as_str().unwrap().contains("quarantined"),
        "{retry}"
    );
    let found = units_lost(app, event).await;
    assert!(found > 0.0, "the loss is counted");
    let audit_before = app.audit(event).await;
    assert_eq!(
        audit_before["discrepancy"].as_f64(),
        Some(found),
        "{audit_before}"
    );
    // The operator decides.
    shardstock::app::recover(run.settings.clone(), event)
        .await
        .expect("shardstock recover");
    eventually("the event on sale again", WAIT, async || {
        (app.buy(event, "after", 1, None).await.status() == StatusCode::CREATED).then_some(())
    })
    .await;
    // Recovered, the same retry learns its order.
    let r = app.buy_final(event, user, 1, rid).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "the retry after the recovery"
    );
    let order: Value = r.json().await.unwrap();
    assert_eq!(order["user_id"], user, "{order}");
    run.sale.sells(200, "orders after the recovery").await;
    close_and_check(run).await;
}

/// The repair's store step, on every backend: it takes at most what a bucket
/// holds (never below zero, whatever is asked), counts as a change of the
/// bucket (the audit's double collect reads it again), and takes nothing
/// from a sealed bucket (a close or a reshard owns its units).
async fn forfeit_takes_at_most_the_stock_and_nothing_from_a_sealed_bucket<S: Store>(
    engine: Engine<S>,
) {
    let id = event_id("forfeit");
    engine.create_event(spec(&id, 40, 4)).await.unwrap();
    let store = engine.store();
    let b0 = BucketRef::new(&id, 0, 0);
    let (adds, _) = store.counters(&b0).await.unwrap();
    assert_eq!(store.forfeit(&b0, 3).await.unwrap(), 3);
    assert_eq!(
        store.forfeit(&b0, 100).await.unwrap(),
        7,
        "10 units per bucket"
    );
    assert_eq!(store.forfeit(&b0, 1).await.unwrap(), 0);
    assert_eq!(store.bucket_state(&b0).await.unwrap().stock, 0);
    assert!(store.counters(&b0).await.unwrap().0 > adds);
    let b1 = BucketRef::new(&id, 0, 1);
    assert_eq!(store.seal(&b1).await.unwrap(), 10);
    assert_eq!(store.forfeit(&b1, 5).await.unwrap(), 0);
    assert_eq!(engine.view(&id).await.unwrap().remaining, 30);
}

crate::harness::on_every_backend!(forfeit_takes_at_most_the_stock_and_nothing_from_a_sealed_bucket);
