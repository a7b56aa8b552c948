//! Configuration: a TOML file (`config/shardstock.toml`), then environment
//! variables and command-line flags on top (see `cli`).
//!
//! Every section has defaults, so an empty file is a valid configuration (the
//! embedded memory store, no events). Unknown keys are errors, and every error
//! names the field it is about: a typo in a flash-sale config should stop the
//! start, not be ignored. Defaults are not silent either: `source` says which
//! file was read or that none was (the start logs it), and `show` writes the
//! resolved settings back as TOML with the secrets masked (`check-config`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod bounds;
mod load;
#[cfg(test)]
mod shipped;
mod show;
mod source;
#[cfg(test)]
mod tests;
pub use bounds::{NUMERIC, Numeric, numeric};
pub use show::{mask_url, show};
pub use source::ConfigSource;

/// The most a CA file (`outbox.webhook_ca_file`) may hold.
const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// The certificates of a PEM file of CA certificates: at least one, the
/// file at most 1 MiB. The error says why, for the field's message.
pub fn read_ca_file(path: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {path:?}: {e}"))?
        .len();
    if size > MAX_CA_FILE_BYTES {
        return Err(format!(
            "{path:?} is {size} bytes, more than a CA file's {MAX_CA_FILE_BYTES}"
        ));
    }
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path:?} is not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path:?} holds no PEM certificate"));
    }
    Ok(certs)
}

use crate::domain::ids::EventId;
use crate::domain::model::{BucketCount, BucketRange, DEFAULT_MAX_PER_ORDER, EventSpec};

/// What to do with an event the ledger has on sale but the store lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LostState {
    /// Recreate the buckets from the ledger.
    Rebuild,
    /// Keep the event unavailable until `shardstock recover`.
    Refuse,
}

/// How log lines are written (`[server] log_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("cannot write the settings as TOML: {0}")]
    Show(String),
}

