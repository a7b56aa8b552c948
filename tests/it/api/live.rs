//! `GET /v1/live`: every listed event's view in one answer, from a snapshot
//! read at most once a second, so many open live pages cost the store what
//! one does.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::MemoryStore;

use crate::harness::faulty::Faulty;
use crate::harness::{Backend, TestApp, eid, on_every_backend, settings};

on_every_backend!(app: every_listed_event_is_in_one_answer);

/// The snapshot as the page reads it.
async fn live(app: &TestApp) -> Value {
    let r = app.get("/v1/live").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.unwrap()
}

/// The event's view in the snapshot.
fn view_in<'a>(live: &'a Value, id: &str) -> Option<&'a Value> {
    live["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id)
}

async fn every_listed_event_is_in_one_answer(b: Backend) {
    let app = TestApp::spawn(b).await;
    let open = eid("live-open");
    let closed = eid("live-closed");
    app.create(&open, 100, 4, json!({})).await;
    app.create(&closed, 50, 2, json!({})).await;
    let r = app.buy(&open, "u-1", 3, None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app.buy(&closed, "u-2", 5, None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    app.close(&closed).await;
    // The first request of this app reads the snapshot: it is current.
    let snapshot = live(&app).await;
    assert_eq!(snapshot["refresh_ms"], 1000);
    assert_eq!(snapshot["skew_threshold"], 1.5, "the default threshold");
    let at = snapshot["at"].as_str().unwrap();
    shardstock::domain::model::rfc3339_ms::parse(at).expect("`at` is RFC 3339");
    assert!(snapshot["unavailable"].as_array().is_some());
    // Each view is the one GET /v1/events/{id} answers, closed ones included.
    for id in [&open, &closed] {
        let view = app.view(id).await;
        assert_eq!(view_in(&snapshot, id), Some(&view), "{id}");
    }
    let closed_view = view_in(&snapshot, &closed).unwrap();
    assert_eq!(
        (&closed_view["status"], &closed_view["leftover"]),
        (&json!("closed"), &json!(45))
    );
    // Listed in the listing's order.
    let ids: Vec<&str> = snapshot["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert!(ids.is_sorted(), "{ids:?}");
}

/// Thirty-two clients asking at once, as thirty-two open live pages do: one
/// listing and one read of each event's buckets for all of them, where a
/// read per request would cost thirty-two. Store calls are counted with the
/// `Faulty` wrapper (no faults); the background work that reads buckets
/// (gauges, rebalancer) is kept out of the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_within_a_second_share_one_store_read() {
    let store = Faulty::plain(MemoryStore::new());
    let mut s = settings(Backend::Memory);
    s.server.gauges_interval_ms = 3_600_000;
    s.rebalancer.enabled = false;
    let app = TestApp::spawn_on(store.clone(), s).await;
    let events = [(eid("live-shared-a"), 4), (eid("live-shared-b"), 8)];
    for (id, buckets) in &events {
        app.create(id, 800, *buckets, json!({})).await;
    }
    let buckets: u64 = events.iter().map(|(_, n)| u64::from(*n)).sum();
    // The first snapshot, so the window below starts with one in place.
    live(&app).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (lists, reads) = (store.calls("list_events"), store.calls("bucket_state"));
    let started = Instant::now();
    let answers = join_all((0..32).map(|_| live(&app))).await;
    let window = started.elapsed();
    let lists = store.calls("list_events") - lists;
    let reads = store.calls("bucket_state") - reads;
    // One snapshot a second begun: one within the second, and on a machine
    // slow enough to stretch the window past it, one more a second.
    let allowed = 1 + window.as_secs();
    assert!(
        (1..=allowed).contains(&lists),
        "{lists} listings for 32 requests in {window:?}"
    );
    assert!(
        reads <= lists * buckets,
        "{reads} bucket reads for 32 requests in {window:?}: at most {buckets} a snapshot"
    );
    for a in &answers {
        for (id, _) in &events {
            assert!(view_in(a, id).is_some(), "{id} in every answer");
        }
    }
    if lists == 1 {
        assert!(
            answers.iter().all(|a| a["at"] == answers[0]["at"]),
            "one snapshot answered them all"
        );
    }
    // A second later the snapshot is read again: the page stays live.
    let before = answers[0]["at"].clone();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let later = live(&app).await;
    assert_ne!(later["at"], before, "a new snapshot after a second");
    app.stop().await;
}
