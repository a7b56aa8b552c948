//! The Redis backend: every store step is one Lua script from `lua/`, run with
//! EVALSHA on the slot of the bucket (or event) it touches. Standalone Redis and
//! Redis Cluster are the same code: fred routes each call by its first key.
//!
//! This file holds the connection, the options and the eval helpers; each
//! step is declared once in [`steps`] (its script, KEYS, ARGV columns, reply
//! and the records it writes), the registry of [`scripts`] is built from
//! those declarations, and each section's calls and reply decoders live in
//! the file named like the section (`buckets.rs` next to `store/buckets.rs`).
//!
//! Scripts are embedded with `include_str!`, loaded on every primary at connect
//! time, and reloaded on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a
//! failover). The client reconnects with exponential backoff and gives every
//! command a timeout; it never re-sends a script whose connection died
//! mid-flight (a purchase is not idempotent without its request id), so such a
//! call fails and the engine resolves what happened. A call the server refused
//! because a Cluster's slots were moving never ran: [`topology`] sends it again,
//! keeps the slot table fresh and fred's routing task alive.

mod buckets;
#[cfg(test)]
mod contract;
mod draws;
mod durability;
mod events;
mod holds;
mod leases;
mod limits;
mod offers;
mod releases;
mod retire;
mod scripts;
mod steps;
mod streams;
mod topology;
mod transfers;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use self::scripts::{Scripts, reply};
use self::steps::{Decl, K, Step};
use super::{Capabilities, Store, StoreError};
use crate::domain::ids::EventId;
use crate::domain::keys::{BucketKeys, BucketRef, EventKeys};
use crate::domain::model::{OrderEntry, RequestRecord};

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://host:port` or `redis-cluster://host:port?node=host:port&node=…`.
    pub url: String,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// Key namespace (`ss` unless a shared Redis must keep users apart).
    pub namespace: String,
    /// How long `connect` waits for the first connection.
    pub(crate) connect_timeout: Duration,
    /// How often a Cluster's slot table is refreshed besides on redirection
    /// (zero: only on redirection).
    pub(crate) cluster_refresh: Duration,
    /// Purchases acknowledged only once on this many replicas (`WAIT`); 0: off.
    pub min_replicas: u32,
    /// How long a step waits for `min_replicas` before it fails.
    pub replica_timeout: Duration,
}

impl RedisOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            cluster_refresh: Duration::from_secs(5),
            min_replicas: 0,
            replica_timeout: Duration::from_millis(250),
            namespace: crate::domain::keys::NAMESPACE.to_owned(),
        }
    }
}

/// The Redis (standalone or Cluster) store.
#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    scripts: Arc<Scripts>,
    namespace: Arc<str>,
    purchase_keys: Arc<RwLock<HashMap<BucketRef, Arc<[Key]>>>>,
    /// How long a call refused by a moving slot is tried again.
    retry_budget: Duration,
    /// The durability setting, when on.
    durability: Option<durability::Durability>,
    /// Stops the router watchdog and the slot refresh with the last clone.
    _tasks: Arc<tokio_util::sync::DropGuard>,
}