fn invalid(field: impl Into<String>, reason: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.to_string(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub database: DatabaseSettings,
    pub engine: EngineSettings,
    pub rate_limit: RateLimitSettings,
    pub rebalancer: RebalancerSettings,
    pub batching: BatchSettings,
    pub outbox: OutboxSettings,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventSettings>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<ReleaseSettings>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address to listen on.
    pub listen: String,
    /// Bearer token for admin endpoints; empty: admin endpoints are disabled
    /// (a warning at start; each answers a 401 that says so).
    pub admin_token: String,
    /// Largest request body accepted.
    pub body_limit_bytes: usize,
    /// Time limit for one request.
    pub request_timeout_ms: u64,
    /// How often the bucket gauges are refreshed.
    pub gauges_interval_ms: u64,
    /// A series of `/metrics` not updated this long is dropped: a closed or
    /// archived event's gauges and counters go this long after its last
    /// change (the open events' are refreshed well within it). Read once a
    /// process: the first application built sets it.
    pub metrics_retention_ms: u64,
    /// How long shutdown may take in all: in-flight requests, then the
    /// background tasks' last work (the flusher's final drain). Past it the
    /// process exits anyway, non-zero if orders were left unflushed.
    pub shutdown_grace_ms: u64,
    /// A request's headers must arrive within this long after the connection
    /// opened or went idle (slow clients and idle keep-alives are closed).
    pub header_read_timeout_ms: u64,
    /// Open client connections at most (64 or more); beyond it new clients
    /// wait to be accepted, and an idle keep-alive connection holds its place
    /// until `header_read_timeout_ms`.
    pub max_connections: usize,
    /// `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// The runtime's worker threads; 0: one per core. On a box whose cores
    /// are shared with Redis or the database, fewer workers than cores cost
    /// less CPU a purchase (BENCHMARKS.md, "Worker threads").
    pub worker_threads: usize,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_token: String::new(),
            body_limit_bytes: 16 * 1024,
            request_timeout_ms: 10_000,
            gauges_interval_ms: 1_000,
            metrics_retention_ms: 900_000,
            shutdown_grace_ms: 10_000,
            header_read_timeout_ms: 10_000,
            max_connections: 8_192,
            log_format: LogFormat::Text,
            worker_threads: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    /// Absent: the embedded memory store. `redis://host:port` (standalone) or
    /// `redis-cluster://host:port?node=host:port&node=…` (Cluster).
    pub redis_url: Option<String>,
    pub command_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Prefix of every key (`<namespace>:{…}`): several deployments can share a Redis.
    pub namespace: String,
    /// How often a Redis Cluster's slot table is refreshed besides on every
    /// redirection (0: only on redirection).
    pub cluster_refresh_ms: u64,
    /// Acknowledge a purchase only once its writes are on this many replicas
    /// of its master (`WAIT`, one per batch); 0: off (Redis replicates
    /// asynchronously, a failover can lose the last acknowledged writes).
    pub min_replicas: u32,
    /// How long a purchase waits for `min_replicas`; past it the answer is
    /// `503` with `"outcome": "unknown"` (a retry with the request id tells).
    pub replica_timeout_ms: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            redis_url: None,
            namespace: crate::domain::keys::NAMESPACE.to_owned(),
            command_timeout_ms: 2_000,
            connect_timeout_ms: 5_000,
            cluster_refresh_ms: 5_000,
            min_replicas: 0,
            replica_timeout_ms: 250,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://data/shardstock.db` (embedded default) or `postgres://…`.
    pub url: String,
    /// Order records per insert batch.
    pub flush_batch: usize,
    /// Flush workers per instance on PostgreSQL: one reads every round, the
    /// others help while the rounds come back full. SQLite (one writer at a
    /// time) has one.
    pub flush_workers: usize,
    /// How long a flush worker waits after a round that found less than a
    /// batch (or nothing) before it reads again: the flush lag when idle, and
    /// what fills the batches at sale rates.
    pub flush_block_ms: u64,
    /// Records pending this long in a dead consumer are claimed.
    pub claim_idle_ms: u64,
    /// The flusher's slow scan for records other instances left: buckets
    /// checked per second, round-robin over every open event (a full pass
    /// over N buckets takes N / this seconds). Its cost does not grow with
    /// the number of events.
    pub flush_sweep_buckets_per_s: u32,
    pub max_connections: u32,
    /// An event the ledger has on sale but the store lost (Redis restarted
    /// empty): `rebuild` its buckets from the ledger, or `refuse` it until
    /// `shardstock recover`. Default: rebuild on the embedded store (it never
    /// survives a restart), refuse on Redis. For a partial loss (found by the
    /// audits: the store lost some writes the ledger has), `rebuild` takes
    /// the units orders in the ledger hold off sale, `refuse` holds the
    /// event until `shardstock recover`.
    pub lost_state: Option<LostState>,
    /// How often the events this instance sold since the last audit are
    /// audited (the `shardstock_audit_balanced` gauge; a partial loss is
    /// found and handled by `lost_state` there); 0 = never.
    pub audit_interval_ms: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://data/shardstock.db".into(),
            flush_batch: 4_000,
            flush_workers: 4,
            flush_block_ms: 100,
            claim_idle_ms: 10_000,
            flush_sweep_buckets_per_s: 256,
            max_connections: 8,
            lost_state: None,
            audit_interval_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSettings {
    pub max_passes: u32,
    pub sold_out_mark_ttl_ms: u64,
    pub reshard_wait_ms: u64,
    pub gather_lease_ttl_ms: u64,
    pub gather_wait_ms: u64,
    /// Lifetime of a saga's probe markers; its end deletes them sooner.
    pub marker_ttl_ms: u64,
    /// A saga pending this long is ended by the sweeper of any instance.
    pub stale_saga_after_ms: u64,
    /// How often each instance sweeps for stale sagas.
    pub sweep_interval_ms: u64,
}

impl Default for EngineSettings {
    /// The engine's defaults: `EngineOptions::default` and the sweeper's are
    /// these (`app::options`), and `config/shardstock.toml` states them.
    fn default() -> Self {
        Self {
            max_passes: 4,
            sold_out_mark_ttl_ms: 1_000,
            reshard_wait_ms: 5_000,
            gather_lease_ttl_ms: 2_000,
            gather_wait_ms: 2_000,
            marker_ttl_ms: 3_600_000,
            stale_saga_after_ms: 30_000,
            sweep_interval_ms: 5_000,
        }
    }
}

/// Seed 000's first layer: refuse floods before they reach the store. Off by default.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitSettings {
    /// Purchases per second per user (0 = off).
    pub per_user_per_sec: u32,
    /// Purchases per second for the whole instance (0 = off).
    pub global_per_sec: u32,
    /// Burst allowance on top of the rate (default: one second's worth).
    pub burst: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RebalancerSettings {
    pub enabled: bool,
    /// Time between rounds.
    pub interval_ms: u64,
    /// Leader lease TTL (the leader renews it every round).
    pub lease_ttl_ms: u64,
    /// Skew above which units are moved toward where demand is.
    pub skew_threshold: f64,
    /// Below this fraction of the stock left, fragments are gathered.
    pub gather_below: f64,
    /// At most this many transfers per round.
    pub max_moves_per_round: u32,
    /// A bucket should hold this long of its own buyers' demand.
    pub horizon_ms: u64,
    /// Adaptive events (`buckets = "auto"` or `{ min, max }`) grow when their
    /// demand per bucket is above this (units/s) ...
    pub grow_above_per_bucket: f64,
    /// ... to about this much per bucket (at least fourfold).
    pub grow_target_per_bucket: f64,
    /// On one Redis server, to at most this many buckets (a multiple of
    /// `batching.shared_lanes` past them); 1: not at all, since an event of
    /// fewer buckets than lanes already has a call in flight on each.
    pub grow_max_one_server: u32,
    /// On a Redis Cluster, grow an event whose buckets already reach every
    /// master (off: it keeps that layout; an adaptive event is created on
    /// every master when its stock allows).
    pub grow_past_masters: bool,
    /// They shrink when fewer than this many full orders per bucket are left.
    pub shrink_orders_per_bucket: u64,
    /// At least this long between two automatic reshards of one event.
    pub resize_interval_ms: u64,
    /// No automatic reshard once an event has sold more units than this (a
    /// reshard moves every buyer's records while purchases wait).
    pub resize_max_sold: u64,
}

impl Default for RebalancerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ms: 250,
            lease_ttl_ms: 3_000,
            skew_threshold: 1.5,
            gather_below: 0.1,
            max_moves_per_round: 8,
            horizon_ms: 1_000,
            grow_above_per_bucket: 20_000.0,
            grow_target_per_bucket: 15_000.0,
            grow_max_one_server: 1,
            grow_past_masters: false,
            shrink_orders_per_bucket: 8,
            resize_interval_ms: 2_000,
            resize_max_sold: 100_000,
        }
    }
}

