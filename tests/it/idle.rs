//! Idle cost: background work follows activity, not the number of events.
//!
//! - Redis commands per second of an idle app, counted on a private server
//!   (`INFO stats` `total_commands_processed`), with 3 and then 30 events:
//!   the flusher's sweep, the gauges, the rebalancer and the audits must not
//!   cost more with more events.
//! - A sale that starts after a long idle is flushed at once: the buckets this
//!   instance wrote are marked dirty (the stream scan is slowed down to a crawl so it
//!   cannot be what finds them).
//! - A bucket written by another instance (another engine on the same store)
//!   still reaches the ledger: the stream scan finds it.
//! - A closed event leaves the open set and is still listed, viewed and audited.
//! - An audit pages through a stream longer than one script reply.
//! - The saga sweeper reads the open events only, and the engine forgets
//!   closed ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::config::Settings;
use shardstock::domain::ids::EventId;
use shardstock::engine::PurchaseRequest;
use shardstock::store::Events;
use shardstock::{Engine, EngineOptions, Store};

use crate::harness::{
    Backend, RedisServer, TOKEN, TestApp, eid, eventually, ledger_for, on_every_backend,
    settings_in, spec, user,
};

const SUITE: &str = "idle";

/// An app on a private Redis server (so every command counted is its own).
fn on_private(server: &RedisServer) -> Settings {
    let mut s = settings_in(SUITE, Backend::Redis);
    s.store.redis_url = Some(server.url());
    s
}

