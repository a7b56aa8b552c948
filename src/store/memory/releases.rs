//! A release's steps in memory: the home's records in one map, a line's
//! take and undo on its pool's bucket, each one critical section.

use std::collections::HashMap;

use super::{Marker, MemoryStore};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::{BucketRef, HomeRef};
use crate::domain::release::{HomeRecord, ReleaseSpec};
use crate::domain::stream::RecordKind;
use crate::store::{
    Buckets, Decided, LineConfirm, LineTake, LineUndo, Releases, ReserveArgs, ReserveReply,
    StoreError, TakeArgs, TakeReply,
};

/// One home slot: what its three keys hold.
#[derive(Debug, Default)]
pub(super) struct Home {
    units: HashMap<UserId, u64>,
    reqs: HashMap<String, HomeRecord>,
    pend: HashMap<String, i64>,
    oids: HashMap<OrderId, String>,
}

impl MemoryStore {
    fn with_home<T>(&self, home: &HomeRef, f: impl FnOnce(&mut Home) -> T) -> T {
        let mut homes = self.inner.homes.lock().expect("homes poisoned");
        f(homes.entry(home.clone()).or_default())
    }

    /// `decide_order.lua`'s compare-and-set.
    fn decide(
        &self,
        home: &HomeRef,
        rid: &str,
        expected: &HomeRecord,
        decided: &HomeRecord,
        ended: bool,
        alias: Option<&OrderId>,
    ) -> Decided {
        self.with_home(home, |h| match h.reqs.get(rid) {
            None => Decided::NoRecord,
            Some(rec) if rec != expected => Decided::Found(rec.clone()),
            Some(_) => {
                h.reqs.insert(rid.to_owned(), decided.clone());
                if let Some(oid) = alias {
                    h.oids.insert(oid.clone(), rid.to_owned());
                }
                if ended {
                    h.pend.remove(rid);
                } else if alias.is_some()
                    && let Some(at) = decided.held_listed_at()
                    && let Some(listed) = h.pend.get_mut(rid)
                {
                    *listed = at;
                }
                Decided::Done
            }
        })
    }
}

impl Releases for MemoryStore {
    /// Mirrors `lua/create_release.lua`.
    async fn create_release(&self, spec: &ReleaseSpec) -> Result<Option<ReleaseSpec>, StoreError> {
        let mut releases = self.inner.releases.lock().expect("releases poisoned");
        if let Some(had) = releases.get(&spec.id) {
            return Ok(Some(had.clone()));
        }
        releases.insert(spec.id.clone(), spec.clone());
        Ok(None)
    }

    async fn load_release(&self, release: &EventId) -> Result<Option<ReleaseSpec>, StoreError> {
        let releases = self.inner.releases.lock().expect("releases poisoned");
        Ok(releases.get(release).cloned())
    }

    async fn list_releases(&self) -> Result<Vec<EventId>, StoreError> {
        let releases = self.inner.releases.lock().expect("releases poisoned");
        Ok(releases.keys().cloned().collect())
    }

    /// Mirrors `lua/reserve.lua`.
    async fn reserve(
        &self,
        home: &HomeRef,
        now_ms: i64,
        a: &ReserveArgs,
    ) -> Result<ReserveReply, StoreError> {
        Ok(self.with_home(home, |h| {
            let held = h.units.get(&a.user).copied().unwrap_or(0);
            if let Some(record) = h.reqs.get(&a.rid) {
                return ReserveReply::Replay {
                    record: record.clone(),
                    held,
                };
            }
            if a.limit > 0 && held + a.units > u64::from(a.limit) {
                h.reqs.insert(a.rid.clone(), a.limited.clone());
                return ReserveReply::Limit { held };
            }
            *h.units.entry(a.user.clone()).or_default() += a.units;
            h.reqs.insert(a.rid.clone(), a.pending.clone());
            h.pend.insert(a.rid.clone(), now_ms);
            ReserveReply::Reserved
        }))
    }

