//! Keeps the per-bucket gauges fresh from a background task, so a scrape of
//! `/metrics` never costs a store call.
//!
//! Every `interval` the task lists the events, reads each event's buckets (one
//! concurrent round per event), and sets `shardstock_bucket_remaining`,
//! `shardstock_bucket_skew_ratio` and the event totals. The first time it sees
//! an event it also initialises the event's counters to 0, so every series a
//! dashboard or alert refers to exists before it first moves.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::ids::EventId;
use crate::engine::{Engine, EventView};
use crate::metrics as m;
use crate::store::Store;

/// Sets every gauge of one event from a view.
pub fn publish(view: &EventView) {
    let event = view.id.to_string();
    for b in &view.buckets {
        metrics::gauge!(m::BUCKET_REMAINING, "event" => event.clone(), "bucket" => b.index.to_string())
            .set(b.remaining as f64);
    }
    metrics::gauge!(m::BUCKET_SKEW, "event" => event.clone()).set(view.skew);
    metrics::gauge!(m::EVENT_STOCK, "event" => event.clone()).set(view.stock as f64);
    metrics::gauge!(m::EVENT_REMAINING, "event" => event.clone()).set(view.remaining as f64);
    metrics::gauge!(m::EVENT_BUCKETS, "event" => event).set(f64::from(view.bucket_count));
}

/// Registers every per-event counter at 0.
pub fn initialise(event: &EventId) {
    let e = event.to_string();
    for outcome in [
        "ok",
        "sold_out",
        "limit_exceeded",
        "invalid",
        "replayed",
        "error",
    ] {
        metrics::counter!(m::PURCHASES, "event" => e.clone(), "outcome" => outcome).increment(0);
    }
    for name in [
        m::PURCHASED_UNITS,
        m::CANCELS,
        m::CONSOLIDATIONS,
        m::SAGAS_SWEPT,
        m::REBALANCE_MOVED_UNITS,
        m::REBALANCE_TRANSFERS,
        m::LEADER_CHANGES,
        m::FENCING_REJECTIONS,
        m::RESHARDS,
        m::DB_GUARD_VIOLATIONS,
    ] {
        metrics::counter!(name, "event" => e.clone()).increment(0);
    }
    metrics::gauge!(m::LEADER, "event" => e).set(0.0);
}

/// Refreshes the gauges every `interval` until `stop`.
pub async fn run<S: Store>(engine: Arc<Engine<S>>, interval: Duration, stop: CancellationToken) {
    let mut seen: HashSet<EventId> = HashSet::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let events = match engine.store().list_events().await {
            Ok(events) => events,
            Err(e) => {
                m::store_error("list_events");
                tracing::warn!(error = %e, "gauges: listing events failed");
                continue;
            }
        };
        for event in events {
            if seen.insert(event.clone()) {
                initialise(&event);
            }
            match engine.view(&event).await {
                Ok(view) => publish(&view),
                Err(e) => tracing::debug!(%event, error = %e, "gauges: view failed"),
            }
        }
    }
}
