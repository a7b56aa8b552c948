//! shardstock itself as benchmark strategies: the engine in process (on
//! standalone Redis or a Cluster, any bucket count, home steps batched or
//! not), and the whole service over HTTP (the real binary in its own process,
//! a separate client).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{BenchError, Outcome, Strategy, Workload};
use crate::domain::ids::{EventId, RequestId, UserId};
use crate::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use crate::engine::{PurchaseRequest, Refusal};
use crate::store::redis::RedisOptions;
use crate::store::{RedisStore, Retirement, Store};
use crate::{Engine, EngineError, EngineOptions};

fn event(prefix: &str) -> EventId {
    EventId::parse(format!("{prefix}-{:08x}", rand::random::<u32>())).expect("a valid id")
}

fn spec(id: &EventId, w: &Workload, buckets: u32) -> EventSpec {
    EventSpec {
        id: id.clone(),
        stock: w.stock,
        buckets,
        per_user_limit: w.per_user_limit,
        max_per_order: w
            .quantities
            .iter()
            .map(|q| q.0)
            .max()
            .unwrap_or(1)
            .max(DEFAULT_MAX_PER_ORDER),
        starts_at: None,
        ends_at: None,
    }
}

/// The engine over Redis, in the benchmark's own process.
pub struct EngineStrategy {
    name: String,
    engine: Arc<Engine<RedisStore>>,
    buckets: u32,
    event: Mutex<Option<EventId>>,
}

impl EngineStrategy {
    /// Closes the Redis connections (before a local Cluster is stopped, so
    /// the client does not log the connections it loses).
    pub async fn close(&self) {
        use fred::interfaces::ClientLike;
        let _ = self.engine.store().client().quit().await;
    }

    /// `url`: `redis://…` or `redis-cluster://…`; `batch`: group commit bound.
    pub async fn connect(
        url: &str,
        buckets: u32,
        batch: Option<usize>,
    ) -> Result<Self, BenchError> {
        let mut opts = RedisOptions::new(url);
        opts.namespace = format!("bench{:04x}", rand::random::<u16>());
        let store = RedisStore::connect(&opts)
            .await
            .map_err(|e| BenchError::Unavailable(format!("Redis at {url}: {e}")))?;
        let where_ = if store.kind() == "redis-cluster" {
            "cluster"
        } else {
            "redis"
        };
        let mode = if batch.is_some() {
            "batched"
        } else {
            "unbatched"
        };
        let options = EngineOptions {
            max_batch: batch,
            ..EngineOptions::default()
        };
        Ok(Self {
            name: format!("shardstock-{where_}-n{buckets}-{mode}"),
            engine: Arc::new(Engine::new(store, options)),
            buckets,
            event: Mutex::new(None),
        })
    }

    fn current(&self) -> EventId {
        current(&self.event)
    }

    /// The Redis client, for counting script calls.
    pub fn store(&self) -> &RedisStore {
        self.engine.store()
    }
}

fn outcome(r: Result<crate::engine::PurchaseOutcome, EngineError>) -> Outcome {
    match r {
        Ok(o) if o.replayed => Outcome::Replayed,
        Ok(o) => match o.result {
            Ok(order) => Outcome::Bought {
                units: order.quantity,
            },
            Err(Refusal::SoldOut { .. }) => Outcome::SoldOut,
            Err(Refusal::LimitExceeded { .. }) => Outcome::LimitExceeded,
        },
        Err(e) => Outcome::Error(e.to_string()),
    }
}

impl Strategy for EngineStrategy {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn claims_no_oversell(&self) -> bool {
        true
    }

    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        let id = event("bench");
        self.engine.create_event(spec(&id, w, self.buckets)).await?;
        self.engine.meta(&id).await?;
        *self.event.lock().expect("event slot") = Some(id);
        Ok(())
    }

    async fn attempt(&self, user: &str, qty: u32, request_id: &str) -> Outcome {
        let req = PurchaseRequest {
            event: self.current(),
            user: match UserId::parse(user) {
                Ok(u) => u,
                Err(e) => return Outcome::Error(e.to_string()),
            },
            quantity: qty,
            request_id: RequestId::parse(request_id).ok(),
        };
        outcome(self.engine.purchase(&req).await)
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.engine.view(&self.current()).await?.remaining as i64)
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        let meta = self.engine.meta(&self.current()).await?;
        for b in crate::control::flusher::buckets_of(&meta) {
            self.engine.store().expire_bucket(&b, 1_000).await?;
        }
        Ok(())
    }
}

