//! The embedded backend: the same steps as the Lua scripts, in process.
//!
//! Each bucket sits behind its own `std::sync::Mutex`: a step is one short
//! critical section with no `.await` inside, exactly the atomicity a script has
//! in Redis, and purchases on different buckets never contend. The bucket map
//! itself is behind an `RwLock` that is only written when buckets are created or
//! retired. Every method mirrors one script in `lua/`; the conformance suite
//! runs the same tests on both, so a difference is a failing test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::{
    BucketAudit, BucketContents, CancelReply, CreateMeta, Finish, FinishArgs, FinishReply,
    HomeEntry, HomeReply, OpenTransfer, SeqBump, Store, StoreError, TakeArgs, TakeReply,
    TransferReply,
};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{
    BucketState, EventMeta, EventSpec, EventStatus, OrderEntry, RequestRecord,
};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};

/// A stream record and, once delivered to a flusher, to whom and when.
#[derive(Debug, Clone)]
struct Slot {
    entry: StreamEntry,
    delivered: Option<(String, Instant)>,
}

#[derive(Debug, Clone)]
enum Marker {
    Taken(OrderId),
    /// (available, adds when decided)
    Short(u64, u64),
    Undone,
}

#[derive(Debug, Clone)]
struct Journal {
    target: u32,
    units: u64,
    token: u64,
    open: bool,
}

#[derive(Debug, Default)]
struct Bucket {
    stock: u64,
    users: HashMap<UserId, u64>,
    reqs: HashMap<String, RequestRecord>,
    markers: HashMap<(String, u32), Marker>,
    idx: HashMap<OrderId, OrderEntry>,
    stream: std::collections::VecDeque<Slot>,
    last_id: StreamId,
    sealed: bool,
    expires: Option<Instant>,
    fence: u64,
    xfer: HashMap<String, Journal>,
    xin: HashMap<String, u64>,
    adds: u64,
    demand: u64,
    /// The epoch at which the event was found sold out (this bucket's copy).
    empty: Option<u64>,
    /// Bumped when units come back to a sold-out event.
    epoch: u64,
}

