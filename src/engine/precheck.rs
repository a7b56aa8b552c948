//! The event-wide check a saga makes before it probes the ring.
//!
//! With the last units of a sale spread over many buckets, probing the ring
//! bucket by bucket costs one round trip per bucket, and refusing an order the
//! event cannot serve used to walk all of them (256 round trips, p99 215 ms).
//! The first driver of a saga reads every bucket's state at once instead (one
//! round trip, pipelined); when the whole event holds fewer units than asked,
//! the saga's double collect makes it a consistent snapshot, the sold-out
//! marks are set, and the order is refused without a probe and without a
//! marker left behind. This began on layouts of 8 buckets or more, on the
//! thought that a short ring probes as cheaply; but the first wave of a crowd
//! at the last unit probes one saga each, so 400 orders of 2 with one unit
//! left cost a refusal p99 of 13.5 ms and 6.9 Redis calls a refusal on one
//! bucket (23 ms, 17 calls on four), against 8.6–10.3 ms and 3.4 calls
//! (6–9 ms, 4 calls) with the shared read (`last_unit --buckets 1,4`).
//!
//! Two things keep it cheap. Sagas of one event in this process share one
//! read at a time: a saga that finds another's read in flight waits for it
//! and then takes its verdict from the event's mark (one call), so a crowd
//! arriving at the last unit costs one snapshot, not one each. And a read
//! that found plenty (at least [`PLENTY_PER_BUCKET`] units per bucket) spares
//! the event's sagas the check for [`PLENTY_FOR`]: mid-sale, a saga whose home
//! bucket is short probes at once, as before. Neither touches correctness:
//! the probe that follows is what decides; the check only refuses from a
//! consistent snapshot or a current mark.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::saga::Saga;
use super::{Engine, EngineError};
use crate::domain::ids::EventId;
use crate::domain::model::EventMeta;
use crate::store::Store;

/// A read that found at least this many units per bucket (times the order's
/// quantity) says the event is far from its last units…
pub(crate) const PLENTY_PER_BUCKET: u64 = 2;
/// …for this long: the event's sagas skip the check meanwhile.
pub(crate) const PLENTY_FOR: Duration = Duration::from_millis(500);

/// Per event: the gate that lets one check run at a time, and until when a
/// check found plenty.
#[derive(Default)]
pub(super) struct Prechecks {
    events: Mutex<HashMap<EventId, Arc<Gate>>>,
}

#[derive(Default)]
struct Gate {
    running: tokio::sync::Mutex<()>,
    plenty_until: Mutex<Option<Instant>>,
}

impl Prechecks {
    fn gate(&self, event: &EventId) -> Arc<Gate> {
        self.events
            .lock()
            .expect("precheck gates poisoned")
            .entry(event.clone())
            .or_default()
            .clone()
    }

    /// Events with a gate.
    pub(super) fn len(&self) -> usize {
        self.events.lock().expect("precheck gates poisoned").len()
    }

    /// Forgets an event (it was deleted or retired).
    pub(super) fn forget(&self, event: &EventId) {
        self.events
            .lock()
            .expect("precheck gates poisoned")
            .remove(event);
    }
}

impl Gate {
    fn plenty(&self) -> bool {
        self.plenty_until
            .lock()
            .expect("precheck gate poisoned")
            .is_some_and(|until| Instant::now() < until)
    }

    fn found_plenty(&self) {
        *self.plenty_until.lock().expect("precheck gate poisoned") =
            Some(Instant::now() + PLENTY_FOR);
    }
}

impl<S: Store> Engine<S> {
    /// `Some(available)` when the whole event holds fewer than the saga's
    /// quantity (at most `available`): the order is refused without a probe.
    /// `None`: probe (the event may serve it, the check was skipped, or its
    /// verdict was not conclusive).
    pub(super) async fn short_everywhere(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        seq: u64,
    ) -> Result<Option<u64>, EngineError> {
        let gate = self.prechecks.gate(&meta.spec.id);
        if gate.plenty() {
            return Ok(None);
        }
        let _running = match gate.running.try_lock() {
            Ok(running) => running,
            Err(_) => {
                // Another saga is reading the event: its verdict, if short,
                // is the event's mark by the time it is done.
                drop(gate.running.lock().await);
                let now = self.fresh_meta(meta).await?;
                let ttl = self.opts.sold_out_mark_ttl.as_millis() as i64;
                return Ok(now.sold_out_for(saga.qty, self.clock.now_ms(), ttl));
            }
        };
        let states = self.bucket_states(meta).await?;
        let qty = u64::from(saga.qty);
        let mut seen: Vec<(u32, u64, u64)> = states
            .iter()
            .enumerate()
            .map(|(j, s)| (j as u32, s.stock + s.in_transfer, s.adds))
            .collect();
        let total: u64 = seen.iter().map(|o| o.1).sum();
        if total >= qty * PLENTY_PER_BUCKET * u64::from(meta.spec.buckets) {
            gate.found_plenty();
        }
        if total >= qty {
            return Ok(None);
        }
        let Some(epochs) = self.settle_short(meta, &mut seen, qty).await? else {
            return Ok(None);
        };
        let available = seen.iter().map(|o| o.1).sum();
        self.mark_short(meta, seq, available, &epochs).await?;
        Ok(Some(available))
    }
}
