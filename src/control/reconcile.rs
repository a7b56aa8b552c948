//! Reconciliation after a partial loss: the store lost some writes the
//! ledger has.
//!
//! Redis can come back with less than it acknowledged: restarted from an AOF
//! whose last second was never fsynced (`appendfsync everysec` and a host
//! crash), or a replica promoted before it had its master's last writes
//! (replication is asynchronous unless `store.min_replicas` is on). The event
//! is still there, so nothing looks lost — but orders the flusher had already
//! written to the ledger lost their decrements, and the buckets offer their
//! units again. The audit sees it (`Audit::discrepancy` > 0: that many units
//! are held by orders in the ledger and on sale in the store).
//!
//! What is promised: **no unit that an order in the ledger holds is sold
//! again** once the loss is found — the found units are taken off sale
//! ([`Retirement::forfeit`], atomic per bucket, units are interchangeable),
//! or, by the `lost_state` setting, the event is refused until an operator
//! runs `shardstock recover`, which does the same. What cannot be promised:
//! an order acknowledged but not yet flushed when Redis lost it exists
//! nowhere any more — only the buyer's 201 remembers it (`min_replicas`
//! closes that window for failovers; an AOF with `appendfsync always` for
//! restarts). And units the loss put back on sale that were sold again
//! before the loss was found are short (`short`): oversold, reported.
//!
//! The repair runs under the event's mover lease and audits again under it
//! first, so two instances finding the same loss take the units off once,
//! and no transfer moves units meanwhile. It runs only while the event is
//! on sale (a close or a reshard moves what the buckets hold: the next
//! audit after it decides).

use std::time::Duration;

use crate::control::ControlError;
use crate::control::audit::{Audit, audit};
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::model::EventStatus;
use crate::engine::{Engine, Lease};
use crate::ledger::Ledger;
use crate::store::{Store, StoreError};

/// How long the repair holds the mover lease at most.
const LEASE_TTL: Duration = Duration::from_secs(10);
/// How long it waits for a mover to give the lease back.
const PATIENCE: Duration = Duration::from_secs(2);

/// What a reconciliation found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// No unit is held both by an order and by a bucket (the audit).
    Clean(Audit),
    /// `units` were held both ways: taken off sale, but for `short` of them,
    /// which had been sold again already.
    Repaired { units: u64, short: u64 },
    /// `units` are held both ways; left for an operator (`refuse`).
    Found { units: u64 },
}

/// Audits `event`; if the store offers units orders in the ledger hold,
/// takes them off sale when `repair`, else only reports them. `Busy` when
/// the event is not on sale or a mover keeps the lease.
pub async fn reconcile<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    event: &EventId,
    repair: bool,
) -> Result<Reconciled, ControlError> {
    let found = audit(engine, ledger, event).await?;
    if found.discrepancy <= 0 {
        return Ok(Reconciled::Clean(found));
    }
    if !repair {
        return Ok(Reconciled::Found {
            units: found.discrepancy as u64,
        });
    }
    let store = engine.store();
    let owner = Lease::owner(engine.instance(), "reconcile");
    let Some(lease) = Lease::wait(store, event, &owner, LEASE_TTL, PATIENCE).await? else {
        return Err(ControlError::Busy(format!(
            "a mover holds the lease of {event}; reconcile again"
        )));
    };
    let repaired = repair_under_lease(engine, ledger, event).await;
    lease.release(store).await;
    repaired
}

async fn repair_under_lease<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    event: &EventId,
) -> Result<Reconciled, ControlError> {
    let store = engine.store();
    let meta = store
        .load_meta(event)
        .await?
        .ok_or_else(|| ControlError::Busy(format!("{event} is gone from the store")))?;
    if meta.status != EventStatus::OnSale || meta.reshard_to.is_some() {
        return Err(ControlError::Busy(format!(
            "{event} is {}: reconcile once it is on sale",
            meta.status.as_str()
        )));
    }
    // Again, under the lease: another instance may have repaired it.
    let found = audit(engine, ledger, event).await?;
    if found.discrepancy <= 0 {
        return Ok(Reconciled::Clean(found));
    }
    let units = found.discrepancy as u64;
    let mut want = units;
    for b in 0..meta.spec.buckets {
        if want == 0 {
            break;
        }
        let bucket = BucketRef::new(event, meta.generation, b);
        match store.forfeit(&bucket, want).await {
            Ok(taken) => want -= taken,
            Err(StoreError::Stale(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::warn!(
        %event,
        units,
        short = want,
        "the store had lost writes the ledger has: took their units off sale"
    );
    Ok(Reconciled::Repaired { units, short: want })
}
