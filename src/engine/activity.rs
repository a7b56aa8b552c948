//! [`Activity`]: which buckets this process wrote, and which events it served.
//!
//! Background work follows the buckets that changed instead of polling every
//! bucket of every event: the flusher reads the order streams this process
//! appended to (`take_dirty`), and the gauges and the rebalancer attend to the
//! events with recent traffic (`events_since`). What other processes wrote
//! (a dead instance's last orders, another replica's events) is found by the
//! slow scans those loops keep, so nothing is missed, only found later.
//!
//! An event's first write after [`QUIET`] without any (a sale starting, or
//! resuming) also wakes the rebalancer (`take_woken`), so an adaptive event is
//! measured from its first purchases rather than from the next round.
//!
//! One short critical section per store write; a write step runs once per
//! batch of purchases, not once per purchase.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;

/// What this process wrote, since the last look.
#[derive(Debug, Default)]
pub struct Activity {
    dirty: Mutex<HashSet<BucketRef>>,
    events: Mutex<HashMap<EventId, Instant>>,
    /// Events whose traffic began after a quiet spell, not yet taken.
    woken: Mutex<Vec<EventId>>,
    wake: Notify,
}

/// How long an event goes without a write before its next one counts as the
/// start of a burst.
pub(crate) const QUIET: Duration = Duration::from_secs(1);

impl Activity {
    /// A write step ran on `bucket` (its stock or its order stream may have changed).
    pub fn wrote(&self, bucket: &BucketRef) {
        {
            let mut dirty = self.dirty.lock().expect("activity poisoned");
            if !dirty.contains(bucket) {
                dirty.insert(bucket.clone());
            }
        }
        let now = Instant::now();
        let woke = {
            let mut events = self.events.lock().expect("activity poisoned");
            match events.get_mut(&bucket.event) {
                Some(at) => std::mem::replace(at, now) + QUIET < now,
                None => {
                    events.insert(bucket.event.clone(), now);
                    true
                }
            }
        };
        if woke {
            let mut woken = self.woken.lock().expect("activity poisoned");
            if !woken.contains(&bucket.event) {
                woken.push(bucket.event.clone());
            }
            drop(woken);
            self.wake.notify_one();
        }
    }

    /// Waits until an event's traffic begins after a quiet spell (at once if
    /// one did since the last [`Activity::take_woken`]).
    pub(crate) async fn woken(&self) {
        if !self.woken.lock().expect("activity poisoned").is_empty() {
            return;
        }
        self.wake.notified().await;
    }

    /// The events whose traffic began after a quiet spell, since the last call.
    pub fn take_woken(&self) -> Vec<EventId> {
        std::mem::take(&mut *self.woken.lock().expect("activity poisoned"))
    }

    /// The buckets written since the last call (the caller flushes them, and
    /// marks again with [`Activity::wrote`] what it could not finish).
    pub(crate) fn take_dirty(&self) -> Vec<BucketRef> {
        let mut dirty = self.dirty.lock().expect("activity poisoned");
        dirty.drain().collect()
    }

    /// Marks `buckets` dirty again (a flush round that could not read them),
    /// without counting it as traffic on their events.
    pub fn again(&self, buckets: &[BucketRef]) {
        self.dirty
            .lock()
            .expect("activity poisoned")
            .extend(buckets.iter().cloned());
    }

    /// Events this process wrote to since `since`.
    pub(crate) fn events_since(&self, since: Instant) -> Vec<EventId> {
        let events = self.events.lock().expect("activity poisoned");
        events
            .iter()
            .filter(|(_, at)| **at >= since)
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// Events with traffic and buckets marked, together.
    pub fn entries(&self) -> usize {
        self.events.lock().expect("activity poisoned").len()
            + self.dirty.lock().expect("activity poisoned").len()
    }

    /// Forgets an event (closed, or gone from the store).
    pub fn forget(&self, event: &EventId) {
        self.events.lock().expect("activity poisoned").remove(event);
        self.dirty
            .lock()
            .expect("activity poisoned")
            .retain(|b| &b.event != event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_buckets_are_taken_once_and_events_remembered() {
        let a = Activity::default();
        let e = EventId::parse("e").unwrap();
        let start = Instant::now();
        a.wrote(&BucketRef::new(&e, 0, 1));
        a.wrote(&BucketRef::new(&e, 0, 1));
        a.wrote(&BucketRef::new(&e, 0, 2));
        let mut dirty = a.take_dirty();
        dirty.sort_by_key(|b| b.index);
        assert_eq!(dirty.iter().map(|b| b.index).collect::<Vec<_>>(), [1, 2]);
        assert!(a.take_dirty().is_empty());
        assert_eq!(a.events_since(start), vec![e.clone()]);
        // The first write woke the rebalancer once; the next ones, close
        // behind it, do not.
        assert_eq!(a.take_woken(), vec![e.clone()]);
        assert!(a.take_woken().is_empty());
        a.forget(&e);
        assert!(a.events_since(start).is_empty());
    }
}
