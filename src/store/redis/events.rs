//! The event slot on Redis: `ss:{<event>}:meta` (a HASH the scripts write
//! field by field), the `ss:events` set of open events and the `ss:retired`
//! set of closed, flushed ones.

use std::collections::HashMap;

use fred::prelude::*;

use super::scripts::reply;
use super::steps;
use super::{At, RedisStore, arg, code, num, unknown};
use crate::domain::ids::EventId;
use crate::domain::model::{
    BucketRange, EventMeta, EventSpec, EventStatus, HISTORY_CAP, LayoutChange, SoldOutMark,
};
use crate::domain::records::LeaseHolder;
use crate::domain::token::TokenAccess;
use crate::store::{CreateEventReply, EndReshardReply, Events, SeqBump, StoreError};

use super::steps::prelude::*;

steps! {
    /// Creates an event's meta unless it exists.
    CreateEvent = create_event {
        keys: [META],
        argv: {
            id: String, stock: u64, buckets: u32, per_user_limit: u32,
            max_per_order: u32, starts_at: String, ends_at: String, now: i64,
            hold_seconds: String, auto_buckets: String, token_keys: String,
            draw: String,
        },
        reply: Reply::Codes(&[reply::OK, reply::EXISTS]),
        writes: [Meta],
    }
    /// Moves the status from `from` to `to`.
    SetStatus = set_status {
        keys: [META],
        argv: { from: &'static str, to: &'static str },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Replaces a token or draw event's keys.
    SetTokenKeys = set_token_keys {
        keys: [META],
        argv: { token_keys: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Switches the layout the meta routes to.
    SetLayout = set_layout {
        keys: [META],
        argv: { generation: u32, buckets: u32, layouts: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Records which old layouts still hold records.
    SetRetired = set_retired {
        keys: [META],
        argv: { generation: u32, layouts: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Bumps the event's sequence number.
    BumpSeq = bump_seq {
        keys: [META],
        argv: {},
        reply: Reply::Values,
        writes: [Meta],
    }
    /// Notes that every bucket's epoch was bumped.
    EpochsBumped = epochs_bumped {
        keys: [META],
        argv: { due: u64 },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Marks the event sold out, unless units came back since `seq`.
    MarkSoldOut = mark_sold_out {
        keys: [META],
        argv: { seq: u64, mark: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Starts a reshard to a new layout.
    BeginReshard = begin_reshard {
        keys: [META],
        argv: { generation: u32, buckets: u32 },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Switches to the reshard's layout, under the mover lease.
    EndReshard = end_reshard {
        keys: [META, K::Event(LEASE_KEY)],
        argv: {
            generation: u32, buckets: u32, layouts: String, owner: String,
            token: u64, now: i64, why: String, history: usize, legacy: String,
        },
        reply: Reply::Codes(&[reply::OK, reply::NOT_RESHARDING, reply::FENCED]),
        writes: [Meta],
    }
}

impl RedisStore {
    /// The set of open event ids (one small key, written once per event).
    fn events_key(&self) -> String {
        format!("{}:events", self.namespace)
    }

    /// The set of retired event ids (closed and flushed).
    fn retired_key(&self) -> String {
        format!("{}:retired", self.namespace)
    }

    async fn members(&self, key: String) -> Result<Vec<EventId>, StoreError> {
        let ids: Vec<String> = self.call(|| self.client.smembers(key.clone())).await?;
        Ok(ids
            .into_iter()
            .filter_map(|id| EventId::parse(id).ok())
            .collect())
    }
}

impl Events for RedisStore {
    async fn create_event(
        &self,
        spec: &EventSpec,
        now_ms: i64,
    ) -> Result<CreateEventReply, StoreError> {
        let step = steps::CreateEvent {
            id: spec.id.to_string(),
            stock: spec.stock,
            buckets: spec.buckets,
            per_user_limit: spec.per_user_limit.unwrap_or(0),
            max_per_order: spec.max_per_order,
            starts_at: opt_ms(spec.starts_at),
            ends_at: opt_ms(spec.ends_at),
            now: now_ms,
            hold_seconds: spec.hold_seconds.map(|s| s.to_string()).unwrap_or_default(),
            auto_buckets: spec
                .auto_buckets
                .map(BucketRange::encode)
                .unwrap_or_default(),
            token_keys: spec
                .tokens
                .as_ref()
                .map(TokenAccess::encode)
                .unwrap_or_default(),
            draw: spec
                .draw
                .as_ref()
                .map(crate::domain::draw::DrawSpec::encode)
                .unwrap_or_default(),
        };
        let reply = self.run(step, At::Event(&spec.id)).await?;
        match code(&reply.into_array())?.as_str() {
            reply::OK => Ok(CreateEventReply::Created),
            reply::EXISTS => match self.load_meta(&spec.id).await? {
                Some(meta) => Ok(CreateEventReply::Exists(Box::new(meta))),
                None => Err(StoreError::Protocol("event vanished during create".into())),
            },
            other => Err(unknown("create_event", other)),
        }
    }

    async fn register_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.call(|| {
            self.client
                .sadd::<(), _, _>(self.events_key(), event.as_str())
        })
        .await?;
        // A rebuilt event is open again.
        self.call(|| {
            self.client
                .srem::<(), _, _>(self.retired_key(), event.as_str())
        })
        .await
    }

    async fn list_events(&self) -> Result<Vec<EventId>, StoreError> {
        let mut ids = self.members(self.events_key()).await?;
        ids.extend(self.members(self.retired_key()).await?);
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    async fn list_open_events(&self) -> Result<Vec<EventId>, StoreError> {
        self.members(self.events_key()).await
    }

    async fn archive_event(&self, event: &EventId) -> Result<(), StoreError> {
        for key in [self.retired_key(), self.events_key()] {
            self.call(|| self.client.srem::<(), _, _>(key.clone(), event.as_str()))
                .await?;
        }
        Ok(())
    }

    async fn retire_event(&self, event: &EventId) -> Result<(), StoreError> {
        // Two keys in two slots (a Cluster refuses SMOVE across them): add
        // first, so a crash in between leaves the event listed twice, not lost.
        self.call(|| {
            self.client
                .sadd::<(), _, _>(self.retired_key(), event.as_str())
        })
        .await?;
        self.call(|| {
            self.client
                .srem::<(), _, _>(self.events_key(), event.as_str())
        })
        .await
    }

    async fn load_meta(&self, event: &EventId) -> Result<Option<EventMeta>, StoreError> {
        let fields = self.hash(self.event_keys(event).meta).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        parse_meta(fields).map(Some)
    }

    /// One HGET of the meta hash's `tokens` field (empty or absent: none).
    async fn load_token_keys(&self, event: &EventId) -> Result<Option<TokenAccess>, StoreError> {
        let key = self.event_keys(event).meta;
        let field: Option<String> = self
            .call(|| self.client.hget(key.clone(), "tokens"))
            .await?;
        Ok(field.as_deref().and_then(TokenAccess::decode))
    }

    async fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> Result<bool, StoreError> {
        let step = steps::SetStatus {
            from: from.as_str(),
            to: to.as_str(),
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn set_token_keys(
        &self,
        event: &EventId,
        keys: &TokenAccess,
    ) -> Result<bool, StoreError> {
        let step = steps::SetTokenKeys {
            token_keys: keys.encode(),
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn set_layout(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        let step = steps::SetLayout {
            generation,
            buckets,
            layouts: EventMeta::encode_layouts(retired),
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn set_retired(
        &self,
        event: &EventId,
        generation: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        let step = steps::SetRetired {
            generation,
            layouts: EventMeta::encode_layouts(retired),
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn bump_seq(&self, event: &EventId) -> Result<SeqBump, StoreError> {
        let v = self.run(steps::BumpSeq {}, At::Event(event)).await?;
        // -1: the event has no meta.
        if v.as_i64() == Some(-1) {
            return Err(StoreError::Stale(format!("meta of {event}")));
        }
        let parts = v.into_array();
        Ok(SeqBump {
            seq: num(arg(&parts, 0)?)?,
            epochs_due: Some(num(arg(&parts, 1)?)?).filter(|&due| due > 0),
        })
    }

    async fn epochs_bumped(&self, event: &EventId, due: u64) -> Result<bool, StoreError> {
        self.run_flag(steps::EpochsBumped { due }, At::Event(event))
            .await
    }

    async fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
        left: u64,
    ) -> Result<bool, StoreError> {
        let mark = SoldOutMark {
            seq,
            at_ms: now_ms,
            left,
        };
        let step = steps::MarkSoldOut {
            seq,
            mark: mark.encode(),
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> Result<bool, StoreError> {
        let step = steps::BeginReshard {
            generation,
            buckets,
        };
        self.run_flag(step, At::Event(event)).await
    }

    async fn end_reshard(
        &self,
        event: &EventId,
        change: &LayoutChange,
        retired: &[(u32, u32)],
        owner: &str,
        token: u64,
    ) -> Result<EndReshardReply, StoreError> {
        let step = steps::EndReshard {
            generation: change.generation,
            buckets: change.buckets,
            layouts: EventMeta::encode_layouts(retired),
            owner: owner.to_owned(),
            token,
            now: change.at_ms,
            why: change.reason.clone(),
            history: HISTORY_CAP,
            legacy: LeaseHolder {
                owner: owner.to_owned(),
                token,
            }
            .legacy(),
        };
        let reply = self.run(step, At::Event(event)).await?;
        match code(&reply.into_array())?.as_str() {
            reply::OK => Ok(EndReshardReply::Switched),
            reply::NOT_RESHARDING => Ok(EndReshardReply::NotResharding),
            reply::FENCED => Ok(EndReshardReply::LeaseLost),
            other => Err(unknown("end_reshard", other)),
        }
    }
}

/// An optional timestamp as `create_event.lua` takes it ('' = none).
fn opt_ms(v: Option<i64>) -> String {
    v.map(|ms| ms.to_string()).unwrap_or_default()
}

/// The meta HASH as `create_event.lua` and the other event scripts write it.
fn parse_meta(fields: HashMap<String, String>) -> Result<EventMeta, StoreError> {
    let bad = |f: &str| StoreError::Protocol(format!("event meta field {f:?} missing or bad"));
    let get = |f: &str| fields.get(f).ok_or_else(|| bad(f));
    let num = |f: &str| get(f)?.parse::<u64>().map_err(|_| bad(f));
    let opt = |f: &str| -> Result<Option<i64>, StoreError> {
        match get(f)?.as_str() {
            "" => Ok(None),
            s => s.parse().map(Some).map_err(|_| bad(f)),
        }
    };
    let limit = num("limit")? as u32;
    let sold_out = match get("soldout")?.as_str() {
        "" => None,
        mark => Some(SoldOutMark::decode(mark).ok_or_else(|| bad("soldout"))?),
    };
    Ok(EventMeta {
        spec: EventSpec {
            id: EventId::parse(get("id")?.as_str()).map_err(|_| bad("id"))?,
            stock: num("stock")?,
            buckets: num("buckets")? as u32,
            per_user_limit: (limit > 0).then_some(limit),
            max_per_order: num("max_per_order")? as u32,
            starts_at: opt("starts_at")?,
            ends_at: opt("ends_at")?,
            // Absent in metas written before holds existed.
            hold_seconds: fields
                .get("hold")
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().map_err(|_| bad("hold")))
                .transpose()?,
            // Absent in metas written before adaptive counts existed.
            auto_buckets: fields
                .get("auto")
                .filter(|s| !s.is_empty())
                .map(|s| BucketRange::decode(s).ok_or_else(|| bad("auto")))
                .transpose()?,
            // Absent in metas written before access tokens existed: open.
            tokens: fields.get("tokens").and_then(|s| TokenAccess::decode(s)),
            // Absent in metas written before draws existed.
            draw: fields
                .get("draw")
                .filter(|s| !s.is_empty())
                .map(|s| crate::domain::draw::DrawSpec::decode(s).ok_or_else(|| bad("draw")))
                .transpose()?,
        },
        status: EventStatus::parse(get("status")?).ok_or_else(|| bad("status"))?,
        generation: num("gen")? as u32,
        seq: num("seq")?,
        sold_out,
        created_ms: num("created")? as i64,
        retired: EventMeta::decode_layouts(fields.get("retired").map_or("", String::as_str))
            .ok_or_else(|| bad("retired"))?,
        reshard_to: EventMeta::decode_layouts(fields.get("reshard_to").map_or("", String::as_str))
            .ok_or_else(|| bad("reshard_to"))?
            .first()
            .copied(),
        history: LayoutChange::decode_all(fields.get("history").map_or("", String::as_str))
            .ok_or_else(|| bad("history"))?,
    })
}
