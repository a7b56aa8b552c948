//! The hot path on Redis: one script per step on one bucket's slot.
//!
//! One file on purpose, though long: the section's declarations, the
//! purchase call's column builder and its reply decoder belong together
//! (the builder and the header are held to each other by a test), and the
//! saga's steps mirror `memory/buckets.rs` path for path.

use std::sync::Arc;

use fred::bytes::{Bytes, BytesMut};
use fred::prelude::*;

use super::scripts::reply;
use super::steps::{self, Step};
use super::{
    At, RedisStore, arg, array_or_stale, code, num, order_entry, protocol, request_record, text,
    unknown,
};
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{BucketState, EntryState, OrderEntry, RequestRecord};
use crate::domain::records::{EmptyMark, ProbeMarker};
use crate::domain::stream::{CopyHead, RecordKind, StreamEntry, StreamId};
use crate::domain::token::{TokenRefusal, TokenUse};
use crate::store::{
    Buckets, CancelReply, FLUSH_GROUP, Finish, FinishArgs, FinishReply, IndexRead, PurchaseEntry,
    PurchaseReply, StoreError, TakeArgs, TakeReply,
};

use super::steps::prelude::*;

steps! {
    /// Makes a bucket: its stock and its stream's consumer group.
    InitBucket = init_bucket {
        keys: [b(Bk::Stock), b(Bk::Orders)],
        argv: { units: u64, group: &'static str },
        reply: Reply::Nothing,
        writes: [],
    }
    /// The saga's probe of bucket j.
    Take = take {
        keys: [b(Bk::Stock), K::Given("tk"), b(Bk::Orders), b(Bk::Xfer), b(Bk::Adds), b(Bk::Sealed)],
        argv: {
            qty: u32, order: String, taken: String, record: String, marker: u64,
            undone: Option<String>, kept: Option<bool>, confirmed: Option<String>,
        },
        reply: Reply::Codes(&[
            reply::STALE, reply::TAKEN, reply::SHORT, reply::UNDONE, reply::LINE_CONFIRMED,
        ]),
        writes: [Marker, Stream],
    }
    /// Gives back what a take took.
    Untake = untake {
        keys: [b(Bk::Stock), K::Given("tk"), b(Bk::Orders), b(Bk::Adds)],
        argv: { qty: u32, taken: String, undone: String, record: String, marker: u64 },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::NO_TAKE]),
        writes: [Marker, Stream],
    }
    /// Ends a saga at its home bucket.
    FinishSaga = finish {
        keys: [b(Bk::Stock), b(Bk::Users), b(Bk::Reqs), b(Bk::Idx), b(Bk::Pend)],
        more_keys: [b(Bk::Holds), b(Bk::Hunits), b(Bk::Orders), b(Bk::Tok)],
        argv: {
            rid: String, outcome: &'static str, user: String, qty: u32, order: String,
            entry: String, record: String, limited: bool, saga: String,
            pay_by: Option<i64>, hold: Option<String>,
        },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::REPLAY, reply::NO_RECORD]),
        writes: [OrderEntry, Request, Stream],
    }
    /// Sagas pending at a home bucket since before a bound.
    StalePending = stale_pending {
        keys: [b(Bk::Pend), b(Bk::Reqs)],
        argv: { bound: i64, count: u32 },
        reply: Reply::Values,
        writes: [],
    }
    /// Cancels an order.
    Cancel = cancel {
        keys: [
            b(Bk::Stock), b(Bk::Users), b(Bk::Idx), b(Bk::Orders), b(Bk::Adds), b(Bk::Sealed), b(Bk::Holds),
            b(Bk::Hunits), b(Bk::Wl),
        ],
        argv: { order: String, head: String, cancelled: &'static str },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::ALREADY_CANCELLED, reply::NOT_FOUND,
        ]),
        writes: [OrderEntry, Stream],
    }
    /// A bucket's addition count and epoch.
    Counters = counters {
        keys: [b(Bk::Adds), b(Bk::Epoch)],
        argv: {},
        reply: Reply::Values,
        writes: [],
    }
    /// Marks the event found sold out, on one bucket.
    SetEmpty = set_empty {
        keys: [b(Bk::Empty), b(Bk::Epoch)],
        argv: { epoch: u64, ttl: u64, mark: String },
        reply: Reply::Flag,
        writes: [EmptyMark],
    }
    /// A bucket's state in one read.
    ReadBucketState = bucket_state {
        keys: [
            b(Bk::Stock), b(Bk::Xfer), b(Bk::Fence), b(Bk::Adds), b(Bk::Demand), b(Bk::Hunits), b(Bk::Sealed),
            b(Bk::Wl),
        ],
        argv: {},
        reply: Reply::Codes(&[reply::STALE]),
        writes: [],
    }
}

