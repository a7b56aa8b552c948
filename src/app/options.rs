//! Settings → each layer's options: the one place that knows both.
//!
//! `config` is a leaf (it imports only `domain`), and the layers below do not
//! know about settings files; the composition root maps one onto the other.

use std::time::Duration;

use crate::config::{DatabaseSettings, RateLimitSettings, RebalancerSettings, Settings};
use crate::control::flusher::FlushOptions;
use crate::control::rebalancer::{Policy, RebalanceOptions, Resizing};
use crate::control::relay::{PruneOptions, RelayOptions};
use crate::control::saga_sweeper::SagaSweepOptions;
use crate::control::webhook::WebhookOptions;
use crate::engine::EngineOptions;
use crate::http::serve::ServeOptions;
use crate::http::{RateLimitOptions, RouterOptions};
use crate::ledger::DbKind;
use crate::store::Rate;
use crate::store::redis::RedisOptions;

/// The engine's tunables and group commit.
pub fn engine(settings: &Settings) -> EngineOptions {
    let (e, b) = (&settings.engine, &settings.batching);
    EngineOptions {
        max_passes: e.max_passes,
        sold_out_mark_ttl: Duration::from_millis(e.sold_out_mark_ttl_ms),
        reshard_wait: Duration::from_millis(e.reshard_wait_ms),
        gather_lease_ttl: Duration::from_millis(e.gather_lease_ttl_ms),
        gather_wait: Duration::from_millis(e.gather_wait_ms),
        max_batch: b.enabled.then_some(b.max_batch),
        batch_wait: Duration::from_micros(b.max_wait_us),
        shared_lanes: b.shared_lanes,
        marker_ttl: Duration::from_millis(e.marker_ttl_ms),
    }
}

/// The sweeper's pace and bound.
pub fn sweep(settings: &Settings) -> SagaSweepOptions {
    let e = &settings.engine;
    SagaSweepOptions {
        interval: Duration::from_millis(e.sweep_interval_ms),
        stale_after: Duration::from_millis(e.stale_saga_after_ms),
        per_bucket: SagaSweepOptions::PER_BUCKET,
    }
}

/// The flusher's batches and pacing. SQLite takes one writer at a time, so
/// there one worker writes: helpers would only queue for its lock.
pub fn flush(db: &DatabaseSettings, kind: DbKind) -> FlushOptions {
    let workers = match kind {
        DbKind::Postgres => db.flush_workers.max(1),
        DbKind::Sqlite => 1,
    };
    FlushOptions {
        batch: db.flush_batch,
        workers,
        idle: Duration::from_millis(db.flush_block_ms),
        claim_idle_ms: db.claim_idle_ms,
    }
}

/// The rebalancer's rounds and policy.
pub fn rebalance(r: &RebalancerSettings) -> RebalanceOptions {
    RebalanceOptions {
        interval: Duration::from_millis(r.interval_ms),
        lease_ttl_ms: r.lease_ttl_ms,
        policy: Policy {
            horizon_s: r.horizon_ms as f64 / 1000.0,
            skew_threshold: r.skew_threshold,
            gather_below: r.gather_below,
            max_moves: r.max_moves_per_round as usize,
        },
        resizing: Resizing {
            grow_above: r.grow_above_per_bucket,
            target: r.grow_target_per_bucket,
            shrink_orders: r.shrink_orders_per_bucket,
            min_interval: Duration::from_millis(r.resize_interval_ms),
            max_moved: r.resize_max_sold,
            one_server_max: r.grow_max_one_server,
            grow_past_masters: r.grow_past_masters,
        },
    }
}

// The layers' defaults are the default settings', mapped as above: written
// once, in `config` (whose test holds `config/shardstock.toml` to them).

impl Default for EngineOptions {
    fn default() -> Self {
        engine(&Settings::default())
    }
}

impl Default for SagaSweepOptions {
    fn default() -> Self {
        sweep(&Settings::default())
    }
}

impl Default for Resizing {
    fn default() -> Self {
        rebalance(&RebalancerSettings::default()).resizing
    }
}

/// How to reach Redis; `None` for the embedded store.
pub fn redis(settings: &Settings) -> Option<RedisOptions> {
    let s = &settings.store;
    s.redis_url.as_ref().map(|url| RedisOptions {
        url: url.clone(),
        command_timeout: Duration::from_millis(s.command_timeout_ms),
        connect_timeout: Duration::from_millis(s.connect_timeout_ms),
        namespace: s.namespace.clone(),
        cluster_refresh: Duration::from_millis(s.cluster_refresh_ms),
        min_replicas: s.min_replicas,
        replica_timeout: Duration::from_millis(s.replica_timeout_ms),
    })
}

/// The bounds of every request.
pub fn router(settings: &Settings) -> RouterOptions {
    RouterOptions {
        request_timeout: Duration::from_millis(settings.server.request_timeout_ms),
        body_limit_bytes: settings.server.body_limit_bytes,
    }
}

