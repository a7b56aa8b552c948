//! Order events out (issue 47): the ledger's outbox, served by
//! `GET /v1/events/{id}/changes` and relayed to the machine's NATS JetStream
//! (127.0.0.1:4222).
//!
//! A sale over HTTP with holds, confirms, cancels and the close's expiries;
//! then every order's changes, from the endpoint and from the stream, are
//! exactly what the sale did: one `order.created` and one terminal change
//! per order, the creation first, `event.closed` with the final counts. The
//! relay is killed mid-way (its marks lost) and another takes over: nothing
//! is lost and the server drops the copies it publishes again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::control::relay::{Relay, RelayOptions};
use shardstock::domain::stream::{RecordKind, StreamEntry, StreamId};
use shardstock::ledger::{FlushRecord, Ledger};

use crate::harness::{
    Backend, Sale, TOKEN, TestApp, eid, event_id, eventually, on_every_backend, pg_pool, pg_url,
    settings_in, spec, standalone,
};

/// Starts the machine's NATS server (JetStream on) when it is down.
pub const START_NATS: &str =
    "nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log &";
const NATS: &str = "nats://127.0.0.1:4222";

/// A JetStream context on the machine's server, or a failure that says how
/// to start it.
/// A suite's settings with order events on (`[outbox] enabled`, off by default).
pub(crate) fn events_on(suite: &str, backend: Backend) -> shardstock::config::Settings {
    let mut s = settings_in(suite, backend);
    s.outbox.enabled = true;
    s
}

async fn jet() -> jetstream::Context {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .connect(NATS)
        .await
        .unwrap_or_else(|e| {
            panic!("NATS is not answering on 127.0.0.1:4222 ({e}); start it with:\n  {START_NATS}")
        });
    jetstream::new(client)
}

/// A stream and subject prefix of this test's own.
fn stream_names() -> (String, String) {
    let tag = format!("{:08x}", rand::random::<u32>());
    (format!("shardstock_it_{tag}"), format!("it{tag}"))
}

/// What the sale did to each order: `order.confirmed`, `order.cancelled`
/// or `order.expired`.
pub(crate) type Outcomes = HashMap<String, &'static str>;

