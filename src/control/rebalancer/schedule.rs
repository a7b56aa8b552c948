//! Which events a rebalancer visits each round: the work follows activity,
//! so an idle service pays almost nothing whatever its number of events.
//!
//! - **Busy** events (this process wrote to them within the last
//!   [`hold`](Rebalancer::hold), 10 lease lifetimes): a full round every
//!   interval, as a leader keeps its lease alive with its heartbeat.
//! - Events whose **sale window has ended** and that are not closed (from the
//!   engine's cached meta, confirmed by a fresh read): led now, which closes them.
//! - **One other** open event per round, round-robin: its meta is read, and it
//!   is led only if it needs a leader (a stalled reshard, old layouts to prune,
//!   a window that ended, a close not finished: a closed event still in the
//!   open set was never retired). An idle event on sale needs no leader: its lease
//!   lapses, nobody renews it, and no leadership flaps between instances that
//!   merely look at it.
//! - **Retired** events (closed and flushed) never: they are not in the open set.
//!
//! An event whose traffic begins after a quiet spell (`Activity::take_woken`)
//! is visited at once and again [`QUICK`] later, the demand measured afresh
//! between the two: an adaptive event sized for a quiet sale grows within
//! tens of milliseconds of its start, while few buyers have records for the
//! reshard to move.
//!
//! An event this rebalancer led and no longer visits is let go (its
//! leadership released, the `shardstock_leader` gauge back to 0).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Rebalancer;
use crate::domain::ids::EventId;
use crate::domain::model::{EventMeta, EventStatus};
use crate::metrics as m;
use crate::store::Store;

/// How soon after a wake the round that measures the new traffic comes.
pub(crate) const QUICK: Duration = Duration::from_millis(50);

/// The round-robin over the open events (pure, unit-tested).
#[derive(Debug, Default)]
pub struct Schedule {
    queue: VecDeque<EventId>,
}

impl Schedule {
    /// The next open event not in `busy`, going round; `None` when there is none.
    pub(crate) fn next_other(&mut self, open: &[EventId], busy: &[EventId]) -> Option<EventId> {
        for _ in 0..2 {
            while let Some(e) = self.queue.pop_front() {
                if open.contains(&e) && !busy.contains(&e) {
                    return Some(e);
                }
            }
            self.queue = open.iter().cloned().collect();
        }
        None
    }
}

/// Does a leader have something to do for this event, though nobody sells it?
fn needs_leader(meta: &EventMeta, now_ms: i64) -> bool {
    match meta.status {
        EventStatus::Creating => false,
        // Still open, so not retired: its close may have been cut off, and
        // the leader is who finishes it.
        EventStatus::Closed | EventStatus::Resharding => true,
        EventStatus::OnSale => {
            !meta.retired.is_empty() || meta.spec.ends_at.is_some_and(|end| now_ms >= end)
        }
    }
}

impl<S: Store> Rebalancer<S> {
    /// How long after this process last wrote to an event it keeps leading it.
    fn hold(&self) -> Duration {
        Duration::from_millis(self.opts.lease_ttl_ms) * 10
    }