/// Order events out: the relay of the ledger's outbox (docs/DESIGN.md,
/// "Order events out"). Off by default: the flusher then writes no outbox and
/// a flushed order costs what it did before the outbox; on, every change is
/// written and the relay runs where a target is configured.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxSettings {
    /// Order events on: the flusher writes each batch's order changes (and a
    /// close its `event.closed`) into the ledger's outbox, the changes
    /// endpoint serves them, and the relay publishes them to `nats_url`.
    pub enabled: bool,
    /// Absent: no JetStream relay. `nats://host:port`: the relay publishes
    /// every change to NATS JetStream.
    pub nats_url: Option<String>,
    /// The deployment's JetStream stream (created if missing), capturing the
    /// subjects `<subject_prefix>.>`.
    pub stream: String,
    /// Subjects are `<subject_prefix>.<event>.<type>`.
    pub subject_prefix: String,
    /// The stream's duplicate window: a change published again within it (a
    /// relay that died between publish and mark) is dropped by the server.
    pub duplicate_window_ms: u64,
    /// Changes a relay round reads and publishes at most.
    pub batch: usize,
    /// How long the relay waits after a round that found nothing new.
    pub interval_ms: u64,
    /// The relay leader's lease (renewed every round).
    pub lease_ttl_ms: u64,
    /// How long one publish may wait for the server's acknowledgement.
    pub publish_timeout_ms: u64,
    /// A change every target has is kept this long for replays
    /// (`GET /v1/events/{id}/changes`), then pruned.
    pub replay_ms: u64,
    /// Any change is pruned this long after it happened, delivered or not:
    /// the outbox stays bounded while a target is down (its lag alert fires
    /// long before).
    pub retention_ms: u64,
    /// How often every instance prunes the outbox.
    pub prune_interval_ms: u64,
    /// How long one webhook POST may take (connect, send, answer).
    pub webhook_timeout_ms: u64,
    /// A failed webhook delivery is retried after a random wait of up to
    /// `webhook_retry_min_ms × 2^(failures − 1)`, capped at
    /// `webhook_retry_max_ms` (exponential backoff, full jitter).
    pub webhook_retry_min_ms: u64,
    pub webhook_retry_max_ms: u64,
    /// A subscription is paused after this many failed deliveries in a row,
    /// or once it has failed for `webhook_pause_after_ms` without a success,
    /// whichever comes first; the admin API resumes it from its cursor.
    pub webhook_pause_after_failures: u32,
    pub webhook_pause_after_ms: u64,
    /// A PEM file of CA certificates trusted for `https://` receivers besides
    /// the system's (a private CA); absent: the system's only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_ca_file: Option<String>,
    /// Webhook subscriptions declared here (`[[outbox.webhooks]]`); more
    /// are made with the admin API (`/v1/webhooks`). Both are kept in the
    /// ledger.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<WebhookSettings>,
}

