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
            access_token: None,
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
            access_token: None,
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
    let flushed = flusher
        .flush_once(std::slice::from_ref(&bucket), &stop)
        .await
        .unwrap();
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

/// The process's per-event and per-bucket maps follow the open events: after
/// `SHARDSTOCK_CACHE_EVENTS` events (300 by default; the long form is
/// 10,000) created, sold, flushed, led and closed, and an adaptive event
/// resharded 100 times with its old layouts pruned, every one is back to its
/// size before (the engine's metas, lanes, gates and activity, the store's
/// key cache, the ledger's stream numbers and registrations, the leader's
/// memory). Each used to keep an entry for every event, bucket, layout or
/// stream the process ever saw.
async fn maps_follow_the_open_events<S: shardstock::Store>(engine: Engine<S>) {
    use shardstock::control::rebalancer::{Policy, RebalanceOptions, Rebalancer};
    use shardstock::control::reshard::{self, Why};
    let events: u64 = std::env::var("SHARDSTOCK_CACHE_EVENTS")
        .ok()
        .map_or(300, |v| {
            v.parse().expect("SHARDSTOCK_CACHE_EVENTS is a number")
        });
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let flush = FlushOptions {
        batch: 500,
        workers: 1,
        idle: Duration::from_millis(10),
        claim_idle_ms: 60_000,
    };
    let mut leader = Rebalancer::new(
        engine.clone(),
        ledger.clone(),
        flush.clone(),
        RebalanceOptions {
            resizing: Default::default(),
            interval: Duration::from_millis(10),
            lease_ttl_ms: 2_000,
            policy: Policy {
                horizon_s: 1.0,
                skew_threshold: 1.5,
                gather_below: 0.1,
                max_moves: 4,
            },
        },
    );
    let mut flusher = Flusher::new(engine.clone(), ledger.clone(), "maps".into(), flush);
    let stop = CancellationToken::new();
    let sizes = |leader: &Rebalancer<S>| {
        (
            engine.cached_entries(),
            ledger.cached_entries(),
            leader.cached_entries(),
        )
    };
    let before = sizes(&leader);
    let buy = async |id: &shardstock::domain::ids::EventId, u: String| {
        let req = PurchaseRequest {
            event: id.clone(),
            user: crate::harness::user(u),
            quantity: 1,
            request_id: None,
            access_token: None,
        };
        engine.purchase(&req).await.unwrap().result.unwrap();
    };
    for i in 0..events {
        let id = event_id("maps");
        lifecycle::create(&engine, &ledger, spec(&id, 4, 2))
            .await
            .unwrap();
        for b in 0..2 {
            buy(&id, user_homed_at(b, 2, &format!("m{i}-"))).await;
        }
        let meta = engine.reload(&id).await.unwrap();
        flusher
            .flush_once(&meta.all_buckets(), &stop)
            .await
            .unwrap();
        leader.lead(&id, &stop).await.unwrap();
        lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
            .await
            .unwrap();
    }
    // An adaptive event resized 100 times, its retired layouts pruned by the
    // leader once flushed.
    let id = event_id("maps-adaptive");
    let mut s = spec(&id, 10_000, 2);
    s.auto_buckets = Some(shardstock::domain::model::BucketRange { min: 1, max: 8 });
    lifecycle::create(&engine, &ledger, s).await.unwrap();
    for r in 0..100u32 {
        buy(&id, format!("a{r}")).await;
        let to = if r % 2 == 0 { 4 } else { 2 };
        reshard::reshard_because(&engine, &id, to, Why::Manual)
            .await
            .unwrap();
        let meta = engine.reload(&id).await.unwrap();
        flusher.drain(&meta.all_buckets(), &stop).await.unwrap();
        leader.lead(&id, &stop).await.unwrap();
    }
    let meta = engine.reload(&id).await.unwrap();
    assert!(
        meta.retired.len() <= 1,
        "the leader prunes flushed layouts: {:?}",
        meta.retired
    );
    lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
        .await
        .unwrap();
    // The leader's next round lists the open events and lets go of the rest.
    let mut schedule = shardstock::control::rebalancer::schedule::Schedule::default();
    leader.round_all(&mut schedule, &stop).await;
    assert_eq!(
        sizes(&leader),
        before,
        "the engine's, the ledger's and the leader's maps after {events} events and 100 resizes"
    );
}