/// The whole service: the `shardstock` binary in its own process, over HTTP.
pub struct HttpStrategy {
    base: String,
    client: reqwest::Client,
    child: Mutex<Option<Child>>,
    buckets: u32,
    event: Mutex<Option<EventId>>,
}

const TOKEN: &str = "bench-admin-token";

impl HttpStrategy {
    /// Starts `binary serve` on a free port against Redis and the database.
    pub async fn start(
        binary: &std::path::Path,
        redis: &str,
        database: &str,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let port = super::cluster::free_port();
        // Every default, no configured events, its own key namespace.
        let config = super::cluster::scratch_dir("bench-http").join("bench.toml");
        let ns = format!(
            "[store]\nnamespace = \"benchhttp{:04x}\"\n",
            rand::random::<u16>()
        );
        std::fs::write(&config, ns).map_err(|e| BenchError::Unavailable(e.to_string()))?;
        let child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--redis",
                redis,
                "--database-url",
                database,
            ])
            .args(["--admin-token", TOKEN, "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                BenchError::Unavailable(format!("cannot start {}: {e}", binary.display()))
            })?;
        let strategy = Self {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(clients)
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| BenchError::Unavailable(e.to_string()))?,
            child: Mutex::new(Some(child)),
            buckets,
            event: Mutex::new(None),
        };
        let start = Instant::now();
        while strategy
            .client
            .get(format!("{}/readyz", strategy.base))
            .send()
            .await
            .map(|r| r.status() != 200)
            .unwrap_or(true)
        {
            if start.elapsed() > Duration::from_secs(30) {
                return Err(BenchError::Unavailable(
                    "the service did not become ready".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(strategy)
    }

    fn current(&self) -> EventId {
        current(&self.event)
    }
}

impl Drop for HttpStrategy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Strategy for HttpStrategy {
    fn name(&self) -> String {
        format!("shardstock-http-n{}", self.buckets)
    }

    fn claims_no_oversell(&self) -> bool {
        true
    }

    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        let id = event("benchhttp");
        let s = spec(&id, w, self.buckets);
        let body = json!({"id": id, "stock": s.stock, "buckets": s.buckets, "max_per_order": s.max_per_order, "per_user_limit": s.per_user_limit});
        let r = self
            .client
            .post(format!("{}/v1/events", self.base))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 201, "creating the event: {}", r.text().await?);
        *self.event.lock().expect("event slot") = Some(id);
        Ok(())
    }

    async fn attempt(&self, user: &str, qty: u32, request_id: &str) -> Outcome {
        let url = format!("{}/v1/events/{}/purchases", self.base, self.current());
        let body = json!({"user_id": user, "quantity": qty, "request_id": request_id});
        let r = match self.client.post(url).json(&body).send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Error(e.to_string()),
        };
        let replayed = r.headers().contains_key("idempotent-replayed");
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        match (status, replayed, body["type"].as_str()) {
            (_, true, _) => Outcome::Replayed,
            (201, _, _) => Outcome::Bought {
                units: body["quantity"].as_u64().unwrap_or(0) as u32,
            },
            (_, _, Some("urn:shardstock:sold-out")) => Outcome::SoldOut,
            (_, _, Some("urn:shardstock:limit-exceeded")) => Outcome::LimitExceeded,
            _ => Outcome::Error(format!("{status}: {body}")),
        }
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        let v: Value = self
            .client
            .get(format!("{}/v1/events/{}", self.base, self.current()))
            .send()
            .await?
            .json()
            .await?;
        v["remaining"]
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("no remaining in {v}"))
    }
}

/// The event `prepare` created for the run.
fn current(slot: &Mutex<Option<EventId>>) -> EventId {
    slot.lock()
        .expect("event slot")
        .clone()
        .expect("prepare ran")
}