/// The rate limits: a rate of 0 is off, and the burst is one second's worth
/// unless set (0 counts as unset).
pub(crate) fn rate_limits(r: &RateLimitSettings) -> RateLimitOptions {
    let rate = |per_sec: u32| {
        (per_sec > 0).then(|| Rate {
            per_sec,
            burst: r.burst.filter(|b| *b > 0).unwrap_or(per_sec),
        })
    };
    RateLimitOptions {
        global: rate(r.global_per_sec),
        per_user: rate(r.per_user_per_sec),
    }
}

/// The accept loop's bounds.
pub fn serve(settings: &Settings) -> ServeOptions {
    ServeOptions {
        header_read_timeout: Duration::from_millis(settings.server.header_read_timeout_ms),
        max_connections: settings.server.max_connections,
    }
}

/// The outbox relay's options; `None` without a NATS URL (no relay).
pub fn relay(o: &crate::config::OutboxSettings) -> Option<RelayOptions> {
    o.nats_url.as_ref().map(|url| RelayOptions {
        nats_url: url.clone(),
        stream: o.stream.clone(),
        subject_prefix: o.subject_prefix.clone(),
        duplicate_window: Duration::from_millis(o.duplicate_window_ms),
        batch: o.batch,
        interval: Duration::from_millis(o.interval_ms),
        lease_ttl_ms: o.lease_ttl_ms,
        publish_timeout: Duration::from_millis(o.publish_timeout_ms),
    })
}

/// How webhooks are delivered.
pub fn webhooks(o: &crate::config::OutboxSettings) -> WebhookOptions {
    WebhookOptions {
        batch: o.batch,
        interval: Duration::from_millis(o.interval_ms),
        lease_ttl_ms: o.lease_ttl_ms,
        timeout: Duration::from_millis(o.webhook_timeout_ms),
        retry_min_ms: o.webhook_retry_min_ms,
        retry_max_ms: o.webhook_retry_max_ms,
        pause_after_failures: o.webhook_pause_after_failures,
        pause_after: Duration::from_millis(o.webhook_pause_after_ms),
        // Checked when the settings were loaded; read again here.
        extra_roots: match o
            .webhook_ca_file
            .as_deref()
            .map(crate::config::read_ca_file)
        {
            None => Vec::new(),
            Some(Ok(roots)) => roots,
            Some(Err(e)) => {
                tracing::error!(error = %e, "outbox.webhook_ca_file: https:// receivers signed by it will fail");
                Vec::new()
            }
        },
    }
}

/// The configuration's webhook subscriptions, as the ledger keeps them.
pub fn config_webhooks(
    o: &crate::config::OutboxSettings,
    now_ms: i64,
) -> Vec<crate::ledger::Subscription> {
    o.webhooks
        .iter()
        .map(|w| crate::ledger::Subscription {
            id: w.id.clone(),
            url: w.url.clone(),
            types: w.types.clone(),
            secrets: w.secrets.clone(),
            origin: crate::ledger::ORIGIN_CONFIG.into(),
            created_ms: now_ms,
            paused_ms: None,
            paused_reason: None,
        })
        .collect()
}

/// How the outbox is pruned: the relay's target, if any, must have a
/// change before its replay window ends.
pub fn prune(o: &crate::config::OutboxSettings) -> PruneOptions {
    PruneOptions {
        replay: Duration::from_millis(o.replay_ms),
        retention: Duration::from_millis(o.retention_ms),
        interval: Duration::from_millis(o.prune_interval_ms),
        targets: relay(o)
            .map(|r| vec![crate::control::relay::target(&r.stream)])
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_of_zero_is_off_and_the_burst_is_a_seconds_worth_unless_set() {
        let mut r = Settings::default().rate_limit;
        assert_eq!(rate_limits(&r), RateLimitOptions::default());
        (r.per_user_per_sec, r.global_per_sec, r.burst) = (2, 0, None);
        let limits = rate_limits(&r);
        assert_eq!(limits.global, None);
        assert_eq!(
            limits.per_user,
            Some(Rate {
                per_sec: 2,
                burst: 2
            })
        );
        (r.global_per_sec, r.burst) = (100, Some(0));
        assert_eq!(
            rate_limits(&r).global,
            Some(Rate {
                per_sec: 100,
                burst: 100
            })
        );
        r.burst = Some(7);
        let limits = rate_limits(&r);
        assert_eq!(
            limits.global,
            Some(Rate {
                per_sec: 100,
                burst: 7
            })
        );
        assert_eq!(
            limits.per_user,
            Some(Rate {
                per_sec: 2,
                burst: 7
            })
        );
    }

    #[test]
    fn sqlite_flushes_with_one_worker() {
        let mut db = Settings::default().database;
        (db.flush_batch, db.flush_workers) = (2_000, 3);
        let pg = flush(&db, DbKind::Postgres);
        assert_eq!((pg.batch, pg.workers), (2_000, 3));
        let sqlite = flush(&db, DbKind::Sqlite);
        assert_eq!((sqlite.batch, sqlite.workers), (2_000, 1));
    }
}
