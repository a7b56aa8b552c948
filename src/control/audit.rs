//! The conservation audit: every unit of an event accounted for, at one instant.
//!
//! `stock = remaining + in_transfer + (sold_flushed + sold_unflushed)
//!          − (released_flushed + released_unflushed) + leftover`
//!
//! Held units (events with holds) are sold units not confirmed yet: counted
//! in `sold` like any take, and shown apart in `held` (read with each bucket,
//! in the same step). An expiry releases them as a cancel does (`released`).
//!
//! Buckets are read one atomic script each (stock and stream change together,
//! so each bucket is self-consistent), then their change counters are read
//! again: if a transfer moved units in or out of a bucket, or a cancel added
//! some, meanwhile, the read is repeated (a double collect), and so it is if
//! the layouts changed (a reshard began) after the meta was read. Units between IN and CLEAR of a transfer are
//! counted once: an open journal entry whose id a bucket already applied is not
//! "in transfer". Every layout that may hold units is read — during a reshard
//! the old, the new and the retired ones. The ledger is then read in one snapshot, leaving out
//! records written after the buckets were read (by stream id) and skipping the
//! stream records it already has (committed, not yet deleted from Redis).

use std::collections::HashSet;

use futures::future::try_join_all;
use serde::Serialize;

use crate::control::ControlError;
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::stream::RecordKind;
use crate::engine::{Engine, EngineError};
use crate::ledger::{Ledger, StreamCut};
use crate::metrics as m;
use crate::store::{BucketAudit, Store, StoreError};

/// The audit as `GET /v1/events/{id}/audit` and `shardstock audit` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Audit {
    pub event_id: EventId,
    pub stock: u64,
    pub remaining: u64,
    pub in_transfer: u64,
    pub sold_flushed: u64,
    pub sold_unflushed: u64,
    /// Units given back (cancels, voids), flushed and not.
    pub released: u64,
    pub released_unflushed: u64,
    /// Units left in buckets at the end of the sale.
    pub leftover: u64,
    /// Units in live holds (taken, not confirmed yet): part of `sold_*`.
    pub held: u64,
    /// Times the database guard refused a batch (must be 0).
    pub guard_violations: u64,
    pub balanced: bool,
}

impl Audit {
    /// Does the conservation equation hold?
    fn check(&mut self) {
        let accounted = (self.remaining
            + self.in_transfer
            + self.sold_flushed
            + self.sold_unflushed
            + self.leftover) as i128
            - self.released as i128;
        self.balanced = accounted == self.stock as i128 && self.guard_violations == 0;
    }
}

