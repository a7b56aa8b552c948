//! The hot path in memory: each step one critical section on one bucket.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Bucket, Marker, MemoryStore};
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{BucketState, EntryState, OrderEntry, RequestRecord};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};
use crate::domain::token::{TokenRefusal, TokenUse};
use crate::store::{
    Buckets, CancelReply, Finish, FinishArgs, FinishReply, IndexRead, PurchaseEntry, PurchaseReply,
    StoreError, TakeArgs, TakeReply,
};

impl Bucket {
    /// One entry of `purchase.lua`'s batch.
    fn purchase_one(
        &mut self,
        index: u32,
        now_ms: i64,
        sold_out: Option<u64>,
        e: &PurchaseEntry,
    ) -> PurchaseReply {
        if let Some(rec) = self.reqs.get(&e.rid).filter(|_| !e.rid.is_empty()) {
            return PurchaseReply::Replay(rec.clone());
        }
        let qty = u64::from(e.qty);
        // A token event: the token's allowance, checked here with the take.
        let token = match &e.token {
            None => None,
            Some(TokenUse::Refused(why)) => return PurchaseReply::TokenRefused(*why),
            Some(TokenUse::Valid { id, allowance }) => {
                let (used, reserved) = self.tokens.get(id).copied().unwrap_or((0, 0));
                if used + reserved + qty > u64::from(*allowance) {
                    return PurchaseReply::TokenRefused(TokenRefusal::Used);
                }
                Some(id)
            }
        };
        let limited = e.limit > 0;
        let held = if limited {
            self.users.get(&e.user).copied().unwrap_or(0)
        } else {
            0
        };
        if limited && held + qty > u64::from(e.limit) {
            if e.keep {
                let record = RequestRecord::LimitExceeded {
                    qty: e.qty,
                    limit: e.limit,
                    held,
                };
                self.reqs.insert(e.rid.clone(), record);
            }
            return PurchaseReply::LimitExceeded { held };
        }
        if self.stock >= qty {
            self.demand += qty;
            self.stock -= qty;
            if limited {
                self.hold(&e.user, qty as i64);
            }
            self.append(e.stream_entry(index, now_ms));
            self.idx
                .insert(e.order_id.clone(), e.order_entry(index, now_ms));
            if let Some(pay_by) = e.pay_by {
                self.holds.insert((pay_by, e.order_id.to_string()));
                self.hunits += qty;
            }
            if e.keep {
                self.reqs.insert(e.rid.clone(), e.bought(index));
            }
            if let Some(id) = token {
                self.tokens.entry(id.clone()).or_default().0 += qty;
            }
            return PurchaseReply::Bought {
                stock_left: self.stock,
            };
        }
        if let Some(left) = sold_out.filter(|&left| self.stock <= left && left < qty) {
            if e.keep {
                let record = RequestRecord::SoldOut {
                    qty: e.qty,
                    remaining: left,
                };
                self.reqs.insert(e.rid.clone(), record);
            }
            return PurchaseReply::SoldOut { remaining: left };
        }
        self.demand += qty;
        if limited {
            self.hold(&e.user, qty as i64);
        }
        if let Some(id) = token {
            self.tokens.entry(id.clone()).or_default().1 += qty;
            self.token_sagas.insert(e.rid.clone(), id.clone());
        }
        self.reqs.insert(e.rid.clone(), e.pending(now_ms));
        self.pend.insert(e.rid.clone(), now_ms);
        PurchaseReply::Pending { stock: self.stock }
    }
}

impl Buckets for MemoryStore {
    /// Mirrors `lua/init_bucket.lua`.
    async fn init_bucket(&self, b: &BucketRef, stock: u64) -> Result<(), StoreError> {
        let mut map = self.inner.buckets.write().expect("bucket map poisoned");
        // Buckets past their expiry go as Redis's keys would (their event
        // closed, or their layout was pruned, an hour ago): dropped when new
        // ones are made, so the map holds what may still be read.
        let now = Instant::now();
        map.retain(|_, bucket| {
            bucket
                .lock()
                .expect("bucket poisoned")
                .expires
                .is_none_or(|at| now < at)
        });
        map.entry(b.clone()).or_insert_with(|| {
            Arc::new(Mutex::new(Bucket {
                stock,
                ..Bucket::default()
            }))
        });
        Ok(())
    }

    /// One [`Buckets::purchase`] a group: the memory store has no calls to save.
    async fn purchase_groups(
        &self,
        now_ms: i64,
        groups: &[(BucketRef, Vec<PurchaseEntry>)],
    ) -> Vec<Result<Vec<PurchaseReply>, StoreError>> {
        crate::store::buckets::purchase_each(self, now_ms, groups).await
    }

    fn groups_buckets(&self) -> bool {
        false
    }

