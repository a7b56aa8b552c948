//! shardstock's engine as a benchmark strategy, in the benchmark's own
//! process: on standalone Redis or a Cluster, any bucket count, home steps
//! batched or not. Also the pieces the HTTP strategy ([`crate::http`]) shares
//! with it: a fresh event id, the event spec a workload asks for, the event a
//! run is on.
//!
//! It calls the `shardstock` library as the service does (`Engine` over a
//! `RedisStore`); what the numbers mean is left to the report.

use std::sync::{Arc, Mutex};

use shardstock::domain::ids::{EventId, RequestId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::engine::{PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::store::redis::RedisOptions;
use shardstock::store::{RedisStore, Retirement, Store};
use shardstock::{Engine, EngineError, EngineOptions};

use crate::{BenchError, Outcome, Strategy, Workload};

/// A fresh event id, `<prefix>-<8 hex digits>`: runs never meet.
pub(crate) fn event(prefix: &str) -> EventId {
    EventId::parse(format!("{prefix}-{:08x}", rand::random::<u32>())).expect("a valid id")
}

/// The event a workload sells: its stock and limit, `buckets` buckets, an
/// order size that admits every quantity of the mix.
pub(crate) fn spec(id: &EventId, w: &Workload, buckets: u32) -> EventSpec {
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
        hold_seconds: None,
        auto_buckets: None,
        tokens: None,
        draw: None,
    }
}

/// The engine over Redis, in the benchmark's own process.
pub struct EngineStrategy {
    name: String,
    engine: Arc<Engine<RedisStore>>,
    buckets: u32,
    event: Mutex<Option<EventId>>,
    /// Events with holds: the share of held orders the buyer confirms (each
    /// confirm sent by a task of its own, as a payment arrives apart from the
    /// purchase; the rest stay held for the run).
    holds: Option<f64>,
}

/// The pay-by window of a benchmark with holds: longer than any run, so
/// nothing expires mid-run and the books stay comparable.
const BENCH_HOLD_SECONDS: u32 = 3_600;

/// A store on `opts.url` in a namespace of its own (`prefix` and a random
/// suffix), so a run never meets an earlier run's keys.
pub async fn connect_fresh(mut opts: RedisOptions, prefix: &str) -> Result<RedisStore, BenchError> {
    opts.namespace = format!("{prefix}{:04x}", rand::random::<u16>());
    RedisStore::connect(&opts).await.map_err(|e| {
        BenchError::Unavailable(format!(
            "Redis at {}: {e} (start it: redis-server --daemonize yes --port 6379)",
            opts.url
        ))
    })
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
        Self::connect_with(url, buckets, batch, 0).await
    }

    /// [`EngineStrategy::connect`] with the durability setting: purchases
    /// acknowledged once on `min_replicas` replicas (`store.min_replicas`).
    pub async fn connect_with(
        url: &str,
        buckets: u32,
        batch: Option<usize>,
        min_replicas: u32,
    ) -> Result<Self, BenchError> {
        let mut opts = RedisOptions::new(url);
        opts.min_replicas = min_replicas;
        let store = connect_fresh(opts, "bench").await?;
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
            name: match min_replicas {
                0 => format!("shardstock-{where_}-n{buckets}-{mode}"),
                n => format!("shardstock-{where_}-n{buckets}-{mode}-wait{n}"),
            },
            engine: Arc::new(Engine::new(store, options)),
            buckets,
            event: Mutex::new(None),
            holds: None,
        })
    }

    /// Purchases are holds; `confirm` of them (0..=1) are confirmed.
    pub fn with_holds(mut self, confirm: f64) -> Self {
        self.name = format!("{}-holds{:.0}", self.name, confirm * 100.0);
        self.holds = Some(confirm.clamp(0.0, 1.0));
        self
    }

    fn current(&self) -> EventId {
        current(&self.event)
    }

    /// The Redis client, for counting script calls.
    pub fn store(&self) -> &RedisStore {
        self.engine.store()
    }
}

fn outcome(r: Result<PurchaseOutcome, EngineError>) -> Outcome {
    match r {
        Ok(o) if o.replayed => Outcome::Replayed,
        Ok(o) => match o.result {
            Ok(order) => Outcome::Bought {
                units: order.quantity,
            },
            Err(Refusal::SoldOut { .. }) => Outcome::SoldOut,
            Err(Refusal::LimitExceeded { .. }) => Outcome::LimitExceeded,
            // The bench's events are open: a token refusal is not expected.
            Err(Refusal::Token(why)) => Outcome::Error(format!("token refused: {why:?}")),
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
        let mut spec = spec(&id, w, self.buckets);
        spec.hold_seconds = self.holds.map(|_| BENCH_HOLD_SECONDS);
        self.engine.create_event(spec).await?;
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
            access_token: None,
        };
        let answer = self.engine.purchase(&req).await;
        if let (
            Some(share),
            Ok(PurchaseOutcome {
                result: Ok(order),
                replayed: false,
            }),
        ) = (self.holds, &answer)
        {
            // The order id's random tail decides, so a share of orders
            // (not of calls) is confirmed.
            let tail = order.order_id.as_str().rsplit('.').next().unwrap_or("0");
            let draw = u64::from_str_radix(tail, 16).unwrap_or(0) % 1000;
            if (draw as f64) < share * 1000.0 {
                let (engine, oid) = (self.engine.clone(), order.order_id.clone());
                tokio::spawn(async move {
                    if let Err(e) = engine.confirm(oid.as_str()).await {
                        eprintln!("confirm {oid}: {e}");
                    }
                });
            }
        }
        outcome(answer)
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.engine.view(&self.current()).await?.remaining as i64)
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        let meta = self.engine.meta(&self.current()).await?;
        for b in meta.all_buckets() {
            self.engine.store().expire_bucket(&b, 1_000).await?;
        }
        Ok(())
    }
}

/// The event `prepare` created for the run.
pub(crate) fn current(slot: &Mutex<Option<EventId>>) -> EventId {
    slot.lock()
        .expect("event slot")
        .clone()
        .expect("prepare ran")
}
