//! Held orders on Redis: `confirm.lua`, `expire_holds.lua`, and the
//! deadline index `ss:holds` (`hold_index.lua` for the sweeper's move).

use fred::prelude::*;
use fred::types::sorted_sets::Ordering as ZOrdering;

use super::scripts::reply;
use super::steps;
use super::{At, RedisStore, arg, code, num, order_entry, text, unknown};
use crate::domain::ids::OrderId;
use crate::domain::keys::{BucketRef, hold_index_key};
use crate::domain::model::EntryState;
use crate::domain::stream::{CopyHead, RecordKind};
use crate::store::{ConfirmReply, ExpireReply, Holds, StoreError};

use super::steps::prelude::*;

steps! {
    /// Confirms a held order (or finds it expired).
    Confirm = confirm {
        keys: [
            b(Bk::Stock), b(Bk::Users), b(Bk::Idx), b(Bk::Orders), b(Bk::Adds), b(Bk::Sealed), b(Bk::Holds),
            b(Bk::Hunits), b(Bk::Hq), b(Bk::Wl),
        ],
        argv: { now: i64, order: String, confirm: String, expire: String, confirmed: &'static str, expired: &'static str },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::ALREADY_CONFIRMED, reply::HOLD_EXPIRED,
            reply::HOLD_CANCELLED, reply::NOT_FOUND,
        ]),
        writes: [OrderEntry, Stream],
    }
    /// Expires the due holds of a bucket (or voids every one).
    ExpireHolds = expire_holds {
        keys: [
            b(Bk::Stock), b(Bk::Users), b(Bk::Idx), b(Bk::Orders), b(Bk::Adds), b(Bk::Sealed), b(Bk::Holds),
            b(Bk::Hunits), b(Bk::Hq), b(Bk::Wl),
        ],
        argv: { now: i64, count: u32, head: String, void: bool, expired: &'static str },
        reply: Reply::Codes(&[reply::STALE, reply::OK]),
        writes: [OrderEntry, Stream],
    }
    /// Moves a bucket's entry in the deadline index.
    HoldIndex = hold_index {
        keys: [K::Given("holds")],
        argv: { bucket: String, seen: i64, next: String },
        reply: Reply::Flag,
        writes: [],
    }
}

impl RedisStore {
    fn hold_index(&self) -> String {
        hold_index_key(&self.namespace)
    }

    /// Announces a bucket's first hold; a failure is only logged: the
    /// sweeper's slow round finds the bucket anyway (`control::saga_sweeper`).
    pub(super) async fn announce_first_hold(&self, bucket: &BucketRef, at_ms: Option<i64>) {
        let Some(at_ms) = at_ms else { return };
        if let Err(e) = self.announce_holds(bucket, at_ms).await {
            tracing::warn!(bucket = %bucket.name(), error = %e, "announcing a bucket's holds failed");
        }
    }
}

/// A ZSET score as Redis answers it (a string or a double).
fn score(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Double(d) => Ok(*d as i64),
        Value::Integer(i) => Ok(*i),
        other => text(other)?
            .parse::<f64>()
            .map(|d| d as i64)
            .map_err(|_| StoreError::Protocol(format!("bad score {other:?}"))),
    }
}

