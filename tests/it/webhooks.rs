//! Webhooks: the outbox's changes POSTed to a receiver the test starts
//! (axum on 127.0.0.1:0), on memory/SQLite and Redis/PostgreSQL.
//!
//! The receiver ends with exactly the database's changes for every order, in
//! per-order order, after deduplication by event id, through a spell of 500
//! answers; a subscription filtered to one type gets that type only; every
//! delivery carries a signature by each of the subscription's two secrets
//! (a rotation), and Python's `hmac`, running the check docs/API.md
//! documents, accepts it and refuses a tampered body and a replay past the
//! tolerance. A subscription that keeps failing is paused, reported (the
//! admin API, the metric), its secret rotated, and resumed from its cursor;
//! subscriptions and cursors survive a restart.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::config::{Settings, WebhookSettings};
use shardstock::domain::webhook::verify;

use crate::harness::{Backend, TOKEN, TestApp, eid, eventually, on_every_backend};
use crate::outbox::{all_changes, check_changes, events_on, sale_with_holds};

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) event_id: String,
    pub(crate) kind: String,
    pub(crate) signature: String,
    pub(crate) body: Bytes,
}

/// A webhook endpoint: records every POST, answers `status`.
pub(crate) struct Receiver {
    status: AtomicU16,
    got: Mutex<Vec<Delivery>>,
}

