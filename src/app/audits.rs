//! The periodic audits of the events this instance sells, and what they do
//! when one finds a partial loss (the store lost writes the ledger has).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::control::ControlError;
use crate::control::reconcile::{Reconciled, reconcile as reconcile_event};
use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::engine::Engine;
use crate::http::{Quarantine, Quarantined};
use crate::ledger::Ledger;
use crate::metrics as m;
use crate::store::Store;

/// What the audits do when one finds a partial loss (`control::reconcile`).
pub(super) struct Reaction {
    pub(crate) quarantine: Arc<Quarantine>,
    /// Take the found units off sale (`lost_state = "rebuild"`), or hold the
    /// event until an operator recovers it (`"refuse"`).
    pub repair: bool,
}

/// Audits, now and then, the events this instance sold (or cancelled, or
/// moved) since its last look, keeping `shardstock_audit_balanced` current.
/// An idle event is not audited again: nothing changed (a flush moves records
/// from the streams to the ledger and leaves every sum as it was), and the
/// instances that do sell it audit it. An audit that could not finish is
/// tried again next time (the buckets kept changing).
///
/// An audit that finds the store offering units orders in the ledger hold
/// (a partial loss: Redis lost writes the ledger has) reconciles the event
/// at once: the units are taken off sale, or the event is quarantined (purchases
/// answer 503) until an operator recovers it; either way
/// `shardstock_store_units_lost_total` counts them. Quarantined events are audited
/// every round, and released once the audit balances again.
pub(super) async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    every: Duration,
    react: Reaction,
    stop: CancellationToken,
) {
    let mut ticker = Ticker::new(every, &stop);
    let mut since = std::time::Instant::now();
    let mut again: Vec<EventId> = Vec::new();
    let mut reported: HashMap<EventId, u64> = HashMap::new();
    while ticker.tick().await {
        let now = std::time::Instant::now();
        let mut events = engine.activity().events_since(since);
        since = now;
        for event in std::mem::take(&mut again)
            .into_iter()
            .chain(react.quarantine.partial())
        {
            if !events.contains(&event) {
                events.push(event);
            }
        }
        for event in events {
            let quarantined = matches!(
                react.quarantine.get(&event),
                Some(Quarantined::Partial { .. })
            );
            let audit = crate::control::audit::audit(&engine, &ledger, &event).await;
            if matches!(&audit, Ok(a) if a.discrepancy <= 0) {
                reported.remove(&event);
            }
            match audit {
                Ok(a) if a.discrepancy > 0 => {
                    if let Err(e) = reconcile(&engine, &ledger, &event, &react, &mut reported).await
                    {
                        tracing::warn!(%event, error = %e, "reconciling failed; again next round");
                        again.push(event);
                    }
                }
                Ok(a) if !a.balanced => {
                    tracing::error!(%event, audit = ?a, "audit does not balance")
                }
                Ok(_) if quarantined => {
                    tracing::warn!(%event, "the event balances again: selling it");
                    react.quarantine.release(&event);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%event, error = %e, "audit skipped");
                    if matches!(e, ControlError::Busy(_)) {
                        again.push(event);
                    }
                }
            }
        }
    }
}

/// An audit found units held both by orders in the ledger and by buckets:
/// take them off sale or quarantine the event (see [`run`]). `reported` holds, per
/// event, the units of the finding already counted and logged (left quarantined, or
/// oversold: found again every round), so each unit is counted once.
async fn reconcile<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    event: &EventId,
    react: &Reaction,
    reported: &mut HashMap<EventId, u64>,
) -> Result<(), ControlError> {
    let known = reported.get(event).copied().unwrap_or(0);
    let lost = |units: u64| {
        metrics::counter!(m::STORE_UNITS_LOST, "event" => event.to_string()).increment(units);
    };
    match reconcile_event(engine, ledger, event, react.repair).await? {
        Reconciled::Clean(_) => {
            reported.remove(event);
            react.quarantine.release(event);
        }
        Reconciled::Repaired { units, short } => {
            lost(units.saturating_sub(known));
            if short > 0 {
                if units > known {
                    tracing::error!(
                        %event, units, short,
                        "the store lost writes the ledger has, and {short} of their units were \
                         sold again before it was found: oversold"
                    );
                }
                reported.insert(event.clone(), short);
            } else {
                reported.remove(event);
            }
            react.quarantine.release(event);
        }
        Reconciled::Found { units } => {
            if units > known {
                lost(units - known);
                tracing::error!(
                    %event, units,
                    "the store lost writes the ledger has: {units} units held by orders are on \
                     sale again; refusing the event until an operator runs `shardstock recover {event}`"
                );
            }
            reported.insert(event.clone(), units);
            react
                .quarantine
                .quarantine(event.clone(), Quarantined::Partial { units });
        }
    }
    Ok(())
}