impl Holds for RedisStore {
    async fn confirm(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<ConfirmReply, StoreError> {
        let head = |kind, at: Option<u32>| {
            CopyHead {
                kind,
                bucket: at,
                home: bucket.index,
                at_ms: now_ms,
            }
            .encode()
        };
        let step = steps::Confirm {
            now: now_ms,
            order: order.to_string(),
            // A confirm's bucket is the entry's (where the units came from);
            // an expiry's, the home bucket the units come back to.
            confirm: head(RecordKind::Confirm, None),
            expire: head(RecordKind::Expire, Some(bucket.index)),
            confirmed: EntryState::Confirmed.tag(),
            expired: EntryState::Expired.tag(),
        };
        let parts = self.run_bucket(bucket, step).await?;
        self.replicated(bucket).await?;
        let entry = || order_entry(arg(&parts, 1)?);
        match code(&parts)?.as_str() {
            reply::OK => Ok(ConfirmReply::Confirmed(entry()?)),
            reply::ALREADY_CONFIRMED => Ok(ConfirmReply::AlreadyConfirmed(entry()?)),
            reply::HOLD_EXPIRED => Ok(ConfirmReply::Expired {
                entry: entry()?,
                now: num(arg(&parts, 2)?)? == 1,
            }),
            reply::HOLD_CANCELLED => Ok(ConfirmReply::Cancelled(entry()?)),
            reply::NOT_FOUND => Ok(ConfirmReply::NotFound),
            other => Err(unknown("confirm", other)),
        }
    }

    async fn expire_holds(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        count: u32,
        void: bool,
    ) -> Result<ExpireReply, StoreError> {
        let head = CopyHead {
            kind: RecordKind::Expire,
            bucket: Some(bucket.index),
            home: bucket.index,
            at_ms: now_ms,
        };
        let step = steps::ExpireHolds {
            now: now_ms,
            count: count.max(1),
            head: head.encode(),
            void,
            expired: EntryState::Expired.tag(),
        };
        let parts = self.run_bucket(bucket, step).await?;
        match code(&parts)?.as_str() {
            reply::OK => {}
            other => return Err(unknown("expire_holds", other)),
        }
        let next = match text(arg(&parts, 1)?)?.as_str() {
            "" => None,
            s => Some(
                s.parse::<f64>()
                    .map_err(|_| StoreError::Protocol(format!("bad next deadline {s:?}")))?
                    as i64,
            ),
        };
        let expired = parts[2..]
            .chunks(2)
            .map(|pair| match pair {
                [oid, entry] => Ok((OrderId::from_stored(&text(oid)?), order_entry(entry)?)),
                _ => Err(StoreError::Protocol(
                    "expire_holds reply is cut short".into(),
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(ExpireReply { expired, next })
    }

    async fn announce_holds(&self, bucket: &BucketRef, at_ms: i64) -> Result<(), StoreError> {
        let key = self.hold_index();
        let member = bucket.name();
        self.call(|| {
            self.client.zadd::<(), _, _>(
                key.clone(),
                None,
                Some(ZOrdering::LessThan),
                false,
                false,
                (at_ms as f64, member.clone()),
            )
        })
        .await
    }

    async fn due_holds(
        &self,
        now_ms: i64,
        count: u32,
    ) -> Result<Vec<(BucketRef, i64)>, StoreError> {
        let key = self.hold_index();
        let found: Vec<Value> = self
            .call(|| {
                self.client.zrangebyscore(
                    key.clone(),
                    f64::NEG_INFINITY,
                    now_ms as f64,
                    true,
                    Some((0, i64::from(count))),
                )
            })
            .await?;
        let mut out = Vec::new();
        for pair in found.chunks(2) {
            let [member, s] = pair else { break };
            let name = text(member)?;
            match BucketRef::parse_name(&name) {
                Some(b) => out.push((b, score(s)?)),
                None => {
                    self.call(|| self.client.zrem::<(), _, _>(key.clone(), name.clone()))
                        .await?;
                }
            }
        }
        Ok(out)
    }

    async fn reschedule_holds(
        &self,
        bucket: &BucketRef,
        seen: i64,
        next: Option<i64>,
    ) -> Result<bool, StoreError> {
        let step = steps::HoldIndex {
            bucket: bucket.name(),
            seen,
            next: next.map(|n| n.to_string()).unwrap_or_default(),
        };
        self.run_flag(step, At::Given(vec![self.hold_index()]))
            .await
    }

    async fn next_hold(&self, bucket: &BucketRef) -> Result<Option<i64>, StoreError> {
        let k = self.keys(bucket);
        let first: Vec<Value> = self
            .call(|| {
                self.client
                    .zrange(k.holds.clone(), 0_i64, 0_i64, None, false, None, true)
            })
            .await?;
        let indexed = first.get(1).map(score).transpose()?;
        // The fast path's queue: its head is its earliest deadline.
        let head: Option<String> = self.call(|| self.client.lindex(k.hq.clone(), 0)).await?;
        let queued = head
            .map(|h| {
                h.split_once('|')
                    .and_then(|(at, _)| at.parse::<i64>().ok())
                    .ok_or_else(|| StoreError::Protocol(format!("bad hold queue entry {h:?}")))
            })
            .transpose()?;
        Ok(indexed.into_iter().chain(queued).min())
    }
}