mod maps {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn follow_the_open_events_on_memory() {
        super::maps_follow_the_open_events(crate::harness::memory()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn follow_the_open_events_on_redis() {
        super::maps_follow_the_open_events(crate::harness::standalone("bounds-maps").await).await;
    }
}

/// One end of every numeric setting's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Min,
    Max,
}

/// Settings for an app of this suite on Redis with every numeric setting
/// (or only `only`) at `end` of its accepted range, and what depends on it
/// moved as little as the other ranges ask (a lease at least twice its
/// round, markers that outlive their sagas …). `store.min_replicas` stays 0:
/// there is no replica here (the failover and replica tests run it at 1).
fn at_end(end: End, only: Option<&str>) -> shardstock::config::Settings {
    // A namespace of its own, for each app: these apps' flushers must not
    // flush the backlog the engine tests above build in theirs, nor each
    // other's. The smallest and the largest ran side by side in one: the
    // smallest's flusher (its sweep walks every open event of its namespace)
    // read the largest's records, and its app ended with them pending under
    // its consumer, for the largest to claim an hour (its `claim_idle_ms`)
    // later: 2–3 units "unflushed" at 180 s on a loaded machine.
    let ns = format!("bounds-apps-{}", rand::random::<u32>());
    let mut s = crate::harness::settings_in(&ns, crate::harness::Backend::Redis);
    for n in shardstock::config::NUMERIC {
        if only.is_none_or(|o| o == n.name) {
            (n.set)(&mut s, if end == End::Min { n.min } else { n.max });
        }
    }
    s.store.min_replicas = 0;
    let e = &mut s.engine;
    e.stale_saga_after_ms = e.stale_saga_after_ms.max(s.server.request_timeout_ms);
    e.sweep_interval_ms = e.sweep_interval_ms.min(e.stale_saga_after_ms);
    e.marker_ttl_ms = e
        .marker_ttl_ms
        .max(4 * (e.stale_saga_after_ms + e.sweep_interval_ms));
    let r = &mut s.rebalancer;
    r.lease_ttl_ms = r.lease_ttl_ms.max(2 * r.interval_ms);
    r.grow_above_per_bucket = r.grow_above_per_bucket.max(r.grow_target_per_bucket);
    s.validate()
        .unwrap_or_else(|e| panic!("{end:?} {only:?}: the settings are refused: {e}"));
    s
}

/// A sale, a database outage and the flush of its backlog, a reshard, more
/// sales and a close, over HTTP, on an app with `settings`; every 201 is in
/// the ledger once and the closed sale passes the oracle.
async fn sale_through_outage_reshard_and_close(
    settings: shardstock::config::Settings,
    buckets: u32,
    to: u32,
    what: &str,
) {
    use serde_json::{Value, json};
    const STOCK: u64 = 3_000;
    let proxy = crate::harness::DbProxy::start("127.0.0.1:5432").await;
    let mut settings = settings;
    let db = crate::harness::pg_url();
    settings.database.url = db.replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port));
    let app = crate::harness::TestApp::spawn_with(settings).await;
    let event = crate::harness::eid("bounds");
    // A create cut short by the request timeout (at its smallest, 100 ms, on
    // a loaded machine) is sent again, as a client would; "exists" means the
    // first one landed.
    crate::harness::eventually(
        &format!("{what}: the event created"),
        Duration::from_secs(60),
        async || {
            let r = app
                .client
                .post(app.url("/v1/events"))
                .bearer_auth(crate::harness::TOKEN)
                .json(&json!({"id": event, "stock": STOCK, "buckets": buckets,
                          "per_user_limit": 20, "max_per_order": 10}))
                .send()
                .await
                .ok()?;
            matches!(r.status().as_u16(), 201 | 409).then_some(())
        },
    )
    .await;
    let bought = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sell = async |phase: &str, n: u32| {
        let app = &app;
        let tasks = (0..16).map(|t| {
            let (event, bought) = (event.clone(), bought.clone());
            async move {
                for i in 0..n / 16 {
                    let user = format!("{phase}-{t}-{}", i % 5);
                    let rid = format!("{phase}-{t}-{i}");
                    let (status, body) = buy(app, &event, &user, 1 + i % 2, &rid).await;
                    match status {
                        201 => bought
                            .lock()
                            .unwrap()
                            .push(body["order_id"].as_str().unwrap().to_owned()),
                        409 => {}
                        other => panic!("{what}: purchase {rid}: {other} {body}"),
                    }
                }
            }
        });
        futures::future::join_all(tasks).await;
    };
    sell("before", 320).await;
    proxy.cut();
    sell("outage", 320).await;
    proxy.restore();
    // The backlog in the ledger; the last audit said when it is not. Asked
    // again when the connection broke: at the smallest
    // `server.header_read_timeout_ms` the server closes idle keep-alive
    // connections the client may be about to reuse (an audit in CI got
    // IncompleteMessage), and a client retries an idempotent GET.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let Some(a) = audit_once(&app, &event).await else {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: no audit answered in 180 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if a["balanced"] == true && a["sold_unflushed"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the backlog not in the ledger after 180 s; the last audit: {a}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The reshard runs on its own (a request cut by the timeout does not
    // stop it), and at the smallest `server.request_timeout_ms` (100 ms) a
    // loaded machine may answer every PUT 503 while it goes on: it is done
    // when a PUT answers 200 or the event's view shows the new layout on
    // sale. The last answer names what happened if neither comes.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let put = app
            .client
            .put(app.url(&format!("/v1/events/{event}/buckets")))
            .bearer_auth(crate::harness::TOKEN)
            .json(&json!({"buckets": to}))
            .send()
            .await;
        let last = match put {
            Ok(r) if r.status() == 200 => break,
            Ok(r) => format!("PUT {}: {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => format!("PUT: {e}"),
        };
        let view = async {
            let r = app
                .client
                .get(app.url(&format!("/v1/events/{event}")))
                .send()
                .await
                .ok()?;
            r.json::<Value>().await.ok()
        };
        if let Some(v) = view.await
            && v["bucket_count"] == to
            && !matches!(v["status"].as_str(), Some("resharding" | "creating"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: a reshard of {event} to {to} buckets not done in 120 s; the last answer: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sell("after", 160).await;
    app.close_eventually(&event, Duration::from_secs(120)).await;
    let ledger = shardstock::ledger::Ledger::connect(&db, 2).await.unwrap();
    let id = shardstock::domain::ids::EventId::parse(event.as_str()).unwrap();
    let sale = crate::harness::oracle::closed_sale(&ledger, &id, STOCK).await;
    assert!(sale.broken.is_empty(), "{what}: {:#?}", sale.broken);
    let bought = bought.lock().unwrap().clone();
    assert!(bought.len() > 100, "{what}: only {} bought", bought.len());
    for oid in &bought {
        assert!(
            sale.orders
                .get(oid)
                .is_some_and(|o| o.status == shardstock::domain::model::OrderStatus::Confirmed),
            "{what}: order {oid} answered 201 is not confirmed in the ledger"
        );
    }
}

/// `GET /v1/events/{id}/audit`, or `None` when the request did not get an
/// answer (a connection the server closed as the client reused it).
async fn audit_once(app: &crate::harness::TestApp, event: &str) -> Option<serde_json::Value> {
    let r = app
        .client
        .get(app.url(&format!("/v1/events/{event}/audit")))
        .bearer_auth(crate::harness::TOKEN)
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// A purchase with a request id, sent again the way a client does: after a
/// 503, and after the connection broke (a server that closes idle
/// keep-alive connections at `server.header_read_timeout_ms` may close one
/// the client is about to reuse). Its status and body.
async fn buy(
    app: &crate::harness::TestApp,
    event: &str,
    user: &str,
    qty: u32,
    rid: &str,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"user_id": user, "quantity": qty, "request_id": rid});
    // Bounded by time, not tries: at the smallest request timeout (100 ms) a
    // loaded machine answers many 503s in a row (100 tries were seen to run
    // out in CI beside other builds).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut tries = 0;
    while std::time::Instant::now() < deadline {
        tries += 1;
        let sent = app
            .client
            .post(app.url(&format!("/v1/events/{event}/purchases")))
            .json(&body)
            .send()
            .await;
        let Ok(r) = sent else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let status = r.status().as_u16();
        if status == 503 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        return (status, r.json().await.unwrap_or_default());
    }
    panic!("{rid}: no final answer in 120 s ({tries} tries)");
}

/// The two whole sales below run one after the other: each is heavy for 2
/// cores (an event of 1,024 buckets; a 100 ms request timeout), and side by
/// side each made the other's timeouts.
static ONE_SALE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every numeric setting at the smallest value the configuration accepts,
/// on an event of one bucket resharded to three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_setting_at_its_smallest_accepted_value_sells_flushes_reshards_and_closes() {
    let _one_at_a_time = ONE_SALE_AT_A_TIME.lock().await;
    sale_through_outage_reshard_and_close(at_end(End::Min, None), 1, 3, "all at min").await;
}

