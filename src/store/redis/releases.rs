//! A release's steps on Redis: the home's scripts on the home's slot, a
//! line's take (`take.lua` with the line's undone marker) and undo on its
//! pool's bucket.

use fred::prelude::*;

use super::scripts::reply;
use super::steps::{self, Step};
use super::{At, RedisStore, arg, array_or_stale, code, num, protocol, text, unknown};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::{BucketRef, HomeRef, release_spec_key, releases_key};
use crate::domain::records::ProbeMarker;
use crate::domain::release::{HomeRecord, ReleaseSpec};
use crate::domain::stream::RecordKind;
use crate::store::{
    Decided, LineConfirm, LineTake, LineUndo, Releases, ReserveArgs, ReserveReply, StoreError,
    TakeArgs,
};

use super::steps::prelude::*;

steps! {
    /// Stores a release's spec unless one is stored.
    CreateRelease = create_release {
        keys: [K::Given("spec")],
        argv: { spec: String },
        reply: Reply::Codes(&[reply::OK, reply::EXISTS]),
        writes: [],
    }
    /// Counts an order against the release-wide limit, or answers its record.
    Reserve = reserve {
        keys: [K::Given("units"), K::Given("reqs"), K::Given("pend")],
        argv: {
            rid: String, user: String, units: u64, limit: u32, now: i64,
            pending: String, limited: String,
        },
        reply: Reply::Codes(&[reply::OK, reply::LIMIT, reply::REPLAY]),
        writes: [Request],
    }
    /// Commits or aborts an order by compare-and-set (`commit_order`, `abort_order`).
    DecideOrder = decide_order {
        keys: [K::Given("reqs"), K::Given("pend"), K::Given("oids")],
        // `listed_at` only with an `alias` (both optional, in that order).
        argv: {
            rid: String, expected: String, decided: String, ended: bool, alias: Option<String>,
            listed_at: Option<i64>,
        },
        reply: Reply::Codes(&[reply::OK, reply::REPLAY, reply::NO_RECORD]),
        writes: [Request],
    }
    /// Gives a refused order's reservation back.
    ReleaseOrder = release_order {
        keys: [K::Given("units"), K::Given("reqs"), K::Given("pend")],
        argv: { rid: String, user: String, units: u64, expected: String, released: String },
        reply: Reply::Codes(&[reply::OK, reply::REPLAY, reply::NO_RECORD]),
        writes: [Request],
    }
    /// Orders not ended at a home since before a bound.
    StaleOrders = stale_orders {
        keys: [K::Given("pend"), K::Given("reqs")],
        argv: { bound: i64, count: u32 },
        reply: Reply::Values,
        writes: [],
    }
    /// One step of a line's undo.
    UndoLine = undo_line {
        keys: [b(Bk::Stock), K::Given("tk"), b(Bk::Orders), b(Bk::Adds)],
        argv: {
            qty: u32, taken: String, undone: String, record: String, marker: u64, held: bool,
        },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::CLOSED, reply::UNDONE_ALREADY, reply::SHORT,
        ]),
        writes: [Marker, Stream],
    }
    /// One step of a held order's line confirmed.
    ConfirmLine = confirm_line {
        keys: [b(Bk::Stock), K::Given("tk"), b(Bk::Orders)],
        argv: { taken: String, confirmed: String, record: String, marker: u64 },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::ALREADY_CONFIRMED, reply::SHORT, reply::NO_TAKE,
        ]),
        writes: [Marker, Stream],
    }
}

impl RedisStore {
    fn home_keys(&self, home: &HomeRef, names: &[&str]) -> At<'static> {
        At::Given(
            names
                .iter()
                .map(|n| home.key_in(&self.namespace, n))
                .collect(),
        )
    }

    async fn decide(
        &self,
        home: &HomeRef,
        step: steps::DecideOrder,
    ) -> Result<Decided, StoreError> {
        let at = self.home_keys(home, &["reqs", "pend", "oids"]);
        let reply = decided("decide_order", self.run(step, at).await?)?;
        self.home_replicated(home).await?;
        Ok(reply)
    }

    /// With `min_replicas`, waits until the home's writes are on replicas.
    async fn home_replicated(&self, home: &HomeRef) -> Result<(), StoreError> {
        self.replicated_at(&home.key_in(&self.namespace, "reqs"))
            .await
    }
}

fn record(v: &Value) -> Result<HomeRecord, StoreError> {
    let s = text(v)?;
    HomeRecord::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad home record {s:?}")))
}

fn decided(step: &str, v: Value) -> Result<Decided, StoreError> {
    let parts = match v {
        Value::Array(parts) => parts,
        other => return Err(protocol("array", &other)),
    };
    match code(&parts)?.as_str() {
        reply::OK => Ok(Decided::Done),
        reply::REPLAY => Ok(Decided::Found(record(arg(&parts, 1)?)?)),
        reply::NO_RECORD => Ok(Decided::NoRecord),
        other => Err(unknown(step, other)),
    }
}