impl Bucket {
    /// Appends a record with the next stream id (ms-seq, like XADD *).
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        kind: RecordKind,
        order_id: &str,
        user: &str,
        qty: u64,
        bucket: u32,
        home: u32,
        rid: &str,
        at_ms: i64,
    ) {
        let ms = at_ms.max(0) as u64;
        let id = if ms > self.last_id.ms {
            StreamId { ms, seq: 0 }
        } else {
            StreamId {
                ms: self.last_id.ms,
                seq: self.last_id.seq + 1,
            }
        };
        self.last_id = id;
        self.stream.push_back(Slot {
            entry: StreamEntry {
                id,
                kind,
                order_id: order_id.to_owned(),
                user: user.to_owned(),
                qty,
                bucket,
                home,
                rid: rid.to_owned(),
                at_ms,
            },
            delivered: None,
        });
    }

    fn in_transfer(&self) -> u64 {
        self.xfer.values().filter(|j| j.open).map(|j| j.units).sum()
    }

    /// The fence check every transfer step starts with (raises the fence).
    fn fence(&mut self, token: u64) -> Result<(), TransferReply> {
        if token < self.fence {
            return Err(TransferReply::Fenced {
                highest: self.fence,
            });
        }
        self.fence = token;
        Ok(())
    }

    /// One entry of the home step (see purchase.lua).
    fn home_one(&mut self, index: u32, now_ms: i64, sold_out: bool, e: &HomeEntry) -> HomeReply {
        if let Some(rec) = self.reqs.get(&e.rid).filter(|_| !e.rid.is_empty()) {
            return HomeReply::Replay(rec.clone());
        }
        let limited = e.limit > 0;
        let held = if limited {
            self.users.get(&e.user).copied().unwrap_or(0)
        } else {
            0
        };
        let qty = u64::from(e.qty);
        if limited && held + qty > u64::from(e.limit) {
            if e.keep {
                let record = RequestRecord::LimitExceeded {
                    qty: e.qty,
                    limit: e.limit,
                    held,
                };
                self.reqs.insert(e.rid.clone(), record);
            }
            return HomeReply::LimitExceeded { held };
        }
        if self.stock >= qty {
            self.demand += qty;
            self.stock -= qty;
            if limited {
                self.hold(&e.user, qty as i64);
            }
            self.record(
                RecordKind::Order,
                e.order_id.as_str(),
                e.user.as_str(),
                qty,
                index,
                index,
                &e.rid,
                now_ms,
            );
            let entry = OrderEntry {
                cancelled: false,
                user: e.user.clone(),
                qty: e.qty,
                bucket: index,
                request_id: if e.keep { e.rid.clone() } else { String::new() },
                at_ms: now_ms,
            };
            self.idx.insert(e.order_id.clone(), entry);
            if e.keep {
                let record = RequestRecord::Bought {
                    qty: e.qty,
                    order_id: e.order_id.clone(),
                    bucket: index,
                    probes: 0,
                };
                self.reqs.insert(e.rid.clone(), record);
            }
            return HomeReply::Bought {
                stock_left: self.stock,
            };
        }
        if sold_out && self.stock == 0 {
            if e.keep {
                self.reqs.insert(
                    e.rid.clone(),
                    RequestRecord::SoldOut {
                        qty: e.qty,
                        remaining: 0,
                    },
                );
            }
            return HomeReply::SoldOut;
        }
        self.demand += qty;
        if limited {
            self.hold(&e.user, qty as i64);
        }
        let record = RequestRecord::Pending {
            qty: e.qty,
            order_id: e.order_id.clone(),
            user: e.user.clone(),
            at_ms: now_ms,
        };
        self.reqs.insert(e.rid.clone(), record);
        HomeReply::Pending { stock: self.stock }
    }

    /// OUT: stock into the journal (see transfer_out.lua).
    fn out(&mut self, token: u64, xid: &str, target: u32, units: u64) -> TransferReply {
        if let Err(fenced) = self.fence(token) {
            return fenced;
        }
        if let Some(j) = self.xfer.get(xid) {
            return TransferReply::Duplicate(j.units);
        }
        let moved = units.min(self.stock);
        if moved > 0 {
            self.stock -= moved;
            self.xfer.insert(
                xid.to_owned(),
                Journal {
                    target,
                    units: moved,
                    token,
                    open: true,
                },
            );
        }
        TransferReply::Applied(moved)
    }

    fn hold(&mut self, user: &UserId, delta: i64) {
        let held = self.users.entry(user.clone()).or_default();
        *held = held.saturating_add_signed(delta);
    }
}

struct EventSlot {
    meta: EventMeta,
    lease: Option<(String, u64, Instant)>,
    token: u64,
    leader: Option<(String, u64, Instant)>,
    term: u64,
}

/// Takes or renews a lease slot (see lease_acquire.lua): the same owner keeps
/// its number, a free or expired slot gets the next one.
fn take_lease(
    slot: &mut Option<(String, u64, Instant)>,
    counter: &mut u64,
    owner: &str,
    ttl_ms: u64,
) -> Option<u64> {
    let now = Instant::now();
    let until = now + Duration::from_millis(ttl_ms);
    match slot {
        Some((holder, n, expiry)) if *expiry > now => (holder == owner).then(|| {
            *expiry = until;
            *n
        }),
        _ => {
            *counter += 1;
            *slot = Some((owner.to_owned(), *counter, until));
            Some(*counter)
        }
    }
}

#[derive(Default)]
struct Inner {
    events: Mutex<HashMap<EventId, EventSlot>>,
    buckets: RwLock<HashMap<BucketRef, Arc<Mutex<Bucket>>>>,
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

    /// Runs `f` on bucket `b` under its lock.
    fn with<T>(&self, b: &BucketRef, f: impl FnOnce(&mut Bucket) -> T) -> Result<T, StoreError> {
        let bucket = self.bucket(b)?;
        let mut guard = bucket.lock().expect("bucket poisoned");
        Ok(f(&mut guard))
    }

    fn with_event<T>(&self, event: &EventId, f: impl FnOnce(&mut EventSlot) -> T) -> Option<T> {
        let mut events = self.inner.events.lock().expect("event map poisoned");
        events.get_mut(event).map(f)
    }