    /// Mirrors `lua/purchase.lua`.
    async fn purchase(
        &self,
        b: &BucketRef,
        now_ms: i64,
        entries: &[PurchaseEntry],
    ) -> Result<Vec<PurchaseReply>, StoreError> {
        let (replies, first) = self.with_live(b, |bk| {
            let sold_out = bk
                .empty
                .filter(|&(epoch, until, _)| epoch == bk.epoch && Instant::now() < until)
                .map(|(_, _, left)| left);
            let none_held = bk.holds.is_empty();
            let replies: Vec<PurchaseReply> = entries
                .iter()
                .map(|e| bk.purchase_one(b.index, now_ms, sold_out, e))
                .collect();
            let first = bk.holds.first().map(|(p, _)| *p).filter(|_| none_held);
            (replies, first)
        })?;
        if let Some(at) = first {
            self.announce(b, at);
        }
        Ok(replies)
    }

    /// Mirrors `lua/take.lua`.
    async fn take(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        self.with_live(b, |bk| {
            if let Some(seen) = bk.marker(&a.rid, a.pass) {
                return match seen {
                    Marker::Taken(order_id) if *order_id == a.order_id => TakeReply::Taken {
                        order_id: order_id.clone(),
                    },
                    Marker::Short(available, adds) => TakeReply::Short {
                        available: *available,
                        fresh: false,
                        adds: *adds,
                    },
                    // This saga's take here was undone, or the take is another
                    // order's (an aborted saga of the same request id): the
                    // bucket as it is now, nothing taken.
                    Marker::Taken(_) | Marker::Undone | Marker::Confirmed => TakeReply::Short {
                        available: bk.stock + bk.in_transfer(),
                        fresh: false,
                        adds: bk.adds,
                    },
                };
            }
            let qty = u64::from(a.qty);
            if bk.stock >= qty {
                bk.stock -= qty;
                bk.append(a.stream_entry(RecordKind::Order, b.index, now_ms));
                let taken = Marker::Taken(a.order_id.clone());
                if a.keep_taken {
                    bk.keep_marker(&a.rid, a.pass, taken);
                } else {
                    bk.set_marker(&a.rid, a.pass, taken, a.marker_ttl_ms);
                }
                TakeReply::Taken {
                    order_id: a.order_id.clone(),
                }
            } else {
                let available = bk.stock + bk.in_transfer();
                let short = Marker::Short(available, bk.adds);
                bk.set_marker(&a.rid, a.pass, short, a.marker_ttl_ms);
                TakeReply::Short {
                    available,
                    fresh: true,
                    adds: bk.adds,
                }
            }
        })
    }

    /// Mirrors `lua/untake.lua`.
    async fn untake(&self, b: &BucketRef, now_ms: i64, a: &TakeArgs) -> Result<bool, StoreError> {
        self.with(b, |bk| {
            match bk.marker(&a.rid, a.pass) {
                Some(Marker::Taken(oid)) if *oid == a.order_id => {}
                _ => return false,
            }
            bk.set_marker(&a.rid, a.pass, Marker::Undone, a.marker_ttl_ms);
            bk.stock += u64::from(a.qty);
            bk.adds += 1;
            bk.append(a.stream_entry(RecordKind::Void, b.index, now_ms));
            true
        })
    }

