//! Held orders in memory: mirrors `lua/confirm.lua`, `lua/expire_holds.lua`
//! and `lua/hold_index.lua`; the deadline index is a map beside the buckets.

use super::{Bucket, MemoryStore};
use crate::domain::ids::OrderId;
use crate::domain::keys::BucketRef;
use crate::domain::model::{EntryState, OrderEntry};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};
use crate::store::{ConfirmReply, ExpireReply, Holds, StoreError};

impl Bucket {
    /// Expires held order `oid` (its index entry is `H`): units back, the
    /// user's count down, the expire record. Returns the entry after.
    fn expire_hold(&mut self, index: u32, oid: &str, now_ms: i64) -> Option<OrderEntry> {
        let order = OrderId::from_stored(oid);
        let entry = self.idx.get_mut(&order)?;
        if entry.state != EntryState::Held {
            return None;
        }
        entry.state = EntryState::Expired;
        let after = entry.clone();
        self.holds
            .remove(&(after.pay_by.unwrap_or_default(), oid.to_owned()));
        if self.users.contains_key(&after.user) {
            self.hold(&after.user, -i64::from(after.qty));
        }
        let qty = u64::from(after.qty);
        self.hunits = self.hunits.saturating_sub(qty);
        self.give_back(qty);
        self.adds += 1;
        self.append(StreamEntry {
            id: StreamId::default(),
            kind: RecordKind::Expire,
            order_id: oid.to_owned(),
            user: after.user.to_string(),
            qty,
            bucket: index,
            home: index,
            rid: after.request_id.clone(),
            at_ms: now_ms,
            pay_by: None,
            part: 0,
        });
        Some(after)
    }
}

impl MemoryStore {
    /// `ZADD ss:holds LT at bucket`.
    pub(super) fn announce(&self, b: &BucketRef, at_ms: i64) {
        let mut index = self.inner.hold_index.lock().expect("hold index poisoned");
        let score = index.entry(b.clone()).or_insert(at_ms);
        *score = (*score).min(at_ms);
    }
}

impl Holds for MemoryStore {
    /// Mirrors `lua/confirm.lua`.
    async fn confirm(
        &self,
        b: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<ConfirmReply, StoreError> {
        self.with_live(b, |bk| {
            let Some(entry) = bk.idx.get_mut(order) else {
                return ConfirmReply::NotFound;
            };
            match entry.state {
                EntryState::Confirmed => return ConfirmReply::AlreadyConfirmed(entry.clone()),
                EntryState::Cancelled => return ConfirmReply::Cancelled(entry.clone()),
                EntryState::Expired => {
                    return ConfirmReply::Expired {
                        entry: entry.clone(),
                        now: false,
                    };
                }
                EntryState::Held => {}
            }
            let pay_by = entry.pay_by.unwrap_or_default();
            if now_ms < pay_by {
                entry.state = EntryState::Confirmed;
                let after = entry.clone();
                bk.holds.remove(&(pay_by, order.to_string()));
                bk.hunits = bk.hunits.saturating_sub(u64::from(after.qty));
                bk.append(StreamEntry {
                    id: StreamId::default(),
                    kind: RecordKind::Confirm,
                    order_id: order.to_string(),
                    user: after.user.to_string(),
                    qty: u64::from(after.qty),
                    bucket: after.bucket,
                    home: b.index,
                    rid: after.request_id.clone(),
                    at_ms: now_ms,
                    pay_by: None,
                    part: 0,
                });
                return ConfirmReply::Confirmed(after);
            }
            match bk.expire_hold(b.index, order.as_str(), now_ms) {
                Some(entry) => ConfirmReply::Expired { entry, now: true },
                None => ConfirmReply::NotFound,
            }
        })
    }

    /// Mirrors `lua/expire_holds.lua`.
    async fn expire_holds(
        &self,
        b: &BucketRef,
        now_ms: i64,
        count: u32,
        void: bool,
    ) -> Result<ExpireReply, StoreError> {
        self.with(b, |bk| {
            if bk.sealed && !void {
                return Err(StoreError::Stale(b.tag()));
            }
            let due: Vec<(i64, String)> = bk
                .holds
                .iter()
                .take_while(|(p, _)| void || *p <= now_ms)
                .take(count.max(1) as usize)
                .cloned()
                .collect();
            let mut expired = Vec::new();
            for (pay_by, oid) in due {
                bk.holds.remove(&(pay_by, oid.clone()));
                if let Some(entry) = bk.expire_hold(b.index, &oid, now_ms) {
                    expired.push((OrderId::from_stored(&oid), entry));
                }
            }
            let next = bk.holds.first().map(|(p, _)| *p);
            Ok(ExpireReply { expired, next })
        })?
    }

    async fn announce_holds(&self, b: &BucketRef, at_ms: i64) -> Result<(), StoreError> {
        self.announce(b, at_ms);
        Ok(())
    }

    async fn due_holds(
        &self,
        now_ms: i64,
        count: u32,
    ) -> Result<Vec<(BucketRef, i64)>, StoreError> {
        let index = self.inner.hold_index.lock().expect("hold index poisoned");
        let mut due: Vec<(BucketRef, i64)> = index
            .iter()
            .filter(|(_, at)| **at <= now_ms)
            .map(|(b, at)| (b.clone(), *at))
            .collect();
        due.sort_by_key(|(_, at)| *at);
        due.truncate(count as usize);
        Ok(due)
    }

    /// Mirrors `lua/hold_index.lua`.
    async fn reschedule_holds(
        &self,
        b: &BucketRef,
        seen: i64,
        next: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut index = self.inner.hold_index.lock().expect("hold index poisoned");
        if index.get(b) != Some(&seen) {
            return Ok(false);
        }
        match next {
            Some(at) => index.insert(b.clone(), at),
            None => index.remove(b),
        };
        Ok(true)
    }

    async fn next_hold(&self, b: &BucketRef) -> Result<Option<i64>, StoreError> {
        self.with(b, |bk| bk.holds.first().map(|(p, _)| *p))
    }
}
