//! The hot path: steps on one bucket that sell, end a saga, cancel, and read.
//!
//! A purchase is `purchase` on the buyer's home bucket (nearly always the only
//! step); when the home bucket is short, the engine's saga probes the ring with
//! `take`, ends at home with `finish`, gives back a take it no longer needs
//! with `untake`, and deletes its probe markers with `clear_markers`. Every
//! step that moves units appends its stream entry and its request record in
//! the same atomic step (see `lua/purchase.lua` for why). A pending saga is
//! listed in its home bucket's `pend` set from the home step to `finish`, and
//! `stale_pending` lists those older than a bound (for the sweeper).

use std::future::Future;

use super::StoreError;
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{BucketState, EntryState, OrderEntry, RequestRecord};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};
use crate::domain::token::{TokenRefusal, TokenUse};

/// One buyer in a `purchase` step (a batch holds one or more).
#[derive(Debug, Clone)]
pub struct PurchaseEntry {
    pub user: UserId,
    pub qty: u32,
    /// 0: no per-user limit.
    pub limit: u32,
    /// The request id: the client's, or an internal one (then `keep` is false).
    pub rid: String,
    /// Store the outcome under `rid` for replays (only for client request ids).
    pub keep: bool,
    pub order_id: OrderId,
    /// Events with holds: the deadline to confirm by (the order is held).
    pub pay_by: Option<i64>,
    /// `token` events: the checked token (its id and allowance), or why it
    /// was refused; `None` for open events, whose step is unchanged. Every
    /// entry of one call has one, or none has (a call is one event's).
    pub token: Option<TokenUse>,
}

impl PurchaseEntry {
    /// The stream entry a purchase in `bucket` (its home) appends; the stream
    /// gives it its id. A held order's carries its deadline (`pay_by`): the
    /// one record says both that units were sold and until when they wait.
    /// Its rid is the client's only (an internal one is not kept: the
    /// ledger has no use for it, and Redis's record is the index entry).
    pub(crate) fn stream_entry(&self, bucket: u32, now_ms: i64) -> StreamEntry {
        StreamEntry {
            id: StreamId::default(),
            kind: RecordKind::Order,
            order_id: self.order_id.to_string(),
            user: self.user.to_string(),
            qty: u64::from(self.qty),
            bucket,
            home: bucket,
            rid: if self.keep {
                self.rid.clone()
            } else {
                String::new()
            },
            at_ms: now_ms,
            pay_by: self.pay_by,
            part: 0,
        }
    }

    /// [`PurchaseEntry::order_entry`] encoded from this entry's strings
    /// without copying them into an [`OrderEntry`] first. On Redis it is
    /// the order's stream record too (`domain::stream`).
    pub fn index_data(&self, bucket: u32, now_ms: i64) -> String {
        let mut s = String::with_capacity(self.user.as_str().len() + self.rid.len() + 40);
        self.write_index_data(&mut s, bucket, now_ms);
        s
    }

    /// [`PurchaseEntry::index_data`], written to `w`.
    pub(crate) fn write_index_data(&self, w: &mut impl std::fmt::Write, bucket: u32, now_ms: i64) {
        OrderEntry::write_parts(
            w,
            if self.pay_by.is_some() {
                EntryState::Held
            } else {
                EntryState::Confirmed
            },
            self.user.as_str(),
            self.qty,
            bucket,
            if self.keep { &self.rid } else { "" },
            now_ms,
            self.pay_by,
        )
    }

    /// The order's entry in its home bucket's index.
    pub fn order_entry(&self, bucket: u32, now_ms: i64) -> OrderEntry {
        OrderEntry {
            state: if self.pay_by.is_some() {
                EntryState::Held
            } else {
                EntryState::Confirmed
            },
            user: self.user.clone(),
            qty: self.qty,
            bucket,
            request_id: if self.keep {
                self.rid.clone()
            } else {
                String::new()
            },
            at_ms: now_ms,
            pay_by: self.pay_by,
        }
    }

    /// The record kept under `rid` when the purchase buys on the fast path.
    pub fn bought(&self, bucket: u32) -> RequestRecord {
        RequestRecord::Bought {
            qty: self.qty,
            order_id: self.order_id.clone(),
            bucket,
            probes: 0,
        }
    }