impl Releases for RedisStore {
    async fn create_release(&self, spec: &ReleaseSpec) -> Result<Option<ReleaseSpec>, StoreError> {
        let key = release_spec_key(&self.namespace, &spec.id);
        let step = steps::CreateRelease {
            spec: spec.encode(),
        };
        let v = self.run(step, At::Given(vec![key])).await?;
        let parts = match v {
            Value::Array(parts) => parts,
            other => return Err(protocol("array", &other)),
        };
        let before = match code(&parts)?.as_str() {
            reply::OK => None,
            reply::EXISTS => {
                let s = text(arg(&parts, 1)?)?;
                Some(
                    ReleaseSpec::decode(&s)
                        .ok_or_else(|| StoreError::Protocol(format!("bad release spec {s:?}")))?,
                )
            }
            other => return Err(unknown("create_release", other)),
        };
        self.call(|| {
            self.client
                .sadd::<(), _, _>(releases_key(&self.namespace), spec.id.as_str())
        })
        .await?;
        Ok(before)
    }

    async fn load_release(&self, release: &EventId) -> Result<Option<ReleaseSpec>, StoreError> {
        let key = release_spec_key(&self.namespace, release);
        let v: Option<String> = self.call(|| self.client.get(key.clone())).await?;
        v.map(|s| {
            ReleaseSpec::decode(&s)
                .ok_or_else(|| StoreError::Protocol(format!("bad release spec {s:?}")))
        })
        .transpose()
    }

    async fn list_releases(&self) -> Result<Vec<EventId>, StoreError> {
        let ids: Vec<String> = self
            .call(|| self.client.smembers(releases_key(&self.namespace)))
            .await?;
        Ok(ids.iter().filter_map(|s| EventId::parse(s).ok()).collect())
    }

