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
    CancelReply, CreateMeta, Finish, FinishArgs, FinishReply, HomeEntry, HomeReply, OpenTransfer,
    Store, StoreError, TakeArgs, TakeReply, TransferReply,
};
use crate::ids::{EventId, OrderId, UserId};
use crate::keys::BucketRef;
use crate::model::{BucketState, EventMeta, EventSpec, EventStatus, OrderEntry, Record};

/// One record of a bucket's order stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    pub kind: RecordKind,
    pub order_id: OrderId,
    pub user: UserId,
    pub qty: u32,
    pub bucket: u32,
    pub home: u32,
    pub rid: String,
    pub at_ms: i64,
}

/// What a stream record says happened to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Units sold (`k=o`).
    Order,
    /// Units given back by a cancel (`k=c`).
    Cancel,
    /// A saga's take undone (`k=v`): the order never happened.
    Void,
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
    reqs: HashMap<String, Record>,
    markers: HashMap<(String, u32), Marker>,
    idx: HashMap<OrderId, OrderEntry>,
    stream: Vec<StreamRecord>,
    fence: u64,
    xfer: HashMap<String, Journal>,
    xin: HashMap<String, u64>,
    adds: u64,
}

impl Bucket {
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

    fn hold(&mut self, user: &UserId, delta: i64) {
        let held = self.users.entry(user.clone()).or_default();
        *held = held.saturating_add_signed(delta);
    }
}

struct EventSlot {
    meta: EventMeta,
    lease: Option<(String, u64, Instant)>,
    token: u64,
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