    /// The record left under `rid` when the home bucket is short.
    pub fn pending(&self, now_ms: i64) -> RequestRecord {
        RequestRecord::Pending {
            qty: self.qty,
            order_id: self.order_id.clone(),
            user: self.user.clone(),
            at_ms: now_ms,
        }
    }
}

/// The answer of a `purchase` step to one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseReply {
    /// Bought on the fast path; the order is in the bucket's stream and index.
    Bought { stock_left: u64 },
    /// The request id already has a record.
    Replay(RequestRecord),
    /// Over the per-user limit; `held` is what the user holds already.
    LimitExceeded { held: u64 },
    /// The home bucket holds fewer than `qty`: quota reserved, a pending record written.
    Pending { stock: u64 },
    /// The event was found to hold fewer units than asked (at most
    /// `remaining`) and no unit has come back since (the bucket's empty mark
    /// holds): refused in this one call.
    SoldOut { remaining: u64 },
    /// `token` events: the token was refused (a fresh request id only: a
    /// known one replays). Nothing was written.
    TokenRefused(TokenRefusal),
}

/// One probe of the ring by the purchase saga (`take`), or its undo (`untake`).
#[derive(Debug, Clone)]
pub struct TakeArgs {
    pub rid: String,
    /// Probe pass (1-based): each bucket decides once per (rid, pass), so a
    /// re-driven saga makes the same decisions and never takes twice.
    pub pass: u32,
    pub user: UserId,
    pub qty: u32,
    pub order_id: OrderId,
    pub home: u32,
    /// Lifetime of the probe marker this step writes (PX): a marker outlives
    /// its saga only until then, even when no driver was left to delete it.
    pub marker_ttl_ms: u64,
    /// A held release order's line: the order's deadline, carried by the
    /// take's record (so the ledger shows the line held until its confirm
    /// or expiry record). `None` everywhere else.
    pub pay_by: Option<i64>,
    /// A held release order's line: its take marker is written without a
    /// lifetime, so it stands until the line's confirm (`K`) or give-back
    /// (`U`) replaces it with one, however long every sweeper was away
    /// (docs/DESIGN.md, "Holds on a release order": markers). Short
    /// decisions keep `marker_ttl_ms`. `false` everywhere else.
    pub keep_taken: bool,
}