/// `purchase.lua`: the HOME step for a batch of entries of one bucket.
/// Its columns are built by `buckets::purchase_args` (the user and
/// quantity columns only where the fast path reads them, limit, keep and
/// pending only for a call that is not uniform, the queue column only with
/// holds).
pub(super) const PURCHASE: &Decl = &Decl {
    name: "purchase",
    lua: lua!(purchase),
    keys: &[
        b(Bk::Stock),
        b(Bk::Users),
        b(Bk::Reqs),
        b(Bk::Orders),
        b(Bk::Idx),
        b(Bk::Sealed),
        b(Bk::Demand),
        b(Bk::Empty),
        b(Bk::Epoch),
        b(Bk::Pend),
    ],
    more_keys: &[b(Bk::Holds), b(Bk::Hunits), b(Bk::Hq), b(Bk::Tok)],
    argv: &[
        Arg::One("now"),
        Arg::One("b"),
        Arg::One("n"),
        Arg::One("uniform"),
        Arg::One("limit"),
        Arg::One("total"),
        Arg::One("limit_format"),
        Arg::One("sold_out_format"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["rid", "record"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["order", "entry"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["user"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["qty"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["limit"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["keep"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["pending"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["queue"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["taken"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["allowance"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["units"],
        },
    ],
    reply: Reply::Codes(&[
        reply::STALE,
        reply::ALL_BOUGHT,
        reply::BOUGHT,
        reply::REPLAY,
        reply::LIMIT,
        reply::SOLD_OUT,
        reply::PENDING,
        reply::WANT_COLUMNS,
        reply::TOKEN,
    ]),
    writes: &[
        Record::Request,
        Record::OrderEntry,
        Record::Stream,
        Record::HoldQueue,
    ],
};

/// `purchase_groups.lua`: several buckets' `purchase` calls in one.
pub(super) const PURCHASE_GROUPS: &Decl = &Decl {
    name: "purchase_groups",
    lua: lua!(purchase_groups),
    keys: &[K::Groups(PURCHASE)],
    more_keys: &[],
    argv: &[
        Arg::One("g"),
        Arg::Each {
            count: "g",
            index: 'i',
            cols: &["keys", "args"],
        },
        Arg::Groups(PURCHASE),
    ],
    reply: Reply::Values,
    writes: PURCHASE.writes,
};

/// `bucket_states.lua`: several buckets' `bucket_state` in one.
pub(super) const BUCKET_STATES: &Decl = &Decl {
    name: "bucket_states",
    lua: lua!(bucket_states),
    keys: &[K::Groups(<ReadBucketState as Step>::DECL)],
    more_keys: &[],
    argv: &[],
    reply: Reply::Values,
    writes: &[],
};

/// `clear_markers.lua`: a saga's probe markers in one bucket, one a pass.
pub(super) const CLEAR_MARKERS: &Decl = &Decl {
    name: "clear_markers",
    lua: lua!(clear_markers),
    keys: &[K::Each("tk")],
    more_keys: &[],
    argv: &[],
    reply: Reply::Number,
    writes: &[],
};

/// This section's steps whose columns repeat: built beside their decoders.
pub(super) const REPEATED: &[&Decl] = &[PURCHASE, PURCHASE_GROUPS, BUCKET_STATES, CLEAR_MARKERS];

impl RedisStore {
    /// `bucket_state.lua`'s keys of a bucket.
    fn state_keys(&self, bucket: &BucketRef) -> Vec<String> {
        self.keys_for(steps::ReadBucketState::DECL, At::Bucket(bucket), false)
    }

    /// `purchase.lua`'s keys of a bucket, in its KEYS order, built once per
    /// bucket: formatting ten key names for every purchase showed up in profiles.
    fn purchase_keys(&self, bucket: &BucketRef) -> Arc<[Key]> {
        let cached = self.purchase_keys.read().expect("key cache poisoned");
        if let Some(keys) = cached.get(bucket) {
            return keys.clone();
        }
        drop(cached);
        let keys: Arc<[Key]> = self
            .keys_for(steps::PURCHASE, At::Bucket(bucket), false)
            .into_iter()
            .map(Key::from)
            .collect();
        let mut cache = self.purchase_keys.write().expect("key cache poisoned");
        cache.insert(bucket.clone(), keys.clone());
        keys
    }

    /// `purchase.lua`'s KEYS and ARGV for a batch on one bucket; `full`:
    /// every column, as a call that is not uniform (the script asked for
    /// them, answering `W`).
    fn purchase_call(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[PurchaseEntry],
        full: bool,
    ) -> (Vec<Key>, Vec<Value>) {
        let mut keys = self.purchase_keys(bucket).to_vec();
        // Events with holds: three keys and a column of arguments more
        // (purchase.lua's hold branch); `token` events the four, and the
        // token column; without either, the call is unchanged.
        let first = entries.first();
        let tokens = first.is_some_and(|e| e.token.is_some());
        if tokens || first.is_some_and(|e| e.pay_by.is_some()) {
            let all = self.keys_for(steps::PURCHASE, At::Bucket(bucket), true);
            let more = if tokens { 4 } else { 3 };
            keys.extend(all.into_iter().skip(keys.len()).take(more).map(Key::from));
        }
        (keys, purchase_args(bucket.index, now_ms, entries, full))
    }

    /// `reply`, or when it is `W` (a uniform call that must go entry by
    /// entry: it carries no pending records, and wrote nothing) the reply of
    /// the call sent again with every column.
    async fn purchase_full_if_asked(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[PurchaseEntry],
        reply: Value,
    ) -> Result<Value, StoreError> {
        let asked = matches!(&reply, Value::Array(v) if v.len() == 1
            && v[0].as_str().as_deref() == Some(reply::WANT_COLUMNS));
        if !asked {
            return Ok(reply);
        }
        let (keys, args) = self.purchase_call(bucket, now_ms, entries, true);
        self.eval_raw(self.scripts.get(steps::PURCHASE), keys, args)
            .await
    }

    /// Decodes `purchase.lua`'s reply to a batch on one bucket (announcing
    /// the bucket's first hold, when the call put it there).
    async fn purchase_replies(
        &self,
        bucket: &BucketRef,
        entries: &[PurchaseEntry],
        reply: Value,
    ) -> Result<Vec<PurchaseReply>, StoreError> {
        let holds = entries.first().is_some_and(|e| e.pay_by.is_some());
        let mut replies = array_or_stale(bucket, reply)?;
        let all_bought =
            replies.first().and_then(Value::as_str).as_deref() == Some(reply::ALL_BOUGHT);
        let values = if all_bought { 2 } else { 2 * entries.len() };
        if holds && replies.len() == values + 1 {
            let first = replies.pop().map(|v| num(&v)).transpose()? == Some(1);
            if first {
                let at = entries.iter().filter_map(|e| e.pay_by).min();
                self.announce_first_hold(bucket, at).await;
            }
        }
        if replies.len() != values {
            return Err(StoreError::Protocol(format!(
                "{} reply values for {} entries",
                replies.len(),
                entries.len()
            )));
        }
        if all_bought {
            // The stock after the last entry: before the first it was that
            // plus every quantity, and each entry takes its own.
            let mut left =
                num(&replies[1])? + entries.iter().map(|e| u64::from(e.qty)).sum::<u64>();
            return Ok(entries
                .iter()
                .map(|e| {
                    left -= u64::from(e.qty);
                    PurchaseReply::Bought { stock_left: left }
                })
                .collect());
        }
        replies
            .chunks(2)
            .map(|pair| {
                let value = &pair[1];
                // Borrowed: a reply code is one letter, not worth a String.
                let code = pair[0]
                    .as_str()
                    .ok_or_else(|| protocol("string", &pair[0]))?;
                Ok(match &*code {
                    reply::BOUGHT => PurchaseReply::Bought {
                        stock_left: num(value)?,
                    },
                    reply::REPLAY => PurchaseReply::Replay(request_record(value)?),
                    reply::LIMIT => PurchaseReply::LimitExceeded { held: num(value)? },
                    reply::PENDING => PurchaseReply::Pending { stock: num(value)? },
                    reply::SOLD_OUT => PurchaseReply::SoldOut {
                        remaining: num(value)?,
                    },
                    reply::TOKEN => PurchaseReply::TokenRefused(
                        TokenRefusal::from_code(&text(value)?)
                            .ok_or_else(|| protocol("a token refusal", value))?,
                    ),
                    other => return Err(unknown("purchase", other)),
                })
            })
            .collect()
    }
}

/// ARGV of `purchase.lua`: a header, then columns of one value per entry in
/// the order the script writes them (its contract says why). The strings
/// the script stores are built here, keeping string and number formatting
/// off the one Redis thread, all of them in one buffer: each value is a
/// slice of it, so a call allocates once for its strings, not twice for
/// each (a profile counted ~96 allocations a purchase over HTTP, 9 of them
/// here).
fn purchase_args(b: u32, now_ms: i64, entries: &[PurchaseEntry], full: bool) -> Vec<Value> {
    use std::fmt::Write;
    let n = entries.len();
    let limit = entries.first().map_or(0, |e| e.limit);
    // A `token` event's call is uniform only if no token comes twice: its
    // fast path checks every token's allowance from one read.
    let tokens = entries.first().is_some_and(|e| e.token.is_some());
    let uniform = !full
        && (!tokens || distinct(entries.iter().filter_map(|e| token_id(e.token.as_ref()))))
        && entries.iter().all(|e| e.keep && e.limit == limit)
        && distinct(entries.iter().map(|e| e.rid.as_str()))
        && (limit == 0 || distinct(entries.iter().map(|e| e.user.as_str())));
    let total: u64 = entries.iter().map(|e| u64::from(e.qty)).sum();
    let holds = entries.first().is_some_and(|e| e.pay_by.is_some());
    // The user and quantity columns, only where the script's fast path reads
    // them (purchase.lua: else it reads them from the index entries).
    let counted = !uniform || limit > 0;
    let columns = 4
        + if counted { 2 } else { 0 }
        + if uniform { 0 } else { 3 }
        + usize::from(holds)
        + if tokens { 3 } else { 0 };
    let refusals = RequestRecord::refusal_formats();
    let mut args: Vec<Value> = Vec::with_capacity(8 + columns * n);
    args.extend([
        Value::Integer(now_ms),
        Value::Integer(i64::from(b)),
        Value::Integer(n as i64),
        Value::Integer(i64::from(uniform)),
        Value::Integer(i64::from(limit)),
        Value::Integer(total as i64),
        Value::Bytes(Bytes::from_static(refusals.limit_exceeded.as_bytes())),
        Value::Bytes(Bytes::from_static(refusals.sold_out.as_bytes())),
    ]);
    // Every string below, with room for the numbers and separators.
    let size: usize = entries
        .iter()
        .map(|e| {
            2 * e.rid.len()
                + 3 * e.order_id.as_str().len()
                + 2 * e.user.as_str().len()
                + 96
                + token_len(e.token.as_ref())
        })
        .sum();
    let mut buf = BytesMut::with_capacity(size);
    // What was written since the last value, as a value of its own.
    fn cut(buf: &mut BytesMut) -> Value {
        Value::Bytes(buf.split().freeze())
    }
    for e in entries {
        buf.extend_from_slice(e.rid.as_bytes());
        args.push(cut(&mut buf));
        RequestRecord::write_bought(&mut buf, e.qty, &e.order_id, b, 0);
        args.push(cut(&mut buf));
    }
    for e in entries {
        buf.extend_from_slice(e.order_id.as_str().as_bytes());
        args.push(cut(&mut buf));
        e.write_index_data(&mut buf, b, now_ms);
        args.push(cut(&mut buf));
    }
    if counted {
        for e in entries {
            buf.extend_from_slice(e.user.as_str().as_bytes());
            args.push(cut(&mut buf));
        }
        args.extend(entries.iter().map(|e| Value::Integer(i64::from(e.qty))));
    }
    if !uniform {
        args.extend(entries.iter().map(|e| Value::Integer(i64::from(e.limit))));
        args.extend(entries.iter().map(|e| Value::Integer(i64::from(e.keep))));
        // The record an entry short here leaves (the script stores it as
        // given: it assembles no record).
        for e in entries {
            let _ = write!(buf, "{}", e.pending(now_ms).encode());
            args.push(cut(&mut buf));
        }
    }
    if holds {
        for e in entries {
            let _ = write!(buf, "{}|{}", e.pay_by.unwrap_or(now_ms), e.order_id);
            args.push(cut(&mut buf));
        }
    }
    if tokens {
        // Each token's taken counter by name, its allowance and the entry's
        // quantity: a refused one's code in the first, allowance 0.
        for e in entries {
            match &e.token {
                Some(TokenUse::Valid { id, allowance }) if *allowance > 0 => {
                    buf.extend_from_slice(b"t:");
                    buf.extend_from_slice(id.as_bytes());
                }
                refused => {
                    let why = match refused {
                        Some(TokenUse::Refused(r)) => *r,
                        // Allowance 0 buys nothing; no token is missing.
                        Some(TokenUse::Valid { .. }) => TokenRefusal::Used,
                        None => TokenRefusal::Missing,
                    };
                    buf.extend_from_slice(b"!");
                    buf.extend_from_slice(why.code().as_bytes());
                }
            }
            args.push(cut(&mut buf));
        }
        args.extend(entries.iter().map(|e| {
            Value::Integer(match &e.token {
                Some(TokenUse::Valid { allowance, .. }) => i64::from(*allowance),
                _ => 0,
            })
        }));
        args.extend(entries.iter().map(|e| Value::Integer(i64::from(e.qty))));
    }
    args
}

/// Room for a token's counter name in the call's buffer.
fn token_len(token: Option<&TokenUse>) -> usize {
    match token {
        Some(TokenUse::Valid { id, .. }) => id.len() + 2,
        _ => 16,
    }
}

/// The id of a token the engine found valid (a refused one is never
/// looked up, so it may come twice).
fn token_id(token: Option<&TokenUse>) -> Option<&str> {
    match token {
        Some(TokenUse::Valid { id, .. }) => Some(id),
        _ => None,
    }
}

/// Whether no value comes twice (batches are short: a sort beats hashing).
fn distinct<'a>(values: impl Iterator<Item = &'a str>) -> bool {
    let mut v: Vec<&str> = values.collect();
    v.sort_unstable();
    v.windows(2).all(|w| w[0] != w[1])
}

/// `take.lua`'s call: the take's marker and its order record, encoded here.
pub(super) fn take_step(bucket: &BucketRef, now_ms: i64, a: &TakeArgs) -> steps::Take {
    let order = a.order_id.to_string();
    steps::Take {
        qty: a.qty,
        taken: ProbeMarker::Taken(order.clone())
            .encode()
            .unwrap_or_default(),
        record: a
            .stream_entry(RecordKind::Order, bucket.index, now_ms)
            .data(),
        order,
        marker: a.marker_ttl_ms.max(1),
        undone: None,
        kept: None,
        confirmed: None,
    }
}

/// `untake.lua`'s call: the take's marker, its undo and the void record.
fn untake_step(bucket: &BucketRef, now_ms: i64, a: &TakeArgs) -> steps::Untake {
    let order = a.order_id.to_string();
    steps::Untake {
        qty: a.qty,
        taken: ProbeMarker::Taken(order.clone())
            .encode()
            .unwrap_or_default(),
        undone: ProbeMarker::Undone(order).encode().unwrap_or_default(),
        record: a
            .stream_entry(RecordKind::Void, bucket.index, now_ms)
            .data(),
        marker: a.marker_ttl_ms.max(1),
    }
}

impl Buckets for RedisStore {
    async fn init_bucket(&self, bucket: &BucketRef, stock: u64) -> Result<(), StoreError> {
        let step = steps::InitBucket {
            units: stock,
            group: FLUSH_GROUP,
        };
        self.run(step, At::Bucket(bucket)).await.map(drop)
    }

    async fn purchase(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[PurchaseEntry],
    ) -> Result<Vec<PurchaseReply>, StoreError> {
        let (keys, args) = self.purchase_call(bucket, now_ms, entries, false);
        let reply = self
            .eval_raw(self.scripts.get(steps::PURCHASE), keys, args)
            .await?;
        let reply = self
            .purchase_full_if_asked(bucket, now_ms, entries, reply)
            .await?;
        // One WAIT for the whole batch (off unless store.min_replicas > 0).
        self.replicated(bucket).await?;
        self.purchase_replies(bucket, entries, reply).await
    }

    async fn purchase_groups(
        &self,
        now_ms: i64,
        groups: &[(BucketRef, Vec<PurchaseEntry>)],
    ) -> Vec<Result<Vec<PurchaseReply>, StoreError>> {
        if !self.groups_buckets() || groups.len() == 1 {
            let calls = groups
                .iter()
                .map(|(bucket, entries)| self.purchase(bucket, now_ms, entries));
            return futures::future::join_all(calls).await;
        }
        // One server holds every bucket: one call, `purchase_groups.lua`.
        // The header (g, then each group's key and argument counts) is
        // filled in as the groups' arguments are appended after it.
        let mut keys = Vec::with_capacity(groups.len() * 10);
        let mut args = vec![Value::Integer(groups.len() as i64); 1 + 2 * groups.len()];
        for (i, (bucket, entries)) in groups.iter().enumerate() {
            let (k, a) = self.purchase_call(bucket, now_ms, entries, false);
            args[1 + 2 * i] = Value::Integer(k.len() as i64);
            args[2 + 2 * i] = Value::Integer(a.len() as i64);
            keys.extend(k);
            args.extend(a);
        }
        let replies = match self
            .eval_raw(self.scripts.get(steps::PURCHASE_GROUPS), keys, args)
            .await
        {
            Ok(Value::Array(replies)) if replies.len() == groups.len() => replies,
            Ok(other) => {
                let e = StoreError::Protocol(format!("{} groups answered {other:?}", groups.len()));
                return groups.iter().map(|_| Err(e.clone())).collect();
            }
            Err(e) => return groups.iter().map(|_| Err(e.clone())).collect(),
        };
        // One server: one WAIT covers every group.
        if let Err(e) = self.replicated(&groups[0].0).await {
            return groups.iter().map(|_| Err(e.clone())).collect();
        }
        let mut out = Vec::with_capacity(groups.len());
        for ((bucket, entries), reply) in groups.iter().zip(replies) {
            // A group that asked for every column is sent again on its own
            // (and waits for its own replicas).
            let asked = matches!(&reply, Value::Array(v) if v.len() == 1
                && v[0].as_str().as_deref() == Some(reply::WANT_COLUMNS));
            let reply = if asked {
                match self
                    .purchase_full_if_asked(bucket, now_ms, entries, reply)
                    .await
                {
                    Ok(reply) => match self.replicated(bucket).await {
                        Ok(()) => reply,
                        Err(e) => {
                            out.push(Err(e));
                            continue;
                        }
                    },
                    Err(e) => {
                        out.push(Err(e));
                        continue;
                    }
                }
            } else {
                reply
            };
            out.push(self.purchase_replies(bucket, entries, reply).await);
        }
        out
    }

    fn groups_buckets(&self) -> bool {
        !self.client.is_clustered()
    }

    async fn server_cpu(&self) -> Option<f64> {
        if !self.groups_buckets() {
            return None;
        }
        let info: String = self
            .client
            .info(Some(fred::types::InfoKind::Cpu))
            .await
            .ok()?;
        cpu_seconds(&info)
    }

    async fn take(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        let marker = bucket.marker_in(&self.namespace, &a.rid, a.pass);
        let at = At::BucketWith(bucket, vec![marker]);
        let reply = self.run(take_step(bucket, now_ms, a), at).await?;
        let parts = array_or_stale(bucket, reply)?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::TAKEN => Ok(TakeReply::Taken {
                order_id: OrderId::from_stored(&text(arg(&parts, 1)?)?),
            }),
            reply::SHORT => Ok(TakeReply::Short {
                available: num(arg(&parts, 1)?)?,
                fresh: num(arg(&parts, 2)?)? == 1,
                adds: num(arg(&parts, 3)?)?,
            }),
            other => Err(unknown("take", other)),
        }
    }

    async fn untake(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &TakeArgs,
    ) -> Result<bool, StoreError> {
        let marker = bucket.marker_in(&self.namespace, &a.rid, a.pass);
        let at = At::BucketWith(bucket, vec![marker]);
        let reply = self.run(untake_step(bucket, now_ms, a), at).await?;
        let parts = array_or_stale(bucket, reply)?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(true),
            reply::NO_TAKE => Ok(false),
            other => Err(unknown("untake", other)),
        }
    }

    async fn finish(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        a: &FinishArgs,
    ) -> Result<FinishReply, StoreError> {
        // outcome: B (bought), S (sold out), A (abort); the order's index
        // entry (B) and the final record (kept ones) encoded here.
        let (outcome, oid, entry, record) = match &a.outcome {
            Finish::Bought {
                order_id,
                bucket: from,
                probes,
            } => {
                let entry = OrderEntry {
                    state: if a.pay_by.is_some() {
                        EntryState::Held
                    } else {
                        EntryState::Confirmed
                    },
                    user: a.user.clone(),
                    qty: a.qty,
                    bucket: *from,
                    request_id: if a.keep { a.rid.clone() } else { String::new() },
                    at_ms: now_ms,
                    pay_by: a.pay_by,
                };
                let record = RequestRecord::encode_bought(a.qty, order_id, *from, *probes);
                ("B", order_id.to_string(), entry.encode(), record)
            }
            Finish::SoldOut { remaining } => {
                let record = RequestRecord::SoldOut {
                    qty: a.qty,
                    remaining: *remaining,
                };
                ("S", String::new(), String::new(), record.encode())
            }
            Finish::Abort => ("A", String::new(), String::new(), String::new()),
        };
        let record = if a.keep { record } else { String::new() };
        // A bought saga of an event with holds is held: finish.lua's hold
        // branch, with the hold's stream record.
        let hold = match (&a.outcome, a.pay_by) {
            (Finish::Bought { bucket: from, .. }, Some(pay_by)) => Some((
                pay_by,
                StreamEntry {
                    id: StreamId::default(),
                    kind: RecordKind::Hold,
                    order_id: a.order_id.to_string(),
                    user: a.user.to_string(),
                    qty: u64::from(a.qty),
                    bucket: *from,
                    home: bucket.index,
                    rid: if a.keep { a.rid.clone() } else { String::new() },
                    at_ms: pay_by,
                    pay_by: None,
                    part: 0,
                }
                .data(),
            )),
            _ => None,
        };
        let step = steps::FinishSaga {
            rid: a.rid.clone(),
            outcome,
            user: a.user.to_string(),
            qty: a.qty,
            order: oid,
            entry,
            record,
            limited: a.limited,
            saga: a.order_id.to_string(),
            pay_by: hold.as_ref().map(|(at, _)| *at),
            hold: hold.as_ref().map(|(_, record)| record.clone()),
        };
        let hold = hold.map(|(at, _)| at);
        // KEYS[6..8] with a hold; KEYS[9] (and so 6..8) for a token event.
        let mut keys = self.keys_for(
            steps::FinishSaga::DECL,
            At::Bucket(bucket),
            hold.is_some() || a.tokens,
        );
        if !a.tokens {
            keys.truncate(8);
        }
        let script = self.scripts.get(steps::FinishSaga::DECL);
        let parts = self.eval_bucket(bucket, script, keys, step.args()).await?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::OK => {
                if parts.get(1).map(num).transpose()? == Some(1) {
                    self.announce_first_hold(bucket, hold).await;
                }
                Ok(FinishReply::Done)
            }
            reply::REPLAY => Ok(FinishReply::Already(request_record(arg(&parts, 1)?)?)),
            reply::NO_RECORD => Ok(FinishReply::NoRecord),
            other => Err(unknown("finish", other)),
        }
    }

    async fn clear_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<u32, StoreError> {
        let markers = (1..=passes)
            .map(|pass| bucket.marker_in(&self.namespace, rid, pass))
            .collect();
        let keys = self.keys_for(steps::CLEAR_MARKERS, At::BucketWith(bucket, markers), false);
        let script = self.scripts.get(steps::CLEAR_MARKERS);
        Ok(num(&self.eval(script, keys, vec![]).await?)? as u32)
    }

    async fn stale_pending(
        &self,
        bucket: &BucketRef,
        before_ms: i64,
        count: u32,
    ) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        let step = steps::StalePending {
            bound: before_ms,
            count,
        };
        let parts = self.run(step, At::Bucket(bucket)).await?.into_array();
        parts
            .chunks(2)
            .map(|pair| match pair {
                [rid, record] => Ok((text(rid)?, request_record(record)?)),
                _ => Err(StoreError::Protocol(
                    "stale_pending reply is cut short".into(),
                )),
            })
            .collect()
    }

    async fn cancel(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<CancelReply, StoreError> {
        let head = CopyHead {
            kind: RecordKind::Cancel,
            bucket: Some(bucket.index),
            home: bucket.index,
            at_ms: now_ms,
        };
        let step = steps::Cancel {
            order: order.to_string(),
            head: head.encode(),
            cancelled: EntryState::Cancelled.tag(),
        };
        let parts = self.run_bucket(bucket, step).await?;
        self.replicated(bucket).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(CancelReply::Cancelled(order_entry(arg(&parts, 1)?)?)),
            reply::ALREADY_CANCELLED => {
                Ok(CancelReply::AlreadyCancelled(order_entry(arg(&parts, 1)?)?))
            }
            reply::NOT_FOUND => Ok(CancelReply::NotFound),
            other => Err(unknown("cancel", other)),
        }
    }

    async fn order_entry(
        &self,
        bucket: &BucketRef,
        order: &OrderId,
    ) -> Result<IndexRead, StoreError> {
        let k = self.keys(bucket);
        // One round trip, the entry first: a bucket unsealed after it was
        // read was current when it was read (sealing is for good).
        let (v, sealed): (Value, u32) = self
            .call(|| async {
                let pipeline = self.client.pipeline();
                let () = pipeline.hget(&k.idx, order.as_str()).await?;
                let () = pipeline.exists(&k.sealed).await?;
                pipeline.all().await
            })
            .await?;
        // What confirms a purchase must be on the replicas too (durability.rs).
        self.replicated(bucket).await?;
        let entry = if v.is_null() {
            None
        } else {
            Some(order_entry(&v)?)
        };
        Ok(IndexRead {
            entry,
            sealed: sealed == 1,
        })
    }

    async fn request_record(
        &self,
        bucket: &BucketRef,
        rid: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let v: Value = self
            .call(|| self.client.hget(self.keys(bucket).reqs, rid))
            .await?;
        self.replicated(bucket).await?;
        if v.is_null() {
            return Ok(None);
        }
        request_record(&v).map(Some)
    }

    async fn user_units(&self, bucket: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        let v: Option<u64> = self
            .call(|| self.client.hget(self.keys(bucket).users, user.as_str()))
            .await?;
        Ok(v.unwrap_or(0))
    }

    async fn counters(&self, bucket: &BucketRef) -> Result<(u64, u64), StoreError> {
        let parts = self
            .run(steps::Counters {}, At::Bucket(bucket))
            .await?
            .into_array();
        Ok((num(arg(&parts, 0)?)?, num(arg(&parts, 1)?)?))
    }

    async fn set_empty(
        &self,
        bucket: &BucketRef,
        epoch: u64,
        ttl_ms: u64,
        left: u64,
    ) -> Result<bool, StoreError> {
        let step = steps::SetEmpty {
            epoch,
            ttl: ttl_ms.max(1),
            mark: EmptyMark { epoch, left }.encode(),
        };
        self.run_flag(step, At::Bucket(bucket)).await
    }

    async fn bump_epoch(&self, bucket: &BucketRef) -> Result<(), StoreError> {
        self.call(|| self.client.incr::<(), _>(self.keys(bucket).epoch))
            .await
    }

    async fn bucket_state(&self, bucket: &BucketRef) -> Result<BucketState, StoreError> {
        let parts = self.run_bucket(bucket, steps::ReadBucketState {}).await?;
        state_of(&parts)
    }

    async fn bucket_states_at_once(
        &self,
        buckets: &[BucketRef],
    ) -> Option<Result<Vec<BucketState>, StoreError>> {
        if !self.groups_buckets() || buckets.len() > STATES_AT_ONCE_MAX {
            return None;
        }
        let keys: Vec<Key> = buckets
            .iter()
            .flat_map(|b| self.state_keys(b))
            .map(Key::from)
            .collect();
        let read = async {
            let replies = match self
                .eval_raw(self.scripts.get(steps::BUCKET_STATES), keys, vec![])
                .await?
            {
                Value::Array(replies) if replies.len() == buckets.len() => replies,
                other => return Err(protocol("one state a bucket", &other)),
            };
            buckets
                .iter()
                .zip(replies)
                .map(|(bucket, reply)| state_of(&array_or_stale(bucket, reply)?))
                .collect()
        };
        Some(read.await)
    }
}

/// The most buckets read in one call: a script holds Redis's one thread
/// while it runs, as long as a purchase call at 32 buckets (0.09 ms at 16,
/// 0.22 at 32, 1.05 at 128, on a loaded machine: 0.50×, 0.59× and 0.79× the
/// Redis time of reading them one call a bucket); more are read one call a
/// bucket.
const STATES_AT_ONCE_MAX: usize = 32;

/// A bucket's state from `bucket_state.lua`'s seven values.
fn state_of(parts: &[Value]) -> Result<BucketState, StoreError> {
    Ok(BucketState {
        stock: num(arg(parts, 0)?)?,
        in_transfer: num(arg(parts, 1)?)?,
        fence: num(arg(parts, 2)?)?,
        adds: num(arg(parts, 3)?)?,
        demand: num(arg(parts, 4)?)?,
        held: num(arg(parts, 5)?)?,
        sealed: num(arg(parts, 6)?)? == 1,
        waiting: num(arg(parts, 7)?)?,
    })
}

/// `used_cpu_user` + `used_cpu_sys` of an `INFO cpu` answer, in seconds.
fn cpu_seconds(info: &str) -> Option<f64> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}

#[cfg(test)]
mod tests {
    use super::cpu_seconds;

    #[test]
    fn cpu_seconds_adds_the_main_process_user_and_system_time() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n\
                    used_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\n\
                    used_cpu_sys_main_thread:1.000000\r\nused_cpu_user_main_thread:2.000000\r\n";
        assert_eq!(cpu_seconds(info), Some(3.75));
        assert_eq!(cpu_seconds("# CPU\r\nused_cpu_sys:1.0\r\n"), None);
        assert_eq!(cpu_seconds("used_cpu_sys:x\nused_cpu_user:1\n"), None);
    }
}