    /// The records of a bucket's order stream (tests and the flusher).
    pub fn stream(&self, b: &BucketRef) -> Result<Vec<StreamRecord>, StoreError> {
        self.with(b, |bk| bk.stream.clone())
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
        };
        events.insert(
            spec.id.clone(),
            EventSlot {
                meta,
                lease: None,
                token: 0,
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

    async fn bump_seq(&self, event: &EventId) -> Result<u64, StoreError> {
        self.with_event(event, |s| {
            s.meta.seq += 1;
            s.meta.seq
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
        self.with(b, |bk| {
            entries
                .iter()
                .map(|e| {
                    if let Some(rec) = bk.reqs.get(&e.rid).filter(|_| !e.rid.is_empty()) {
                        return HomeReply::Replay(rec.clone());
                    }
                    let held = bk.users.get(&e.user).copied().unwrap_or(0);
                    let qty = u64::from(e.qty);
                    if e.limit > 0 && held + qty > u64::from(e.limit) {
                        if e.keep {
                            bk.reqs.insert(
                                e.rid.clone(),
                                Record::LimitExceeded {
                                    qty: e.qty,
                                    limit: e.limit,
                                    held,
                                },
                            );
                        }
                        return HomeReply::LimitExceeded { held };
                    }
                    bk.hold(&e.user, qty as i64);
                    if bk.stock >= qty {
                        bk.stock -= qty;
                        bk.stream.push(StreamRecord {
                            kind: RecordKind::Order,
                            order_id: e.order_id.clone(),
                            user: e.user.clone(),
                            qty: e.qty,
                            bucket: b.index,
                            home: b.index,
                            rid: e.rid.clone(),
                            at_ms: now_ms,
                        });
                        bk.idx.insert(
                            e.order_id.clone(),
                            OrderEntry {
                                cancelled: false,
                                user: e.user.clone(),
                                qty: e.qty,
                                bucket: b.index,
                                request_id: if e.keep { e.rid.clone() } else { String::new() },
                                at_ms: now_ms,
                            },
                        );
                        if e.keep {
                            bk.reqs.insert(
                                e.rid.clone(),
                                Record::Bought {
                                    qty: e.qty,
                                    order_id: e.order_id.clone(),
                                    bucket: b.index,
                                    probes: 0,
                                },
                            );
                        }
                        HomeReply::Bought {
                            stock_left: bk.stock,
                        }
                    } else {
                        bk.reqs.insert(
                            e.rid.clone(),
                            Record::Pending {
                                qty: e.qty,
                                order_id: e.order_id.clone(),
                                user: e.user.clone(),
                                at_ms: now_ms,
                            },
                        );
                        HomeReply::Pending { stock: bk.stock }
                    }
                })
                .collect()
        })
    }

    async fn take(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        self.with(b, |bk| {
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
                bk.stream.push(StreamRecord {
                    kind: RecordKind::Order,
                    order_id: a.order_id.clone(),
                    user: a.user.clone(),
                    qty: a.qty,
                    bucket: b.index,
                    home: a.home,
                    rid: a.rid.clone(),
                    at_ms: now_ms,
                });
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
            bk.stream.push(StreamRecord {
                kind: RecordKind::Void,
                order_id: a.order_id.clone(),
                user: a.user.clone(),
                qty: a.qty,
                bucket: b.index,
                home: a.home,
                rid: a.rid.clone(),
                at_ms: now_ms,
            });
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
                Some(Record::Pending { .. }) => {}
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
                    Some(Record::Bought {
                        qty: a.qty,
                        order_id: order_id.clone(),
                        bucket: *bucket,
                        probes: *probes,
                    })
                }
                Finish::SoldOut { remaining } => {
                    bk.hold(&a.user, -i64::from(a.qty));
                    Some(Record::SoldOut {
                        qty: a.qty,
                        remaining: *remaining,
                    })
                }
                Finish::Abort => {
                    bk.hold(&a.user, -i64::from(a.qty));
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
        self.with(b, |bk| {
            let Some(entry) = bk.idx.get_mut(order) else {
                return CancelReply::NotFound;
            };
            if entry.cancelled {
                return CancelReply::AlreadyCancelled(entry.clone());
            }
            let before = entry.clone();
            entry.cancelled = true;
            bk.hold(&before.user, -i64::from(before.qty));
            bk.stock += u64::from(before.qty);
            bk.adds += 1;
            bk.stream.push(StreamRecord {
                kind: RecordKind::Cancel,
                order_id: order.clone(),
                user: before.user.clone(),
                qty: before.qty,
                bucket: b.index,
                home: b.index,
                rid: String::new(),
                at_ms: now_ms,
            });
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

    async fn record(&self, b: &BucketRef, rid: &str) -> Result<Option<Record>, StoreError> {
        self.with(b, |bk| bk.reqs.get(rid).cloned())
    }

    async fn held(&self, b: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        self.with(b, |bk| bk.users.get(user).copied().unwrap_or(0))
    }

    async fn adds(&self, b: &BucketRef) -> Result<u64, StoreError> {
        self.with(b, |bk| bk.adds)
    }

    async fn bucket_state(&self, b: &BucketRef) -> Result<BucketState, StoreError> {
        self.with(b, |bk| BucketState {
            stock: bk.stock,
            in_transfer: bk.in_transfer(),
            fence: bk.fence,
            adds: bk.adds,
        })
    }

    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = Instant::now();
        let until = now + Duration::from_millis(ttl_ms);
        Ok(self
            .with_event(event, |s| match &mut s.lease {
                Some((holder, token, expiry)) if *expiry > now => (holder == owner).then(|| {
                    *expiry = until;
                    *token
                }),
                _ => {
                    s.token += 1;
                    s.lease = Some((owner.to_owned(), s.token, until));
                    Some(s.token)
                }
            })
            .flatten())
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
        self.with(b, |bk| {
            if let Err(fenced) = bk.fence(token) {
                return fenced;
            }
            if let Some(j) = bk.xfer.get(xid) {
                return TransferReply::Duplicate(j.units);
            }
            let moved = units.min(bk.stock);
            if moved > 0 {
                bk.stock -= moved;
                bk.xfer.insert(
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
        self.with(b, |bk| {
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
}