impl RedisStore {
    /// Connects, and loads every script on every primary.
    pub async fn connect(opts: &RedisOptions) -> Result<Self, StoreError> {
        let mut config = Config::from_url(&opts.url)
            .map_err(|e| StoreError::Unavailable(format!("bad Redis URL {:?}: {e}", opts.url)))?;
        let mut connection = ConnectionConfig {
            connection_timeout: opts.connect_timeout,
            internal_command_timeout: opts.connect_timeout,
            // A command whose connection died may have run: never re-send it.
            max_command_attempts: 1,
            ..ConnectionConfig::default()
        };
        topology::configure(&mut config, &mut connection);
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = opts.command_timeout)
            .set_connection_config(connection)
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .map_err(unavailable)?;
        let router = tokio::time::timeout(opts.connect_timeout, client.init())
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "no answer from Redis at {} within {:?}",
                    opts.url, opts.connect_timeout
                ))
            })?
            .map_err(unavailable)?;
        let tasks = tokio_util::sync::CancellationToken::new();
        topology::watch(
            client.clone(),
            router,
            opts.cluster_refresh,
            opts.connect_timeout,
            tasks.clone(),
        );
        let store = Self {
            client,
            scripts: Arc::new(Scripts::new()),
            namespace: opts.namespace.as_str().into(),
            purchase_keys: Arc::default(),
            retry_budget: opts.command_timeout,
            durability: (opts.min_replicas > 0).then_some(durability::Durability {
                min_replicas: opts.min_replicas,
                timeout: opts.replica_timeout,
            }),
            _tasks: Arc::new(tasks.drop_guard()),
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// `SCRIPT LOAD` of every script on every primary.
    pub(crate) async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in self.scripts.all() {
            script.load(&self.client).await.map_err(unavailable)?;
        }
        Ok(())
    }

    /// The underlying client, for diagnostics and tests (INFO, SCRIPT FLUSH …).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn keys(&self, bucket: &BucketRef) -> BucketKeys {
        bucket.keys_in(&self.namespace)
    }

    /// A bucket's order stream (`keys(bucket).orders`, formatted alone).
    fn orders_key(&self, bucket: &BucketRef) -> String {
        bucket.key_in(&self.namespace, "orders")
    }

    fn event_keys(&self, event: &EventId) -> EventKeys {
        EventKeys::in_namespace(&self.namespace, event)
    }

    /// A declared step's KEYS on `at`, in its order (with its optional
    /// last keys when `more`).
    fn keys_for(&self, step: &Decl, at: At<'_>, more: bool) -> Vec<String> {
        let (bucket, event, mut given) = match at {
            At::Bucket(b) => (Some(b), None, Vec::new()),
            At::BucketWith(b, given) => (Some(b), None, given),
            At::Event(e) => (None, Some(e), Vec::new()),
            At::Given(given) => (None, None, given),
        };
        given.reverse();
        let extra = if more { step.more_keys } else { &[] };
        let mut keys = Vec::with_capacity(step.keys.len() + extra.len());
        for key in step.keys.iter().chain(extra) {
            match (key, bucket, event) {
                (K::Bucket(k), Some(b), _) => keys.push(b.key_in(&self.namespace, k.name())),
                (K::Event(k), _, Some(e)) => keys.push(k.of(&self.namespace, e)),
                (K::Event(k), Some(b), _) => keys.push(k.of(&self.namespace, &b.event)),
                (K::Given(_), ..) => keys.extend(given.pop()),
                (K::Each(_), ..) => keys.extend(given.drain(..).rev()),
                _ => panic!("{}: key {key:?} has no place in this call", step.name),
            }
        }
        keys
    }

    /// Runs a declared step on `at`.
    async fn run<S: Step>(&self, step: S, at: At<'_>) -> Result<Value, StoreError> {
        let keys = self.keys_for(S::DECL, at, false);
        self.eval(self.scripts.get(S::DECL), keys, step.args())
            .await
    }

    /// Runs a declared bucket step that answers an array, or [`reply::STALE`].
    async fn run_bucket<S: Step>(
        &self,
        bucket: &BucketRef,
        step: S,
    ) -> Result<Vec<Value>, StoreError> {
        array_or_stale(bucket, self.run(step, At::Bucket(bucket)).await?)
    }

    /// Runs a declared step answering 1 (applied) or 0.
    async fn run_flag<S: Step>(&self, step: S, at: At<'_>) -> Result<bool, StoreError> {
        Ok(num(&self.run(step, at).await?)? == 1)
    }

    /// EVALSHA; on `NOSCRIPT` (scripts flushed, a restart, a failover) the
    /// same call once more as EVAL with the script's body, which cannot miss and
    /// caches the script again on exactly the node that lost it.
    async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        // Moved into fred's types (no copy), whose clones are reference counts.
        let keys: Vec<Key> = keys.into_iter().map(Key::from).collect();
        let args: Vec<Value> = args.into_iter().map(Value::from).collect();
        self.eval_raw(script, keys, args).await
    }

    /// EVALSHA with fred's own key and value types (the hot path builds them
    /// directly: cached keys, integers as integers). A call refused while the
    /// Cluster's slots move is sent again ([`topology`]).
    async fn eval_raw(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let (keys, args) = (&keys, &args);
        self.call(|| async move {
            // fred takes its arguments by value: one copy per attempt (the
            // values are reference-counted buffers), a second only on NOSCRIPT.
            match script
                .evalsha(&self.client, keys.clone(), args.clone())
                .await
            {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    let lua = script
                        .lua()
                        .cloned()
                        .expect("scripts are built from their Lua");
                    self.client.eval(lua, keys.clone(), args.clone()).await
                }
                other => other,
            }
        })
        .await
    }

    /// One Redis call, sent again while the Cluster's slots move and refuse
    /// it ([`topology::retrying`], within the command timeout).
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        topology::retrying(self.retry_budget, call).await
    }

    /// Runs a bucket script that answers an array, or [`reply::STALE`].
    async fn eval_bucket(
        &self,
        bucket: &BucketRef,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Vec<Value>, StoreError> {
        array_or_stale(bucket, self.eval(script, keys, args).await?)
    }

    /// A HASH read whole (`HGETALL`).
    async fn hash(&self, key: String) -> Result<HashMap<String, String>, StoreError> {
        self.call(|| self.client.hgetall(key.clone())).await
    }
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        if self.client.is_clustered() {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::REDIS
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|| self.client.ping::<()>(None)).await
    }

    /// Drops the cached purchase keys of `event`'s buckets (every layout).
    fn forget_event(&self, event: &EventId) {
        self.purchase_keys
            .write()
            .expect("key cache poisoned")
            .retain(|b, _| &b.event != event);
    }

    fn cached_entries(&self) -> usize {
        self.purchase_keys.read().expect("key cache poisoned").len()
    }

    fn spread(&self, event: &EventId, generation: u32, max: u32) -> u32 {
        use fred::interfaces::ClusterInterface;
        let Some(routing) = self.client.cached_cluster_state() else {
            return 1;
        };
        let masters = routing.unique_primary_nodes().len();
        let mut seen = std::collections::HashSet::new();
        for b in 0..max {
            let tag = BucketRef::new(event, generation, b).tag();
            if let Some(server) = routing.get_server(crate::domain::keys::slot(&tag)) {
                seen.insert(server.clone());
            }
            if seen.len() >= masters {
                return b + 1;
            }
        }
        max.max(1)
    }
}