    /// Mirrors `lua/finish.lua`.
    async fn finish(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &FinishArgs,
    ) -> Result<FinishReply, StoreError> {
        let mut first = None;
        let reply = self.with(b, |bk| {
            match bk.reqs.get(&a.rid) {
                None => {
                    bk.pend.remove(&a.rid);
                    return FinishReply::NoRecord;
                }
                // Another saga under the same request id: not ours to end.
                Some(RequestRecord::Pending { order_id, .. }) if *order_id != a.order_id => {
                    return FinishReply::NoRecord;
                }
                Some(RequestRecord::Pending { .. }) => {}
                Some(done) => {
                    let done = done.clone();
                    bk.pend.remove(&a.rid);
                    return FinishReply::Already(done);
                }
            }
            bk.pend.remove(&a.rid);
            // The saga's token reservation: consumed with a bought order,
            // given back otherwise (`finish.lua`).
            if let Some(id) = a.tokens.then(|| bk.token_sagas.remove(&a.rid)).flatten() {
                let q = u64::from(a.qty);
                let (used, reserved) = bk.tokens.entry(id).or_default();
                *reserved = reserved.saturating_sub(q);
                if matches!(a.outcome, Finish::Bought { .. }) {
                    *used += q;
                }
            }
            let final_record = match &a.outcome {
                Finish::Bought {
                    order_id,
                    bucket,
                    probes,
                } => {
                    let rid = if a.keep { a.rid.clone() } else { String::new() };
                    bk.idx.insert(
                        order_id.clone(),
                        OrderEntry {
                            state: if a.pay_by.is_some() {
                                EntryState::Held
                            } else {
                                EntryState::Confirmed
                            },
                            user: a.user.clone(),
                            qty: a.qty,
                            bucket: *bucket,
                            request_id: rid.clone(),
                            at_ms: now_ms,
                            pay_by: a.pay_by,
                        },
                    );
                    if let Some(pay_by) = a.pay_by {
                        if bk.holds.is_empty() {
                            first = Some(pay_by);
                        }
                        bk.holds.insert((pay_by, order_id.to_string()));
                        bk.hunits += u64::from(a.qty);
                        bk.append(StreamEntry {
                            id: StreamId::default(),
                            kind: RecordKind::Hold,
                            order_id: order_id.to_string(),
                            user: a.user.to_string(),
                            qty: u64::from(a.qty),
                            bucket: *bucket,
                            home: b.index,
                            rid,
                            at_ms: pay_by,
                            pay_by: None,
                            part: 0,
                        });
                    }
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
        })?;
        if let Some(at) = first {
            self.announce(b, at);
        }
        Ok(reply)
    }

    /// Mirrors `lua/clear_markers.lua`.
    async fn clear_markers(
        &self,
        b: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<u32, StoreError> {
        self.with(b, |bk| {
            let mut n = 0;
            for pass in 1..=passes {
                match bk.marker(rid, pass) {
                    Some(Marker::Taken(_)) => continue,
                    Some(_) => n += 1,
                    None => {}
                }
                bk.markers.remove(&(rid.to_owned(), pass));
            }
            n
        })
    }

    /// Mirrors `lua/stale_pending.lua`.
    async fn stale_pending(
        &self,
        b: &BucketRef,
        before_ms: i64,
        count: u32,
    ) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        self.with(b, |bk| {
            let mut old: Vec<(i64, String)> = bk
                .pend
                .iter()
                .filter(|(_, at)| **at <= before_ms)
                .map(|(rid, at)| (*at, rid.clone()))
                .collect();
            old.sort();
            old.truncate(count as usize);
            let mut out = Vec::new();
            for (_, rid) in old {
                match bk.reqs.get(&rid) {
                    Some(r @ RequestRecord::Pending { .. }) => out.push((rid, r.clone())),
                    _ => {
                        bk.pend.remove(&rid);
                    }
                }
            }
            out
        })
    }

    /// Mirrors `lua/cancel.lua`.
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
            if matches!(entry.state, EntryState::Cancelled | EntryState::Expired) {
                return CancelReply::AlreadyCancelled(entry.clone());
            }
            let before = entry.clone();
            entry.state = EntryState::Cancelled;
            if before.state == EntryState::Held {
                bk.holds
                    .remove(&(before.pay_by.unwrap_or_default(), order.to_string()));
                bk.hunits = bk.hunits.saturating_sub(u64::from(before.qty));
            }
            if bk.users.contains_key(&before.user) {
                bk.hold(&before.user, -i64::from(before.qty));
            }
            bk.give_back(u64::from(before.qty));
            bk.adds += 1;
            bk.append(StreamEntry {
                id: StreamId::default(),
                kind: RecordKind::Cancel,
                order_id: order.to_string(),
                user: before.user.to_string(),
                qty: u64::from(before.qty),
                bucket: b.index,
                home: b.index,
                rid: String::new(),
                at_ms: now_ms,
                pay_by: None,
                part: 0,
            });
            CancelReply::Cancelled(before)
        })
    }

    async fn order_entry(&self, b: &BucketRef, order: &OrderId) -> Result<IndexRead, StoreError> {
        self.with(b, |bk| IndexRead {
            entry: bk.idx.get(order).cloned(),
            sealed: bk.sealed,
        })
    }

    async fn request_record(
        &self,
        b: &BucketRef,
        rid: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        self.with(b, |bk| bk.reqs.get(rid).cloned())
    }

    async fn user_units(&self, b: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        self.with(b, |bk| bk.users.get(user).copied().unwrap_or(0))
    }

    /// Mirrors `lua/counters.lua`.
    async fn counters(&self, b: &BucketRef) -> Result<(u64, u64), StoreError> {
        self.with(b, |bk| (bk.adds, bk.epoch))
    }

    /// Mirrors `lua/set_empty.lua`.
    async fn set_empty(
        &self,
        b: &BucketRef,
        epoch: u64,
        ttl_ms: u64,
        left: u64,
    ) -> Result<bool, StoreError> {
        self.with(b, |bk| {
            let current = bk.epoch == epoch;
            if current {
                let until = Instant::now() + Duration::from_millis(ttl_ms);
                bk.empty = Some((epoch, until, left));
            }
            current
        })
    }

    async fn bump_epoch(&self, b: &BucketRef) -> Result<(), StoreError> {
        self.with(b, |bk| bk.epoch += 1)
    }

    /// Mirrors `lua/bucket_state.lua`.
    async fn bucket_state(&self, b: &BucketRef) -> Result<BucketState, StoreError> {
        self.with(b, |bk| BucketState {
            stock: bk.stock,
            in_transfer: bk.in_transfer(),
            fence: bk.fence,
            adds: bk.adds,
            demand: bk.demand,
            held: bk.hunits,
            waiting: bk.wait.units,
            sealed: bk.sealed,
        })
    }
}