fn commands_processed(server: &RedisServer) -> u64 {
    server
        .cli(&["info", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_commands_processed")
}

/// Commands per second the server processed over `window` (a measurement
/// window, not a wait for a condition).
async fn commands_per_s(server: &RedisServer, window: Duration) -> f64 {
    let before = commands_processed(server);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = commands_processed(server);
    // The INFO command that read `before` is counted in `after`.
    (after - before).saturating_sub(1) as f64 / started.elapsed().as_secs_f64()
}

async fn audit(app: &TestApp, id: &str) -> Value {
    let r = app
        .client
        .get(app.url(&format!("/v1/events/{id}/audit")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// Waits until the ledger has `units` sold for `id`, and the audit balances.
async fn flushed(app: &TestApp, id: &str, units: u64, within: Duration) {
    eventually("the order in the ledger", within, async || {
        let a = audit(app, id).await;
        (a["sold_flushed"] == units && a["balanced"] == true).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_cost_does_not_grow_with_the_number_of_events() {
    let server = RedisServer::start();
    let app = TestApp::spawn_with(on_private(&server)).await;
    let window = Duration::from_secs(3);
    let settle = Duration::from_secs(1);
    for _ in 0..3 {
        app.create(&eid("idle"), 400, 4, json!({})).await;
    }
    tokio::time::sleep(settle).await;
    let few = commands_per_s(&server, window).await;
    for _ in 0..27 {
        app.create(&eid("idle"), 400, 4, json!({})).await;
    }
    tokio::time::sleep(settle).await;
    let many = commands_per_s(&server, window).await;
    println!("idle Redis commands/s: 3 events {few:.0}, 30 events {many:.0}");
    assert!(
        many < 2.0 * few,
        "30 idle events cost {many:.0} commands/s, 3 cost {few:.0}: idle work grows with the events"
    );
    app.stop().await;
}

async fn a_sale_after_a_long_idle_is_flushed_at_once(b: Backend) {
    let mut s = settings_in(SUITE, b);
    // A pass of this sweep over the events below takes minutes: only the
    // dirty marks can bring the order to the ledger in time.
    s.database.flush_sweep_buckets_per_s = 1;
    let app = TestApp::spawn_with(s).await;
    let ids: Vec<String> = (0..20).map(|_| eid("after-idle")).collect();
    for id in &ids {
        app.create(id, 160, 16, json!({})).await;
    }
    let hot = &ids[13];
    let r = app.buy(hot, "u-late", 2, Some("late-1")).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    flushed(&app, hot, 2, Duration::from_secs(5)).await;
    app.stop().await;
}

on_every_backend!(app: a_sale_after_a_long_idle_is_flushed_at_once);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_another_instance_wrote_reaches_the_ledger_through_the_sweep() {
    let server = RedisServer::start();
    let app = TestApp::spawn_with(on_private(&server)).await;
    let id = eid("other");
    app.create(&id, 100, 8, json!({})).await;
    // Another instance sells (an engine on the same store, with no flusher of
    // its own, like an instance that died right after): this app never wrote
    // to that bucket, so only its sweep can find the record.
    let store = crate::harness::connect(&server.url(), SUITE).await;
    let other = Engine::new(store, EngineOptions::default());
    let out = other
        .purchase(&PurchaseRequest {
            event: EventId::parse(id.clone()).unwrap(),
            user: user("u-elsewhere"),
            quantity: 3,
            request_id: None,
            access_token: None,
        })
        .await
        .unwrap();
    assert!(out.result.is_ok(), "{out:?}");
    flushed(&app, &id, 3, Duration::from_secs(20)).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_event_leaves_the_open_set_and_is_still_listed_viewed_and_audited() {
    let server = RedisServer::start();
    let app = TestApp::spawn_with(on_private(&server)).await;
    let (closed, open) = (eid("closed"), eid("open"));
    app.create(&closed, 50, 4, json!({})).await;
    app.create(&open, 50, 4, json!({})).await;
    assert_eq!(
        app.buy(&closed, "u-1", 2, None).await.status(),
        StatusCode::CREATED
    );
    app.close(&closed).await;
    let store = crate::harness::connect(&server.url(), SUITE).await;
    let ids = |v: Vec<EventId>| v.into_iter().map(|e| e.to_string()).collect::<Vec<_>>();
    let open_now = ids(store.list_open_events().await.unwrap());
    assert!(
        open_now.contains(&open) && !open_now.contains(&closed),
        "{open_now:?}"
    );
    assert!(ids(store.list_events().await.unwrap()).contains(&closed));
    let listed: Vec<String> = app.get("/v1/events").await.json().await.unwrap();
    assert!(
        listed.contains(&closed) && listed.contains(&open),
        "{listed:?}"
    );
    let view = app.view(&closed).await;
    assert_eq!(view["status"], "closed");
    assert_eq!(view["sold"], 2);
    let a = audit(&app, &closed).await;
    assert!(a["balanced"] == true && a["sold_flushed"] == 2, "{a}");
    app.stop().await;
}

/// More unflushed records in one bucket than one `audit_bucket` reply holds
/// (512): the audit pages through them and counts each once.
async fn an_audit_pages_through_a_long_unflushed_stream<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = crate::harness::event_id("long-stream");
    shardstock::control::lifecycle::create(&engine, &ledger, spec(&id, 2_000, 1))
        .await
        .unwrap();
    let sales = (0..1_100).map(|i| {
        let (engine, id) = (engine.clone(), id.clone());
        async move {
            let req = PurchaseRequest {
                event: id,
                user: user(format!("u-{i}")),
                quantity: 1,
                request_id: None,
                access_token: None,
            };
            engine.purchase(&req).await.unwrap().result.unwrap();
        }
    });
    futures::future::join_all(sales).await;
    let a = shardstock::control::audit::audit(&engine, &ledger, &id)
        .await
        .unwrap();
    assert!(a.balanced, "{a:?}");
    assert_eq!((a.sold_unflushed, a.remaining), (1_100, 900), "{a:?}");
}

on_every_backend!(an_audit_pages_through_a_long_unflushed_stream);

/// The saga sweeper's round reads the open events only, and a closed event
/// stays out of the engine's cache. It used to read every event ever
/// created, every 5 s on every instance, and each read put a closed event
/// back into the cache the close had taken it out of.
async fn the_saga_sweeper_reads_open_events_only_and_forgets_closed_ones<S: Store>(store: S) {
    use crate::harness::faulty::Faulty;
    use shardstock::control::{flusher::Flusher, lifecycle, saga_sweeper};
    let store = Faulty::plain(store);
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    let ledger = ledger_for(engine.store().kind()).await;
    let mut closed = Vec::new();
    for i in 0..6 {
        let id = crate::harness::event_id(&format!("sweep-{i}"));
        lifecycle::create(&engine, &ledger, spec(&id, 10, 2))
            .await
            .unwrap();
        if i > 0 {
            let mut flusher = Flusher::new(
                engine.clone(),
                ledger.clone(),
                format!("closer-{i}"),
                shardstock::control::flusher::FlushOptions {
                    batch: 500,
                    workers: 1,
                    idle: Duration::from_millis(10),
                    claim_idle_ms: 1_000,
                },
            );
            let stop = tokio_util::sync::CancellationToken::new();
            lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
                .await
                .unwrap();
            closed.push(id);
        }
    }
    let open = store.list_open_events().await.unwrap().len() as u64;
    let everything = store.list_events().await.unwrap().len() as u64;
    assert!(everything >= open + 5, "{everything} events, {open} open");
    let before = store.calls("load_meta");
    saga_sweeper::sweep_round(&engine, &saga_sweeper::SagaSweepOptions::default()).await;
    let read = store.calls("load_meta") - before;
    assert_eq!(
        read, open,
        "one meta read an open event ({everything} events in all)"
    );
    for id in &closed {
        assert!(!engine.is_known(id), "{id} is closed: not cached");
        engine.reload(id).await.unwrap();
        assert!(!engine.is_known(id), "{id}: a read does not cache it again");
    }
}

mod sweeper_rounds {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_memory() {
        super::the_saga_sweeper_reads_open_events_only_and_forgets_closed_ones(
            shardstock::MemoryStore::new(),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_redis() {
        let store = crate::harness::connect("redis://127.0.0.1:6379", "idle-sweeper").await;
        super::the_saga_sweeper_reads_open_events_only_and_forgets_closed_ones(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_cluster() {
        let url = crate::harness::shared_cluster().url();
        let store = crate::harness::connect(&url, "idle-sweeper-cluster").await;
        super::the_saga_sweeper_reads_open_events_only_and_forgets_closed_ones(store).await;
    }
}