/// Reads every bucket, twice for the addition counters; `None` if they moved.
async fn collect<S: Store>(
    store: &S,
    buckets: &[BucketRef],
) -> Result<Option<Vec<Option<BucketAudit>>>, StoreError> {
    let reads = try_join_all(buckets.iter().map(|b| async move {
        match store.audit_bucket(b).await {
            Ok(a) => Ok(Some(a)),
            Err(StoreError::Stale(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }))
    .await?;
    let again = try_join_all(buckets.iter().map(|b| async move {
        match store.counters(b).await {
            Ok((adds, _)) => Ok(Some(adds)),
            Err(StoreError::Stale(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }))
    .await?;
    let same = reads
        .iter()
        .zip(&again)
        .all(|(r, a)| r.as_ref().map(|r| r.adds) == *a || r.is_none());
    Ok(same.then_some(reads))
}

/// Audits an event (see the module docs).
pub async fn audit<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    event: &EventId,
) -> Result<Audit, ControlError> {
    let store = engine.store();
    for _ in 0..20 {
        let meta = match store.load_meta(event).await? {
            Some(meta) => meta,
            None => {
                let db = ledger
                    .event(event)
                    .await?
                    .ok_or_else(|| EngineError::UnknownEvent(event.clone()))?;
                return from_ledger_only(ledger, event, db.spec.stock).await;
            }
        };
        let buckets = meta.all_buckets();
        let Some(reads) = collect(store, &buckets).await? else {
            continue;
        };
        // A reshard that began after the meta was read moves units into
        // buckets this audit did not read: then read again.
        match store.load_meta(event).await? {
            Some(now) if now.generation == meta.generation && now.reshard_to == meta.reshard_to => {
            }
            _ => continue,
        }
        // Transfer ids are unique across layouts (a reshard's land in the new one).
        let applied: HashSet<&String> = reads
            .iter()
            .flatten()
            .flat_map(|r| r.applied.iter())
            .collect();
        let cuts: Vec<StreamCut> = buckets
            .iter()
            .zip(&reads)
            .filter_map(|(b, r)| {
                r.as_ref().map(|r| StreamCut {
                    stream: b.name(),
                    last: r.last_id,
                    present: r.entries.iter().map(|(id, ..)| *id).collect(),
                })
            })
            .collect();
        let db = ledger.audit_view(event, &cuts).await?;
        let mut a = Audit {
            event_id: event.clone(),
            stock: meta.spec.stock,
            remaining: 0,
            in_transfer: 0,
            sold_flushed: db.totals.sold,
            sold_unflushed: 0,
            released: db.totals.released,
            released_unflushed: 0,
            leftover: db.totals.leftover,
            held: 0,
            guard_violations: db.totals.guard_violations,
            balanced: false,
        };
        for (b, r) in buckets.iter().zip(&reads) {
            let Some(r) = r else { continue };
            a.remaining += r.stock;
            // A sealed layout's holds moved with their users (a reshard's
            // restore) or were voided (a close): count the live ones once.
            if !r.sealed {
                a.held += r.held;
            }
            for (xid, _, units) in &r.open {
                if !applied.contains(xid) {
                    a.in_transfer += units;
                }
            }
            let stream = b.name();
            for (id, kind, qty) in &r.entries {
                if db.already.contains(&(stream.clone(), *id)) {
                    continue;
                }
                match kind {
                    RecordKind::Order => a.sold_unflushed += qty,
                    RecordKind::Cancel | RecordKind::Void | RecordKind::Expire => {
                        a.released += qty;
                        a.released_unflushed += qty;
                    }
                    RecordKind::Leftover => a.leftover += qty,
                    // A hold's start and its confirmation move no units.
                    RecordKind::Hold | RecordKind::Confirm => {}
                }
            }
        }
        // The ledger's pending excess (its flushed records over the stock
        // while the sale is open) is no violation when the releases still in
        // the streams cover it: a cancel flushed after the re-sale of its unit.
        let net = (a.sold_flushed + a.sold_unflushed + a.leftover) as i128 - a.released as i128;
        if db.totals.guard_pending && net <= a.stock as i128 {
            a.guard_violations -= 1;
        }
        a.check();
        metrics::gauge!(m::AUDIT_BALANCED, "event" => event.to_string()).set(if a.balanced {
            1.0
        } else {
            0.0
        });
        return Ok(a);
    }
    Err(ControlError::Busy(format!(
        "the buckets of {event} kept changing; audit again"
    )))
}

/// The audit of an event the store no longer has (closed and expired).
async fn from_ledger_only(
    ledger: &Ledger,
    event: &EventId,
    stock: u64,
) -> Result<Audit, ControlError> {
    let t = ledger.totals(event).await?.unwrap_or_default();
    let mut a = Audit {
        event_id: event.clone(),
        stock,
        remaining: 0,
        in_transfer: 0,
        sold_flushed: t.sold,
        sold_unflushed: 0,
        released: t.released,
        released_unflushed: 0,
        leftover: t.leftover,
        held: 0,
        guard_violations: t.guard_violations,
        balanced: false,
    };
    a.check();
    metrics::gauge!(m::AUDIT_BALANCED, "event" => event.to_string()).set(if a.balanced {
        1.0
    } else {
        0.0
    });
    Ok(a)
}