impl Receiver {
    /// Starts one on 127.0.0.1:0; its URL.
    async fn start(status: u16) -> (Arc<Self>, String) {
        let receiver = Self::new(status);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let app = receiver.router();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    pub(crate) fn new(status: u16) -> Arc<Self> {
        Arc::new(Self {
            status: AtomicU16::new(status),
            got: Mutex::new(Vec::new()),
        })
    }

    /// The endpoint, `POST /hook`, serving this receiver.
    pub(crate) fn router(self: &Arc<Self>) -> axum::Router {
        async fn hook(
            State(r): State<Arc<Receiver>>,
            headers: HeaderMap,
            body: Bytes,
        ) -> AxumStatus {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            r.got.lock().unwrap().push(Delivery {
                event_id: header("shardstock-event-id"),
                kind: header("shardstock-event-type"),
                signature: header("shardstock-signature"),
                body,
            });
            AxumStatus::from_u16(r.status.load(Ordering::SeqCst)).unwrap()
        }
        axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(self.clone())
    }

    fn set(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub(crate) fn all(&self) -> Vec<Delivery> {
        self.got.lock().unwrap().clone()
    }

    /// The deliveries answered 2xx or not, first copy of each id, in
    /// arrival order, as the changes endpoint writes a change.
    pub(crate) fn deduplicated(&self, event: &str) -> Vec<Value> {
        let mut seen = HashSet::new();
        self.all()
            .into_iter()
            .filter_map(|d| {
                let body: Value = serde_json::from_slice(&d.body).unwrap();
                (body["event_id"] == event && seen.insert(d.event_id.clone())).then(|| {
                    assert_eq!(body["id"], d.event_id.as_str());
                    assert_eq!(body["type"], d.kind.as_str());
                    assert!(body["created"].as_str().is_some_and(|c| c.ends_with('Z')));
                    json!({
                        "id": body["id"], "seq": body["seq"], "type": body["type"],
                        "event_id": body["event_id"], "subject": body["subject"],
                        "at_ms": body["at_ms"], "payload": body["data"],
                    })
                })
            })
            .collect()
    }
}

/// Settings with order events on and quick retries (a delivery failing is
/// retried within 100 ms), pausing after `pause_after` failures in a row.
pub(crate) fn hooks_on(backend: Backend, pause_after: u32) -> Settings {
    let mut s = events_on("webhooks", backend);
    s.outbox.webhook_retry_min_ms = 10;
    s.outbox.webhook_retry_max_ms = 100;
    s.outbox.webhook_timeout_ms = 2_000;
    s.outbox.webhook_pause_after_failures = pause_after;
    s
}

const SECRET_OLD: &str = "whsec-old-0123456789abcdef";
pub(crate) const SECRET_NEW: &str = "whsec-new-fedcba9876543210";

/// The check docs/API.md documents, in Python with its standard library:
/// `verify(secret, header, body, now, tolerance)` answers `ok`,
/// `malformed`, `too-old` or `mismatch`.
const PY_VERIFY: &str = r#"
import hashlib, hmac, sys

def verify(secret: bytes, header: str, body: bytes, now: int, tolerance: int = 300) -> str:
    """Shardstock-Signature: t=<unix>,v1=<hex>[,v1=<hex>]; v1 = HMAC-SHA256(secret, "<t>.<body>")."""
    items = [part.split("=", 1) for part in header.split(",")]
    if any(len(item) != 2 for item in items):
        return "malformed"
    stamps = [v for k, v in items if k == "t"]
    if len(stamps) != 1 or not stamps[0].isdigit():
        return "malformed"
    t = int(stamps[0])
    if abs(now - t) > tolerance:
        return "too-old"          # a replay, or a clock far off
    expected = hmac.new(secret, stamps[0].encode() + b"." + body, hashlib.sha256).hexdigest()
    ok = any(hmac.compare_digest(expected, v) for k, v in items if k == "v1")
    return "ok" if ok else "mismatch"

secret, header, path, now = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
with open(path, "rb") as f:
    body = f.read()
print(verify(secret.encode(), header, body, int(now)))
"#;

/// Python's verdict on a delivery, `now_offset` seconds after its `t`.
fn python_verify(secret: &str, header: &str, body: &[u8], now_offset: i64) -> String {
    let t: i64 = header
        .split(',')
        .find_map(|p| p.strip_prefix("t="))
        .unwrap()
        .parse()
        .unwrap();
    let path = std::env::temp_dir().join(format!("webhook-body-{:08x}", rand::random::<u32>()));
    std::fs::write(&path, body).unwrap();
    let out = Command::new("python3")
        .args(["-c", PY_VERIFY, secret, header])
        .arg(&path)
        .arg((t + now_offset).to_string())
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 is needed to verify signatures ({e}): apt-get install -y python3")
        });
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(crate) async fn subscribe(app: &TestApp, body: Value) -> Value {
    let r = app.admin_post("/v1/webhooks", body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json().await.unwrap()
}

pub(crate) async fn webhook(app: &TestApp, id: &str) -> Value {
    let r = app
        .client
        .get(app.url(&format!("/v1/webhooks/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn put_secrets(app: &TestApp, id: &str, body: Value) -> reqwest::Response {
    app.client
        .put(app.url(&format!("/v1/webhooks/{id}/secrets")))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn delete(app: &TestApp, id: &str) -> StatusCode {
    app.client
        .delete(app.url(&format!("/v1/webhooks/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .status()
}

/// A sale's changes reach a receiver that answers 500 for its first 1.5 s,
/// each order's in order, signed by both secrets; a second subscription gets
/// its one type only.
async fn a_receiver_gets_exactly_the_ledgers_changes_signed(backend: Backend) {
    let (all, all_url) = Receiver::start(500).await;
    let (created, created_url) = Receiver::start(200).await;
    let app = TestApp::spawn_with(hooks_on(backend, 1_000_000)).await;
    let tag = format!("{:08x}", rand::random::<u32>());
    let view = subscribe(
        &app,
        json!({"id": format!("all-{tag}"), "url": all_url, "secrets": [SECRET_OLD, SECRET_NEW]}),
    )
    .await;
    assert_eq!(view["status"], "active");
    assert_eq!(view["secrets"], 2, "secrets are never shown: {view}");
    subscribe(
        &app,
        json!({"id": format!("created-{tag}"), "url": created_url, "types": ["order.created"], "secrets": [SECRET_NEW]}),
    )
    .await;
    let recover = tokio::spawn({
        let all = all.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            all.set(200);
        }
    });
    let event = eid("wh");
    let outcomes = sale_with_holds(&app, &event, 60).await;
    let changes = all_changes(&app, &event, 1000).await;
    recover.await.unwrap();
    let delivered = eventually(
        "every change at the receiver",
        Duration::from_secs(60),
        async || {
            let got = all.deduplicated(&event);
            (got.len() == changes.len()).then_some(got)
        },
    )
    .await;
    check_changes(&delivered, &event, &outcomes, 60);
    assert_eq!(delivered, changes, "the database's changes, in its order");
    let failed = all.all().len() - changes.len();
    assert!(
        failed > 0,
        "the receiver answered 500 at first; those deliveries were retried"
    );

    let creations: Vec<Value> = eventually(
        "the creations at the filtered receiver",
        Duration::from_secs(30),
        async || {
            let got = created.deduplicated(&event);
            (got.len() == outcomes.len()).then_some(got)
        },
    )
    .await;
    assert!(creations.iter().all(|c| c["type"] == "order.created"));
    assert!(created.all().iter().all(|d| d.kind == "order.created"));

    // Signatures: every delivery verifies by each secret (a rotation), none
    // by another; Python's hmac agrees, and refuses a tampered body and a
    // replay past the tolerance.
    let now = |d: &Delivery| -> i64 {
        d.signature
            .split(',')
            .find_map(|p| p.strip_prefix("t="))
            .unwrap()
            .parse()
            .unwrap()
    };
    for d in all.all() {
        assert_eq!(d.signature.matches("v1=").count(), 2, "{}", d.signature);
        for secret in [SECRET_OLD, SECRET_NEW] {
            verify(secret, &d.signature, &d.body, now(&d), 300).unwrap();
        }
        assert!(
            verify(
                "whsec-another-0123456789",
                &d.signature,
                &d.body,
                now(&d),
                300
            )
            .is_err()
        );
    }
    let d = all.all().pop().unwrap();
    assert_eq!(python_verify(SECRET_OLD, &d.signature, &d.body, 0), "ok");
    assert_eq!(python_verify(SECRET_NEW, &d.signature, &d.body, 200), "ok");
    let mut tampered = d.body.to_vec();
    let at = tampered.iter().position(|b| b.is_ascii_digit()).unwrap();
    tampered[at] = if tampered[at] == b'9' {
        b'8'
    } else {
        tampered[at] + 1
    };
    assert_eq!(
        python_verify(SECRET_OLD, &d.signature, &tampered, 0),
        "mismatch"
    );
    assert_eq!(
        python_verify(SECRET_OLD, &d.signature, &d.body, 301),
        "too-old"
    );
    assert_eq!(
        python_verify("whsec-another-0123456789", &d.signature, &d.body, 0),
        "mismatch"
    );
    let filtered = created.all().pop().unwrap();
    assert_eq!(filtered.signature.matches("v1=").count(), 1);
    assert_eq!(
        python_verify(SECRET_NEW, &filtered.signature, &filtered.body, 0),
        "ok"
    );
    assert_eq!(
        python_verify(SECRET_OLD, &filtered.signature, &filtered.body, 0),
        "mismatch"
    );
    for id in [format!("all-{tag}"), format!("created-{tag}")] {
        assert_eq!(delete(&app, &id).await, StatusCode::NO_CONTENT);
    }
    app.stop().await;
}

/// A subscription whose endpoint keeps failing is paused after the bound,
/// reported by the API and the metric, never holds up another one, and
/// resumes from its cursor once the endpoint answers again.
///
/// On memory/SQLite only: the leader's settings bound every subscription of
/// its database, and the suites on Redis share one PostgreSQL database, so a
/// leader pausing after 3 failures would pause the other tests'
/// subscriptions too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_subscription_is_paused_reported_and_resumed() {
    let (down, down_url) = Receiver::start(500).await;
    let (up, up_url) = Receiver::start(200).await;
    let app = TestApp::spawn_with(hooks_on(Backend::Memory, 3)).await;
    let tag = format!("{:08x}", rand::random::<u32>());
    let (down_id, up_id) = (format!("down-{tag}"), format!("up-{tag}"));
    subscribe(
        &app,
        json!({"id": down_id, "url": down_url, "secrets": [SECRET_OLD]}),
    )
    .await;
    subscribe(
        &app,
        json!({"id": up_id, "url": up_url, "secrets": [SECRET_OLD]}),
    )
    .await;
    let event = eid("wp");
    let outcomes = sale_with_holds(&app, &event, 12).await;
    let changes = all_changes(&app, &event, 1000).await;
    // The healthy subscription gets everything while the other fails.
    eventually(
        "the healthy receiver's changes",
        Duration::from_secs(30),
        async || (up.deduplicated(&event).len() == changes.len()).then_some(()),
    )
    .await;
    let paused = eventually(
        "the failing subscription paused",
        Duration::from_secs(30),
        async || {
            let view = webhook(&app, &down_id).await;
            (view["status"] == "paused").then_some(view)
        },
    )
    .await;
    assert!(paused["paused_at"].as_str().is_some(), "{paused}");
    let reason = paused["paused_reason"].as_str().unwrap();
    assert!(
        reason.contains("3 deliveries failed") && reason.contains("500"),
        "{reason}"
    );
    assert_eq!(down.all().len(), 3, "no delivery after the pause");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let line = format!("shardstock_webhook_paused{{subscription=\"{down_id}\"}} 1");
    assert!(metrics.contains(&line), "{line} in /metrics");

    // Its secret rotated while paused: what it sends after is signed by the
    // new one only.
    let rotated = put_secrets(&app, &down_id, json!({"secrets": [SECRET_NEW]})).await;
    assert_eq!(rotated.status(), StatusCode::OK);
    let before = down.all().len();
    down.set(200);
    let r = app
        .admin_post(&format!("/v1/webhooks/{down_id}/resume"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let view: Value = r.json().await.unwrap();
    assert_eq!(view["status"], "active");
    assert!(view["paused_reason"].is_null());
    let delivered = eventually(
        "the resumed receiver's changes",
        Duration::from_secs(30),
        async || {
            let got = down.deduplicated(&event);
            (got.len() == changes.len()).then_some(got)
        },
    )
    .await;
    check_changes(&delivered, &event, &outcomes, 12);
    for d in &down.all()[before..] {
        let t: i64 = d
            .signature
            .split(',')
            .find_map(|p| p.strip_prefix("t="))
            .unwrap()
            .parse()
            .unwrap();
        verify(SECRET_NEW, &d.signature, &d.body, t, 300).unwrap();
        assert!(verify(SECRET_OLD, &d.signature, &d.body, t, 300).is_err());
    }
    let last = changes.last().unwrap()["seq"].as_i64().unwrap();
    eventually(
        "the cursor past the sale",
        Duration::from_secs(10),
        async || (webhook(&app, &down_id).await["cursor"].as_i64().unwrap() >= last).then_some(()),
    )
    .await;
    for id in [&down_id, &up_id] {
        assert_eq!(delete(&app, id).await, StatusCode::NO_CONTENT);
    }
    app.stop().await;
}

on_every_backend!(app: a_receiver_gets_exactly_the_ledgers_changes_signed);

/// The admin API: its token, its checks (each naming the field), 409s, 404s,
/// and order events off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_api_checks_what_it_is_given() {
    let mut settings = hooks_on(Backend::Memory, 3);
    settings.outbox.webhooks = vec![WebhookSettings {
        id: "from-config".into(),
        url: "http://127.0.0.1:9/hook".into(),
        types: vec![],
        secrets: vec![SECRET_OLD.into()],
    }];
    let app = TestApp::spawn_with(settings.clone()).await;
    let ok = json!({"id": "pay", "url": "http://127.0.0.1:9/x", "secrets": [SECRET_OLD]});
    let r = app.post("/v1/webhooks", ok.clone()).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    for (body, field) in [
        (
            json!({"id": "a b", "url": "http://x", "secrets": [SECRET_OLD]}),
            "id",
        ),
        (
            json!({"id": "a", "url": "ftp://x", "secrets": [SECRET_OLD]}),
            "url",
        ),
        (
            json!({"id": "a", "url": "http://x", "types": ["order.made"], "secrets": [SECRET_OLD]}),
            "types",
        ),
        (
            json!({"id": "a", "url": "http://x", "secrets": ["short"]}),
            "secrets",
        ),
        (
            json!({"id": "a", "url": "http://x", "secrets": [SECRET_OLD], "secret": "x"}),
            "secret",
        ),
    ] {
        let r = app.admin_post("/v1/webhooks", body.clone()).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{body}: {problem}"
        );
    }
    subscribe(&app, ok.clone()).await;
    let r = app.admin_post("/v1/webhooks", ok).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let list: Value = app
        .client
        .get(app.url("/v1/webhooks"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let origins: HashMap<String, String> = list["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap().to_owned(),
                w["origin"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(origins["pay"], "api");
    assert_eq!(origins["from-config"], "config");
    let two = json!({"secrets": [SECRET_OLD, SECRET_NEW]});
    let r = put_secrets(&app, "pay", two.clone()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["secrets"], 2);
    assert_eq!(
        put_secrets(&app, "from-config", two.clone()).await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        put_secrets(&app, "nope", two).await.status(),
        StatusCode::NOT_FOUND
    );
    let short = put_secrets(&app, "pay", json!({"secrets": ["short"]})).await;
    assert_eq!(short.status(), StatusCode::BAD_REQUEST);
    assert_eq!(delete(&app, "from-config").await, StatusCode::CONFLICT);
    assert_eq!(delete(&app, "nope").await, StatusCode::NOT_FOUND);
    let r = app.admin_post("/v1/webhooks/nope/resume", json!({})).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    app.stop().await;

    // Both kinds survive a restart, with their cursors.
    let app = TestApp::spawn_with(settings.clone()).await;
    assert_eq!(webhook(&app, "pay").await["origin"], "api");
    assert_eq!(webhook(&app, "from-config").await["origin"], "config");
    assert_eq!(delete(&app, "pay").await, StatusCode::NO_CONTENT);
    assert_eq!(delete(&app, "pay").await, StatusCode::NOT_FOUND);
    app.stop().await;

    // Order events off: the API says which setting turns them on.
    let mut off = settings;
    off.outbox.enabled = false;
    off.outbox.webhooks.clear();
    let app = TestApp::spawn_with(off).await;
    let r = app
        .client
        .get(app.url("/v1/webhooks"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["type"], "urn:shardstock:order-events-off");
    app.stop().await;
}
