//! Keeps the per-bucket gauges fresh from a background task, so a scrape of
//! `/metrics` never costs a store call.
//!
//! Every `interval` the task reads the buckets of the events that need it (one
//! concurrent round per event) and sets `shardstock_bucket_remaining`,
//! `shardstock_bucket_skew_ratio` and the event totals (and a drawn draw's
//! winners, whichever instance drew). The first time it sees
//! an event it also initialises the event's counters to 0, so every series a
//! dashboard or alert refers to exists before it first moves.
//!
//! Which events need it follows activity, so an idle service reads almost
//! nothing whatever its number of events: those this process wrote to since
//! the last tick (`engine::Activity`), those seen for the first time, and one
//! other open event per tick, round-robin, so what other instances sell (or
//! the rebalancer moves) shows up within one pass over the open events.
//! Closed events and events whose sale window has ended are not read at all.
//! An event that is a release's pool also gets `shardstock_release_pool_info`
//! (its release and pool, for a dashboard's join) and its release's order
//! counters at 0.
//!
//! The recorder drops a gauge or counter not updated for
//! `server.metrics_retention_ms` (`app::metrics_handle_keeping`). So, every
//! third of that, this task sets every open event's gauges again from its
//! last view and touches its counters: an idle open event keeps its series,
//! while a closed one's go. A close sets its final values at once
//! ([`publish_closed`]), and an event that left the open set (closed by
//! another instance, or archived) gets them from here, once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::domain::model::EventStatus;
use crate::engine::{Engine, EventView};
use crate::metrics as m;
use crate::store::Store;

/// Sets every gauge of one event from a view.
pub(crate) fn publish(view: &EventView) {
    let event = view.id.to_string();
    for b in &view.buckets {
        metrics::gauge!(m::BUCKET_REMAINING, "event" => event.clone(), "bucket" => b.index.to_string())
            .set(b.remaining as f64);
    }
    metrics::gauge!(m::BUCKET_SKEW, "event" => event.clone()).set(view.skew);
    metrics::gauge!(m::EVENT_STOCK, "event" => event.clone()).set(view.stock as f64);
    metrics::gauge!(m::EVENT_REMAINING, "event" => event.clone()).set(view.remaining as f64);
    metrics::gauge!(m::EVENT_HELD, "event" => event.clone()).set(view.held as f64);
    if let Some(winners) = view.draw.as_ref().and_then(|d| d.winners) {
        metrics::gauge!(m::DRAW_WINNERS, "event" => event.clone()).set(winners as f64);
    }
    metrics::gauge!(m::EVENT_BUCKETS, "event" => event).set(f64::from(view.bucket_count));
}

/// The gauges of an event whose sale is over: nothing remaining or held in
/// any bucket, the leftover as the close counted it.
pub(crate) fn publish_closed(view: &EventView) {
    let mut over = view.clone();
    over.remaining = 0;
    over.held = 0;
    for b in &mut over.buckets {
        b.remaining = 0;
    }
    publish(&over);
    if let Some(leftover) = view.leftover {
        metrics::gauge!(m::EVENT_LEFTOVER, "event" => view.id.to_string()).set(leftover as f64);
    }
}

/// Registers every per-event counter at 0 (and keeps it alive: the
/// recorder drops series not updated for a while).
pub(crate) fn initialise(event: &EventId) {
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
        m::DB_GUARD_VIOLATIONS,
    ] {
        metrics::counter!(name, "event" => e.clone()).increment(0);
    }
    for reason in crate::control::reshard::Why::ALL {
        metrics::counter!(m::RESHARDS, "event" => e.clone(), "reason" => reason).increment(0);
    }
    metrics::gauge!(m::LEADER, "event" => e).set(0.0);
}

/// A release's pool: its info series, set to 1 (the join from an event's
/// series to its release and pool), and the release's order and hold
/// counters at 0.
fn publish_pool(event: &EventId, release: &EventId) {
    let pool = event
        .as_str()
        .strip_prefix(release.as_str())
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or(event.as_str());
    let r = release.to_string();
    metrics::gauge!(m::RELEASE_POOL, "release" => r.clone(), "pool" => pool.to_owned(), "event" => event.to_string())
        .set(1.0);
    for outcome in m::RELEASE_ORDER_OUTCOMES {
        metrics::counter!(m::RELEASE_ORDERS, "release" => r.clone(), "outcome" => outcome)
            .increment(0);
    }
    for outcome in m::RELEASE_HOLD_OUTCOMES {
        metrics::counter!(m::RELEASE_HOLDS, "release" => r.clone(), "outcome" => outcome)
            .increment(0);
    }
}

/// Refreshes the gauges every `interval` until `stop`; every open event's
/// series at least every third of `retention`.
pub async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    interval: Duration,
    retention: Duration,
    stop: CancellationToken,
) {
    // Each open event this task has seen, and its last view.
    let mut seen: HashMap<EventId, Option<EventView>> = HashMap::new();
    // The open events that are a release's pool, and their release.
    let mut pools: HashMap<EventId, EventId> = HashMap::new();
    let mut others: VecDeque<EventId> = VecDeque::new();
    let mut since = Instant::now();
    let mut refreshed = Instant::now();
    let mut ticker = Ticker::new(interval, &stop);
    while ticker.tick().await {
        let now = Instant::now();
        let open = match engine.store().list_open_events().await {
            Ok(events) => events,
            Err(e) => {
                m::store_error("list_open_events");
                tracing::warn!(error = %e, "gauges: listing events failed");
                continue;
            }
        };
        let mut due = engine.activity().events_since(since);
        since = now;
        for event in &open {
            if !seen.contains_key(event) {
                seen.insert(event.clone(), None);
                initialise(event);
                // Cached by the engine: one lookup per pool, none for an
                // id without a dot. A failed one is asked again next time.
                match engine.pool_release(event).await {
                    Ok(Some(release)) => {
                        publish_pool(event, &release);
                        pools.insert(event.clone(), release);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(%event, error = %e, "gauges: pool lookup failed");
                        seen.remove(event);
                        continue;
                    }
                }
                due.push(event.clone());
            }
        }
        // Left the open set (closed and flushed here or elsewhere, or
        // archived): its final values once, then its series age out.
        seen.retain(|event, last| {
            let kept = open.contains(event);
            if !kept && let Some(view) = last {
                publish_closed(view);
            }
            kept
        });
        pools.retain(|event, _| seen.contains_key(event));
        if now.duration_since(refreshed) >= retention / 3 {
            refreshed = now;
            for (event, last) in &seen {
                initialise(event);
                if let Some(view) = last {
                    publish(view);
                }
            }
            for (event, release) in &pools {
                publish_pool(event, release);
            }
        }
        if others.is_empty() {
            others = open.into();
        }
        if let Some(other) = others.pop_front()
            && !due.contains(&other)
        {
            due.push(other);
        }
        for event in due {
            if ended(&engine, &event).await {
                continue;
            }
            match engine.view(&event).await {
                Ok(view) => {
                    publish(&view);
                    if let Some(last) = seen.get_mut(&event) {
                        *last = Some(view);
                    }
                }
                Err(e) => tracing::debug!(%event, error = %e, "gauges: view failed"),
            }
        }
    }
}

/// Closed, or past its sale window (the engine's cached meta: no store read
/// once known).
async fn ended<S: Store>(engine: &Engine<S>, event: &EventId) -> bool {
    match engine.meta(event).await {
        Ok(meta) => {
            meta.status == EventStatus::Closed
                || meta
                    .spec
                    .ends_at
                    .is_some_and(|end| engine.clock().now_ms() >= end)
        }
        Err(_) => true,
    }
}