    /// The records still in a bucket's order stream.
    pub fn stream(&self, b: &BucketRef) -> Result<Vec<StreamEntry>, StoreError> {
        self.with(b, |bk| bk.stream.iter().map(|s| s.entry.clone()).collect())
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
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn create_meta(&self, spec: &EventSpec, now_ms: i64) -> Result<CreateMeta, StoreError> {
        let mut events = self.inner.events.lock().expect("event map poisoned");
        if let Some(slot) = events.get(&spec.id) {
            return Ok(CreateMeta::Exists(slot.meta.clone()));
        }
        let meta = EventMeta {
            spec: spec.clone(),
            status: EventStatus::Creating,
            generation: 0,
            seq: 0,
            sold_out: None,
            created_ms: now_ms,
            retired: Vec::new(),
            reshard_to: None,
        };
        events.insert(
            spec.id.clone(),
            EventSlot {
                meta,
                lease: None,
                token: 0,
                leader: None,
                term: 0,
            },
        );
        Ok(CreateMeta::Created)
    }

    async fn register_event(&self, _event: &EventId) -> Result<(), StoreError> {
        Ok(())
    }

    async fn list_events(&self) -> Result<Vec<EventId>, StoreError> {
        let events = self.inner.events.lock().expect("event map poisoned");
        Ok(events.keys().cloned().collect())
    }

    async fn load_meta(&self, event: &EventId) -> Result<Option<EventMeta>, StoreError> {
        Ok(self.with_event(event, |s| s.meta.clone()))
    }

    async fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| {
                let ok = s.meta.status == from;
                if ok {
                    s.meta.status = to;
                }
                ok
            })
            .unwrap_or(false))
    }

    async fn set_layout(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| {
                s.meta.generation = generation;
                s.meta.spec.buckets = buckets;
                s.meta.retired = retired.to_vec();
            })
            .is_some())
    }

    async fn bump_seq(&self, event: &EventId) -> Result<SeqBump, StoreError> {
        self.with_event(event, |s| {
            let was_sold_out = matches!(s.meta.sold_out, Some((seq, _)) if seq == s.meta.seq);
            s.meta.seq += 1;
            SeqBump {
                seq: s.meta.seq,
                was_sold_out,
            }
        })
        .ok_or_else(|| StoreError::Stale(format!("meta of {event}")))
    }

    async fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| {
                let ok = s.meta.seq == seq;
                if ok {
                    s.meta.sold_out = Some((seq, now_ms));
                }
                ok
            })
            .unwrap_or(false))
    }

    async fn init_bucket(&self, b: &BucketRef, stock: u64) -> Result<(), StoreError> {
        let mut map = self.inner.buckets.write().expect("bucket map poisoned");
        map.entry(b.clone()).or_insert_with(|| {
            Arc::new(Mutex::new(Bucket {
                stock,
                ..Bucket::default()
            }))
        });
        Ok(())
    }

    async fn home(
        &self,
        b: &BucketRef,
        now_ms: i64,
        entries: &[HomeEntry],
    ) -> Result<Vec<HomeReply>, StoreError> {
        self.with_live(b, |bk| {
            let sold_out = bk.empty == Some(bk.epoch);
            entries
                .iter()
                .map(|e| bk.home_one(b.index, now_ms, sold_out, e))
                .collect()
        })
    }

    async fn take(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        self.with_live(b, |bk| {
            let marker = (a.rid.clone(), a.pass);
            if let Some(seen) = bk.markers.get(&marker) {
                return match seen {
                    Marker::Taken(order_id) => TakeReply::Taken {
                        order_id: order_id.clone(),
                    },
                    Marker::Short(available, adds) => TakeReply::Short {
                        available: *available,
                        fresh: false,
                        adds: *adds,
                    },
                    // This saga's take here was undone: the bucket as it is now.
                    Marker::Undone => TakeReply::Short {
                        available: bk.stock + bk.in_transfer(),
                        fresh: false,
                        adds: bk.adds,
                    },
                };
            }
            let qty = u64::from(a.qty);
            if bk.stock >= qty {
                bk.stock -= qty;
                bk.record(
                    RecordKind::Order,
                    a.order_id.as_str(),
                    a.user.as_str(),
                    qty,
                    b.index,
                    a.home,
                    &a.rid,
                    now_ms,
                );
                bk.markers.insert(marker, Marker::Taken(a.order_id.clone()));
                TakeReply::Taken {
                    order_id: a.order_id.clone(),
                }
            } else {
                let available = bk.stock + bk.in_transfer();
                bk.markers.insert(marker, Marker::Short(available, bk.adds));
                TakeReply::Short {
                    available,
                    fresh: true,
                    adds: bk.adds,
                }
            }
        })
    }

    async fn untake(&self, b: &BucketRef, now_ms: i64, a: &TakeArgs) -> Result<bool, StoreError> {
        self.with(b, |bk| {
            let marker = (a.rid.clone(), a.pass);
            match bk.markers.get(&marker) {
                Some(Marker::Taken(oid)) if *oid == a.order_id => {}
                _ => return false,
            }
            bk.markers.insert(marker, Marker::Undone);
            bk.stock += u64::from(a.qty);
            bk.adds += 1;
            bk.record(
                RecordKind::Void,
                a.order_id.as_str(),
                a.user.as_str(),
                u64::from(a.qty),
                b.index,
                a.home,
                &a.rid,
                now_ms,
            );
            true
        })
    }

    async fn finish(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &FinishArgs,
    ) -> Result<FinishReply, StoreError> {
        self.with(b, |bk| {
            match bk.reqs.get(&a.rid) {
                None => return FinishReply::NoRecord,
                Some(RequestRecord::Pending { .. }) => {}
                Some(done) => return FinishReply::Already(done.clone()),
            }
            let final_record = match &a.outcome {
                Finish::Bought {
                    order_id,
                    bucket,
                    probes,
                } => {
                    bk.idx.insert(
                        order_id.clone(),
                        OrderEntry {
                            cancelled: false,
                            user: a.user.clone(),
                            qty: a.qty,
                            bucket: *bucket,
                            request_id: if a.keep { a.rid.clone() } else { String::new() },
                            at_ms: now_ms,
                        },
                    );
                    Some(RequestRecord::Bought {
                        qty: a.qty,
                        order_id: order_id.clone(),
                        bucket: *bucket,
                        probes: *probes,
                    })
                }
                Finish::SoldOut { remaining } => {
                    if a.limited {
                        bk.hold(&a.user, -i64::from(a.qty));
                    }
                    Some(RequestRecord::SoldOut {
                        qty: a.qty,
                        remaining: *remaining,
                    })
                }
                Finish::Abort => {
                    if a.limited {
                        bk.hold(&a.user, -i64::from(a.qty));
                    }
                    None
                }
            };
            match final_record.filter(|_| a.keep) {
                Some(r) => bk.reqs.insert(a.rid.clone(), r),
                None => bk.reqs.remove(&a.rid),
            };
            FinishReply::Done
        })
    }

    async fn cancel(
        &self,
        b: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<CancelReply, StoreError> {
        self.with_live(b, |bk| {
            let Some(entry) = bk.idx.get_mut(order) else {
                return CancelReply::NotFound;
            };
            if entry.cancelled {
                return CancelReply::AlreadyCancelled(entry.clone());
            }
            let before = entry.clone();
            entry.cancelled = true;
            if bk.users.contains_key(&before.user) {
                bk.hold(&before.user, -i64::from(before.qty));
            }
            bk.stock += u64::from(before.qty);
            bk.adds += 1;
            bk.record(
                RecordKind::Cancel,
                order.as_str(),
                before.user.as_str(),
                u64::from(before.qty),
                b.index,
                b.index,
                "",
                now_ms,
            );
            CancelReply::Cancelled(before)
        })
    }

    async fn order_entry(
        &self,
        b: &BucketRef,
        order: &OrderId,
    ) -> Result<Option<OrderEntry>, StoreError> {
        self.with(b, |bk| bk.idx.get(order).cloned())
    }

    async fn record(&self, b: &BucketRef, rid: &str) -> Result<Option<RequestRecord>, StoreError> {
        self.with(b, |bk| bk.reqs.get(rid).cloned())
    }

    async fn held(&self, b: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        self.with(b, |bk| bk.users.get(user).copied().unwrap_or(0))
    }

    async fn counters(&self, b: &BucketRef) -> Result<(u64, u64), StoreError> {
        self.with(b, |bk| (bk.adds, bk.epoch))
    }

    async fn set_empty(&self, b: &BucketRef, epoch: u64) -> Result<bool, StoreError> {
        self.with(b, |bk| {
            let current = bk.epoch == epoch;
            if current {
                bk.empty = Some(epoch);
            }
            current
        })
    }

    async fn bump_epoch(&self, b: &BucketRef) -> Result<(), StoreError> {
        self.with(b, |bk| bk.epoch += 1)
    }

    async fn bucket_state(&self, b: &BucketRef) -> Result<BucketState, StoreError> {
        self.with(b, |bk| BucketState {
            stock: bk.stock,
            in_transfer: bk.in_transfer(),
            fence: bk.fence,
            adds: bk.adds,
            demand: bk.demand,
        })
    }

    async fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| match s.meta.status {
                EventStatus::OnSale => {
                    s.meta.status = EventStatus::Resharding;
                    s.meta.reshard_to = Some((generation, buckets));
                    true
                }
                EventStatus::Resharding => s.meta.reshard_to == Some((generation, buckets)),
                _ => false,
            })
            .unwrap_or(false))
    }

    async fn end_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| {
                if s.meta.reshard_to != Some((generation, buckets)) {
                    return false;
                }
                s.meta.generation = generation;
                s.meta.spec.buckets = buckets;
                s.meta.retired = retired.to_vec();
                s.meta.status = EventStatus::OnSale;
                s.meta.reshard_to = None;
                s.meta.seq += 1;
                true
            })
            .unwrap_or(false))
    }

    async fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .with_event(event, |s| {
                take_lease(&mut s.leader, &mut s.term, owner, ttl_ms)
            })
            .flatten())
    }

    async fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> Result<(), StoreError> {
        self.with_event(event, |s| {
            if matches!(&s.leader, Some((holder, t, _)) if holder == owner && *t == term) {
                s.leader = None;
            }
        });
        Ok(())
    }

    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .with_event(event, |s| {
                take_lease(&mut s.lease, &mut s.token, owner, ttl_ms)
            })
            .flatten())
    }

    async fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        self.with_event(event, |s| {
            s.lease = None;
            take_lease(&mut s.lease, &mut s.token, owner, ttl_ms)
        })
        .flatten()
        .ok_or_else(|| StoreError::Stale(event.to_string()))
    }

    async fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        Ok(self
            .with_event(event, |s| match &mut s.lease {
                Some((holder, t, expiry)) if *expiry > now && holder == owner && *t == token => {
                    if ttl_ms == 0 {
                        s.lease = None;
                    } else {
                        *expiry = now + Duration::from_millis(ttl_ms);
                    }
                    true
                }
                _ => false,
            })
            .unwrap_or(false))
    }

    async fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> Result<(), StoreError> {
        self.renew_lease(event, owner, token, 0).await.map(drop)
    }

    async fn transfer_out(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with_live(b, |bk| bk.out(token, xid, target, units))
    }

    async fn drain_out(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with(b, |bk| bk.out(token, xid, target, units))
    }

    async fn raise_fence(&self, b: &BucketRef, token: u64) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            bk.fence = bk.fence.max(token);
            bk.fence
        })
    }

    async fn transfer_in(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        _source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with_live(b, |bk| {
            if let Err(fenced) = bk.fence(token) {
                return fenced;
            }
            if let Some(&done) = bk.xin.get(xid) {
                return TransferReply::Duplicate(done);
            }
            bk.stock += units;
            bk.adds += 1;
            bk.xin.insert(xid.to_owned(), units);
            TransferReply::Applied(units)
        })
    }

    async fn transfer_clear(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
    ) -> Result<TransferReply, StoreError> {
        self.with(b, |bk| {
            if let Err(fenced) = bk.fence(token) {
                return fenced;
            }
            match bk.xfer.get_mut(xid) {
                None => TransferReply::Duplicate(0),
                Some(j) if !j.open => TransferReply::Duplicate(j.units),
                Some(j) => {
                    j.open = false;
                    TransferReply::Applied(j.units)
                }
            }
        })
    }

    async fn open_transfers(&self, b: &BucketRef) -> Result<Vec<OpenTransfer>, StoreError> {
        self.with(b, |bk| {
            bk.xfer
                .iter()
                .filter(|(_, j)| j.open)
                .map(|(xid, j)| OpenTransfer {
                    xid: xid.clone(),
                    target: j.target,
                    units: j.units,
                    token: j.token,
                })
                .collect()
        })
    }

    async fn stream_read(
        &self,
        b: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let now = Instant::now();
        let idle = Duration::from_millis(claim_idle_ms);
        self.with(b, |bk| {
            // Claimed first (left pending long enough), then new: like XAUTOCLAIM + XREADGROUP.
            let claimable =
                |s: &Slot| matches!(&s.delivered, Some((_, at)) if now.duration_since(*at) >= idle);
            let mut out = Vec::new();
            for pass in [0, 1] {
                for slot in bk.stream.iter_mut() {
                    if out.len() >= count {
                        break;
                    }
                    let take = if pass == 0 {
                        claimable(slot)
                    } else {
                        slot.delivered.is_none()
                    };
                    if take {
                        slot.delivered = Some((consumer.to_owned(), now));
                        out.push(slot.entry.clone());
                    }
                }
            }
            out
        })
    }

    async fn stream_ack(&self, b: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            let before = bk.stream.len();
            bk.stream.retain(|s| !ids.contains(&s.entry.id));
            (before - bk.stream.len()) as u64
        })
    }

    async fn stream_len(&self, b: &BucketRef) -> Result<u64, StoreError> {
        // A missing bucket has no stream: length 0, as XLEN answers.
        Ok(self.with(b, |bk| bk.stream.len() as u64).unwrap_or(0))
    }

    async fn seal(&self, b: &BucketRef) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            bk.sealed = true;
            bk.stock
        })
    }

    async fn retire(&self, b: &BucketRef, now_ms: i64) -> Result<Option<u64>, StoreError> {
        let label = format!("{}#{}#{}", b.event, b.generation, b.index);
        self.with(b, |bk| {
            if !bk.sealed {
                return None;
            }
            let units = std::mem::take(&mut bk.stock);
            if units > 0 {
                bk.record(
                    RecordKind::Leftover,
                    &label,
                    "",
                    units,
                    b.index,
                    b.index,
                    "",
                    now_ms,
                );
            }
            Some(units)
        })
    }

    async fn audit_bucket(&self, b: &BucketRef) -> Result<BucketAudit, StoreError> {
        self.with(b, |bk| BucketAudit {
            stock: bk.stock,
            adds: bk.adds,
            sealed: bk.sealed,
            last_id: bk.last_id,
            open: bk
                .xfer
                .iter()
                .filter(|(_, j)| j.open)
                .map(|(xid, j)| (xid.clone(), j.target, j.units))
                .collect(),
            applied: bk.xin.keys().cloned().collect(),
            records: bk
                .stream
                .iter()
                .map(|s| (s.entry.id, s.entry.kind, s.entry.qty))
                .collect(),
        })
    }

    async fn pending(&self, b: &BucketRef) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        self.with(b, |bk| {
            bk.reqs
                .iter()
                .filter(|(_, r)| matches!(r, RequestRecord::Pending { .. }))
                .map(|(rid, r)| (rid.clone(), r.clone()))
                .collect()
        })
    }

    async fn take_markers(
        &self,
        b: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<Vec<(u32, OrderId)>, StoreError> {
        self.with(b, |bk| {
            (1..=passes)
                .filter_map(|pass| match bk.markers.get(&(rid.to_owned(), pass)) {
                    Some(Marker::Taken(oid)) => Some((pass, oid.clone())),
                    _ => None,
                })
                .collect()
        })
    }

    async fn restore(
        &self,
        b: &BucketRef,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
    ) -> Result<(), StoreError> {
        self.with(b, |bk| {
            for (user, units) in holdings {
                bk.users.insert(user.clone(), *units);
            }
            for (oid, entry) in orders {
                bk.idx.insert(oid.clone(), entry.clone());
            }
            for (rid, record) in records {
                bk.reqs.insert(rid.clone(), record.clone());
            }
        })
    }

    async fn contents(&self, b: &BucketRef) -> Result<BucketContents, StoreError> {
        self.with(b, |bk| BucketContents {
            holdings: bk
                .users
                .iter()
                .filter(|(_, u)| **u > 0)
                .map(|(u, n)| (u.clone(), *n))
                .collect(),
            orders: bk.idx.iter().map(|(o, e)| (o.clone(), e.clone())).collect(),
            records: bk
                .reqs
                .iter()
                .filter(|(rid, r)| rid.contains('/') && !matches!(r, RequestRecord::Pending { .. }))
                .map(|(rid, r)| (rid.clone(), r.clone()))
                .collect(),
        })
    }

    async fn expire_bucket(&self, b: &BucketRef, ttl_ms: u64) -> Result<(), StoreError> {
        self.with(b, |bk| {
            bk.expires = Some(Instant::now() + Duration::from_millis(ttl_ms))
        })
    }
}
