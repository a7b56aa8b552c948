//! The end of a bucket on Redis: seal, leftover, the audit's read, what the
//! bucket remembers (its `users`, `idx` and `reqs` hashes) and expiry. Probe
//! markers are keys of their own with a lifetime (`take.lua`), so expiry
//! leaves them to it.

use fred::prelude::*;

use super::scripts::reply;
use super::steps;
use super::{At, RedisStore, arg, array_or_stale, code, is_stale, num, text, unknown};
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EntryState, OrderEntry, RequestRecord};
use crate::domain::records::ProbeMarker;
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};
use crate::store::{BucketAudit, BucketContents, RestoreReply, Retirement, StoreError};

use super::steps::prelude::*;

steps! {
    /// Seals a bucket.
    Seal = seal {
        keys: [b(Bk::Stock), b(Bk::Sealed)],
        argv: {},
        reply: Reply::Number,
        writes: [],
    }
    /// Takes units out of a sealed bucket for good.
    Forfeit = forfeit {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Adds)],
        argv: { units: u64 },
        reply: Reply::Number,
        writes: [],
    }
    /// Retires a sealed bucket: its leftover into the stream.
    Retire = retire {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Orders), b(Bk::Wl)],
        argv: { record: String },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::NOT_SEALED]),
        writes: [Stream],
    }
    /// Everything the audit equation reads of a bucket.
    AuditBucket = audit_bucket {
        keys: [b(Bk::Stock), b(Bk::Xfer), b(Bk::Xin), b(Bk::Adds), b(Bk::Orders), b(Bk::Sealed), b(Bk::Hunits), b(Bk::Wl)],
        argv: { page: usize },
        reply: Reply::Codes(&[reply::STALE]),
        writes: [],
    }
}

/// `restore.lua`: a bucket's users, orders and request records put back.
pub(super) const RESTORE: &Decl = &Decl {
    name: "restore",
    lua: lua!(restore),
    keys: &[
        b(Bk::Users),
        b(Bk::Idx),
        b(Bk::Reqs),
        b(Bk::Fence),
        b(Bk::Holds),
        b(Bk::Hunits),
        b(Bk::Tok),
    ],
    more_keys: &[],
    argv: &[
        Arg::One("token"),
        Arg::One("n"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["user", "units"],
        },
        Arg::One("m"),
        Arg::Each {
            count: "m",
            index: 'j',
            cols: &["order", "entry"],
        },
        Arg::One("r"),
        Arg::Each {
            count: "r",
            index: 'k',
            cols: &["rid", "record"],
        },
        Arg::One("t"),
        Arg::Each {
            count: "t",
            index: 'l',
            cols: &["field", "used"],
        },
    ],
    reply: Reply::Codes(&[reply::OK, reply::FENCED]),
    writes: &[Record::OrderEntry, Record::Request],
};

/// This section's steps whose columns repeat: built beside their decoders.
pub(super) const REPEATED: &[&Decl] = &[RESTORE];

impl Retirement for RedisStore {
    async fn seal(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        match self.run(steps::Seal {}, At::Bucket(bucket)).await? {
            v if is_stale(&v) => Err(StoreError::Stale(bucket.tag())),
            v => num(&v),
        }
    }

    async fn forfeit(&self, bucket: &BucketRef, units: u64) -> Result<u64, StoreError> {
        match self
            .run(steps::Forfeit { units }, At::Bucket(bucket))
            .await?
        {
            v if is_stale(&v) => Err(StoreError::Stale(bucket.tag())),
            v => num(&v),
        }
    }

