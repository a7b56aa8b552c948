//! The Redis backend: every store step is one Lua script from `lua/`, run with
//! EVALSHA on the slot of the bucket (or event) it touches. Standalone Redis and
//! Redis Cluster are the same code: fred routes each call by its first key.
//!
//! Scripts are embedded with `include_str!`, loaded on every primary at connect
//! time, and reloaded on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a
//! failover) by `evalsha_with_reload`. The client reconnects with exponential
//! backoff and gives every command a timeout; it never re-sends a script whose
//! connection died mid-flight (a purchase is not idempotent without its request
//! id), so such a call fails and the engine resolves what happened.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::{
    BucketAudit, BucketContents, CancelReply, CreateMeta, FLUSH_GROUP, Finish, FinishArgs,
    FinishReply, HomeEntry, HomeReply, OpenTransfer, SeqBump, Store, StoreError, TakeArgs,
    TakeReply, TransferReply,
};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::{BucketRef, EventKeys};
use crate::domain::model::{
    BucketState, EventMeta, EventSpec, EventStatus, OrderEntry, RequestRecord,
};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://host:port` or `redis-cluster://host:port?node=host:port&node=…`.
    pub url: String,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// Key namespace (`ss` unless a shared Redis must keep users apart).
    pub namespace: String,
    /// How long `connect` waits for the first connection.
    pub connect_timeout: Duration,
}

impl RedisOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            namespace: crate::domain::keys::NAMESPACE.to_owned(),
        }
    }
}

struct Scripts {
    purchase: Script,
    take: Script,
    untake: Script,
    finish: Script,
    cancel: Script,
    create_event: Script,
    set_status: Script,
    bump_seq: Script,
    mark_sold_out: Script,
    init_bucket: Script,
    bucket_state: Script,
    lease_acquire: Script,
    lease_renew: Script,
    transfer_out: Script,
    transfer_in: Script,
    transfer_clear: Script,
    stream_read: Script,
    stream_ack: Script,
    seal: Script,
    retire: Script,
    audit_bucket: Script,
    restore: Script,
    set_layout: Script,
    raise_fence: Script,
    begin_reshard: Script,
    end_reshard: Script,
    set_empty: Script,
    counters: Script,
}

impl Scripts {
    fn new() -> Self {
        let s = |lua: &'static str| Script::from_lua(lua);
        Self {
            purchase: s(include_str!("../../lua/purchase.lua")),
            take: s(include_str!("../../lua/take.lua")),
            untake: s(include_str!("../../lua/untake.lua")),
            finish: s(include_str!("../../lua/finish.lua")),
            cancel: s(include_str!("../../lua/cancel.lua")),
            create_event: s(include_str!("../../lua/create_event.lua")),
            set_status: s(include_str!("../../lua/set_status.lua")),
            bump_seq: s(include_str!("../../lua/bump_seq.lua")),
            mark_sold_out: s(include_str!("../../lua/mark_sold_out.lua")),
            init_bucket: s(include_str!("../../lua/init_bucket.lua")),
            bucket_state: s(include_str!("../../lua/bucket_state.lua")),
            lease_acquire: s(include_str!("../../lua/lease_acquire.lua")),
            lease_renew: s(include_str!("../../lua/lease_renew.lua")),
            transfer_out: s(include_str!("../../lua/transfer_out.lua")),
            transfer_in: s(include_str!("../../lua/transfer_in.lua")),
            transfer_clear: s(include_str!("../../lua/transfer_clear.lua")),
            stream_read: s(include_str!("../../lua/stream_read.lua")),
            stream_ack: s(include_str!("../../lua/stream_ack.lua")),
            seal: s(include_str!("../../lua/seal.lua")),
            retire: s(include_str!("../../lua/retire.lua")),
            audit_bucket: s(include_str!("../../lua/audit_bucket.lua")),
            restore: s(include_str!("../../lua/restore.lua")),
            set_layout: s(include_str!("../../lua/set_layout.lua")),
            raise_fence: s(include_str!("../../lua/raise_fence.lua")),
            begin_reshard: s(include_str!("../../lua/begin_reshard.lua")),
            end_reshard: s(include_str!("../../lua/end_reshard.lua")),
            set_empty: s(include_str!("../../lua/set_empty.lua")),
            counters: s(include_str!("../../lua/counters.lua")),
        }
    }

