//! The embedded backend: the same steps as the Lua scripts, in process.
//!
//! Each bucket sits behind its own `std::sync::Mutex`: a step is one short
//! critical section with no `.await` inside, exactly the atomicity a script has
//! in Redis, and purchases on different buckets never contend. The bucket map
//! itself is behind an `RwLock` that is only written when buckets are created or
//! retired. This file holds the state (a bucket's fields are the keys of one
//! Redis bucket, decoded); each section's steps live in the file named like the
//! section, every step's doc names the script it mirrors, and the conformance
//! suite runs the same tests on both backends, so a difference is a failing test.

mod buckets;
mod draws;
mod events;
mod holds;
mod leases;
mod limits;
mod offers;
mod releases;
mod retire;
mod streams;
mod transfers;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::{Capabilities, Store, StoreError};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventMeta, OrderEntry, RequestRecord};
use crate::domain::stream::{StreamEntry, StreamId};

/// A stream entry and, once delivered to a flusher, when (a claim goes by
/// how long it has been pending, not by whom), and whether acknowledged.
#[derive(Debug, Clone)]
struct Slot {
    entry: StreamEntry,
    delivered: Option<Instant>,
    acked: bool,
}

/// A saga's decision in a bucket, per (rid, pass): take.lua's marker.
#[derive(Debug, Clone)]
enum Marker {
    Taken(OrderId),
    /// (available, adds when decided)
    Short(u64, u64),
    Undone,
    /// A held release order's line confirmed (`K|oid`).
    Confirmed,
}

/// An entry of a bucket's transfer journal (`xfer`).
#[derive(Debug, Clone)]
struct Journal {
    target: u32,
    units: u64,
    token: u64,
    open: bool,
}

/// One bucket: its fields are the keys of a Redis bucket (`domain::keys`).
#[derive(Debug, Default)]
struct Bucket {
    stock: u64,
    users: HashMap<UserId, u64>,
    reqs: HashMap<String, RequestRecord>,
    /// Request ids of sagas pending here -> start ms (`pend`).
    pend: HashMap<String, i64>,
    /// Probe markers, each with the instant it expires (their PX); `None`:
    /// kept until a later step gives it a lifetime (a held release line's
    /// take, `TakeArgs::keep_taken`).
    markers: HashMap<(String, u32), (Marker, Option<Instant>)>,
    idx: HashMap<OrderId, OrderEntry>,
    stream: VecDeque<Slot>,
    last_id: StreamId,
    sealed: bool,
    expires: Option<Instant>,
    fence: u64,
    xfer: HashMap<String, Journal>,
    xin: HashMap<String, u64>,
    adds: u64,
    demand: u64,
    /// The epoch at which the event was found to hold fewer units than a
    /// buyer asked (this bucket's copy), until when the mark is trusted, and
    /// the units it found left.
    empty: Option<(u64, Instant, u64)>,
    /// Bumped when units come back to a sold-out event.
    epoch: u64,
    /// Live holds of users homed here: (pay-by ms, order id) (`holds`).
    holds: BTreeSet<(i64, String)>,
    /// Units in live holds (`hunits`).
    hunits: u64,
    /// `token` events: access tokens of users homed here, id -> (used,
    /// reserved), and the token a pending saga reserved, rid -> id (`tok`).
    tokens: HashMap<String, (u64, u64)>,
    token_sagas: HashMap<String, String>,
    /// A draw's waiting list here (`wl`, `wo`): `offers.rs`.
    wait: offers::Waitlist,
}

impl Bucket {
    /// Appends an entry to the stream with the next id (ms-seq, like XADD *).
    fn append(&mut self, mut entry: StreamEntry) {
        let ms = entry.at_ms.max(0) as u64;
        entry.id = if ms > self.last_id.ms {
            StreamId { ms, seq: 0 }
        } else {
            StreamId {
                ms: self.last_id.ms,
                seq: self.last_id.seq + 1,
            }
        };
        self.last_id = entry.id;
        self.stream.push_back(Slot {
            entry,
            delivered: None,
            acked: false,
        });
    }

    /// The saga's marker of `pass`, unless it expired.
    fn marker(&self, rid: &str, pass: u32) -> Option<&Marker> {
        self.markers
            .get(&(rid.to_owned(), pass))
            .filter(|(_, until)| until.is_none_or(|until| Instant::now() < until))
            .map(|(m, _)| m)
    }

    /// Sets a marker for `ttl_ms` (PX). Expired ones are purged now and then
    /// (whenever the map reaches a power of two past 1024), like Redis's
    /// active expiry: not on every step.
    fn set_marker(&mut self, rid: &str, pass: u32, marker: Marker, ttl_ms: u64) {
        let until = Instant::now() + std::time::Duration::from_millis(ttl_ms.max(1));
        self.put_marker(rid, pass, marker, Some(until));
    }