/// A webhook subscription of the configuration (`[[outbox.webhooks]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Its name: 1 to 64 of `A-Z a-z 0-9 _ -`, unique.
    pub id: String,
    /// Where the changes are POSTed: `http://…` or `https://…` (the
    /// receiver's certificate checked against the system's roots and
    /// `webhook_ca_file`'s).
    pub url: String,
    /// The change types delivered (`order.created` …); empty or absent:
    /// every type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// The signing secrets, at least 16 bytes each: one, or two while a
    /// secret is rotated (every delivery then carries a signature by each).
    pub secrets: Vec<String>,
}

impl Default for OutboxSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            nats_url: None,
            stream: "shardstock".into(),
            subject_prefix: "shardstock".into(),
            duplicate_window_ms: 120_000,
            batch: 512,
            interval_ms: 100,
            lease_ttl_ms: 3_000,
            publish_timeout_ms: 5_000,
            replay_ms: 86_400_000,
            retention_ms: 604_800_000,
            prune_interval_ms: 60_000,
            webhook_timeout_ms: 10_000,
            webhook_retry_min_ms: 500,
            webhook_retry_max_ms: 300_000,
            webhook_pause_after_failures: 20,
            webhook_pause_after_ms: 3_600_000,
            webhook_ca_file: None,
            webhooks: Vec::new(),
        }
    }
}

/// Group commit of concurrent purchases per bucket (see the README).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSettings {
    pub enabled: bool,
    /// Purchases per script call at most.
    pub max_batch: usize,
    /// How long a call may wait for more purchases when it would go out with
    /// fewer than `max_batch` (0, the default: never — a lone purchase is sent
    /// at once; the only wait is for a call already in flight). The timer's
    /// granularity is a millisecond.
    pub max_wait_us: u64,
    /// On a standalone Redis, how many lanes the buckets share: bucket `b`
    /// queues in lane `b % shared_lanes`, and a call carries every bucket of
    /// its lane (`purchase_groups.lua`). Fewer lanes, fuller calls; more,
    /// more calls in flight. An event of fewer buckets than lanes spreads
    /// over them while the server is busy (`engine::batch`). A Cluster keeps
    /// a lane per bucket.
    pub shared_lanes: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_batch: 64,
            max_wait_us: 0,
            shared_lanes: 2,
        }
    }
}

/// An event declared in the configuration: created at start-up when absent.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    pub id: String,
    pub stock: u64,
    /// A count, `"auto"`, or `{ min = 1, max = 256 }`.
    pub buckets: BucketsSetting,
    pub per_user_limit: Option<u32>,
    pub max_per_order: Option<u32>,
    /// RFC 3339.
    pub starts_at: Option<String>,
    /// RFC 3339.
    pub ends_at: Option<String>,
    /// Purchases are holds to confirm within this many seconds (1..=86400).
    pub hold_seconds: Option<u32>,
}

/// `buckets` in `[[events]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum BucketsSetting {
    Count(u32),
    Named(String),
    Range { min: u32, max: u32 },
}

impl BucketsSetting {
    fn buckets(&self) -> Option<BucketCount> {
        match self {
            Self::Count(n) => Some(BucketCount::Fixed(*n)),
            Self::Named(s) => BucketCount::named(s),
            &Self::Range { min, max } => Some(BucketCount::Auto(BucketRange { min, max })),
        }
    }
}

impl EventSettings {
    /// The spec, validated; errors name the field (`events[i].field`).
    pub fn spec(&self, i: usize) -> Result<EventSpec, ConfigError> {
        let field = |f: &str| format!("events[{i}].{f}");
        let time = |f: &str, v: &Option<String>| {
            v.as_deref()
                .map(crate::domain::model::rfc3339_ms::parse)
                .transpose()
                .map_err(|e| invalid(field(f), e))
        };
        let buckets = self.buckets.buckets().ok_or_else(|| {
            invalid(
                field("buckets"),
                "a count, \"auto\" or { min = .., max = .. }",
            )
        })?;
        let spec = EventSpec {
            id: EventId::parse(self.id.clone()).map_err(|e| invalid(field("id"), e))?,
            stock: self.stock,
            buckets: buckets.initial(),
            auto_buckets: buckets.range(),
            per_user_limit: self.per_user_limit,
            max_per_order: self.max_per_order.unwrap_or(DEFAULT_MAX_PER_ORDER),
            starts_at: time("starts_at", &self.starts_at)?,
            ends_at: time("ends_at", &self.ends_at)?,
            hold_seconds: self.hold_seconds,
            tokens: None,
            draw: None,
        };
        spec.validate().map_err(|e| {
            use crate::domain::model::SpecError::*;
            if let BucketRange { min, max } = e {
                // The domain's message is the API's, in JSON; this file is TOML.
                return invalid(
                    field("buckets"),
                    format!(
                        "{{ min = {min}, max = {max} }}: need 1 ≤ min ≤ max ≤ {}",
                        crate::domain::model::MAX_BUCKETS
                    ),
                );
            }
            let f = match e {
                Buckets(_) | BucketRange { .. } => "buckets",
                Stock(_) => "stock",
                MaxPerOrder(_) => "max_per_order",
                PerUserLimit(_) => "per_user_limit",
                Window => "ends_at",
                HoldSeconds(_) => "hold_seconds",
                // A configured event is open (access tokens come by the API).
                TokenKeys(_) => "token_keys",
            };
            invalid(field(f), e)
        })?;
        Ok(spec)
    }
}