    fn all(&self) -> [&Script; 28] {
        [
            &self.purchase,
            &self.take,
            &self.untake,
            &self.finish,
            &self.cancel,
            &self.create_event,
            &self.set_status,
            &self.bump_seq,
            &self.mark_sold_out,
            &self.init_bucket,
            &self.bucket_state,
            &self.lease_acquire,
            &self.lease_renew,
            &self.transfer_out,
            &self.transfer_in,
            &self.transfer_clear,
            &self.stream_read,
            &self.stream_ack,
            &self.seal,
            &self.retire,
            &self.audit_bucket,
            &self.restore,
            &self.set_layout,
            &self.raise_fence,
            &self.begin_reshard,
            &self.end_reshard,
            &self.set_empty,
            &self.counters,
        ]
    }
}

/// The Redis (standalone or Cluster) store.
#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    scripts: std::sync::Arc<Scripts>,
    namespace: std::sync::Arc<str>,
    home_keys: Arc<RwLock<HashMap<BucketRef, Arc<[Key]>>>>,
}

impl RedisStore {
    /// Connects, and loads every script on every primary.
    pub async fn connect(opts: &RedisOptions) -> Result<Self, StoreError> {
        let config = Config::from_url(&opts.url)
            .map_err(|e| StoreError::Unavailable(format!("bad Redis URL {:?}: {e}", opts.url)))?;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = opts.command_timeout)
            .with_connection_config(|c| {
                c.connection_timeout = opts.connect_timeout;
                c.internal_command_timeout = opts.connect_timeout;
                // A command whose connection died may have run: never re-send it.
                c.max_command_attempts = 1;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .map_err(unavailable)?;
        tokio::time::timeout(opts.connect_timeout, client.init())
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "no answer from Redis at {} within {:?}",
                    opts.url, opts.connect_timeout
                ))
            })?
            .map_err(unavailable)?;
        let store = Self {
            client,
            scripts: std::sync::Arc::new(Scripts::new()),
            namespace: opts.namespace.as_str().into(),
            home_keys: Arc::default(),
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// `SCRIPT LOAD` of every script on every primary.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in self.scripts.all() {
            script.load(&self.client).await.map_err(unavailable)?;
        }
        Ok(())
    }

    fn keys(&self, bucket: &BucketRef) -> crate::domain::keys::BucketKeys {
        bucket.keys_in(&self.namespace)
    }

    /// The home step's keys of a bucket, built once per bucket: formatting
    /// nine key names for every purchase showed up in profiles.
    fn home_keys(&self, bucket: &BucketRef) -> Arc<[Key]> {
        if let Some(keys) = self
            .home_keys
            .read()
            .expect("key cache poisoned")
            .get(bucket)
        {
            return keys.clone();
        }
        let k = self.keys(bucket);
        let keys: Arc<[Key]> = [
            k.stock, k.users, k.reqs, k.orders, k.idx, k.sealed, k.demand, k.empty, k.epoch,
        ]
        .into_iter()
        .map(Key::from)
        .collect();
        let mut cache = self.home_keys.write().expect("key cache poisoned");
        cache.insert(bucket.clone(), keys.clone());
        keys
    }

    fn event_keys(&self, event: &EventId) -> EventKeys {
        EventKeys::in_namespace(&self.namespace, event)
    }

    /// The set of known event ids (one small key, written once per event).
    fn events_key(&self) -> String {
        format!("{}:events", self.namespace)
    }

    /// OUT, optionally allowed on a sealed bucket.
    async fn out_step(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
        sealed_ok: bool,
    ) -> Result<TransferReply, StoreError> {
        let k = self.keys(bucket);
        let args = vec![
            token.to_string(),
            xid.to_owned(),
            target.to_string(),
            units.to_string(),
            if sealed_ok { "1" } else { "0" }.to_owned(),
        ];
        let parts = self
            .eval_bucket(
                bucket,
                &self.scripts.transfer_out,
                vec![k.stock, k.xfer, k.fence, k.sealed],
                args,
            )
            .await?;
        transfer_reply(&parts)
    }

    /// The underlying client, for diagnostics and tests (INFO, SCRIPT FLUSH …).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A step on the event's layout in `meta` (`set_layout`, `end_reshard`):
    /// true when it applied.
    async fn layout_step(
        &self,
        script: &Script,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        let keys = vec![self.event_keys(event).meta];
        let args = vec![
            generation.to_string(),
            buckets.to_string(),
            EventMeta::encode_layouts(retired),
        ];
        Ok(num(&self.eval(script, keys, args).await?)? == 1)
    }

    /// `lease_acquire.lua` on a holder key and its token counter (the
    /// rebalancer's leadership, or the mover lease): the new token, or `None`
    /// when another owner holds it.
    async fn take_lease(
        &self,
        holder: String,
        counter: String,
        owner: &str,
        ttl_ms: u64,
        seize: bool,
    ) -> Result<Option<u64>, StoreError> {
        let mut args = vec![owner.to_owned(), ttl_ms.to_string()];
        if seize {
            args.push("seize".to_owned());
        }
        let parts = self
            .eval(&self.scripts.lease_acquire, vec![holder, counter], args)
            .await?
            .into_array();
        match code(&parts)?.as_str() {
            "OK" => Ok(Some(num(arg(&parts, 1)?)?)),
            _ => Ok(None),
        }
    }

    /// `lease_renew.lua`: extends (or, with `ttl_ms` 0, releases) a lease the
    /// owner still holds with this token; false when it does not.
    async fn renew_lease_key(
        &self,
        holder: String,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let args = vec![owner.to_owned(), token.to_string(), ttl_ms.to_string()];
        let v = self
            .eval(&self.scripts.lease_renew, vec![holder], args)
            .await?;
        Ok(num(&v)? == 1)
    }

    /// EVALSHA; on `NOSCRIPT` (scripts flushed, a restart, a failover) the
    /// same call once more as EVAL with the script's body, which cannot miss and
    /// caches the script again on exactly the node that lost it.
    async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        // Moved into fred's types (no copy), whose clones are reference counts.
        let keys: Vec<Key> = keys.into_iter().map(Key::from).collect();
        let args: Vec<Value> = args.into_iter().map(Value::from).collect();
        self.eval_raw(script, keys, args).await
    }

    /// EVALSHA with fred's own key and value types (the hot path builds them
    /// directly: cached keys, integers as integers).
    async fn eval_raw(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        match script
            .evalsha(&self.client, keys.clone(), args.clone())
            .await
        {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                let lua = script
                    .lua()
                    .cloned()
                    .expect("scripts are built from their Lua");
                self.client.eval(lua, keys, args).await.map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    /// Runs a bucket script; "ST" becomes [`StoreError::Stale`].
    async fn eval_bucket(
        &self,
        bucket: &BucketRef,
        script: &Script,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Vec<Value>, StoreError> {
        match self.eval(script, keys, args).await? {
            Value::Array(parts) => Ok(parts),
            v if v.as_str().as_deref() == Some("ST") => Err(StoreError::Stale(bucket.tag())),
            other => Err(protocol("array", &other)),
        }
    }
}

fn unavailable(e: Error) -> StoreError {
    match e.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Backpressure
        | ErrorKind::Cluster
        | ErrorKind::Routing => StoreError::Unavailable(e.to_string()),
        _ if e.details().starts_with("CLUSTERDOWN") || e.details().starts_with("LOADING") => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Protocol(e.to_string()),
    }
}

fn protocol(what: &str, got: &Value) -> StoreError {
    StoreError::Protocol(format!("expected {what}, got {got:?}"))
}

fn text(v: &Value) -> Result<String, StoreError> {
    v.as_str()
        .map(|s| s.into_owned())
        .ok_or_else(|| protocol("string", v))
}

fn num(v: &Value) -> Result<u64, StoreError> {
    v.as_u64().ok_or_else(|| protocol("number", v))
}

fn code(parts: &[Value]) -> Result<String, StoreError> {
    parts
        .first()
        .ok_or_else(|| StoreError::Protocol("empty reply".into()))
        .and_then(text)
}

fn arg(parts: &[Value], i: usize) -> Result<&Value, StoreError> {
    parts
        .get(i)
        .ok_or_else(|| StoreError::Protocol(format!("reply too short: {parts:?}")))
}

fn record(v: &Value) -> Result<RequestRecord, StoreError> {
    let s = text(v)?;
    RequestRecord::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad record {s:?}")))
}

fn entry(v: &Value) -> Result<OrderEntry, StoreError> {
    let s = text(v)?;
    OrderEntry::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad order entry {s:?}")))
}

fn transfer_reply(parts: &[Value]) -> Result<TransferReply, StoreError> {
    let n = num(arg(parts, 1)?)?;
    match code(parts)?.as_str() {
        "A" => Ok(TransferReply::Applied(n)),
        "D" => Ok(TransferReply::Duplicate(n)),
        "F" => Ok(TransferReply::Fenced { highest: n }),
        other => Err(StoreError::Protocol(format!("transfer reply {other:?}"))),
    }
}

/// `{id, {"d", "k|oid|user|q|b|h|rid|t"}}` from XREADGROUP / XAUTOCLAIM.
fn stream_entry(v: Value) -> Result<StreamEntry, StoreError> {
    let parts = v.into_array();
    let raw_id = text(arg(&parts, 0)?)?;
    let id = StreamId::parse(&raw_id)
        .ok_or_else(|| StoreError::Protocol(format!("bad stream id {raw_id:?}")))?;
    let fields = arg(&parts, 1)?.clone().into_array();
    let data = fields
        .chunks(2)
        .find_map(|pair| match pair {
            [k, v] if k.as_str().as_deref() == Some("d") => text(v).ok(),
            _ => None,
        })
        .ok_or_else(|| StoreError::Protocol(format!("stream entry {raw_id} has no d field")))?;
    let bad = || StoreError::Protocol(format!("stream entry {raw_id}: {data:?}"));
    let f: Vec<&str> = data.split('|').collect();
    if f.len() != 8 {
        return Err(bad());
    }
    Ok(StreamEntry {
        id,
        kind: RecordKind::parse(f[0]).ok_or_else(bad)?,
        order_id: f[1].to_owned(),
        user: f[2].to_owned(),
        qty: f[3].parse().map_err(|_| bad())?,
        bucket: f[4].parse().map_err(|_| bad())?,
        home: f[5].parse().map_err(|_| bad())?,
        rid: f[6].to_owned(),
        at_ms: f[7].parse().map_err(|_| bad())?,
    })
}

fn opt_ms(v: Option<i64>) -> String {
    v.map(|ms| ms.to_string()).unwrap_or_default()
}

fn parse_meta(fields: std::collections::HashMap<String, String>) -> Result<EventMeta, StoreError> {
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
    let sold_out = match get("soldout")?.split_once('|') {
        Some((seq, at)) => Some((
            seq.parse().map_err(|_| bad("soldout"))?,
            at.parse().map_err(|_| bad("soldout"))?,
        )),
        None => None,
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
    })
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        if self.client.is_clustered() {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client.ping::<()>(None).await.map_err(unavailable)
    }

    async fn create_meta(&self, spec: &EventSpec, now_ms: i64) -> Result<CreateMeta, StoreError> {
        let keys = self.event_keys(&spec.id);
        let args = vec![
            spec.id.to_string(),
            spec.stock.to_string(),
            spec.buckets.to_string(),
            spec.per_user_limit.unwrap_or(0).to_string(),
            spec.max_per_order.to_string(),
            opt_ms(spec.starts_at),
            opt_ms(spec.ends_at),
            now_ms.to_string(),
        ];
        let reply = self
            .eval(&self.scripts.create_event, vec![keys.meta], args)
            .await?;
        match code(&reply.into_array())?.as_str() {
            "OK" => Ok(CreateMeta::Created),
            _ => match self.load_meta(&spec.id).await? {
                Some(meta) => Ok(CreateMeta::Exists(meta)),
                None => Err(StoreError::Protocol("event vanished during create".into())),
            },
        }
    }

    async fn register_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.client
            .sadd::<(), _, _>(self.events_key(), event.as_str())
            .await
            .map_err(unavailable)
    }

    async fn list_events(&self) -> Result<Vec<EventId>, StoreError> {
        let ids: Vec<String> = self
            .client
            .smembers(self.events_key())
            .await
            .map_err(unavailable)?;
        Ok(ids
            .into_iter()
            .filter_map(|id| EventId::parse(id).ok())
            .collect())
    }

    async fn load_meta(&self, event: &EventId) -> Result<Option<EventMeta>, StoreError> {
        let fields: std::collections::HashMap<String, String> = self
            .client
            .hgetall(self.event_keys(event).meta)
            .await
            .map_err(unavailable)?;
        if fields.is_empty() {
            return Ok(None);
        }
        parse_meta(fields).map(Some)
    }

    async fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> Result<bool, StoreError> {
        let keys = vec![self.event_keys(event).meta];
        let args = vec![from.as_str().to_owned(), to.as_str().to_owned()];
        let v = self.eval(&self.scripts.set_status, keys, args).await?;
        Ok(num(&v)? == 1)
    }

    async fn set_layout(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        let script = &self.scripts.set_layout;
        self.layout_step(script, event, generation, buckets, retired)
            .await
    }

    async fn bump_seq(&self, event: &EventId) -> Result<SeqBump, StoreError> {
        let keys = vec![self.event_keys(event).meta];
        let v = self.eval(&self.scripts.bump_seq, keys, vec![]).await?;
        if v.as_i64() == Some(-1) {
            return Err(StoreError::Stale(format!("meta of {event}")));
        }
        let parts = v.into_array();
        Ok(SeqBump {
            seq: num(arg(&parts, 0)?)?,
            was_sold_out: num(arg(&parts, 1)?)? == 1,
        })
    }

    async fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let keys = vec![self.event_keys(event).meta];
        let args = vec![seq.to_string(), now_ms.to_string()];
        let v = self.eval(&self.scripts.mark_sold_out, keys, args).await?;
        Ok(num(&v)? == 1)
    }

    async fn init_bucket(&self, bucket: &BucketRef, stock: u64) -> Result<(), StoreError> {
        let k = self.keys(bucket);
        let args = vec![stock.to_string(), FLUSH_GROUP.to_owned()];
        self.eval(&self.scripts.init_bucket, vec![k.stock, k.orders], args)
            .await
            .map(drop)
    }

    async fn home(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[HomeEntry],
    ) -> Result<Vec<HomeReply>, StoreError> {
        let keys = self.home_keys(bucket).to_vec();
        let mut args: Vec<Value> = Vec::with_capacity(3 + 6 * entries.len());
        args.extend([
            Value::Integer(now_ms),
            Value::Integer(i64::from(bucket.index)),
            Value::Integer(entries.len() as i64),
        ]);
        for e in entries {
            // The script only writes these; building them here keeps string
            // work off the one Redis thread.
            let (b, oid, user, rid) = (
                bucket.index,
                e.order_id.as_str(),
                e.user.as_str(),
                e.rid.as_str(),
            );
            let kept = if e.keep { rid } else { "" };
            args.extend([
                Value::from(user),
                Value::Integer(i64::from(e.qty)),
                Value::Integer(i64::from(e.limit)),
                Value::from(rid),
                Value::Integer(i64::from(e.keep)),
                Value::from(oid),
                Value::from(format!("o|{oid}|{user}|{}|{b}|{b}|{rid}|{now_ms}", e.qty)),
                Value::from(format!("C|{user}|{}|{b}|{kept}|{now_ms}", e.qty)),
                Value::from(format!("P|{}|{oid}|{user}|{now_ms}", e.qty)),
                Value::from(format!("B|{}|{oid}|{b}|0", e.qty)),
            ]);
        }
        let replies = match self.eval_raw(&self.scripts.purchase, keys, args).await? {
            Value::Array(parts) => parts,
            v if v.as_str().as_deref() == Some("ST") => {
                return Err(StoreError::Stale(bucket.tag()));
            }
            other => return Err(protocol("array", &other)),
        };
        if replies.len() != 2 * entries.len() {
            return Err(StoreError::Protocol(format!(
                "{} reply values for {} entries",
                replies.len(),
                entries.len()
            )));
        }
        replies
            .chunks(2)
            .map(|pair| {
                let value = &pair[1];
                Ok(match pair[0].as_str().as_deref() {
                    Some("B") => HomeReply::Bought {
                        stock_left: num(value)?,
                    },
                    Some("R") => HomeReply::Replay(record(value)?),
                    Some("L") => HomeReply::LimitExceeded { held: num(value)? },
                    Some("P") => HomeReply::Pending { stock: num(value)? },
                    Some("S") => HomeReply::SoldOut,
                    other => return Err(StoreError::Protocol(format!("home reply {other:?}"))),
                })
            })
            .collect()
    }

    async fn take(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.reqs, k.orders, k.xfer, k.adds, k.sealed];
        let args = vec![
            now_ms.to_string(),
            bucket.index.to_string(),
            a.rid.clone(),
            a.pass.to_string(),
            a.user.to_string(),
            a.qty.to_string(),
            a.order_id.to_string(),
            a.home.to_string(),
        ];
        let parts = self
            .eval_bucket(bucket, &self.scripts.take, keys, args)
            .await?;
        match code(&parts)?.as_str() {
            "T" => Ok(TakeReply::Taken {
                order_id: OrderId::from_stored(text(arg(&parts, 1)?)?),
            }),
            "S" => Ok(TakeReply::Short {
                available: num(arg(&parts, 1)?)?,
                fresh: num(arg(&parts, 2)?)? == 1,
                adds: num(arg(&parts, 3)?)?,
            }),
            other => Err(StoreError::Protocol(format!("take reply {other:?}"))),
        }
    }

    async fn untake(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<bool, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.reqs, k.orders, k.adds];
        let args = vec![
            now_ms.to_string(),
            bucket.index.to_string(),
            a.rid.clone(),
            a.pass.to_string(),
            a.user.to_string(),
            a.qty.to_string(),
            a.order_id.to_string(),
            a.home.to_string(),
        ];
        let parts = self
            .eval_bucket(bucket, &self.scripts.untake, keys, args)
            .await?;
        Ok(code(&parts)? == "OK")
    }

    async fn finish(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &FinishArgs,
    ) -> Result<FinishReply, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.users, k.reqs, k.idx];
        let (kind, oid, from, probes, remaining) = match &a.outcome {
            Finish::Bought {
                order_id,
                bucket,
                probes,
            } => ("B", order_id.to_string(), *bucket, *probes, 0),
            Finish::SoldOut { remaining } => ("S", String::new(), 0, 0, *remaining),
            Finish::Abort => ("A", String::new(), 0, 0, 0),
        };
        let args = vec![
            now_ms.to_string(),
            a.rid.clone(),
            kind.to_owned(),
            a.user.to_string(),
            a.qty.to_string(),
            if a.keep { "1" } else { "0" }.to_owned(),
            oid,
            from.to_string(),
            probes.to_string(),
            remaining.to_string(),
            if a.limited { "1" } else { "0" }.to_owned(),
        ];
        let parts = self
            .eval_bucket(bucket, &self.scripts.finish, keys, args)
            .await?;
        match code(&parts)?.as_str() {
            "OK" => Ok(FinishReply::Done),
            "R" => Ok(FinishReply::Already(record(arg(&parts, 1)?)?)),
            "NR" => Ok(FinishReply::NoRecord),
            other => Err(StoreError::Protocol(format!("finish reply {other:?}"))),
        }
    }

    async fn cancel(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<CancelReply, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.users, k.idx, k.orders, k.adds, k.sealed];
        let args = vec![
            now_ms.to_string(),
            order.to_string(),
            bucket.index.to_string(),
        ];
        let parts = self
            .eval_bucket(bucket, &self.scripts.cancel, keys, args)
            .await?;
        match code(&parts)?.as_str() {
            "OK" => Ok(CancelReply::Cancelled(entry(arg(&parts, 1)?)?)),
            "AC" => Ok(CancelReply::AlreadyCancelled(entry(arg(&parts, 1)?)?)),
            "NF" => Ok(CancelReply::NotFound),
            other => Err(StoreError::Protocol(format!("cancel reply {other:?}"))),
        }
    }

    async fn order_entry(
        &self,
        bucket: &BucketRef,
        order: &OrderId,
    ) -> Result<Option<OrderEntry>, StoreError> {
        let v: Value = self
            .client
            .hget(self.keys(bucket).idx, order.as_str())
            .await
            .map_err(unavailable)?;
        if v.is_null() {
            return Ok(None);
        }
        entry(&v).map(Some)
    }

    async fn record(
        &self,
        bucket: &BucketRef,
        rid: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let v: Value = self
            .client
            .hget(self.keys(bucket).reqs, rid)
            .await
            .map_err(unavailable)?;
        if v.is_null() {
            return Ok(None);
        }
        record(&v).map(Some)
    }

    async fn held(&self, bucket: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        let v: Option<u64> = self
            .client
            .hget(self.keys(bucket).users, user.as_str())
            .await
            .map_err(unavailable)?;
        Ok(v.unwrap_or(0))
    }

    async fn counters(&self, bucket: &BucketRef) -> Result<(u64, u64), StoreError> {
        let k = self.keys(bucket);
        let parts = self
            .eval(&self.scripts.counters, vec![k.adds, k.epoch], vec![])
            .await?
            .into_array();
        Ok((num(arg(&parts, 0)?)?, num(arg(&parts, 1)?)?))
    }

    async fn set_empty(&self, bucket: &BucketRef, epoch: u64) -> Result<bool, StoreError> {
        let k = self.keys(bucket);
        let v = self
            .eval(
                &self.scripts.set_empty,
                vec![k.empty, k.epoch],
                vec![epoch.to_string()],
            )
            .await?;
        Ok(num(&v)? == 1)
    }

    async fn bump_epoch(&self, bucket: &BucketRef) -> Result<(), StoreError> {
        self.client
            .incr::<(), _>(self.keys(bucket).epoch)
            .await
            .map_err(unavailable)
    }

    async fn bucket_state(&self, bucket: &BucketRef) -> Result<BucketState, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.xfer, k.fence, k.adds, k.demand];
        let parts = self
            .eval_bucket(bucket, &self.scripts.bucket_state, keys, vec![])
            .await?;
        Ok(BucketState {
            stock: num(arg(&parts, 0)?)?,
            in_transfer: num(arg(&parts, 1)?)?,
            fence: num(arg(&parts, 2)?)?,
            adds: num(arg(&parts, 3)?)?,
            demand: num(arg(&parts, 4)?)?,
        })
    }

    async fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> Result<bool, StoreError> {
        let keys = vec![self.event_keys(event).meta];
        let v = self
            .eval(
                &self.scripts.begin_reshard,
                keys,
                vec![generation.to_string(), buckets.to_string()],
            )
            .await?;
        Ok(num(&v)? == 1)
    }

    async fn end_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        let script = &self.scripts.end_reshard;
        self.layout_step(script, event, generation, buckets, retired)
            .await
    }

    async fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let k = self.event_keys(event);
        self.take_lease(k.leader, k.term, owner, ttl_ms, false)
            .await
    }

    async fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> Result<(), StoreError> {
        let k = self.event_keys(event);
        self.renew_lease_key(k.leader, owner, term, 0)
            .await
            .map(drop)
    }

    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let k = self.event_keys(event);
        self.take_lease(k.lease, k.token, owner, ttl_ms, false)
            .await
    }

    async fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        let k = self.event_keys(event);
        self.take_lease(k.lease, k.token, owner, ttl_ms, true)
            .await?
            .ok_or_else(|| StoreError::Protocol("a seized lease was refused".into()))
    }

    async fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let k = self.event_keys(event);
        self.renew_lease_key(k.lease, owner, token, ttl_ms).await
    }

    async fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> Result<(), StoreError> {
        self.renew_lease(event, owner, token, 0).await.map(drop)
    }

    async fn transfer_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.out_step(bucket, token, xid, target, units, false)
            .await
    }

    async fn drain_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.out_step(bucket, token, xid, target, units, true).await
    }

    async fn raise_fence(&self, bucket: &BucketRef, token: u64) -> Result<u64, StoreError> {
        let v = self
            .eval(
                &self.scripts.raise_fence,
                vec![self.keys(bucket).fence],
                vec![token.to_string()],
            )
            .await?;
        num(&v)
    }

    async fn transfer_in(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        let k = self.keys(bucket);
        let args = vec![
            token.to_string(),
            xid.to_owned(),
            source.to_string(),
            units.to_string(),
        ];
        let parts = self
            .eval_bucket(
                bucket,
                &self.scripts.transfer_in,
                vec![k.stock, k.xin, k.fence, k.adds, k.sealed],
                args,
            )
            .await?;
        transfer_reply(&parts)
    }

    async fn transfer_clear(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
    ) -> Result<TransferReply, StoreError> {
        let k = self.keys(bucket);
        let args = vec![token.to_string(), xid.to_owned()];
        let parts = self
            .eval_bucket(
                bucket,
                &self.scripts.transfer_clear,
                vec![k.stock, k.xfer, k.fence],
                args,
            )
            .await?;
        transfer_reply(&parts)
    }

    async fn open_transfers(&self, bucket: &BucketRef) -> Result<Vec<OpenTransfer>, StoreError> {
        let all: std::collections::HashMap<String, String> = self
            .client
            .hgetall(self.keys(bucket).xfer)
            .await
            .map_err(unavailable)?;
        let mut open = Vec::new();
        for (xid, v) in all {
            let f: Vec<&str> = v.split('|').collect();
            let bad = || StoreError::Protocol(format!("bad journal entry {v:?}"));
            if f.len() != 4 {
                return Err(bad());
            }
            if f[3] == "o" {
                open.push(OpenTransfer {
                    xid,
                    target: f[0].parse().map_err(|_| bad())?,
                    units: f[1].parse().map_err(|_| bad())?,
                    token: f[2].parse().map_err(|_| bad())?,
                });
            }
        }
        Ok(open)
    }

    async fn stream_read(
        &self,
        bucket: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let args = vec![
            FLUSH_GROUP.to_owned(),
            consumer.to_owned(),
            count.to_string(),
            claim_idle_ms.to_string(),
        ];
        let v = self
            .eval(
                &self.scripts.stream_read,
                vec![self.keys(bucket).orders],
                args,
            )
            .await?;
        v.into_array().into_iter().map(stream_entry).collect()
    }

    async fn stream_ack(&self, bucket: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        let mut args = Vec::with_capacity(ids.len() + 1);
        args.push(FLUSH_GROUP.to_owned());
        args.extend(ids.iter().map(StreamId::to_string));
        let v = self
            .eval(
                &self.scripts.stream_ack,
                vec![self.keys(bucket).orders],
                args,
            )
            .await?;
        num(&v)
    }

    async fn stream_len(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        self.client
            .xlen(self.keys(bucket).orders)
            .await
            .map_err(unavailable)
    }

    async fn seal(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        let k = self.keys(bucket);
        match self
            .eval(&self.scripts.seal, vec![k.stock, k.sealed], vec![])
            .await?
        {
            v if v.as_str().as_deref() == Some("ST") => Err(StoreError::Stale(bucket.tag())),
            v => num(&v),
        }
    }

    async fn retire(&self, bucket: &BucketRef, now_ms: i64) -> Result<Option<u64>, StoreError> {
        let k = self.keys(bucket);
        let label = format!("{}#{}#{}", bucket.event, bucket.generation, bucket.index);
        let args = vec![now_ms.to_string(), bucket.index.to_string(), label];
        let parts = self
            .eval_bucket(
                bucket,
                &self.scripts.retire,
                vec![k.stock, k.sealed, k.orders],
                args,
            )
            .await?;
        match code(&parts)?.as_str() {
            "OK" => Ok(Some(num(arg(&parts, 1)?)?)),
            _ => Ok(None),
        }
    }

    async fn audit_bucket(&self, bucket: &BucketRef) -> Result<BucketAudit, StoreError> {
        let k = self.keys(bucket);
        let keys = vec![k.stock, k.xfer, k.xin, k.adds, k.orders, k.sealed];
        let parts = self
            .eval_bucket(bucket, &self.scripts.audit_bucket, keys, vec![])
            .await?;
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
        let records = list(6)?
            .chunks(3)
            .map(|c| {
                let (rid, kind, qty) = triple(c)?;
                let kind = RecordKind::parse(&text(&kind)?).ok_or_else(|| {
                    StoreError::Protocol(format!("bad record kind {kind:?} in {}", bucket.tag()))
                })?;
                Ok((id(&rid)?, kind, num(&qty)?))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(BucketAudit {
            stock: num(arg(&parts, 0)?)?,
            adds: num(arg(&parts, 1)?)?,
            sealed: num(arg(&parts, 2)?)? == 1,
            last_id: id(arg(&parts, 3)?)?,
            open,
            applied,
            records,
        })
    }

    async fn pending(
        &self,
        bucket: &BucketRef,
    ) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        let all: std::collections::HashMap<String, String> = self
            .client
            .hgetall(self.keys(bucket).reqs)
            .await
            .map_err(unavailable)?;
        Ok(all
            .into_iter()
            .filter(|(_, v)| v.starts_with("P|"))
            .filter_map(|(rid, v)| RequestRecord::decode(&v).map(|r| (rid, r)))
            .collect())
    }

    async fn take_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<Vec<(u32, OrderId)>, StoreError> {
        let fields: Vec<String> = (1..=passes).map(|p| format!("t:{rid}:{p}")).collect();
        let values: Vec<Option<String>> = self
            .client
            .hmget(self.keys(bucket).reqs, fields)
            .await
            .map_err(unavailable)?;
        Ok(values
            .into_iter()
            .zip(1..)
            .filter_map(|(v, pass)| {
                v?.strip_prefix("T|")
                    .map(|oid| (pass, OrderId::from_stored(oid.to_owned())))
            })
            .collect())
    }

    async fn restore(
        &self,
        bucket: &BucketRef,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
    ) -> Result<(), StoreError> {
        let k = self.keys(bucket);
        let mut args = vec![holdings.len().to_string()];
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
        self.eval(&self.scripts.restore, vec![k.users, k.idx, k.reqs], args)
            .await
            .map(drop)
    }

    async fn contents(&self, bucket: &BucketRef) -> Result<BucketContents, StoreError> {
        let k = self.keys(bucket);
        let hash = |key: String| async move {
            let all: std::collections::HashMap<String, String> =
                self.client.hgetall(key).await.map_err(unavailable)?;
            Ok::<_, StoreError>(all)
        };
        let (users, idx, reqs) = (
            hash(k.users).await?,
            hash(k.idx).await?,
            hash(k.reqs).await?,
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
            c.orders.push((OrderId::from_stored(oid), entry));
        }
        // Client request ids only ("<user>/<id>"); probe markers and internal ids stay behind.
        for (rid, record) in reqs {
            if rid.contains('/')
                && !rid.starts_with("t:")
                && let Some(record) = RequestRecord::decode(&record)
                && !matches!(record, RequestRecord::Pending { .. })
            {
                c.records.push((rid, record));
            }
        }
        Ok(c)
    }

    async fn expire_bucket(&self, bucket: &BucketRef, ttl_ms: u64) -> Result<(), StoreError> {
        for key in self.keys(bucket).all() {
            self.client
                .pexpire::<(), _>(key, ttl_ms as i64, None)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }
}
