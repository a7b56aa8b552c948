//! The quarantine: events an instance refuses to sell until an operator
//! recovers them (not to be confused with a pay-by hold): the
//! store lost the event (start-up check, `lost_state = "refuse"`), or lost
//! some of its writes that the ledger has (a partial loss found by the
//! periodic audit, `control::reconcile`). Set by the application, read by
//! the purchase path.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ApiError;
use crate::domain::ids::EventId;

/// Why an event is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quarantined {
    /// The store lost the event itself (it has no meta), the ledger has it on sale.
    Lost,
    /// The store lost some writes the ledger has: `units` held by orders in
    /// the ledger are on sale again (`database.lost_state = "refuse"`).
    Partial { units: u64 },
}

/// Events this instance refuses to sell until an operator recovers them
/// (`shardstock recover`): a purchase of one answers `503
/// backend-unavailable`, nothing deducted. The purchase path asks
/// [`Quarantine::refusal`] first: one relaxed atomic load while nothing is quarantined.
#[derive(Debug, Default)]
pub struct Quarantine {
    any: AtomicBool,
    events: RwLock<HashMap<EventId, Quarantined>>,
}

impl Quarantine {
    /// Quarantines the events the store lost at start-up.
    pub fn lost(events: impl IntoIterator<Item = EventId>) -> Self {
        let q = Self::default();
        for e in events {
            q.quarantine(e, Quarantined::Lost);
        }
        q
    }

    pub fn contains(&self, event: &EventId) -> bool {
        self.get(event).is_some()
    }

    pub fn get(&self, event: &EventId) -> Option<Quarantined> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.events
            .read()
            .expect("quarantine poisoned")
            .get(event)
            .copied()
    }

    pub(crate) fn quarantine(&self, event: EventId, why: Quarantined) {
        let mut events = self.events.write().expect("quarantine poisoned");
        events.insert(event, why);
        self.any.store(true, Ordering::Relaxed);
    }

    pub fn release(&self, event: &EventId) {
        let mut events = self.events.write().expect("quarantine poisoned");
        events.remove(event);
        self.any.store(!events.is_empty(), Ordering::Relaxed);
    }

    /// The events quarantined for a partial loss (re-audited until recovered).
    pub fn partial(&self) -> Vec<EventId> {
        let events = self.events.read().expect("quarantine poisoned");
        events
            .iter()
            .filter(|(_, h)| matches!(h, Quarantined::Partial { .. }))
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// The answer to a purchase of a quarantined event, if it is.
    pub fn refusal(&self, event: &EventId) -> Option<ApiError> {
        let detail = match self.get(event)? {
            Quarantined::Lost => format!(
                "the store lost event {event}, which the database has on sale; \
                 an operator must run `shardstock recover {event}`"
            ),
            Quarantined::Partial { units } => format!(
                "the store lost writes of event {event} that the database has ({units} units \
                 held by orders are on sale again); an operator must run `shardstock recover {event}`"
            ),
        };
        Some(ApiError::Unavailable {
            detail,
            outcome_unknown: false,
        })
    }
}