/// A release declared in the configuration: created at start-up when absent.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSettings {
    pub id: String,
    pub pools: Vec<PoolSettings>,
    pub per_user_limit: Option<u32>,
    pub max_per_order: Option<u32>,
    /// RFC 3339.
    pub starts_at: Option<String>,
    /// RFC 3339.
    pub ends_at: Option<String>,
    /// Orders are held this long for their buyer to confirm (1 to 86400);
    /// absent: bought at once.
    pub hold_seconds: Option<u32>,
}

/// A pool of `[[releases]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    pub id: String,
    pub stock: u64,
    /// A count, `"auto"`, or `{ min = 1, max = 256 }`.
    pub buckets: BucketsSetting,
}

impl ReleaseSettings {
    /// The spec, validated; errors name the field (`releases[i].field`).
    pub fn spec(&self, i: usize) -> Result<crate::domain::release::ReleaseSpec, ConfigError> {
        use crate::domain::release::{DEFAULT_HOMES, MAX_POOLS, PoolSpec, ReleaseSpec};
        let field = |f: &str| format!("releases[{i}].{f}");
        let id = crate::domain::release::release_id(self.id.clone())
            .map_err(|e| invalid(field("id"), e))?;
        if self.pools.is_empty() || self.pools.len() > MAX_POOLS {
            return Err(invalid(
                field("pools"),
                format!("1 to {MAX_POOLS} pools, got {}", self.pools.len()),
            ));
        }
        let time = |f: &str, v: &Option<String>| {
            v.as_deref()
                .map(crate::domain::model::rfc3339_ms::parse)
                .transpose()
                .map_err(|e| invalid(field(f), e))
        };
        let mut pools = Vec::with_capacity(self.pools.len());
        for (k, p) in self.pools.iter().enumerate() {
            let pf = |f: &str| field(&format!("pools[{k}].{f}"));
            let name =
                crate::domain::release::pool_id(p.id.clone()).map_err(|e| invalid(pf("id"), e))?;
            if self.pools[..k].iter().any(|o| o.id == p.id) {
                return Err(invalid(pf("id"), format!("pool {name} is listed twice")));
            }
            let buckets = p.buckets.buckets().ok_or_else(|| {
                invalid(pf("buckets"), "a count, \"auto\" or { min = .., max = .. }")
            })?;
            pools.push(PoolSpec {
                name,
                stock: p.stock,
                buckets: buckets.initial(),
                auto_buckets: buckets.range(),
            });
        }
        let spec = ReleaseSpec {
            id,
            pools,
            per_user_limit: self.per_user_limit,
            max_per_order: self.max_per_order.unwrap_or(DEFAULT_MAX_PER_ORDER),
            starts_at: time("starts_at", &self.starts_at)?,
            ends_at: time("ends_at", &self.ends_at)?,
            hold_seconds: self.hold_seconds,
            homes: DEFAULT_HOMES,
        };
        spec.validate().map_err(|e| {
            use crate::domain::model::SpecError::*;
            use crate::domain::release::ReleaseError;
            match &e {
                ReleaseError::Pool { pool, error } => {
                    let k = spec.pool_index(pool).unwrap_or(0);
                    let f = match error {
                        Buckets(_) | BucketRange { .. } => format!("pools[{k}].buckets"),
                        Stock(_) => format!("pools[{k}].stock"),
                        MaxPerOrder(_) => "max_per_order".into(),
                        PerUserLimit(_) => "per_user_limit".into(),
                        Window => "ends_at".into(),
                        HoldSeconds(_) => "hold_seconds".into(),
                        TokenKeys(_) => "token_keys".into(),
                    };
                    invalid(field(&f), error)
                }
                _ => invalid(field("pools"), &e),
            }
        })?;
        Ok(spec)
    }
}
