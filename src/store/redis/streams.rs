//! The order streams on Redis: one STREAM per bucket, read by the flusher's
//! consumer group.

use fred::prelude::*;

use super::steps;
use super::{At, RedisStore, num};
use crate::domain::keys::BucketRef;
use crate::domain::stream::{StreamEntry, StreamId};
use crate::store::{FLUSH_GROUP, StoreError, Streams};

use super::steps::prelude::*;

steps! {
    /// Reads a bucket's stream (claiming what a dead consumer held).
    StreamRead = stream_read {
        keys: [b(Bk::Orders)],
        argv: { group: &'static str, consumer: String, count: usize, claim: String },
        reply: Reply::Values,
        writes: [],
    }
}

/// `stream_ack.lua`: acknowledges stream entries (the rest of ARGV).
pub(super) const STREAM_ACK: &Decl = &Decl {
    name: "stream_ack",
    lua: lua!(stream_ack),
    keys: &[b(Bk::Orders)],
    more_keys: &[],
    argv: &[
        Arg::One("group"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["id"],
        },
    ],
    reply: Reply::Number,
    writes: &[],
};

/// This section's steps whose columns repeat: built beside their decoders.
pub(super) const REPEATED: &[&Decl] = &[STREAM_ACK];

impl Streams for RedisStore {
    async fn stream_read(
        &self,
        bucket: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: Option<u64>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        if claim_idle_ms.is_none() {
            return self.read_new(bucket, consumer, count).await;
        }
        let step = steps::StreamRead {
            group: FLUSH_GROUP,
            consumer: consumer.to_owned(),
            count,
            claim: claim_idle_ms.map_or_else(String::new, |ms| ms.to_string()),
        };
        let v = self.run(step, At::Bucket(bucket)).await?;
        let mut out = Vec::new();
        for entry in v.into_array() {
            stream_entry(entry, &mut out)?;
        }
        Ok(out)
    }

    async fn stream_ack(&self, bucket: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        let keys = self.keys_for(steps::STREAM_ACK, At::Bucket(bucket), false);
        // group, then one id an entry.
        let mut args = Vec::with_capacity(ids.len() + 1);
        args.push(FLUSH_GROUP.to_owned());
        args.extend(ids.iter().map(StreamId::to_string));
        let script = self.scripts.get(steps::STREAM_ACK);
        num(&self.eval(script, keys, args).await?)
    }

    async fn stream_len(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        self.call(|| self.client.xlen(self.orders_key(bucket)))
            .await
    }
}

impl RedisStore {
    /// New entries of a bucket's stream for `consumer` (`XREADGROUP … >`),
    /// sent as the command itself: most flusher reads claim nothing, and a
    /// script would copy every entry into Lua and back. A stream or group
    /// that does not exist yet (`NOGROUP`) has nothing to read.
    async fn read_new(
        &self,
        bucket: &BucketRef,
        consumer: &str,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let key = self.orders_key(bucket);
        let read = self
            .call(|| {
                self.client.xreadgroup::<Value, _, _, _, _>(
                    FLUSH_GROUP,
                    consumer.to_owned(),
                    Some(count as u64),
                    None,
                    false,
                    key.clone(),
                    ">",
                )
            })
            .await;
        let reply = match read {
            Ok(reply) => reply,
            Err(StoreError::Protocol(e)) if e.contains("NOGROUP") => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in new_entries(reply)? {
            stream_entry(entry, &mut out)?;
        }
        Ok(out)
    }
}

/// The entries of an `XREADGROUP` reply for one stream: `[[key, [entry, …]]]`
/// (RESP2; RESP3 answers `{key: [entry, …]}`), or nil when nothing is new.
fn new_entries(reply: Value) -> Result<Vec<Value>, StoreError> {
    let stream = match reply {
        Value::Null => return Ok(Vec::new()),
        Value::Array(streams) => match streams.into_iter().next() {
            None => return Ok(Vec::new()),
            Some(Value::Array(pair)) => pair.into_iter().nth(1),
            Some(other) => return Err(super::protocol("[key, entries]", &other)),
        },
        Value::Map(streams) => streams.inner().into_iter().next().map(|(_, v)| v),
        other => return Err(super::protocol("stream entries", &other)),
    };
    match stream {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => Ok(entries),
        Some(other) => Err(super::protocol("stream entries", &other)),
    }
}

/// The records of `{id, fields}` from XREADGROUP / XAUTOCLAIM / XRANGE,
/// appended to `out`: one for a `{"d", data}` entry (`{"d", data, "q",
/// units}` when the script counted the units), one for a copy record
/// `{"k", head, "o", order id, "h", index entry}`, one per order for a
/// purchase call's `{order id, index entry, …}` (see `domain::stream`). The
/// flusher decodes every record it carries to the ledger: the id and the
/// fields are read from the reply's own buffers, not copied out first.
pub(super) fn stream_entry(v: Value, out: &mut Vec<StreamEntry>) -> Result<(), StoreError> {
    let Value::Array(parts) = v else {
        return Err(super::protocol("[id, fields]", &v));
    };
    let mut parts = parts.into_iter();
    let (Some(raw_id), Some(fields)) = (parts.next(), parts.next()) else {
        return Err(StoreError::Protocol(
            "stream entry: [id, fields] expected".into(),
        ));
    };
    let raw_id = raw_id
        .as_str()
        .ok_or_else(|| super::protocol("a stream id", &raw_id))?;
    let id = StreamId::parse(&raw_id)
        .ok_or_else(|| StoreError::Protocol(format!("bad stream id {raw_id:?}")))?;
    let fields = match fields {
        Value::Array(fields) => fields,
        other => other.into_array(),
    };
    let bad = |what: &str| StoreError::Protocol(format!("stream entry {raw_id}: {what}"));
    if fields.len() % 2 != 0 || fields.is_empty() {
        return Err(bad("fields expected in pairs"));
    }
    match &*field(&fields[0], &bad)? {
        "d" => {
            let data = field(&fields[1], &bad)?;
            let mut record = StreamEntry::from_data(id, &data);
            if let [_, _, q, units] = &fields[..] {
                if field(q, &bad)? != "q" {
                    return Err(bad("a d record's second field is not q"));
                }
                record = record.and_then(|r| r.with_qty(&field(units, &bad).ok()?));
            } else if fields.len() != 2 {
                return Err(bad("a d record has one field, or d and q"));
            }
            out.push(record.ok_or_else(|| bad(&format!("{data:?}")))?);
            return Ok(());
        }
        "k" => {
            let [_, head, o, order, h, entry] = &fields[..] else {
                return Err(bad("a copy record has the fields k, o and h"));
            };
            if field(o, &bad)? != "o" || field(h, &bad)? != "h" {
                return Err(bad("a copy record has the fields k, o and h"));
            }
            let (head, order, entry) =
                (field(head, &bad)?, field(order, &bad)?, field(entry, &bad)?);
            out.push(
                StreamEntry::from_copy(id, &head, &order, &entry)
                    .ok_or_else(|| bad(&format!("{head:?} {order:?} {entry:?}")))?,
            );
            return Ok(());
        }
        _ => {}
    }
    for (part, pair) in fields.chunks(2).enumerate() {
        let (order, entry) = (field(&pair[0], &bad)?, field(&pair[1], &bad)?);
        out.push(
            StreamEntry::from_order(id, part as u32, &order, &entry)
                .ok_or_else(|| bad(&format!("order {order:?}: {entry:?}")))?,
        );
    }
    Ok(())
}

/// A field of a stream entry, as text.
fn field<'a>(
    v: &'a Value,
    bad: &impl Fn(&str) -> StoreError,
) -> Result<std::borrow::Cow<'a, str>, StoreError> {
    v.as_str()
        .ok_or_else(|| bad("a field that is not a string"))
}