/// A sale of `stock` units in 4 buckets with holds, bought to the last unit by
/// 6 clients over HTTP (the last units by sagas), then a third of the orders
/// confirmed, a third cancelled, and the close: the rest expire.
pub(crate) async fn sale_with_holds(app: &TestApp, event: &str, stock: u64) -> Outcomes {
    app.create(event, stock, 4, json!({"hold_seconds": 600}))
        .await;
    let sale = Sale::start(&app.base, event, 6);
    eventually(
        "the sale to sell out",
        Duration::from_secs(60),
        async || {
            let view = app.view(event).await;
            (view["remaining"] == 0).then_some(())
        },
    )
    .await;
    let sent = sale.stop().await;
    let orders: Vec<String> = sent
        .iter()
        .filter(|s| s.status == 201)
        .map(|s| s.answer["order_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(orders.len() as u64, stock, "one unit an order");
    let mut outcomes = Outcomes::new();
    for (i, order) in orders.iter().enumerate() {
        let outcome = match i % 3 {
            0 => {
                let r = app
                    .post(&format!("/v1/orders/{order}/confirm"), json!({}))
                    .await;
                assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
                "order.confirmed"
            }
            1 => {
                let r = app
                    .post(&format!("/v1/orders/{order}/cancel"), json!({}))
                    .await;
                assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
                "order.cancelled"
            }
            _ => "order.expired",
        };
        outcomes.insert(order.clone(), outcome);
    }
    app.close(event).await;
    outcomes
}

/// Every change of `event` from the endpoint, `limit` a page.
pub(crate) async fn all_changes(app: &TestApp, event: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let r = app
            .client
            .get(app.url(&format!(
                "/v1/events/{event}/changes?after={after}&limit={limit}"
            )))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let page: Value = r.json().await.unwrap();
        let changes = page["changes"].as_array().unwrap().clone();
        assert!(changes.len() <= limit);
        let next = page["next"].as_i64().unwrap();
        if changes.is_empty() {
            assert_eq!(next, after, "an empty page keeps the cursor");
            return out;
        }
        assert_eq!(next, changes.last().unwrap()["seq"].as_i64().unwrap());
        after = next;
        out.extend(changes);
    }
}

/// `changes` (in the order delivered) say exactly what `outcomes` did: per
/// order its creation then its terminal change, nothing twice, and the
/// event's close with the final counts.
pub(crate) fn check_changes(changes: &[Value], event: &str, outcomes: &Outcomes, stock: u64) {
    let mut seen = HashSet::new();
    let mut per_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut last_seq = 0;
    let mut closed = None;
    for c in changes {
        let id = c["id"].as_str().unwrap();
        assert!(seen.insert(id.to_owned()), "{id} twice");
        let seq = c["seq"].as_i64().unwrap();
        assert!(seq > last_seq, "in sequence order");
        last_seq = seq;
        assert_eq!(c["event_id"], event);
        let kind = c["type"].as_str().unwrap();
        let subject = c["subject"].as_str().unwrap();
        assert_eq!(id, format!("{subject}:{kind}"));
        if kind == "event.closed" {
            closed = Some(c["payload"].clone());
            continue;
        }
        assert_eq!(c["payload"]["order_id"], subject);
        assert_eq!(c["payload"]["quantity"], 1);
        if kind == "order.created" {
            assert!(
                c["payload"]["pay_by_ms"].as_i64().is_some(),
                "a hold's creation has its deadline: {c}"
            );
        }
        per_order
            .entry(subject.to_owned())
            .or_default()
            .push(kind.to_owned());
    }
    assert_eq!(
        per_order.len(),
        outcomes.len(),
        "every order, and only them"
    );
    for (order, outcome) in outcomes {
        assert_eq!(
            per_order[order],
            ["order.created", outcome],
            "the changes of {order}"
        );
    }
    let closed = closed.expect("event.closed");
    let cancelled_or_expired = outcomes
        .values()
        .filter(|o| **o != "order.confirmed")
        .count() as u64;
    // A saga's losing take counts in both sold and released.
    assert_eq!(closed["stock"], stock);
    assert_eq!(closed["net_sold"], stock - cancelled_or_expired);
}

/// The endpoint serves a sale's changes, in pages, each order's in order;
/// its parameters are checked and it is the admin's.
async fn a_sales_changes_are_served_in_order_per_order(backend: Backend) {
    let app = TestApp::spawn_with(events_on("outbox", backend)).await;
    let event = eid("ch");
    let outcomes = sale_with_holds(&app, &event, 60).await;
    let changes = all_changes(&app, &event, 7).await;
    check_changes(&changes, &event, &outcomes, 60);
    assert_eq!(all_changes(&app, &event, 1000).await, changes);

    let get = |query: &str, token: bool| {
        let mut r = app
            .client
            .get(app.url(&format!("/v1/events/{event}/changes{query}")));
        if token {
            r = r.bearer_auth(TOKEN);
        }
        r.send()
    };
    for (query, field) in [
        ("?after=-1", "after"),
        ("?after=x", "after"),
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limt=5", "limt"),
    ] {
        let r = get(query, true).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains(field),
            "{query}: {body}"
        );
    }
    assert_eq!(
        get("", false).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let r = app
        .client
        .get(app.url("/v1/events/no-such-event/changes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

/// Every message of `stream`, in the stream's order, deduplicated by
/// `Nats-Msg-Id` (with the count of copies found), as change bodies.
async fn stream_messages(jet: &jetstream::Context, stream: &str) -> (Vec<Value>, usize) {
    let mut s = jet.get_stream(stream).await.unwrap();
    let last = s.info().await.unwrap().state.last_sequence;
    let (mut out, mut ids, mut copies) = (Vec::new(), HashSet::new(), 0);
    for seq in 1..=last {
        let m = s.get_raw_message(seq).await.unwrap();
        let id = m.headers.get("Nats-Msg-Id").unwrap().to_string();
        let body: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(body["id"].as_str().unwrap(), id);
        let want = format!(
            "{}.{}.{}",
            stream_prefix(&m.subject),
            body["event_id"].as_str().unwrap().replace('.', "_"),
            body["type"].as_str().unwrap()
        );
        assert_eq!(m.subject.as_str(), want);
        if ids.insert(id) {
            out.push(body);
        } else {
            copies += 1;
        }
    }
    (out, copies)
}

fn stream_prefix(subject: &str) -> &str {
    subject.split('.').next().unwrap()
}

/// The relay of a running service publishes every change of a sale to
/// JetStream: after deduplication, exactly the database's changes.
async fn the_relay_publishes_exactly_the_ledgers_changes(backend: Backend) {
    let jet = jet().await;
    let (stream, prefix) = stream_names();
    let mut settings = events_on("outbox", backend);
    settings.outbox.nats_url = Some(NATS.into());
    settings.outbox.stream = stream.clone();
    settings.outbox.subject_prefix = prefix.clone();
    settings.outbox.interval_ms = 20;
    let app = TestApp::spawn_with(settings).await;
    let event = eid("nats");
    let outcomes = sale_with_holds(&app, &event, 60).await;
    let changes = all_changes(&app, &event, 1000).await;
    check_changes(&changes, &event, &outcomes, 60);
    // The database holds other tests' changes too (on PostgreSQL): the
    // relay publishes them all, this event's among them.
    let mine = eventually(
        "the relay to publish every change",
        Duration::from_secs(30),
        async || {
            let (messages, copies) = stream_messages(&jet, &stream).await;
            assert_eq!(copies, 0);
            let mine: Vec<Value> = messages
                .into_iter()
                .filter(|m| m["event_id"] == event.as_str())
                .collect();
            (mine.len() >= changes.len()).then_some(mine)
        },
    )
    .await;
    assert_eq!(
        mine, changes,
        "the stream holds the ledger's changes, in order"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("shardstock_outbox_deliveries_total"),
        "{metrics}"
    );
    assert!(metrics.contains("shardstock_outbox_lag_seconds"));
    app.stop().await;
    jet.delete_stream(&stream).await.unwrap();
}

/// With the default settings order events are off: a whole sale (flushes,
/// confirms, cancels, the close) writes no outbox row, and the endpoint
/// answers `order-events-off`, naming the setting that turns them on.
async fn by_default_a_sale_writes_no_outbox_and_the_endpoint_says_so(backend: Backend) {
    let settings = settings_in("outbox-off", backend);
    assert!(!settings.outbox.enabled, "off by default");
    let url = settings.database.url.clone();
    let app = TestApp::spawn_with(settings).await;
    let event = eid("off");
    let outcomes = sale_with_holds(&app, &event, 30).await;
    // Read as an outbox-on ledger would: nothing is there.
    let ledger = Ledger::connect(&url, 2).await.unwrap().with_outbox(true);
    let id = shardstock::domain::ids::EventId::parse(event.clone()).unwrap();
    let totals = ledger
        .totals(&id)
        .await
        .unwrap()
        .expect("the event is in the ledger");
    // A saga's losing take counts in sold (and released).
    assert!(totals.sold >= outcomes.len() as u64, "the sale was flushed");
    assert_eq!(ledger.changes(Some(&event), 0, 1_000).await.unwrap(), []);
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);
    let r = app
        .client
        .get(app.url(&format!("/v1/events/{event}/changes")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "urn:shardstock:order-events-off", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("[outbox] enabled = true"),
        "{body}"
    );
    app.stop().await;
}

/// A release's multi-line order: each line is an order of its pool, and
/// each line's changes name the release order, its release and its pool,
/// so a consumer can put the order back together.
async fn a_release_orders_lines_name_their_release_order(backend: Backend) {
    let app = TestApp::spawn_with(events_on("outbox-release", backend)).await;
    let rel = eid("obrel");
    let r = app
        .admin_post(
            "/v1/releases",
            json!({"id": rel, "per_user_limit": 4, "max_per_order": 4, "pools": [
                {"id": "s42", "stock": 10, "buckets": 2},
                {"id": "s43", "stock": 10, "buckets": 1},
            ]}),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = app
        .post(
            &format!("/v1/releases/{rel}/orders"),
            json!({"user_id": "u-1", "request_id": "ro-1",
                   "lines": [{"pool": "s42", "quantity": 2}, {"pool": "s43", "quantity": 1}]}),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let order: Value = r.json().await.unwrap();
    let release_order = order["order_id"].as_str().unwrap().to_owned();
    let lines = order["lines"].as_array().unwrap().clone();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        let (pool, event) = (
            line["pool"].as_str().unwrap(),
            line["event"].as_str().unwrap(),
        );
        let line_id = line["order_id"].as_str().unwrap();
        let created = eventually(
            "the line's order.created",
            Duration::from_secs(20),
            async || {
                all_changes(&app, event, 100)
                    .await
                    .into_iter()
                    .find(|c| c["type"] == "order.created" && c["subject"] == line_id)
            },
        )
        .await;
        let p = &created["payload"];
        assert_eq!(p["release_id"], rel.as_str(), "{created}");
        assert_eq!(p["release_order"], release_order.as_str(), "{created}");
        assert_eq!(p["pool"], pool, "{created}");
        assert_eq!(p["quantity"], line["quantity"], "{created}");
    }
    // A plain event's changes carry none of them.
    let plain = eid("obplain");
    app.create(&plain, 5, 1, json!({})).await;
    let r = app
        .post(
            &format!("/v1/events/{plain}/purchases"),
            json!({"user_id": "u-2", "request_id": "p-1", "quantity": 1}),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let created = eventually(
        "the plain order.created",
        Duration::from_secs(20),
        async || all_changes(&app, &plain, 100).await.into_iter().next(),
    )
    .await;
    assert!(
        created["payload"].get("release_order").is_none(),
        "{created}"
    );
    app.stop().await;
}

on_every_backend!(app:
    a_release_orders_lines_name_their_release_order,
    a_sales_changes_are_served_in_order_per_order,
    the_relay_publishes_exactly_the_ledgers_changes,
    by_default_a_sale_writes_no_outbox_and_the_endpoint_says_so,
);

fn relay_options(stream: &str, prefix: &str) -> RelayOptions {
    RelayOptions {
        nats_url: NATS.into(),
        stream: stream.into(),
        subject_prefix: prefix.into(),
        duplicate_window: Duration::from_secs(120),
        batch: 16,
        interval: Duration::from_millis(5),
        lease_ttl_ms: 400,
        publish_timeout: Duration::from_secs(5),
    }
}

/// A relay killed mid-way, its last marks lost (the cursor set back, as if
/// it died between publishing and marking): the next leader takes over once
/// the lease lapses, publishes the rest and the copies again, the server
/// drops the copies, and the stream ends with every change once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_mid_way_loses_nothing_and_publishes_nothing_twice() {
    let jet = jet().await;
    let (stream, prefix) = stream_names();
    // The sale, on Redis and PostgreSQL, with no relay of its own.
    let app = TestApp::spawn_with(events_on("outbox-kill", Backend::Redis)).await;
    let event = eid("kill");
    let outcomes = sale_with_holds(&app, &event, 90).await;
    let changes = all_changes(&app, &event, 1000).await;
    check_changes(&changes, &event, &outcomes, 90);
    let ledger = Ledger::connect(&pg_url(), 2)
        .await
        .unwrap()
        .with_outbox(true);
    // Other tests' changes share this database: the relay publishes them too.
    let last = ledger.changes(None, 0, i64::MAX).await.unwrap();
    let last = last.last().unwrap().seq;
    let target = format!("nats:{stream}");

    // The relays' lease apart from the app's: the app's webhook dispatcher
    // takes the relay lease of its namespace while any test of this process
    // has a webhook subscription in the shared database.
    let engine = Arc::new(standalone("outbox-kill-relay").await);
    let mut first = Relay::new(
        engine.clone(),
        ledger.clone(),
        relay_options(&stream, &prefix),
    );
    for _ in 0..4 {
        assert!(first.round().await.unwrap().led);
    }
    drop(first); // killed: the leadership is not given back
    let reached = ledger.outbox_cursor(&target).await.unwrap();
    assert!(reached < last, "killed mid-way ({reached} of {last})");
    // Its last marks lost: the changes after `lost` were published, not marked.
    let lost = reached / 2;
    sqlx::query("UPDATE outbox_cursors SET seq = $1 WHERE target = $2")
        .bind(lost)
        .bind(&target)
        .execute(&pg_pool().await)
        .await
        .unwrap();

    let mut second = Relay::new(engine, ledger.clone(), relay_options(&stream, &prefix));
    let (mut duplicates, mut led) = (0, false);
    eventually(
        "the second relay to finish",
        Duration::from_secs(60),
        async || {
            let round = second.round().await.unwrap();
            led |= round.led;
            duplicates += round.duplicates;
            (round.led && round.cursor >= last).then_some(())
        },
    )
    .await;
    assert!(led);
    assert!(
        duplicates as i64 >= reached - lost,
        "the server dropped the copies: {duplicates} of {}",
        reached - lost
    );
    let (messages, copies) = stream_messages(&jet, &stream).await;
    assert_eq!(copies, 0, "no copy reached the stream");
    let all = ledger.changes(None, 0, i64::MAX).await.unwrap();
    let ids: Vec<&str> = messages.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let want: Vec<&str> = all
        .iter()
        .filter(|c| c.seq <= last)
        .map(|c| c.change_id.as_str())
        .collect();
    assert_eq!(ids[..want.len()], want[..], "every change once, in order");
    let mine: Vec<Value> = messages
        .into_iter()
        .filter(|m| m["event_id"] == event.as_str())
        .collect();
    assert_eq!(mine, changes);
    app.stop().await;
    jet.delete_stream(&stream).await.unwrap();
}

// ---- the ledger's outbox alone, on both databases ----

fn record(stream: &str, event: &str, seq: u64, kind: RecordKind, order: &str) -> FlushRecord {
    FlushRecord {
        stream: stream.to_owned(),
        event: event.to_owned(),
        entry: StreamEntry {
            id: StreamId { ms: 1_000, seq },
            kind,
            order_id: order.to_owned(),
            user: "u-1".into(),
            qty: 1,
            bucket: 0,
            home: 0,
            rid: String::new(),
            at_ms: 1_000 + seq as i64,
            pay_by: None,
            part: 0,
        },
    }
}

/// `(subject, type)` of each change of `event`, in sequence order.
async fn kinds(ledger: &Ledger, event: &str) -> Vec<(String, String)> {
    let all = ledger.changes(Some(event), 0, 100_000).await.unwrap();
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    all.into_iter().map(|c| (c.subject, c.kind)).collect()
}

/// A cancel flushed before its take (another bucket's stream) waits for the
/// take's creation and comes right after it; batches applied again add no
/// change.
async fn a_cancel_flushed_before_its_take_comes_after_its_creation(url: String) {
    let id = event_id("park");
    let ledger = Ledger::connect(&url, 4).await.unwrap().with_outbox(true);
    ledger.register_event(&spec(&id, 100, 4), 0).await.unwrap();
    let e = id.as_str();
    let (home, other) = (format!("{e}#0#0"), format!("{e}#0#1"));
    let first = vec![
        record(&home, e, 1, RecordKind::Order, "a"),
        record(&home, e, 2, RecordKind::Cancel, "x"),
    ];
    ledger.apply(&first, 5).await.unwrap();
    let pair = |s: &str, k: &str| (s.to_owned(), k.to_owned());
    assert_eq!(kinds(&ledger, e).await, [pair("a", "order.created")]);
    assert_eq!(ledger.parked_changes().await.unwrap(), 1);
    let second = vec![
        record(&other, e, 1, RecordKind::Order, "x"),
        record(&other, e, 2, RecordKind::Order, "b"),
        record(&home, e, 3, RecordKind::Cancel, "a"),
    ];
    ledger.apply(&second, 6).await.unwrap();
    let want = [
        pair("a", "order.created"),
        pair("x", "order.created"),
        pair("b", "order.created"),
        pair("x", "order.cancelled"),
        pair("a", "order.cancelled"),
    ];
    assert_eq!(kinds(&ledger, e).await, want);
    for batch in [&first, &second] {
        assert_eq!(ledger.apply(batch, 7).await.unwrap().new_records, 0);
    }
    let mut both = first.clone();
    both.extend(second.clone());
    both.push(record(&other, e, 3, RecordKind::Order, "c"));
    assert_eq!(ledger.apply(&both, 8).await.unwrap().new_records, 1);
    let mut want = want.to_vec();
    want.push(pair("c", "order.created"));
    assert_eq!(kinds(&ledger, e).await, want);
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);
    // A second take of `a` (a saga's, in a third stream) beside a new order:
    // the plain insert meets a's creation, the batch is written again
    // skipping it.
    let third = format!("{e}#0#2");
    let again = vec![
        record(&third, e, 1, RecordKind::Order, "a"),
        record(&third, e, 2, RecordKind::Order, "d"),
    ];
    assert_eq!(ledger.apply(&again, 8).await.unwrap().new_records, 2);
    want.push(pair("d", "order.created"));
    assert_eq!(kinds(&ledger, e).await, want);
    ledger.close_event(&id, 9).await.unwrap();
    ledger.close_event(&id, 10).await.unwrap();
    want.push(pair(e, "event.closed"));
    assert_eq!(kinds(&ledger, e).await, want, "closed once");
}

/// Eight writers on overlapping batches, each batch twice in another order:
/// every order's creation once, before its cancel, each cancel once, and
/// the sequence rising with no number used twice.
async fn concurrent_flushers_write_each_change_once_in_order(url: String) {
    let id = event_id("meet");
    let ledger = Ledger::connect(&url, 8).await.unwrap().with_outbox(true);
    ledger
        .register_event(&spec(&id, 1_000_000, 8), 0)
        .await
        .unwrap();
    let e = id.to_string();
    // Orders in one stream, their cancels in another: the cancels often
    // reach the ledger first.
    let records: Vec<FlushRecord> = (0..1_200u64)
        .map(|i| {
            let order = format!("{e}.o{}", i / 2);
            if i % 2 == 0 {
                record(
                    &format!("{e}#0#{}", i % 8),
                    &e,
                    1 + i,
                    RecordKind::Order,
                    &order,
                )
            } else {
                record(
                    &format!("{e}#0#{}", 7 - i % 8),
                    &e,
                    1 + i,
                    RecordKind::Cancel,
                    &order,
                )
            }
        })
        .collect();
    let mut batches: Vec<Vec<FlushRecord>> = Vec::new();
    for start in (0..records.len()).step_by(90) {
        let mut b = records[start..(start + 120).min(records.len())].to_vec();
        b.reverse();
        batches.push(b.clone());
        let half = b.len() / 2;
        b.rotate_left(half);
        batches.push(b);
    }
    let batches = Arc::new(batches);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let (ledger, batches, next) = (ledger.clone(), batches.clone(), next.clone());
            tokio::spawn(async move {
                while let Some(b) =
                    batches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    ledger.apply(b, 0).await.expect("no writer gives up");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let changes = kinds(&ledger, &e).await;
    assert_eq!(changes.len(), 1_200, "each change once");
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for (subject, kind) in changes {
        seen.entry(subject).or_default().push(kind);
    }
    assert_eq!(seen.len(), 600);
    for (order, kinds) in seen {
        assert_eq!(kinds, ["order.created", "order.cancelled"], "{order}");
    }
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);
}

/// A saga's take given back (`v`) on an event without holds: the ledger
/// derives its order as voided (it never existed). Flushed after the take's
/// `order.created`, it is announced as `order.voided`, once, after it; with
/// its take in the same batch, or before it, neither is written; a losing
/// take given back while another take of the order stands changes nothing.
async fn a_take_given_back_after_its_creation_is_voided(url: String) {
    let id = event_id("void");
    let ledger = Ledger::connect(&url, 4).await.unwrap().with_outbox(true);
    ledger.register_event(&spec(&id, 100, 4), 0).await.unwrap();
    let e = id.as_str();
    let (s0, s1) = (format!("{e}#0#0"), format!("{e}#0#1"));
    let in_bucket = |stream: &str, seq: u64, kind: RecordKind, order: &str, bucket: u32| {
        let mut r = record(stream, e, seq, kind, order);
        r.entry.bucket = bucket;
        r
    };
    let pair = |s: &str, k: &str| (s.to_owned(), k.to_owned());
    // The saga's take in one batch, its void in a later one.
    let take = vec![in_bucket(&s1, 1, RecordKind::Order, "v", 1)];
    ledger.apply(&take, 5).await.unwrap();
    let mut want = vec![pair("v", "order.created")];
    assert_eq!(kinds(&ledger, e).await, want);
    let void = vec![in_bucket(&s1, 2, RecordKind::Void, "v", 1)];
    assert_eq!(ledger.apply(&void, 6).await.unwrap().new_records, 1);
    want.push(pair("v", "order.voided"));
    assert_eq!(kinds(&ledger, e).await, want, "created, then voided");
    let voided = ledger
        .changes(Some(e), 0, 100)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(voided.change_id, "v:order.voided");
    assert_eq!(voided.payload["order_id"], "v");
    assert_eq!(voided.payload["quantity"], 1);
    // Applied again: nothing new.
    assert_eq!(ledger.apply(&void, 7).await.unwrap().new_records, 0);
    assert_eq!(kinds(&ledger, e).await, want, "voided once");

    // Take and void in one batch: neither.
    let both = vec![
        in_bucket(&s1, 3, RecordKind::Order, "w", 1),
        in_bucket(&s1, 4, RecordKind::Void, "w", 1),
    ];
    assert_eq!(ledger.apply(&both, 8).await.unwrap().new_records, 2);
    assert_eq!(
        kinds(&ledger, e).await,
        want,
        "a take given back in its batch"
    );

    // The void flushed before its take: neither, and nothing left parked.
    ledger
        .apply(&[in_bucket(&s1, 6, RecordKind::Void, "x", 1)], 9)
        .await
        .unwrap();
    ledger
        .apply(&[in_bucket(&s1, 5, RecordKind::Order, "x", 1)], 10)
        .await
        .unwrap();
    assert_eq!(kinds(&ledger, e).await, want, "a void before its take");
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);

    // A losing take given back while the order's other take stands.
    ledger
        .apply(&[in_bucket(&s0, 2, RecordKind::Order, "y", 0)], 11)
        .await
        .unwrap();
    want.push(pair("y", "order.created"));
    ledger
        .apply(
            &[
                in_bucket(&s1, 7, RecordKind::Order, "y", 1),
                in_bucket(&s1, 8, RecordKind::Void, "y", 1),
            ],
            12,
        )
        .await
        .unwrap();
    assert_eq!(kinds(&ledger, e).await, want, "the order stands");
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);

    // Two drivers: the loser's take announced and given back before the
    // winner's take (another bucket) is flushed reads as voided; the
    // winner's take then restores it, once.
    ledger
        .apply(&[in_bucket(&s1, 9, RecordKind::Order, "z", 1)], 13)
        .await
        .unwrap();
    ledger
        .apply(&[in_bucket(&s1, 10, RecordKind::Void, "z", 1)], 14)
        .await
        .unwrap();
    want.push(pair("z", "order.created"));
    want.push(pair("z", "order.voided"));
    assert_eq!(kinds(&ledger, e).await, want, "voided for that moment");
    let winner = [in_bucket(&s0, 3, RecordKind::Order, "z", 0)];
    assert_eq!(ledger.apply(&winner, 15).await.unwrap().new_records, 1);
    want.push(pair("z", "order.restored"));
    assert_eq!(
        kinds(&ledger, e).await,
        want,
        "restored once the winner is in"
    );
    let restored = ledger
        .changes(Some(e), 0, 100)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(restored.change_id, "z:order.restored");
    assert_eq!(restored.payload["order_id"], "z");
    // Applied again: nothing new.
    assert_eq!(ledger.apply(&winner, 16).await.unwrap().new_records, 0);
    assert_eq!(kinds(&ledger, e).await, want, "restored once");
    assert_eq!(ledger.parked_changes().await.unwrap(), 0);
}

macro_rules! on_both_databases {
    ($($name:ident),*) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::harness::sqlite_url()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::harness::pg_url()).await;
                }
            )*
        }
    };
}