    /// Sets a marker without a lifetime (SET without PX): the step that
    /// replaces it gives it one.
    fn keep_marker(&mut self, rid: &str, pass: u32, marker: Marker) {
        self.put_marker(rid, pass, marker, None);
    }

    fn put_marker(&mut self, rid: &str, pass: u32, marker: Marker, until: Option<Instant>) {
        let now = Instant::now();
        if self.markers.len() >= 1024 && self.markers.len().is_power_of_two() {
            self.markers
                .retain(|_, (_, until)| until.is_none_or(|until| now < until));
        }
        self.markers.insert((rid.to_owned(), pass), (marker, until));
    }

    fn in_transfer(&self) -> u64 {
        self.xfer.values().filter(|j| j.open).map(|j| j.units).sum()
    }

    fn hold(&mut self, user: &UserId, delta: i64) {
        let held = self.users.entry(user.clone()).or_default();
        *held = held.saturating_add_signed(delta);
    }
}

/// An event's slot: its meta and its two leases.
struct EventSlot {
    meta: EventMeta,
    /// The mover lease; its numbers are fencing tokens.
    lease: leases::LeaseSlot,
    /// The rebalancer's leadership; its numbers are terms.
    leader: leases::LeaseSlot,
    /// A sold-out mark went stale and the buckets' epochs are not all bumped
    /// yet: the seq at which that was recorded.
    epochs_due: Option<u64>,
    /// Closed and flushed: listed, but no longer visited by background work.
    retired: bool,
    /// Archived by an operator: not listed any more.
    archived: bool,
    /// Layout generation -> the token below which its transfers are closed
    /// (`xsettled`).
    settled: HashMap<u32, u64>,
}

#[derive(Default)]
struct Inner {
    events: Mutex<HashMap<EventId, EventSlot>>,
    buckets: RwLock<HashMap<BucketRef, Arc<Mutex<Bucket>>>>,
    /// The deadline index of buckets with holds (`ss:holds`).
    hold_index: Mutex<HashMap<BucketRef, i64>>,
    /// Each buyer's theoretical arrival time, µs (`ss:{u#<user>}:rate`).
    rates: Mutex<HashMap<UserId, u64>>,
    /// Releases' specs (`ss:{r#<release>}:spec`).
    releases: Mutex<HashMap<EventId, crate::domain::release::ReleaseSpec>>,
    /// Releases' home slots (`ss:{r#<release>#h<h>}:*`).
    homes: Mutex<HashMap<crate::domain::keys::HomeRef, releases::Home>>,
    /// Draws' records and entry shards (`ss:{d#<event>…}:*`).
    draws: Mutex<draws::DrawMap>,
    /// Draws' waiting lists (`ss:{w#<event>}:*`).
    lists: Mutex<HashMap<EventId, offers::List>>,
}

/// The in-process store (the embedded default).
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn bucket(&self, b: &BucketRef) -> Result<Arc<Mutex<Bucket>>, StoreError> {
        let map = self.inner.buckets.read().expect("bucket map poisoned");
        map.get(b)
            .cloned()
            .ok_or_else(|| StoreError::Stale(b.tag()))
    }

    /// Runs `f` on bucket `b` under its lock. A bucket past its expiry is
    /// gone, as its Redis keys would be.
    fn with<T>(&self, b: &BucketRef, f: impl FnOnce(&mut Bucket) -> T) -> Result<T, StoreError> {
        let bucket = self.bucket(b)?;
        let mut guard = bucket.lock().expect("bucket poisoned");
        if guard.expires.is_some_and(|at| Instant::now() >= at) {
            return Err(StoreError::Stale(b.tag()));
        }
        Ok(f(&mut guard))
    }

    /// Runs `f` on a bucket that sells (exists and is not sealed).
    fn with_live<T>(
        &self,
        b: &BucketRef,
        f: impl FnOnce(&mut Bucket) -> T,
    ) -> Result<T, StoreError> {
        self.with(b, |bk| (!bk.sealed).then(|| f(bk)))?
            .ok_or_else(|| StoreError::Stale(b.tag()))
    }

    /// Runs `f` on the event's slot; `None` when the event does not exist.
    fn with_event<T>(&self, event: &EventId, f: impl FnOnce(&mut EventSlot) -> T) -> Option<T> {
        let mut events = self.inner.events.lock().expect("event map poisoned");
        events.get_mut(event).map(f)
    }

    /// A compare-and-set on the event's slot: false when the event does not exist.
    fn event_flag(&self, event: &EventId, f: impl FnOnce(&mut EventSlot) -> bool) -> bool {
        self.with_event(event, f).unwrap_or(false)
    }

    /// The entries still in a bucket's order stream.
    pub fn stream(&self, b: &BucketRef) -> Result<Vec<StreamEntry>, StoreError> {
        self.with(b, |bk| bk.stream.iter().map(|s| s.entry.clone()).collect())
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::EMBEDDED
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
