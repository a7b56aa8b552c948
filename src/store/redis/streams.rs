//! The order streams on Redis: one STREAM per bucket, read by the flusher's
//! consumer group.

use fred::prelude::*;

use super::{RedisStore, num};
use crate::domain::keys::BucketRef;
use crate::domain::stream::{StreamEntry, StreamId};
use crate::store::{FLUSH_GROUP, StoreError, Streams};

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
        let keys = vec![self.keys(bucket).orders];
        let args = vec![
            FLUSH_GROUP.to_owned(),
            consumer.to_owned(),
            count.to_string(),
            claim_idle_ms.map_or_else(String::new, |ms| ms.to_string()),
        ];
        let v = self.eval(&self.scripts.stream_read, keys, args).await?;
        v.into_array().into_iter().map(stream_entry).collect()
    }

    async fn stream_ack(&self, bucket: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        let keys = vec![self.keys(bucket).orders];
        let mut args = Vec::with_capacity(ids.len() + 1);
        args.push(FLUSH_GROUP.to_owned());
        args.extend(ids.iter().map(StreamId::to_string));
        num(&self.eval(&self.scripts.stream_ack, keys, args).await?)
    }

    async fn stream_len(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        self.call(|| self.client.xlen(self.keys(bucket).orders))
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
        let key = self.keys(bucket).orders;
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
        new_entries(reply)?.into_iter().map(stream_entry).collect()
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

/// `{id, {"d", data, …}}` from XREADGROUP / XAUTOCLAIM. The flusher decodes
/// every record it carries to the ledger: the id and the data are read from
/// the reply's own buffers, not copied out first.
pub(super) fn stream_entry(v: Value) -> Result<StreamEntry, StoreError> {
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
    let data = fields
        .chunks(2)
        .find_map(|pair| match pair {
            [k, v] if k.as_str().as_deref() == Some("d") => v.as_str(),
            _ => None,
        })
        .ok_or_else(|| StoreError::Protocol(format!("stream entry {raw_id} has no d field")))?;
    StreamEntry::from_data(id, &data)
        .ok_or_else(|| StoreError::Protocol(format!("stream entry {raw_id}: {data:?}")))
}