    async fn retire(&self, bucket: &BucketRef, now_ms: i64) -> Result<Option<u64>, StoreError> {
        let step = steps::Retire {
            record: StreamEntry::leftover(bucket.name(), bucket.index, now_ms).data(),
        };
        let parts = self.run_bucket(bucket, step).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(Some(num(arg(&parts, 1)?)?)),
            reply::NOT_SEALED => Ok(None),
            other => Err(unknown("retire", other)),
        }
    }

    async fn audit_bucket(&self, bucket: &BucketRef) -> Result<BucketAudit, StoreError> {
        let orders = self.orders_key(bucket);
        let step = steps::AuditBucket { page: AUDIT_PAGE };
        let reply = self.run(step, At::Bucket(bucket)).await?;
        let mut audit = decode_audit(bucket, array_or_stale(bucket, reply)?)?;
        // A full page: the rest of the stream, page by page, up to the
        // script's last id (see the script's contract).
        let mut page = audit.entries.len();
        while page == AUDIT_PAGE {
            let Some(&(from, ..)) = audit.entries.last() else {
                break;
            };
            if from >= audit.last_id {
                break;
            }
            let raw: Value = self
                .call(|| {
                    self.client.xrange(
                        &orders,
                        format!("({from}"),
                        audit.last_id.to_string(),
                        Some(AUDIT_PAGE as u64),
                    )
                })
                .await?;
            let raw = raw.into_array();
            page = raw.len();
            let mut more = Vec::with_capacity(page);
            for entry in raw {
                super::streams::stream_entry(entry, &mut more)?;
            }
            audit
                .entries
                .extend(more.into_iter().map(|e| (e.id, e.kind, e.qty)));
        }
        Ok(audit)
    }

    async fn take_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<Vec<(u32, OrderId)>, StoreError> {
        // take.lua's marker of (rid, pass): its own key, "T|oid" once taken
        // (a short decision's is a hash, which MGET answers as nil).
        // One MGET: the markers of a bucket share its hash tag, so its slot.
        let keys: Vec<String> = (1..=passes)
            .map(|p| bucket.marker_in(&self.namespace, rid, p))
            .collect();
        let values: Vec<Option<String>> = self.call(|| self.client.mget(keys.clone())).await?;
        Ok(values
            .into_iter()
            .zip(1..)
            .filter_map(|(v, pass)| match ProbeMarker::decode(&v?)? {
                ProbeMarker::Taken(oid) => Some((pass, OrderId::from_stored(&oid))),
                _ => None,
            })
            .collect())
    }

    async fn restore(
        &self,
        bucket: &BucketRef,
        token: u64,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
        tokens: &[(String, u64)],
    ) -> Result<RestoreReply, StoreError> {
        // token, then n, m, r and t entries, each count before its entries.
        let mut args = vec![token.to_string(), holdings.len().to_string()];
        for (user, units) in holdings {
            args.extend([user.to_string(), units.to_string()]);
        }
        args.push(orders.len().to_string());
        for (oid, entry) in orders {
            args.extend([oid.to_string(), entry.encode()]);
        }
        args.push(records.len().to_string());
        for (rid, record) in records {
            args.extend([rid.clone(), record.encode()]);
        }
        args.push(tokens.len().to_string());
        for (id, used) in tokens {
            args.extend([format!("t:{id}"), used.to_string()]);
        }
        let keys = self.keys_for(steps::RESTORE, At::Bucket(bucket), false);
        let parts = self
            .eval(self.scripts.get(steps::RESTORE), keys, args)
            .await?
            .into_array();
        match code(&parts)?.as_str() {
            reply::OK => {
                // Live holds moved here: the sweeper must follow this bucket.
                let first = orders
                    .iter()
                    .filter(|(_, e)| e.state == EntryState::Held)
                    .filter_map(|(_, e)| e.pay_by)
                    .min();
                self.announce_first_hold(bucket, first).await;
                Ok(RestoreReply::Restored)
            }
            reply::FENCED => Ok(RestoreReply::Fenced {
                highest: num(arg(&parts, 1)?)?,
            }),
            other => Err(unknown("restore", other)),
        }
    }

    async fn contents(&self, bucket: &BucketRef) -> Result<BucketContents, StoreError> {
        let k = self.keys(bucket);
        let (users, idx, reqs, tok) = (
            self.hash(k.users).await?,
            self.hash(k.idx).await?,
            self.hash(k.reqs).await?,
            self.hash(k.tok).await?,
        );
        let mut c = BucketContents::default();
        for (user, units) in users {
            let units: u64 = units
                .parse()
                .map_err(|_| StoreError::Protocol(format!("held {units:?}")))?;
            if let (Ok(user), true) = (UserId::parse(user), units > 0) {
                c.holdings.push((user, units));
            }
        }
        for (oid, entry) in idx {
            let entry = OrderEntry::decode(&entry)
                .ok_or_else(|| StoreError::Protocol(format!("entry {entry:?}")))?;
            c.orders.push((OrderId::from_stored(&oid), entry));
        }
        // Client request ids only ("<user>/<id>"); internal ids stay behind.
        // (Probe markers are keys of their own, never fields of this hash, so
        // no user id, whatever it starts with, is mistaken for one.)
        for (rid, record) in reqs {
            if rid.contains('/')
                && let Some(record) = RequestRecord::decode(&record)
                && !matches!(record, RequestRecord::Pending { .. })
            {
                c.records.push((rid, record));
            }
        }
        // Tokens' consumption, which a reshard moves: units taken ("t:",
        // bought or reserved) less those reserved ("r:"), plus units bought
        // under the earlier encoding ("u:", bought only). A sealed layout's
        // reservations were ended with its pending sagas (`r:` back to 0,
        // `s:` gone), so they are read only (`reserved`, `token_sagas`).
        let mut counts: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
        for (field, value) in &tok {
            if field.starts_with("s:") {
                c.token_sagas += 1;
                continue;
            }
            let Some((kind, id)) = field.split_at_checked(2) else {
                continue;
            };
            if !matches!(kind, "t:" | "u:" | "r:") {
                continue;
            }
            let units: u64 = value
                .parse()
                .map_err(|_| StoreError::Protocol(format!("token field {field}: {value:?}")))?;
            let (bought, reserved) = counts.entry(id).or_default();
            match kind {
                "r:" => *reserved += units,
                _ => *bought += units,
            }
        }
        for (id, (taken, reserved)) in counts {
            let bought = taken.saturating_sub(reserved);
            if bought > 0 {
                c.tokens.push((id.to_owned(), bought));
            }
            if reserved > 0 {
                c.reserved.push((id.to_owned(), reserved));
            }
        }
        Ok(c)
    }

    async fn expire_bucket(&self, bucket: &BucketRef, ttl_ms: u64) -> Result<(), StoreError> {
        // The bucket's keys share its slot: one trip for all of them (fred
        // pipelines concurrent commands), not one each. A close expires
        // every bucket of the event, and 17 round trips a bucket took a
        // 1,000-bucket close past the API's wait (4 s of its 7.5 s).
        let keys = self.keys(bucket);
        futures::future::try_join_all(
            keys.all().into_iter().map(|key| {
                self.call(move || self.client.pexpire::<(), _>(key, ttl_ms as i64, None))
            }),
        )
        .await
        .map(drop)
    }
}

