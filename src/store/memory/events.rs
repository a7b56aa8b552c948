//! The event slot in memory: the meta of each event, in the event map.

use super::leases::LeaseSlot;
use super::{EventSlot, MemoryStore};
use crate::domain::ids::EventId;
use crate::domain::model::{
    EventMeta, EventSpec, EventStatus, HISTORY_CAP, LayoutChange, SoldOutMark,
};
use crate::domain::token::TokenAccess;
use crate::store::{CreateEventReply, EndReshardReply, Events, SeqBump, StoreError};

impl Events for MemoryStore {
    /// Mirrors `lua/create_event.lua`.
    async fn create_event(
        &self,
        spec: &EventSpec,
        now_ms: i64,
    ) -> Result<CreateEventReply, StoreError> {
        let mut events = self.inner.events.lock().expect("event map poisoned");
        if let Some(slot) = events.get(&spec.id) {
            return Ok(CreateEventReply::Exists(Box::new(slot.meta.clone())));
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
            history: vec![LayoutChange {
                generation: 0,
                buckets: spec.buckets,
                at_ms: now_ms,
                reason: "created".into(),
            }],
        };
        events.insert(
            spec.id.clone(),
            EventSlot {
                meta,
                lease: LeaseSlot::default(),
                leader: LeaseSlot::default(),
                epochs_due: None,
                retired: false,
                archived: false,
                settled: Default::default(),
            },
        );
        Ok(CreateEventReply::Created)
    }

    /// The event map is the set of known events: a registered event is open.
    async fn register_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.with_event(event, |s| s.retired = false);
        Ok(())
    }

    async fn list_events(&self) -> Result<Vec<EventId>, StoreError> {
        let events = self.inner.events.lock().expect("event map poisoned");
        Ok(events
            .iter()
            .filter(|(_, s)| !s.archived)
            .map(|(id, _)| id.clone())
            .collect())
    }

    async fn list_open_events(&self) -> Result<Vec<EventId>, StoreError> {
        let events = self.inner.events.lock().expect("event map poisoned");
        Ok(events
            .iter()
            .filter(|(_, s)| !s.retired && !s.archived)
            .map(|(id, _)| id.clone())
            .collect())
    }

    /// Out of both sets: the slot stays, marked archived.
    async fn archive_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.with_event(event, |s| {
            s.retired = true;
            s.archived = true;
        });
        Ok(())
    }

    /// `ss:events` → `ss:retired`: the slot stays, marked retired.
    async fn retire_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.with_event(event, |s| s.retired = true);
        Ok(())
    }

    async fn load_meta(&self, event: &EventId) -> Result<Option<EventMeta>, StoreError> {
        Ok(self.with_event(event, |s| s.meta.clone()))
    }

    /// The meta's `tokens` field, as Redis's HGET reads it.
    async fn load_token_keys(&self, event: &EventId) -> Result<Option<TokenAccess>, StoreError> {
        Ok(self
            .with_event(event, |s| s.meta.spec.tokens.clone())
            .flatten())
    }

    /// Mirrors `lua/set_status.lua`.
    async fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| {
            let ok = s.meta.status == from;
            if ok {
                s.meta.status = to;
            }
            ok
        }))
    }

    /// Mirrors `lua/set_token_keys.lua`.
    async fn set_token_keys(
        &self,
        event: &EventId,
        keys: &TokenAccess,
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| {
            let ok = s.meta.spec.tokens.is_some() && s.meta.status != EventStatus::Closed;
            if ok {
                s.meta.spec.tokens = Some(keys.clone());
            }
            ok
        }))
    }

    /// Mirrors `lua/set_layout.lua`.
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

    /// Mirrors `lua/set_retired.lua`.
    async fn set_retired(
        &self,
        event: &EventId,
        generation: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| {
            let current = s.meta.status == EventStatus::OnSale && s.meta.generation == generation;
            if current {
                s.meta.retired = retired.to_vec();
            }
            current
        }))
    }

    /// Mirrors `lua/bump_seq.lua`.
    async fn bump_seq(&self, event: &EventId) -> Result<SeqBump, StoreError> {
        self.with_event(event, |s| {
            let marked = s.meta.sold_out.is_some_and(|m| m.seq == s.meta.seq);
            s.meta.seq += 1;
            if marked {
                s.epochs_due = Some(s.meta.seq);
            }
            SeqBump {
                seq: s.meta.seq,
                epochs_due: s.epochs_due,
            }
        })
        .ok_or_else(|| StoreError::Stale(format!("meta of {event}")))
    }

    /// Mirrors `lua/epochs_bumped.lua`.
    async fn epochs_bumped(&self, event: &EventId, due: u64) -> Result<bool, StoreError> {
        Ok(self
            .with_event(event, |s| {
                let current = s.epochs_due == Some(due);
                if current {
                    s.epochs_due = None;
                }
                current
            })
            .unwrap_or(false))
    }

    /// Mirrors `lua/mark_sold_out.lua`.
    async fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
        left: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| {
            let ok = s.meta.seq == seq;
            if ok {
                s.meta.sold_out = Some(SoldOutMark {
                    seq,
                    at_ms: now_ms,
                    left,
                });
            }
            ok
        }))
    }

    /// Mirrors `lua/begin_reshard.lua`.
    async fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| match s.meta.status {
            EventStatus::OnSale => {
                s.meta.status = EventStatus::Resharding;
                s.meta.reshard_to = Some((generation, buckets));
                true
            }
            EventStatus::Resharding => s.meta.reshard_to == Some((generation, buckets)),
            _ => false,
        }))
    }

    /// Mirrors `lua/end_reshard.lua`.
    async fn end_reshard(
        &self,
        event: &EventId,
        change: &LayoutChange,
        retired: &[(u32, u32)],
        owner: &str,
        token: u64,
    ) -> Result<EndReshardReply, StoreError> {
        let (generation, buckets) = (change.generation, change.buckets);
        let reply = self.with_event(event, |s| {
            if s.meta.status != EventStatus::Resharding
                || s.meta.reshard_to != Some((generation, buckets))
            {
                return EndReshardReply::NotResharding;
            }
            if s.lease.holder() != Some((owner.to_owned(), token)) {
                return EndReshardReply::LeaseLost;
            }
            s.meta.generation = generation;
            s.meta.spec.buckets = buckets;
            s.meta.retired = retired.to_vec();
            s.meta.status = EventStatus::OnSale;
            s.meta.reshard_to = None;
            s.meta.seq += 1;
            s.meta.history.push(change.clone());
            let over = s.meta.history.len().saturating_sub(HISTORY_CAP);
            s.meta.history.drain(..over);
            EndReshardReply::Switched
        });
        Ok(reply.unwrap_or(EndReshardReply::NotResharding))
    }
}
