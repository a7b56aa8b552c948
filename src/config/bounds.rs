//! Every numeric setting and the range it is accepted in.
//!
//! One table: [`Settings::validate`](super::Settings::validate) refuses a
//! value outside its range with an error that names the setting and both
//! ends, and the bounds test (`tests/it/bounds.rs`) runs a sale, a flush
//! through a database outage, a reshard and a close with every setting at
//! its smallest and at its largest accepted value: what the configuration
//! accepts must work, and where it did not the range shrank to what does.
//! The ranges that relate two settings (a lease at least twice its interval,
//! markers that outlive their sagas …) stay in `validate`.
//!
//! Each setting is read and written as an `f64` through plain function
//! pointers (every integer setting here is far below 2^53).

use super::Settings;

/// A numeric setting: its dotted name, its accepted range, and how to read
/// and write it.
pub struct Numeric {
    pub name: &'static str,
    pub min: f64,
    pub max: f64,
    pub get: fn(&Settings) -> f64,
    pub set: fn(&mut Settings, f64),
}

impl Numeric {
    /// The range as an error says it.
    pub fn range(&self) -> String {
        format!("must be between {} and {}", self.min, self.max)
    }
}

/// A setting's value as an `f64`, and back (an optional one: absent reads
/// as its smallest value, and is written present).
trait AsF64: Sized {
    fn f64(&self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! as_f64 {
    ($($t:ty),*) => {$(
        impl AsF64 for $t {
            fn f64(&self) -> f64 {
                *self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
        impl AsF64 for Option<$t> {
            fn f64(&self) -> f64 {
                self.map_or(0.0, |v| v as f64)
            }
            fn from_f64(v: f64) -> Self {
                Some(v as $t)
            }
        }
    )*};
}

as_f64!(u32, u64, usize, f64);

macro_rules! numeric {
    ($($name:literal: $($field:ident).+ in $min:expr, $max:expr;)*) => {
        /// Every numeric setting (see the module docs).
        pub const NUMERIC: &[Numeric] = &[$(
            Numeric {
                name: $name,
                min: $min as f64,
                max: $max as f64,
                get: |s| AsF64::f64(&s.$($field).+),
                set: |s, v| s.$($field).+ = AsF64::from_f64(v),
            },
        )*];
    };
}

/// An hour and a day, in ms.
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

numeric! {
    "server.body_limit_bytes": server.body_limit_bytes in 256, 16 << 20;
    "server.request_timeout_ms": server.request_timeout_ms in 100, 600_000;
    "server.gauges_interval_ms": server.gauges_interval_ms in 10, HOUR_MS;
    "server.metrics_retention_ms": server.metrics_retention_ms in 1_000, DAY_MS;
    "server.shutdown_grace_ms": server.shutdown_grace_ms in 0, 600_000;
    "server.header_read_timeout_ms": server.header_read_timeout_ms in 100, 600_000;
    // Idle keep-alive connections hold their place until
    // server.header_read_timeout_ms: with a handful of places, a client past
    // them waited that long for each request (at 1, 16 clients got a few
    // answers a minute).
    "server.max_connections": server.max_connections in 64, 1_000_000;
    "server.worker_threads": server.worker_threads in 0, 1024;
    "store.command_timeout_ms": store.command_timeout_ms in 100, 600_000;
    "store.connect_timeout_ms": store.connect_timeout_ms in 100, 600_000;
    "store.cluster_refresh_ms": store.cluster_refresh_ms in 0, HOUR_MS;
    "store.min_replicas": store.min_replicas in 0, 16;
    "store.replica_timeout_ms": store.replica_timeout_ms in 1, 60_000;
    "database.flush_batch": database.flush_batch in 1, 10_000;
    // Workers past 32 never read: a round is one batch a worker.
    "database.flush_workers": database.flush_workers in 1, 32;
    // The flush lag when idle: at 60 s the ledger, the audit and an outage's
    // backlog waited a minute between rounds.
    "database.flush_block_ms": database.flush_block_ms in 1, 10_000;
    "database.claim_idle_ms": database.claim_idle_ms in 100, HOUR_MS;
    "database.flush_sweep_buckets_per_s": database.flush_sweep_buckets_per_s in 1, 1_000_000;
    // PostgreSQL's own default is 100 connections for every client together.
    "database.max_connections": database.max_connections in 1, 64;
    "database.audit_interval_ms": database.audit_interval_ms in 0, DAY_MS;
    "engine.max_passes": engine.max_passes in 1, 64;
    "engine.sold_out_mark_ttl_ms": engine.sold_out_mark_ttl_ms in 0, 60_000;
    "engine.reshard_wait_ms": engine.reshard_wait_ms in 0, 600_000;
    "engine.gather_lease_ttl_ms": engine.gather_lease_ttl_ms in 100, 600_000;
    "engine.gather_wait_ms": engine.gather_wait_ms in 0, 600_000;
    "engine.marker_ttl_ms": engine.marker_ttl_ms in 1_000, 8 * DAY_MS;
    "engine.stale_saga_after_ms": engine.stale_saga_after_ms in 100, DAY_MS;
    "engine.sweep_interval_ms": engine.sweep_interval_ms in 10, DAY_MS;
    "rate_limit.per_user_per_sec": rate_limit.per_user_per_sec in 0, 1_000_000;
    "rate_limit.global_per_sec": rate_limit.global_per_sec in 0, 100_000_000;
    "rate_limit.burst": rate_limit.burst in 0, 100_000_000;
    "rebalancer.interval_ms": rebalancer.interval_ms in 10, HOUR_MS;
    "rebalancer.lease_ttl_ms": rebalancer.lease_ttl_ms in 20, 2 * HOUR_MS;
    "rebalancer.skew_threshold": rebalancer.skew_threshold in 1, 1_000;
    "rebalancer.gather_below": rebalancer.gather_below in 0, 1;
    "rebalancer.max_moves_per_round": rebalancer.max_moves_per_round in 0, 1_024;
    "rebalancer.horizon_ms": rebalancer.horizon_ms in 1, HOUR_MS;
    "rebalancer.grow_above_per_bucket": rebalancer.grow_above_per_bucket in 0.001, 1e9;
    "rebalancer.grow_target_per_bucket": rebalancer.grow_target_per_bucket in 0.001, 1e9;
    "rebalancer.grow_max_one_server": rebalancer.grow_max_one_server in 1, 1_024;
    "rebalancer.shrink_orders_per_bucket": rebalancer.shrink_orders_per_bucket in 1, 1_000_000;
    "rebalancer.resize_interval_ms": rebalancer.resize_interval_ms in 0, DAY_MS;
    "rebalancer.resize_max_sold": rebalancer.resize_max_sold in 0, 1u64 << 53;
    "batching.max_batch": batching.max_batch in 1, crate::domain::model::MAX_BATCH;
    "batching.max_wait_us": batching.max_wait_us in 0, 100_000;
    "batching.shared_lanes": batching.shared_lanes in 1, 256;
    "outbox.duplicate_window_ms": outbox.duplicate_window_ms in 1_000, DAY_MS;
    "outbox.batch": outbox.batch in 1, 10_000;
    "outbox.interval_ms": outbox.interval_ms in 1, 60_000;
    "outbox.lease_ttl_ms": outbox.lease_ttl_ms in 100, HOUR_MS;
    "outbox.publish_timeout_ms": outbox.publish_timeout_ms in 10, 600_000;
    "outbox.replay_ms": outbox.replay_ms in 0, 365 * DAY_MS;
    "outbox.retention_ms": outbox.retention_ms in 60_000, 365 * DAY_MS;
    "outbox.prune_interval_ms": outbox.prune_interval_ms in 100, DAY_MS;
    "outbox.webhook_timeout_ms": outbox.webhook_timeout_ms in 10, 600_000;
    "outbox.webhook_retry_min_ms": outbox.webhook_retry_min_ms in 1, 600_000;
    "outbox.webhook_retry_max_ms": outbox.webhook_retry_max_ms in 1, DAY_MS;
    "outbox.webhook_pause_after_failures": outbox.webhook_pause_after_failures in 1, 1_000_000;
    "outbox.webhook_pause_after_ms": outbox.webhook_pause_after_ms in 1, 30 * DAY_MS;
}

/// A setting of the table by name.
pub fn numeric(name: &str) -> Option<&'static Numeric> {
    NUMERIC.iter().find(|n| n.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_in_its_range_and_every_setting_is_named_once() {
        let defaults = Settings::default();
        for n in NUMERIC {
            let v = (n.get)(&defaults);
            assert!(
                n.min <= v && v <= n.max,
                "{}: default {v} out of range",
                n.name
            );
        }
        let mut names: Vec<&str> = NUMERIC.iter().map(|n| n.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), NUMERIC.len(), "each setting once");
    }

    #[test]
    fn a_value_past_either_end_is_refused_naming_the_setting_and_its_range() {
        for n in NUMERIC {
            for past in [n.min - 1.0, n.max + 1.0] {
                let mut s = Settings::default();
                (n.set)(&mut s, past);
                // An unsigned setting cannot hold a value below 0, nor an
                // f64 one past 2^53 apart from it.
                let held = (n.get)(&s);
                if held < n.min || held > n.max {
                    let e = s.validate().expect_err(n.name).to_string();
                    assert!(
                        e.contains(n.name) && e.contains(&n.range()),
                        "{}: {e}",
                        n.name
                    );
                }
            }
        }
    }
}