impl TakeArgs {
    /// The record a take (`Order`) or its undo (`Void`) in `bucket` appends
    /// to that bucket's stream: the same fields, as `take.lua` and
    /// `untake.lua` store them (the memory store keeps this value).
    pub fn stream_entry(&self, kind: RecordKind, bucket: u32, now_ms: i64) -> StreamEntry {
        StreamEntry {
            id: StreamId::default(),
            kind,
            order_id: self.order_id.to_string(),
            user: self.user.to_string(),
            qty: u64::from(self.qty),
            bucket,
            home: self.home,
            rid: self.rid.clone(),
            at_ms: now_ms,
            pay_by: self.pay_by.filter(|_| kind == RecordKind::Order),
            part: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeReply {
    /// Units taken here (now or by an earlier driver of the same saga) for this order.
    Taken { order_id: OrderId },
    /// Not enough here; `available` counts stock plus units journaled out by
    /// open transfers; `adds` is the bucket's addition count when that was
    /// decided; `fresh`: decided by this call (false: an earlier driver's
    /// decision, replayed).
    Short {
        available: u64,
        fresh: bool,
        adds: u64,
    },
}

/// How a saga ends at the home bucket.
#[derive(Debug, Clone)]
pub enum Finish {
    Bought {
        order_id: OrderId,
        bucket: u32,
        probes: u32,
    },
    /// Release the quota; answer sold out with `remaining` units seen.
    SoldOut { remaining: u64 },
    /// Release the quota and forget the request: nothing was bought, a retry starts afresh.
    Abort,
}

#[derive(Debug, Clone)]
pub struct FinishArgs {
    pub rid: String,
    /// The saga's order id (that of its pending record): `finish` ends only
    /// that saga, never a later one that reused the request id after an abort.
    pub order_id: OrderId,
    pub user: UserId,
    pub qty: u32,
    pub keep: bool,
    /// The event has a per-user limit (only then was a quota reserved).
    pub limited: bool,
    pub outcome: Finish,
    /// Events with holds: a `Bought` saga's order is held until then.
    pub pay_by: Option<i64>,
    /// A `token` event: the saga's token reservation at the home (if its
    /// home step made one) becomes consumption with a bought order, or is
    /// given back with sold out and abort, in the same step.
    pub tokens: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReply {
    /// This call ended the saga.
    Done,
    /// The saga had already ended (a concurrent driver): this is its record.
    Already(RequestRecord),
    /// No record for this request id (nothing pending).
    NoRecord,
}

/// An order's entry read from its home bucket, and whether that bucket was
/// sealed when read. A sealed bucket's index is final for its layout: right
/// for a closed event or one whose reshard is moving that layout, stale once
/// a newer layout took over (the reader's cached layout is old).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRead {
    pub entry: Option<OrderEntry>,
    pub sealed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReply {
    Cancelled(OrderEntry),
    AlreadyCancelled(OrderEntry),
    NotFound,
}

/// [`Buckets::purchase_groups`] as one `purchase` a group, one after another:
/// for stores that have no calls to save, or that must see every step (the
/// tests' fault-injecting store).
pub async fn purchase_each<B: Buckets + Sync + ?Sized>(
    store: &B,
    now_ms: i64,
    groups: &[(BucketRef, Vec<PurchaseEntry>)],
) -> Vec<Result<Vec<PurchaseReply>, StoreError>> {
    let mut out = Vec::with_capacity(groups.len());
    for (bucket, entries) in groups {
        out.push(store.purchase(bucket, now_ms, entries).await);
    }
    out
}

section! {
    /// Steps on one bucket: selling, the saga, cancels, reads.
    pub trait Buckets => forward_buckets {
        /// Creates the bucket with `stock` units unless it exists (idempotent)
        /// (`lua/init_bucket.lua`).
        fn init_bucket(bucket: &BucketRef, stock: u64) -> ();

        /// The fast path: one atomic step per batch, entries applied in order
        /// (`lua/purchase.lua`).
        fn purchase(
            bucket: &BucketRef,
            now_ms: i64,
            entries: &[PurchaseEntry],
        ) -> Vec<PurchaseReply>;

        /// One probe of the ring (`lua/take.lua`).
        fn take(bucket: &BucketRef, now_ms: i64, args: &TakeArgs) -> TakeReply;

        /// Undoes this saga's take in `bucket` (a concurrent driver ended the saga
        /// otherwise): units back, a void entry in the stream. False if there was
        /// no take (`lua/untake.lua`).
        fn untake(bucket: &BucketRef, now_ms: i64, args: &TakeArgs) -> bool;

        /// Ends a saga at its home bucket, and takes it off the bucket's pending
        /// set (`lua/finish.lua`). A pending record of another order under the same
        /// request id answers `NoRecord`.
        fn finish(bucket: &BucketRef, now_ms: i64, args: &FinishArgs) -> FinishReply;

        /// Deletes the probe markers of saga `rid` (passes `1..=passes`) in the
        /// bucket, except the mark of a take that stands ("T|oid": it decides the
        /// saga's units and a late driver must find it). Returns how many went
        /// (`lua/clear_markers.lua`). Works on sealed buckets.
        fn clear_markers(bucket: &BucketRef, rid: &str, passes: u32) -> u32;

        /// Sagas pending at this home bucket since `before_ms` or earlier, at most
        /// `count`, with their records; entries whose record is no longer
        /// pending are dropped from the set on the way (`lua/stale_pending.lua`).
        fn stale_pending(
            bucket: &BucketRef,
            before_ms: i64,
            count: u32,
        ) -> Vec<(String, RequestRecord)>;

        /// Cancels an order in its home bucket: units back on sale there, the
        /// user's count down (`lua/cancel.lua`).
        fn cancel(bucket: &BucketRef, now_ms: i64, order: &OrderId) -> CancelReply;

        /// The order's entry in its home bucket's index, and whether the bucket
        /// was sealed (read after the entry: unsealed then means current then).
        fn order_entry(bucket: &BucketRef, order: &OrderId) -> IndexRead;

        /// The record stored under a request id in its home bucket.
        fn request_record(bucket: &BucketRef, rid: &str) -> Option<RequestRecord>;

        /// Units a user holds (bought and reserved) in their home bucket.
        fn user_units(bucket: &BucketRef, user: &UserId) -> u64;

        /// `(adds, epoch)`: how many steps added units to the bucket, and its epoch
        /// (bumped when units come back to a sold-out event). One atomic read
        /// (`lua/counters.lua`).
        fn counters(bucket: &BucketRef) -> (u64, u64);

        /// Marks the bucket's copy of "the event holds at most `left` units"
        /// (orders of more are sold out) for `ttl_ms` if its epoch is still
        /// `epoch` (`lua/set_empty.lua`).
        fn set_empty(bucket: &BucketRef, epoch: u64, ttl_ms: u64, left: u64) -> bool;

        /// Bumps the bucket's epoch: its empty mark no longer holds.
        fn bump_epoch(bucket: &BucketRef) -> ();

        /// Stock, journaled units, fence, adds, demand and held units in one read
        /// (`lua/bucket_state.lua`).
        fn bucket_state(bucket: &BucketRef) -> BucketState;
    }
    also {
        /// Home steps on several buckets at once: each group exactly as
        /// [`Buckets::purchase`] of its entries, one result a group, in order.
        /// Where [`Buckets::groups_buckets`] says so the groups go in one atomic
        /// call (one Redis server: `lua/purchase_groups.lua`); else one call each.
        fn purchase_groups(
            &self,
            now_ms: i64,
            groups: &[(BucketRef, Vec<PurchaseEntry>)],
        ) -> impl Future<Output = Vec<Result<Vec<PurchaseReply>, StoreError>>> + Send;

        /// Whether [`Buckets::purchase_groups`] serves several buckets in one
        /// call, so that the engine's batcher gains by letting buckets share a
        /// lane (a standalone Redis: yes; a Cluster, where each bucket has a slot
        /// of its own, and the memory store, which has no calls to save: no).
        fn groups_buckets(&self) -> bool;

        /// CPU seconds the one server behind a grouping store has used since it
        /// started (Redis's `INFO cpu`: `used_cpu_user` + `used_cpu_sys`), so
        /// the batcher can tell whether that server is the sale's limit; `None`
        /// where no one server serves every bucket, or when it does not answer.
        fn server_cpu(&self) -> impl Future<Output = Option<f64>> + Send {
            async { None }
        }

        /// Every saga pending at this home bucket, oldest first: its pend index
        /// with no bound ([`Buckets::stale_pending`]; a pending record and its
        /// index entry are written together, and the entry leaves only once the
        /// record is no longer pending). A reshard and a close read them after
        /// sealing the bucket, while the event's purchases wait: the index holds
        /// the few sagas in flight, where the request records are one a buyer.
        fn pending(
            &self,
            bucket: &BucketRef,
        ) -> impl Future<Output = Result<Vec<(String, RequestRecord)>, StoreError>> + Send {
            self.stale_pending(bucket, i64::MAX, u32::MAX)
        }

        /// Every one of `buckets`' states in one atomic read, in order, where
        /// one server holds them all ([`Buckets::groups_buckets`]: a standalone
        /// Redis, `lua/bucket_states.lua`, up to 32 buckets); `None` elsewhere,
        /// where the engine reads them one at a time and checks what moved
        /// between its reads.
        fn bucket_states_at_once(
            &self,
            buckets: &[BucketRef],
        ) -> impl Future<Output = Option<Result<Vec<BucketState>, StoreError>>> + Send {
            let _ = buckets;
            async { None }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::EventId;

    #[test]
    fn the_hot_paths_encodings_are_the_entries() {
        let event = EventId::parse("e1").unwrap();
        for (keep, pay_by) in [(true, None), (false, Some(9_000)), (true, Some(9_000))] {
            let e = PurchaseEntry {
                user: UserId::parse("u-1").unwrap(),
                qty: 2,
                limit: 0,
                rid: if keep { "u-1/r".into() } else { "~0a".into() },
                keep,
                order_id: OrderId::generate(&event, 7),
                pay_by,
                token: None,
            };
            // What Redis's stream holds for the order is what the memory
            // store keeps.
            assert_eq!(
                StreamEntry::from_order(
                    StreamId::default(),
                    0,
                    e.order_id.as_str(),
                    &e.index_data(3, 5)
                ),
                Some(e.stream_entry(3, 5))
            );
            assert_eq!(e.index_data(3, 5), e.order_entry(3, 5).encode());
            assert_eq!(
                RequestRecord::encode_bought(e.qty, &e.order_id, 3, 0),
                e.bought(3).encode()
            );
        }
    }
}