    /// Mirrors `lua/decide_order.lua` (a commit ends the order).
    async fn commit_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        bought: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        Ok(self.decide(
            home,
            rid,
            pending,
            bought,
            true,
            bought.head().map(|h| &h.order_id),
        ))
    }

    /// Mirrors `lua/decide_order.lua` (an abort keeps the order listed).
    async fn abort_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        refused: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        Ok(self.decide(home, rid, pending, refused, false, None))
    }

    /// Mirrors `lua/decide_order.lua` (the order id indexed).
    async fn hold_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        held: &HomeRecord,
        order_id: &OrderId,
    ) -> Result<Decided, StoreError> {
        Ok(self.decide(home, rid, pending, held, false, Some(order_id)))
    }

    /// Mirrors `lua/decide_order.lua`.
    async fn move_hold(
        &self,
        home: &HomeRef,
        rid: &str,
        expected: &HomeRecord,
        next: &HomeRecord,
        ended: bool,
    ) -> Result<Decided, StoreError> {
        Ok(self.decide(home, rid, expected, next, ended, None))
    }

    async fn order_request(
        &self,
        home: &HomeRef,
        order_id: &OrderId,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.with_home(home, |h| h.oids.get(order_id).cloned()))
    }

    /// Mirrors `lua/release_order.lua`.
    async fn release_order(
        &self,
        home: &HomeRef,
        rid: &str,
        user: &UserId,
        units: u64,
        refused: &HomeRecord,
        released: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        Ok(self.with_home(home, |h| match h.reqs.get(rid) {
            None => Decided::NoRecord,
            Some(rec) if rec != refused => Decided::Found(rec.clone()),
            Some(_) => {
                let held = h.units.entry(user.clone()).or_default();
                *held = held.saturating_sub(units);
                h.reqs.insert(rid.to_owned(), released.clone());
                h.pend.remove(rid);
                Decided::Done
            }
        }))
    }

    /// Mirrors `lua/stale_orders.lua`.
    async fn stale_orders(
        &self,
        home: &HomeRef,
        before_ms: i64,
        count: u32,
    ) -> Result<Vec<(String, HomeRecord)>, StoreError> {
        Ok(self.with_home(home, |h| {
            let mut due: Vec<(i64, String)> = h
                .pend
                .iter()
                .filter(|(_, at)| **at <= before_ms)
                .map(|(rid, at)| (*at, rid.clone()))
                .collect();
            due.sort();
            due.truncate(count as usize);
            let mut out = Vec::new();
            for (_, rid) in due {
                match h.reqs.get(&rid) {
                    Some(
                        rec @ (HomeRecord::Pending(_)
                        | HomeRecord::Refused(..)
                        | HomeRecord::Held(..)),
                    ) => out.push((rid, rec.clone())),
                    _ => {
                        h.pend.remove(&rid);
                    }
                }
            }
            out
        }))
    }

    async fn home_record(
        &self,
        home: &HomeRef,
        rid: &str,
    ) -> Result<Option<HomeRecord>, StoreError> {
        Ok(self.with_home(home, |h| h.reqs.get(rid).cloned()))
    }

    async fn home_units(&self, home: &HomeRef, user: &UserId) -> Result<u64, StoreError> {
        Ok(self.with_home(home, |h| h.units.get(user).copied().unwrap_or(0)))
    }

    /// Mirrors `lua/take.lua` with the line's undone and confirmed markers:
    /// either stops the walk; anything else is `take`.
    async fn take_line(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineTake, StoreError> {
        // Two critical sections, and as good as one: `take` answers an
        // undone or confirmed marker as short and writes nothing, and a
        // short decision (or another order's take) is never turned into
        // either, so a short answer whose marker is one of them right after
        // found it so (both are final until they expire).
        Ok(match self.take(b, now_ms, a).await? {
            TakeReply::Taken { order_id } => LineTake::Taken { order_id },
            TakeReply::Short {
                available,
                fresh,
                adds,
            } => match self.line_marker(b, a)? {
                Some(Marker::Undone) => LineTake::Undone,
                Some(Marker::Confirmed) => LineTake::Confirmed,
                _ => LineTake::Short {
                    available,
                    fresh,
                    adds,
                },
            },
        })
    }

    /// Mirrors `lua/undo_line.lua`.
    async fn undo_line(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineUndo, StoreError> {
        self.give_back_line(b, now_ms, a, RecordKind::Void).await
    }

    /// Mirrors `lua/undo_line.lua` with a record of `kind` (`held` = a kind
    /// other than `Void`).
    async fn give_back_line(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
        kind: RecordKind,
    ) -> Result<LineUndo, StoreError> {
        self.with(b, |bk| {
            match bk.marker(&a.rid, a.pass) {
                // A held order's give-back: its walk passed this bucket (a
                // short decision since expired), and its take is further on.
                None if kind != RecordKind::Void => return LineUndo::Short,
                None => {
                    bk.set_marker(&a.rid, a.pass, Marker::Undone, a.marker_ttl_ms);
                    return LineUndo::Closed;
                }
                Some(Marker::Undone) => return LineUndo::Already,
                Some(Marker::Taken(oid)) if *oid == a.order_id => {}
                Some(_) => return LineUndo::Short,
            }
            bk.set_marker(&a.rid, a.pass, Marker::Undone, a.marker_ttl_ms);
            bk.stock += u64::from(a.qty);
            bk.adds += 1;
            bk.append(a.stream_entry(kind, b.index, now_ms));
            LineUndo::GaveBack
        })
    }

    /// Mirrors `lua/confirm_line.lua`.
    async fn confirm_line(
        &self,
        b: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineConfirm, StoreError> {
        self.with(b, |bk| {
            match bk.marker(&a.rid, a.pass) {
                None | Some(Marker::Undone) => return LineConfirm::Missing,
                Some(Marker::Confirmed) => return LineConfirm::Already,
                Some(Marker::Taken(oid)) if *oid == a.order_id => {}
                Some(_) => return LineConfirm::Short,
            }
            bk.set_marker(&a.rid, a.pass, Marker::Confirmed, a.marker_ttl_ms);
            bk.append(a.stream_entry(RecordKind::Confirm, b.index, now_ms));
            LineConfirm::Confirmed
        })
    }
}

impl MemoryStore {
    /// The line's marker in `b`, unless it expired.
    fn line_marker(&self, b: &BucketRef, a: &TakeArgs) -> Result<Option<Marker>, StoreError> {
        self.with(b, |bk| bk.marker(&a.rid, a.pass).cloned())
    }
}
