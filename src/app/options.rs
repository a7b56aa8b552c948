//! Settings → each layer's options: the one place that knows both.
//!
//! `config` is a leaf (it imports only `domain`), and the layers below do not
//! know about settings files; the composition root maps one onto the other.

use std::time::Duration;

use crate::config::{DatabaseSettings, RebalancerSettings, Settings};
use crate::control::flusher::FlushOptions;
use crate::control::rebalancer::{Policy, RebalanceOptions, Resizing};
use crate::control::sweeper::SweepOptions;
use crate::engine::EngineOptions;
use crate::http::serve::ServeOptions;
use crate::ledger::DbKind;
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
pub fn sweep(settings: &Settings) -> SweepOptions {
    let e = &settings.engine;
    SweepOptions {
        interval: Duration::from_millis(e.sweep_interval_ms),
        stale_after: Duration::from_millis(e.stale_saga_after_ms),
        ..SweepOptions::default()
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

/// The accept loop's bounds.
pub fn serve(settings: &Settings) -> ServeOptions {
    ServeOptions {
        header_read_timeout: Duration::from_millis(settings.server.header_read_timeout_ms),
        max_connections: settings.server.max_connections,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_settings_are_the_engines_defaults() {
        assert_eq!(engine(&Settings::default()), EngineOptions::default());
        assert_eq!(sweep(&Settings::default()), SweepOptions::default());
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
