//! The end of a bucket in memory: seal, leftover, the audit's read, what the
//! bucket remembers and expiry.

use std::time::{Duration, Instant};

use super::{Marker, MemoryStore};
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EntryState, OrderEntry, RequestRecord};
use crate::domain::stream::StreamEntry;
use crate::store::{
    BucketAudit, BucketContents, RestoreReply, Retirement, StoreError, TransferReply,
};

impl Retirement for MemoryStore {
    /// Mirrors `lua/seal.lua`.
    async fn seal(&self, b: &BucketRef) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            bk.sealed = true;
            bk.stock
        })
    }

    /// Mirrors `lua/forfeit.lua`.
    async fn forfeit(&self, b: &BucketRef, units: u64) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            if bk.sealed {
                return 0;
            }
            let take = bk.stock.min(units);
            if take > 0 {
                bk.stock -= take;
                bk.adds += 1;
            }
            take
        })
    }

    /// Mirrors `lua/retire.lua`.
    async fn retire(&self, b: &BucketRef, now_ms: i64) -> Result<Option<u64>, StoreError> {
        self.with(b, |bk| {
            if !bk.sealed {
                return None;
            }
            let units = std::mem::take(&mut bk.stock) + std::mem::take(&mut bk.wait.units);
            bk.wait.aside = 0;
            if units > 0 {
                bk.append(StreamEntry {
                    qty: units,
                    ..StreamEntry::leftover(b.name(), b.index, now_ms)
                });
            }
            Some(units)
        })
    }

    /// Mirrors `lua/audit_bucket.lua` and the adapter's paging after it, in
    /// one piece (no Redis thread to keep free here).
    async fn audit_bucket(&self, b: &BucketRef) -> Result<BucketAudit, StoreError> {
        self.with(b, |bk| BucketAudit {
            stock: bk.stock + bk.wait.units,
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
            entries: bk
                .stream
                .iter()
                .map(|s| (s.entry.id, s.entry.kind, s.entry.qty))
                .collect(),
            // It never loses a write: every record after the last id is newer.
            read_ms: 0,
            held: bk.hunits,
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
                .filter_map(|pass| match bk.marker(rid, pass) {
                    Some(Marker::Taken(oid)) => Some((pass, oid.clone())),
                    _ => None,
                })
                .collect()
        })
    }

    /// Mirrors `lua/restore.lua`.
    async fn restore(
        &self,
        b: &BucketRef,
        token: u64,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
        tokens: &[(String, u64)],
    ) -> Result<RestoreReply, StoreError> {
        let reply = self.with(b, |bk| {
            if let Err(TransferReply::Fenced { highest }) = bk.fence(token) {
                return RestoreReply::Fenced { highest };
            }
            // Only where the bucket has none yet (restore.lua: its source is
            // frozen, so what is here is as new or newer).
            for (user, units) in holdings {
                bk.users.entry(user.clone()).or_insert(*units);
            }
            for (oid, entry) in orders {
                if bk.idx.contains_key(oid) {
                    continue;
                }
                bk.idx.insert(oid.clone(), entry.clone());
                // A live hold this call wrote joins the deadline index.
                if let (EntryState::Held, Some(pay_by)) = (entry.state, entry.pay_by) {
                    bk.holds.insert((pay_by, oid.to_string()));
                    bk.hunits += u64::from(entry.qty);
                }
            }
            for (rid, record) in records {
                bk.reqs.entry(rid.clone()).or_insert_with(|| record.clone());
            }
            for (id, used) in tokens {
                bk.tokens.entry(id.clone()).or_insert((*used, 0));
            }
            RestoreReply::Restored
        })?;
        let first = orders
            .iter()
            .filter(|(_, e)| e.state == EntryState::Held)
            .filter_map(|(_, e)| e.pay_by)
            .min();
        if let (RestoreReply::Restored, Some(at)) = (reply, first) {
            self.announce(b, at);
        }
        Ok(reply)
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
            tokens: bk
                .tokens
                .iter()
                .filter(|(_, (used, _))| *used > 0)
                .map(|(id, (used, _))| (id.clone(), *used))
                .collect(),
            reserved: bk
                .tokens
                .iter()
                .filter(|(_, (_, reserved))| *reserved > 0)
                .map(|(id, (_, reserved))| (id.clone(), *reserved))
                .collect(),
            token_sagas: bk.token_sagas.len(),
        })
    }

    async fn expire_bucket(&self, b: &BucketRef, ttl_ms: u64) -> Result<(), StoreError> {
        self.with(b, |bk| {
            bk.expires = Some(Instant::now() + Duration::from_millis(ttl_ms))
        })
    }
}
