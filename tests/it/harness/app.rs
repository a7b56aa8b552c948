//! `TestApp`: the real application on 127.0.0.1:0, and a client for it;
//! problem+json and Prometheus helpers. (Tests run on each `Backend` with
//! `on_every_backend!(app: …)`.)

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use shardstock::app::Application;
use shardstock::config::Settings;
use shardstock::store::Store;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "test-admin-token";

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Memory,
    Redis,
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    /// The service's own typed client (`shardstock::client`), with the test token.
    pub api: shardstock::client::Client,
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// Settings for an app of the API suite (its apps share the `api` namespace
/// on Redis, as when the suite was its own binary).
pub fn settings(backend: Backend) -> Settings {
    settings_in("api", backend)
}

/// Settings for an app of `suite`: port 0, the test token, fast gauges; on
/// Redis, the suite's namespace and this process's PostgreSQL database.
pub fn settings_in(suite: &str, backend: Backend) -> Settings {
    let mut s = Settings::default();
    s.server.listen = "127.0.0.1:0".into();
    s.server.admin_token = TOKEN.into();
    s.server.gauges_interval_ms = 50;
    match backend {
        Backend::Memory => s.database.url = super::sqlite_url(),
        Backend::Redis => {
            s.store.redis_url = Some("redis://127.0.0.1:6379".into());
            s.store.namespace = super::namespace(suite);
            s.database.url = super::pg_url();
        }
    }
    s
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> Self {
        Self::spawn_with(settings(backend)).await
    }

    /// Builds and serves the app. A store that does not answer its first
    /// call within the configured timeout is asked again, four times: at
    /// the smallest accepted timeout (100 ms, `bounds.rs`) a loaded machine's
    /// Redis once missed it (CI, 2026-12-07). One that is down still fails,
    /// loudly, with the command that starts it.
    pub async fn spawn_with(settings: Settings) -> Self {
        let mut tries = 0;
        let app = loop {
            match Application::build(settings.clone()).await {
                Ok(app) => break app,
                Err(e) if tries < 4 && format!("{e:#}").contains("store unavailable") => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                Err(e) => panic!(
                    "cannot build the app ({e:#}); is Redis up? start it with:\n  {}",
                    super::START_REDIS
                ),
            }
        };
        Self::serve(app)
    }

    /// The app on a store the test holds too (a `Faulty` wrapper that counts
    /// the store's calls, say).
    pub async fn spawn_on<S: Store>(store: S, settings: Settings) -> Self {
        let app = Application::with_store(store, settings)
            .await
            .unwrap_or_else(|e| panic!("cannot build the app: {e:#}"));
        Self::serve(app)
    }

    fn serve(app: Application) -> Self {
        let base = format!("http://127.0.0.1:{}", app.port());
        let stop = CancellationToken::new();
        let signal = stop.clone();
        let handle = tokio::spawn(app.run_until(async move { signal.cancelled().await }));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Self {
            api: shardstock::client::Client::with_http(base.clone(), client.clone())
                .with_token(TOKEN),
            base,
            client,
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the app and waits for it to finish.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn create(&self, id: &str, stock: u64, buckets: u32, extra: Value) -> Value {
        let mut body = json!({"id": id, "stock": stock, "buckets": buckets});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap_or_default());
        let r = self.admin_post("/v1/events", body).await;
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "{}",
            r.text().await.unwrap()
        );
        r.json().await.unwrap()
    }

    /// `POST /v1/events/{id}/close` with the admin token, whatever it answers
    /// (a close refused or cut off; [`TestApp::close`] for one that must end
    /// the sale).
    pub async fn close_request(&self, id: &str) -> Response {
        self.admin_post(&format!("/v1/events/{id}/close"), json!({}))
            .await
    }

    /// Closes `id`: the close must answer 200, which it does once every order
    /// is drained to the database; the final view (`status`, `sold`,
    /// `leftover`).
    pub async fn close(&self, id: &str) -> Value {
        let r = self.close_request(id).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, StatusCode::OK, "closing {id}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("closing {id}: {e}: {text}"))
    }

    /// Closes `id`, asking again until the close answers 200 (while a reshard
    /// holds the event, or a close before it was cut off), for at most
    /// `within`; the final view.
    pub async fn close_eventually(&self, id: &str, within: Duration) -> Value {
        super::eventually(&format!("{id} to close"), within, async || {
            let r = self
                .client
                .post(self.url(&format!("/v1/events/{id}/close")))
                .bearer_auth(TOKEN)
                .json(&json!({}))
                .send()
                .await
                .ok()?;
            if r.status() != StatusCode::OK {
                return None;
            }
            r.json().await.ok()
        })
        .await
    }

    /// `GET /v1/events/{id}/audit` with the admin token, as JSON.
    pub async fn audit(&self, id: &str) -> Value {
        self.client
            .get(self.url(&format!("/v1/events/{id}/audit")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn view(&self, id: &str) -> Value {
        let r = self.get(&format!("/v1/events/{id}")).await;
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::OK, "the view of {id}: {body}");
        body
    }

    pub async fn buy(&self, event: &str, user: &str, qty: u32, rid: Option<&str>) -> Response {
        let mut body = json!({"user_id": user, "quantity": qty});
        if let Some(rid) = rid {
            body["request_id"] = json!(rid);
        }
        self.post(&format!("/v1/events/{event}/purchases"), body)
            .await
    }

    /// [`TestApp::buy`] with a request id, driven to a final answer the way a
    /// client does it: a 503 (`try-again`, or `outcome: unknown` after a store
    /// call that timed out on a CPU-starved run) is sent again with the same
    /// request id after a pause, a bounded number of times. The id makes the
    /// retry safe: it answers what the first attempt did.
    pub async fn buy_final(&self, event: &str, user: &str, qty: u32, rid: &str) -> Response {
        for _ in 0..20 {
            let r = self.buy(event, user, qty, Some(rid)).await;
            if r.status() != StatusCode::SERVICE_UNAVAILABLE {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        self.buy(event, user, qty, Some(rid)).await
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Asserts a problem+json response and returns its body.
pub async fn problem(r: Response, status: u16, kind: &str) -> Value {
    assert_eq!(r.status().as_u16(), status, "status for {kind}");
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        ct.as_deref(),
        Some("application/problem+json"),
        "content type for {kind}"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:shardstock:{kind}"), "{body}");
    assert_eq!(body["status"], status);
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    body
}

/// A unique event id.
pub fn eid(prefix: &str) -> String {
    super::event_id(prefix).to_string()
}

/// The value of a Prometheus sample `name{labels…}` in a text exposition:
/// every `(label, value)` in `want` must be among the sample's labels.
pub fn sample(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let ok = want
                .iter()
                .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse().ok()).flatten()
        })
}