/// Stream records per `audit_bucket.lua` call and per XRANGE page after it.
pub(super) const AUDIT_PAGE: usize = 512;

/// `audit_bucket.lua`'s reply: stock, adds, sealed, last id, then the open
/// transfers, the applied ones and the stream's entries as flat lists, then
/// the server's clock.
fn decode_audit(bucket: &BucketRef, parts: Vec<Value>) -> Result<BucketAudit, StoreError> {
    let id = |v: &Value| {
        let s = text(v)?;
        StreamId::parse(&s).ok_or_else(|| StoreError::Protocol(format!("bad stream id {s:?}")))
    };
    let list = |i: usize| arg(&parts, i).map(|v| v.clone().into_array());
    let triple = |c: &[Value]| match c {
        [a, b, c] => Ok((a.clone(), b.clone(), c.clone())),
        _ => Err(StoreError::Protocol(format!(
            "audit reply of {} is cut short",
            bucket.tag()
        ))),
    };
    let open = list(4)?
        .chunks(3)
        .map(|c| {
            let (xid, target, units) = triple(c)?;
            Ok((text(&xid)?, num(&target)? as u32, num(&units)?))
        })
        .collect::<Result<_, StoreError>>()?;
    let applied = list(5)?.iter().map(text).collect::<Result<_, _>>()?;
    let entries = list(6)?
        .chunks(3)
        .map(|c| {
            let (entry_id, kind, qty) = triple(c)?;
            let kind = RecordKind::parse(&text(&kind)?).ok_or_else(|| {
                StoreError::Protocol(format!("bad record kind {kind:?} in {}", bucket.tag()))
            })?;
            Ok((id(&entry_id)?, kind, num(&qty)?))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(BucketAudit {
        stock: num(arg(&parts, 0)?)?,
        adds: num(arg(&parts, 1)?)?,
        sealed: num(arg(&parts, 2)?)? == 1,
        last_id: id(arg(&parts, 3)?)?,
        open,
        applied,
        entries,
        read_ms: num(arg(&parts, 7)?)? as i64,
        held: parts.get(8).map(num).transpose()?.unwrap_or(0),
    })
}