/// Every numeric setting at the largest value the configuration accepts, on
/// an event of the most buckets an event may have, resharded to half.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_setting_at_its_largest_accepted_value_sells_flushes_reshards_and_closes() {
    let _one_at_a_time = ONE_SALE_AT_A_TIME.lock().await;
    let max = shardstock::domain::model::MAX_BUCKETS;
    sale_through_outage_reshard_and_close(at_end(End::Max, None), max, max / 2, "all at max").await;
}

/// The long form: each numeric setting alone at each end of its range (about
/// a hundred runs, documented in docs/TESTING.md):
/// `cargo test --test it bounds::each_setting_alone -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long form (about 100 runs): run it with --ignored"]
async fn each_setting_alone_at_each_end() {
    for n in shardstock::config::NUMERIC {
        for end in [End::Min, End::Max] {
            let what = format!("{} at {end:?}", n.name);
            if n.name == "store.min_replicas" && end == End::Max {
                println!("{what}: needs that many replicas (at 1: tests/it/failover.rs)");
                continue;
            }
            let started = std::time::Instant::now();
            sale_through_outage_reshard_and_close(at_end(end, Some(n.name)), 4, 2, &what).await;
            println!("{what}: ok in {:.1} s", started.elapsed().as_secs_f64());
        }
    }
}

/// The largest stock an event takes closes on Redis with its whole stock
/// leftover: the close's scripts keep the units as stored strings (Lua
/// formats a number past 1e14 as "6.4e+15", which the close could not read:
/// a 500 the contract run found).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_largest_stock_closes_with_all_of_it_leftover() {
    use crate::harness::{Backend, TestApp, eid};
    let app = TestApp::spawn(Backend::Redis).await;
    let id = eid("huge");
    let stock: u64 = 1 << 53;
    app.create(&id, stock, 2, serde_json::json!({})).await;
    let audit = app.audit(&id).await;
    assert_eq!(audit["remaining"], stock, "{audit}");
    let r = app
        .admin_post(&format!("/v1/events/{id}/close"), serde_json::json!({}))
        .await;
    assert_eq!(r.status(), 200);
    let view: serde_json::Value = r.json().await.unwrap();
    assert_eq!(view["leftover"], stock, "{view}");
}