    /// The loop: every interval, a round for the events the schedule picks
    /// (see the module docs), until `stop`. An event whose traffic begins
    /// after a quiet spell wakes it at once: that round takes a fresh
    /// baseline of the event's demand and the next one, [`QUICK`] later,
    /// measures it (so an adaptive event grows from its first purchases).
    pub async fn run(mut self, stop: CancellationToken) {
        let engine = self.engine.clone();
        let mut due = tokio::time::Instant::now();
        let mut schedule = Schedule::default();
        loop {
            let woke = tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(due) => false,
                _ = engine.activity().woken() => {
                    let woken = engine.activity().take_woken();
                    if woken.is_empty() {
                        continue; // a wake already taken
                    }
                    for event in &woken {
                        self.remeasure(event);
                    }
                    true
                }
            };
            let started = tokio::time::Instant::now();
            self.round_all(&mut schedule, &stop).await;
            let pause = if woke { QUICK } else { self.opts.interval };
            due = started + pause.min(self.opts.interval);
        }
        let all = HashSet::new();
        self.let_go(&all).await;
    }

    /// One round of every event the schedule picks (what [`Rebalancer::run`]
    /// does every interval).
    pub async fn round_all(&mut self, schedule: &mut Schedule, stop: &CancellationToken) {
        let open = match self.engine.store().list_open_events().await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "rebalancer: listing events failed");
                return;
            }
        };
        // What the leader keeps per event is for open events only.
        self.closed.retain(|e| open.contains(e));
        self.abandoned.retain(|e, _| open.contains(e));
        let since = Instant::now().checked_sub(self.hold());
        let mut busy: Vec<EventId> = match since {
            Some(since) => self.engine.activity().events_since(since),
            None => self
                .engine
                .activity()
                .events_since(Instant::now() - self.opts.interval),
        };
        busy.retain(|e| open.contains(e));
        for event in &open {
            if !busy.contains(event) && self.window_over(event).await {
                busy.push(event.clone());
            }
        }
        let mut visited: HashSet<EventId> = busy.iter().cloned().collect();
        for event in &busy {
            self.round(event, stop).await;
        }
        if let Some(other) = schedule.next_other(&open, &busy) {
            let now_ms = self.engine.clock().now_ms();
            match self.engine.reload(&other).await {
                Ok(meta) if needs_leader(&meta, now_ms) => {
                    self.round(&other, stop).await;
                    visited.insert(other);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(event = %other, error = %e, "rebalancer: no meta"),
            }
        }
        self.let_go(&visited).await;
    }

    /// One `lead`, logged and counted if it fails.
    async fn round(&mut self, event: &EventId, stop: &CancellationToken) {
        if let Err(e) = self.lead(event, stop).await {
            m::store_error("rebalance");
            tracing::warn!(%event, error = %e, "rebalancer round failed");
        }
    }

    /// Has the event's sale window ended while it is not closed? The cached
    /// meta says so first; a fresh read confirms it (and refreshes the cache,
    /// so a closed event stops coming back).
    async fn window_over(&self, event: &EventId) -> bool {
        let now_ms = self.engine.clock().now_ms();
        let over = |meta: &EventMeta| {
            meta.status != EventStatus::Closed && meta.spec.ends_at.is_some_and(|end| now_ms >= end)
        };
        match self.engine.meta(event).await {
            Ok(meta) if over(&meta) => self
                .engine
                .reload(event)
                .await
                .is_ok_and(|meta| over(&meta)),
            _ => false,
        }
    }

    /// Releases the leadership of every event led and not in `keep`.
    async fn let_go(&mut self, keep: &HashSet<EventId>) {
        let gone: Vec<EventId> = self
            .led
            .keys()
            .filter(|e| !keep.contains(*e))
            .cloned()
            .collect();
        for event in gone {
            if let Some(led) = self.led.remove(&event) {
                let _ = self
                    .engine
                    .store()
                    .release_leadership(&event, &self.owner, led.term)
                    .await;
                metrics::gauge!(m::LEADER, "event" => event.to_string()).set(0.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<EventId> {
        names.iter().map(|n| EventId::parse(*n).unwrap()).collect()
    }

    #[test]
    fn other_events_come_round_one_at_a_time_skipping_busy_ones() {
        let mut s = Schedule::default();
        let open = ids(&["a", "b", "c"]);
        let busy = ids(&["b"]);
        let picked: Vec<EventId> = (0..4).filter_map(|_| s.next_other(&open, &busy)).collect();
        assert_eq!(picked, ids(&["a", "c", "a", "c"]));
        assert_eq!(s.next_other(&ids(&["b"]), &busy), None);
        assert_eq!(s.next_other(&[], &[]), None);
    }
}