/// Where a step runs: what its KEYS are formatted from.
enum At<'a> {
    /// A bucket's keys (and its event's).
    Bucket(&'a BucketRef),
    /// A bucket's keys, and the keys the caller names ([`K::Given`],
    /// [`K::Each`]) in their order.
    BucketWith(&'a BucketRef, Vec<String>),
    /// An event's meta slot.
    Event(&'a EventId),
    /// Only keys the caller names.
    Given(Vec<String>),
}

// ---- errors and reply decoding shared by the sections ----

fn unavailable(e: Error) -> StoreError {
    match e.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Backpressure
        | ErrorKind::Cluster
        | ErrorKind::Routing => StoreError::Unavailable(e.to_string()),
        // Refused (never ran) or cut off (may have run): not this version's
        // misunderstanding of a reply, so never a protocol error.
        _ if topology::refusal(&e).is_some()
            || e.details().starts_with("CLUSTERDOWN")
            || e.details().starts_with("MASTERDOWN")
            || e.details().starts_with("Too many failed write attempts") =>
        {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Protocol(e.to_string()),
    }
}

fn protocol(what: &str, got: &Value) -> StoreError {
    StoreError::Protocol(format!("expected {what}, got {got:?}"))
}

/// The reply's parts, or [`StoreError::Stale`] for [`reply::STALE`].
fn array_or_stale(bucket: &BucketRef, v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(parts) => Ok(parts),
        v if is_stale(&v) => Err(StoreError::Stale(bucket.tag())),
        other => Err(protocol("array", &other)),
    }
}

fn is_stale(v: &Value) -> bool {
    v.as_str().as_deref() == Some(reply::STALE)
}

fn text(v: &Value) -> Result<String, StoreError> {
    v.as_str()
        .map(|s| s.into_owned())
        .ok_or_else(|| protocol("string", v))
}

fn num(v: &Value) -> Result<u64, StoreError> {
    v.as_u64().ok_or_else(|| protocol("number", v))
}

/// The reply code, the first part of a script's array reply.
fn code(parts: &[Value]) -> Result<String, StoreError> {
    parts
        .first()
        .ok_or_else(|| StoreError::Protocol("empty reply".into()))
        .and_then(text)
}

fn arg(parts: &[Value], i: usize) -> Result<&Value, StoreError> {
    parts
        .get(i)
        .ok_or_else(|| StoreError::Protocol(format!("reply too short: {parts:?}")))
}

/// A reply code no decoder of `step` knows.
fn unknown(step: &str, code: &str) -> StoreError {
    StoreError::Protocol(format!("{step} reply {code:?}"))
}

fn request_record(v: &Value) -> Result<RequestRecord, StoreError> {
    let s = text(v)?;
    RequestRecord::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad record {s:?}")))
}

fn order_entry(v: &Value) -> Result<OrderEntry, StoreError> {
    let s = text(v)?;
    OrderEntry::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad order entry {s:?}")))
}