on_both_databases!(
    a_cancel_flushed_before_its_take_comes_after_its_creation,
    concurrent_flushers_write_each_change_once_in_order,
    a_take_given_back_after_its_creation_is_voided,
    the_outbox_is_pruned_once_delivered_and_bounded_by_retention
);

/// Pruning keeps what a target has not had until the retention ends, and
/// what every target has until the replay window ends; it goes from the
/// oldest change on.
async fn the_outbox_is_pruned_once_delivered_and_bounded_by_retention(url: String) {
    // Pruning goes from the deployment's oldest change: on PostgreSQL a
    // database of its own, away from the other tests' changes.
    let private = url
        .starts_with("postgres")
        .then(|| format!("shardstock_prune_{:08x}", rand::random::<u32>()));
    let url = match &private {
        Some(db) => format!("{}/{db}", url.rsplit_once('/').unwrap().0),
        None => url,
    };
    let id = event_id("prune");
    let ledger = Ledger::connect(&url, 4).await.unwrap().with_outbox(true);
    ledger
        .register_event(&spec(&id, 10_000, 1), 0)
        .await
        .unwrap();
    let e = id.as_str();
    let stream = format!("{e}#0#0");
    // 30 orders, one change each, at_ms 1_001 … 1_030.
    let batch: Vec<FlushRecord> = (1..=30)
        .map(|i| record(&stream, e, i, RecordKind::Order, &format!("{e}.o{i}")))
        .collect();
    ledger.apply(&batch, 0).await.unwrap();
    let mine = ledger.changes(Some(e), 0, 1_000).await.unwrap();
    let (first, tenth) = (mine[0].seq, mine[9].seq);
    // The target has up to the tenth.
    let target = format!("prune-{e}");
    assert!(ledger.mark_outbox(&target, tenth, 1, 0).await.unwrap());
    let upto = ledger
        .lowest_cursor(std::slice::from_ref(&target))
        .await
        .unwrap();
    assert_eq!(upto, Some(tenth));
    // The target's backlog (the lag gauges): twenty changes behind, the
    // first of them the eleventh order's (the database is this test's own).
    let behind = ledger.backlog(tenth).await.unwrap();
    assert_eq!((behind.changes, behind.oldest_ms), (20, Some(1_011)));
    let none = ledger.backlog(mine[29].seq).await.unwrap();
    assert_eq!((none.changes, none.oldest_ms), (0, None));
    // Nothing older than the retention, nothing delivered past the replay window.
    ledger.prune_outbox(1_000, 1_000, upto).await.unwrap();
    assert_eq!(ledger.changes(Some(e), 0, 1_000).await.unwrap().len(), 30);
    // Delivered and past the replay window: the first ten go, no more.
    ledger.prune_outbox(1_000, 1_020, upto).await.unwrap();
    let left = ledger.changes(Some(e), 0, 1_000).await.unwrap();
    assert_eq!(left.len(), 20);
    assert_eq!(left[0].seq, mine[10].seq);
    assert!(ledger.changes(Some(e), first - 1, 1).await.unwrap()[0].seq > tenth);
    // Past the retention, delivered or not: up to at_ms 1_025.
    ledger.prune_outbox(1_026, 1_020, upto).await.unwrap();
    assert_eq!(ledger.changes(Some(e), 0, 1_000).await.unwrap().len(), 5);
    drop(ledger);
    if let Some(db) = private {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
        )))
        .execute(&pg_pool().await)
        .await
        .unwrap();
    }
}