    async fn reserve(
        &self,
        home: &HomeRef,
        now_ms: i64,
        a: &ReserveArgs,
    ) -> Result<ReserveReply, StoreError> {
        let step = steps::Reserve {
            rid: a.rid.clone(),
            user: a.user.to_string(),
            units: a.units,
            limit: a.limit,
            now: now_ms,
            pending: a.pending.encode(),
            limited: a.limited.encode(),
        };
        let at = self.home_keys(home, &["units", "reqs", "pend"]);
        let parts = match self.run(step, at).await? {
            Value::Array(parts) => parts,
            other => return Err(protocol("array", &other)),
        };
        self.home_replicated(home).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(ReserveReply::Reserved),
            reply::LIMIT => Ok(ReserveReply::Limit {
                held: num(arg(&parts, 1)?)?,
            }),
            reply::REPLAY => Ok(ReserveReply::Replay {
                record: record(arg(&parts, 1)?)?,
                held: num(arg(&parts, 2)?)?,
            }),
            other => Err(unknown("reserve", other)),
        }
    }

    async fn commit_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        bought: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        let step = steps::DecideOrder {
            rid: rid.to_owned(),
            expected: pending.encode(),
            decided: bought.encode(),
            ended: true,
            alias: bought.head().map(|h| h.order_id.to_string()),
            listed_at: None,
        };
        self.decide(home, step).await
    }

    async fn abort_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        refused: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        let step = steps::DecideOrder {
            rid: rid.to_owned(),
            expected: pending.encode(),
            decided: refused.encode(),
            ended: false,
            alias: None,
            listed_at: None,
        };
        self.decide(home, step).await
    }

    async fn hold_order(
        &self,
        home: &HomeRef,
        rid: &str,
        pending: &HomeRecord,
        held: &HomeRecord,
        order_id: &OrderId,
    ) -> Result<Decided, StoreError> {
        let step = steps::DecideOrder {
            rid: rid.to_owned(),
            expected: pending.encode(),
            decided: held.encode(),
            ended: false,
            alias: Some(order_id.to_string()),
            listed_at: held.held_listed_at(),
        };
        self.decide(home, step).await
    }

    async fn move_hold(
        &self,
        home: &HomeRef,
        rid: &str,
        expected: &HomeRecord,
        next: &HomeRecord,
        ended: bool,
    ) -> Result<Decided, StoreError> {
        let step = steps::DecideOrder {
            rid: rid.to_owned(),
            expected: expected.encode(),
            decided: next.encode(),
            ended,
            alias: None,
            listed_at: None,
        };
        self.decide(home, step).await
    }

    async fn order_request(
        &self,
        home: &HomeRef,
        order_id: &OrderId,
    ) -> Result<Option<String>, StoreError> {
        let key = home.key_in(&self.namespace, "oids");
        self.call(|| self.client.hget(key.clone(), order_id.as_str()))
            .await
    }

    async fn release_order(
        &self,
        home: &HomeRef,
        rid: &str,
        user: &UserId,
        units: u64,
        refused: &HomeRecord,
        released: &HomeRecord,
    ) -> Result<Decided, StoreError> {
        let step = steps::ReleaseOrder {
            rid: rid.to_owned(),
            user: user.to_string(),
            units,
            expected: refused.encode(),
            released: released.encode(),
        };
        let at = self.home_keys(home, &["units", "reqs", "pend"]);
        let reply = decided("release_order", self.run(step, at).await?)?;
        self.home_replicated(home).await?;
        Ok(reply)
    }

    async fn stale_orders(
        &self,
        home: &HomeRef,
        before_ms: i64,
        count: u32,
    ) -> Result<Vec<(String, HomeRecord)>, StoreError> {
        let step = steps::StaleOrders {
            bound: before_ms,
            count,
        };
        let at = self.home_keys(home, &["pend", "reqs"]);
        let parts = match self.run(step, at).await? {
            Value::Array(parts) => parts,
            other => return Err(protocol("array", &other)),
        };
        parts
            .chunks(2)
            .map(|pair| Ok((text(arg(pair, 0)?)?, record(arg(pair, 1)?)?)))
            .collect()
    }

    async fn home_record(
        &self,
        home: &HomeRef,
        rid: &str,
    ) -> Result<Option<HomeRecord>, StoreError> {
        let key = home.key_in(&self.namespace, "reqs");
        let v: Value = self.call(|| self.client.hget(key.clone(), rid)).await?;
        if v.is_null() {
            return Ok(None);
        }
        record(&v).map(Some)
    }

    async fn home_units(&self, home: &HomeRef, user: &UserId) -> Result<u64, StoreError> {
        let key = home.key_in(&self.namespace, "units");
        let v: Option<i64> = self
            .call(|| self.client.hget(key.clone(), user.as_str()))
            .await?;
        Ok(v.unwrap_or(0).max(0) as u64)
    }

    async fn take_line(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineTake, StoreError> {
        let marker = bucket.marker_in(&self.namespace, &a.rid, a.pass);
        let at = At::BucketWith(bucket, vec![marker]);
        let mut step = super::buckets::take_step(bucket, now_ms, a);
        step.undone = ProbeMarker::Undone(a.order_id.to_string()).encode();
        step.kept = Some(a.keep_taken);
        step.confirmed = ProbeMarker::Confirmed(a.order_id.to_string()).encode();
        let parts = array_or_stale(bucket, self.run(step, at).await?)?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::TAKEN => Ok(LineTake::Taken {
                order_id: OrderId::from_stored(&text(arg(&parts, 1)?)?),
            }),
            reply::SHORT => Ok(LineTake::Short {
                available: num(arg(&parts, 1)?)?,
                fresh: num(arg(&parts, 2)?)? == 1,
                adds: num(arg(&parts, 3)?)?,
            }),
            reply::UNDONE => Ok(LineTake::Undone),
            reply::LINE_CONFIRMED => Ok(LineTake::Confirmed),
            other => Err(unknown("take", other)),
        }
    }

    async fn undo_line(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineUndo, StoreError> {
        self.give_back_line(bucket, now_ms, a, RecordKind::Void)
            .await
    }

    async fn give_back_line(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
        kind: RecordKind,
    ) -> Result<LineUndo, StoreError> {
        let marker = bucket.marker_in(&self.namespace, &a.rid, a.pass);
        let at = At::BucketWith(bucket, vec![marker]);
        let order = a.order_id.to_string();
        let step = steps::UndoLine {
            qty: a.qty,
            taken: ProbeMarker::Taken(order.clone())
                .encode()
                .unwrap_or_default(),
            undone: ProbeMarker::Undone(order).encode().unwrap_or_default(),
            record: a.stream_entry(kind, bucket.index, now_ms).data(),
            marker: a.marker_ttl_ms.max(1),
            held: kind != RecordKind::Void,
        };
        let parts = array_or_stale(bucket, self.run(step, at).await?)?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(LineUndo::GaveBack),
            reply::CLOSED => Ok(LineUndo::Closed),
            reply::UNDONE_ALREADY => Ok(LineUndo::Already),
            reply::SHORT => Ok(LineUndo::Short),
            other => Err(unknown("undo_line", other)),
        }
    }

    async fn confirm_line(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<LineConfirm, StoreError> {
        let marker = bucket.marker_in(&self.namespace, &a.rid, a.pass);
        let at = At::BucketWith(bucket, vec![marker]);
        let order = a.order_id.to_string();
        let step = steps::ConfirmLine {
            taken: ProbeMarker::Taken(order.clone())
                .encode()
                .unwrap_or_default(),
            confirmed: ProbeMarker::Confirmed(order).encode().unwrap_or_default(),
            record: a
                .stream_entry(RecordKind::Confirm, bucket.index, now_ms)
                .data(),
            marker: a.marker_ttl_ms.max(1),
        };
        let parts = array_or_stale(bucket, self.run(step, at).await?)?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(LineConfirm::Confirmed),
            reply::ALREADY_CONFIRMED => Ok(LineConfirm::Already),
            reply::SHORT => Ok(LineConfirm::Short),
            reply::NO_TAKE => Ok(LineConfirm::Missing),
            other => Err(unknown("confirm_line", other)),
        }
    }
}
