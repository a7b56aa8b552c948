//! The store: per-bucket atomic steps, and the two backends that provide them.
//!
//! [`Store`] is the whole contract between the engine and a backend. Every method
//! is one atomic step on one slot (one bucket, or one event's meta): a Lua script
//! in `redis`, one critical section under the bucket's mutex in `memory`. The
//! engine composes them (routing, probing, the purchase saga, consolidation) and
//! is written once; the conformance suite in `tests/` runs it on every backend.
//!
//! A bucket that does not exist (sealed by a reshard, retired by a close, lost
//! with a Redis that restarted empty) answers [`StoreError::Stale`]: the caller's
//! view of the event is out of date and it must reload the meta.

pub mod memory;
pub mod redis;

use std::future::Future;

use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{
    BucketState, EventMeta, EventSpec, EventStatus, OrderEntry, RequestRecord,
};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};

pub use memory::MemoryStore;
pub use redis::RedisStore;

/// Failures of one store step.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The bucket does not exist under this layout generation.
    #[error("bucket {0} does not exist (sealed, closed or lost)")]
    Stale(String),
    /// The backend answered something this version does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

/// One purchase in a home step (a batch holds one or more).
#[derive(Debug, Clone)]
pub struct HomeEntry {
    pub user: UserId,
    pub qty: u32,
    /// 0: no per-user limit.
    pub limit: u32,
    /// The request id: the client's, or an internal one (then `keep` is false).
    pub rid: String,
    /// Store the outcome under `rid` for replays (only for client request ids).
    pub keep: bool,
    pub order_id: OrderId,
}

/// The answer of a home step to one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HomeReply {
    /// Bought on the fast path; the order is in the bucket's stream and index.
    Bought { stock_left: u64 },
    /// The request id already has a record.
    Replay(RequestRecord),
    /// Over the per-user limit; `held` is what the user holds already.
    LimitExceeded { held: u64 },
    /// The home bucket holds fewer than `qty`: quota reserved, a pending record written.
    Pending { stock: u64 },
    /// The event was found sold out and no unit has come back since (the
    /// bucket's empty mark holds): refused in this one call.
    SoldOut,
}

/// One probe of the ring by the purchase saga.
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
    pub user: UserId,
    pub qty: u32,
    pub keep: bool,
    /// The event has a per-user limit (only then was a quota reserved).
    pub limited: bool,
    pub outcome: Finish,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReply {
    Cancelled(OrderEntry),
    AlreadyCancelled(OrderEntry),
    NotFound,
}

/// What bumping an event's seq found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqBump {
    pub seq: u64,
    /// The event was marked sold out: the buckets' empty marks must be invalidated.
    pub was_sold_out: bool,
}

/// Whether an event's meta was written by this call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateMeta {
    Created,
    Exists(EventMeta),
}

/// The answer of a fenced transfer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferReply {
    /// Done; for `transfer_out`, the units actually journaled (≤ asked).
    Applied(u64),
    /// Already done before (same transfer id): nothing changed.
    Duplicate(u64),
    /// The bucket has accepted a higher token: this mover is stale.
    Fenced { highest: u64 },
}

/// An open transfer journaled in its source bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransfer {
    pub xid: String,
    pub target: u32,
    pub units: u64,
    pub token: u64,
}

/// The flusher's consumer group on every bucket stream.
pub const FLUSH_GROUP: &str = "flusher";

/// Everything the audit needs from one bucket, read atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketAudit {
    pub stock: u64,
    pub adds: u64,
    pub sealed: bool,
    /// The last id the stream has generated (records after it are newer than this read).
    pub last_id: StreamId,
    /// Open transfers out of this bucket: (xid, target, units).
    pub open: Vec<(String, u32, u64)>,
    /// Transfer ids applied into this bucket.
    pub applied: std::collections::HashSet<String>,
    /// Records still in the stream: (id, kind, qty).
    pub records: Vec<(StreamId, RecordKind, u64)>,
}

/// What a bucket remembers about its users (moved by a reshard).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketContents {
    pub holdings: Vec<(UserId, u64)>,
    pub orders: Vec<(OrderId, OrderEntry)>,
    /// Final records of client request ids (`<user>/<id>`).
    pub records: Vec<(String, RequestRecord)>,
}

/// The per-slot atomic steps every backend provides.
///
/// Futures are `Send` so the engine can run on a multi-threaded runtime.
pub trait Store: Clone + Send + Sync + 'static {
    /// Short name for logs and metrics (`memory`, `redis`).
    fn kind(&self) -> &'static str;

    /// Does the backend answer?
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    // ---- event meta (the event's own slot) ----

    /// Writes the meta with status `creating` unless the event exists.
    fn create_meta(
        &self,
        spec: &EventSpec,
        now_ms: i64,
    ) -> impl Future<Output = Result<CreateMeta, StoreError>> + Send;

    /// Adds the event to the set of known events (`ss:events`); idempotent.
    fn register_event(
        &self,
        event: &EventId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every known event.
    fn list_events(&self) -> impl Future<Output = Result<Vec<EventId>, StoreError>> + Send;

    fn load_meta(
        &self,
        event: &EventId,
    ) -> impl Future<Output = Result<Option<EventMeta>, StoreError>> + Send;

    /// Moves the status from `from` to `to`; false if it was not `from`.
    fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Routes the event to layout `generation` with `buckets` buckets; `retired`
    /// lists older layouts that may still hold records. False without meta.
    fn set_layout(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Increments the event's seq (after units were added to a bucket).
    fn bump_seq(&self, event: &EventId)
    -> impl Future<Output = Result<SeqBump, StoreError>> + Send;

    /// Marks the event sold out at `seq` if its seq is still `seq`.
    fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    // ---- buckets ----

    /// Creates the bucket with `stock` units unless it exists (idempotent).
    fn init_bucket(
        &self,
        bucket: &BucketRef,
        stock: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The fast path: one atomic step per batch, entries applied in order.
    fn home(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[HomeEntry],
    ) -> impl Future<Output = Result<Vec<HomeReply>, StoreError>> + Send;

    fn take(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &TakeArgs,
    ) -> impl Future<Output = Result<TakeReply, StoreError>> + Send;

    /// Undoes this saga's take in `bucket` (a concurrent driver ended the saga
    /// otherwise): units back, a void record in the stream. False if there was no take.
    fn untake(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &TakeArgs,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    fn finish(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &FinishArgs,
    ) -> impl Future<Output = Result<FinishReply, StoreError>> + Send;

    /// Cancels an order in its home bucket: units back on sale there, the user's count down.
    fn cancel(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> impl Future<Output = Result<CancelReply, StoreError>> + Send;

    /// The order's entry in its home bucket's index.
    fn order_entry(
        &self,
        bucket: &BucketRef,
        order: &OrderId,
    ) -> impl Future<Output = Result<Option<OrderEntry>, StoreError>> + Send;

    /// The record stored under a request id in its home bucket.
    fn record(
        &self,
        bucket: &BucketRef,
        rid: &str,
    ) -> impl Future<Output = Result<Option<RequestRecord>, StoreError>> + Send;

    /// Units a user holds (bought and reserved) in their home bucket.
    fn held(
        &self,
        bucket: &BucketRef,
        user: &UserId,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// `(adds, epoch)`: how many steps added units to the bucket, and its epoch
    /// (bumped when units come back to a sold-out event). One atomic read.
    fn counters(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<(u64, u64), StoreError>> + Send;

    /// Marks the bucket's copy of "the event is sold out" if its epoch is still `epoch`.
    fn set_empty(
        &self,
        bucket: &BucketRef,
        epoch: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Bumps the bucket's epoch: its empty mark no longer holds.
    fn bump_epoch(&self, bucket: &BucketRef)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    fn bucket_state(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<BucketState, StoreError>> + Send;

    // ---- the mover: lease and fenced transfers ----

    /// Marks the event as resharding to `(generation, buckets)` (or confirms an
    /// interrupted reshard to the same layout); false otherwise.
    fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Switches to the new layout and back on sale, in one step.
    fn end_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Takes or renews (same owner) the event's rebalancer leadership; returns
    /// the leadership term, or `None` when another instance leads.
    fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes (or renews, for the same owner) the event's mover lease; returns its
    /// fencing token, or `None` when another owner holds it.
    fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Takes the event's mover lease whoever holds it, with a fresh fencing
    /// token (a close wins over background work). The caller must raise every
    /// bucket's fence to the token before it moves anything.
    fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Extends the lease if `owner` still holds it with `token`.
    fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// OUT: journals up to `units` from `bucket` for transfer `xid` to `target`.
    fn transfer_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> impl Future<Output = Result<TransferReply, StoreError>> + Send;

    /// OUT from a sealed bucket: a reshard draining the old layout.
    fn drain_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> impl Future<Output = Result<TransferReply, StoreError>> + Send;

    /// Raises the bucket's fence to `token` (a new leader, before it moves anything).
    fn raise_fence(
        &self,
        bucket: &BucketRef,
        token: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// IN: adds `units` of transfer `xid` to `bucket`, once per `xid`.
    fn transfer_in(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
    ) -> impl Future<Output = Result<TransferReply, StoreError>> + Send;

    /// Clears transfer `xid` from the source's journal.
    fn transfer_clear(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
    ) -> impl Future<Output = Result<TransferReply, StoreError>> + Send;

    fn open_transfers(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<Vec<OpenTransfer>, StoreError>> + Send;

    // ---- the order stream, the end of a bucket ----

    /// Up to `count` records for `consumer` of the flusher group: first those a
    /// consumer left unacknowledged for `claim_idle_ms`, then new ones.
    fn stream_read(
        &self,
        bucket: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: u64,
    ) -> impl Future<Output = Result<Vec<StreamEntry>, StoreError>> + Send;

    /// Acknowledges and deletes records the database has committed.
    fn stream_ack(
        &self,
        bucket: &BucketRef,
        ids: &[StreamId],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Records not yet flushed (and deleted) from the bucket's stream.
    fn stream_len(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Seals the bucket (no more purchases, takes or transfers); returns its stock.
    fn seal(&self, bucket: &BucketRef) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Moves a sealed bucket's stock into a leftover record; `None` if not sealed.
    fn retire(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    fn audit_bucket(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<BucketAudit, StoreError>> + Send;

    /// Pending saga records of the bucket (request id → record).
    fn pending(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<Vec<(String, RequestRecord)>, StoreError>> + Send;

    /// The takes this saga made in the bucket, by pass (read-only; works on a
    /// sealed bucket, where the saga can no longer probe).
    fn take_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> impl Future<Output = Result<Vec<(u32, OrderId)>, StoreError>> + Send;

    /// Writes users' holdings, order index entries and request records into a
    /// bucket being rebuilt (Redis lost its state) or filled by a reshard.
    fn restore(
        &self,
        bucket: &BucketRef,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What a (sealed) bucket remembers about its users: holdings, order index
    /// entries and final records of client request ids.
    fn contents(
        &self,
        bucket: &BucketRef,
    ) -> impl Future<Output = Result<BucketContents, StoreError>> + Send;

    /// Lets every key of the bucket expire after `ttl_ms` (an ended event).
    fn expire_bucket(
        &self,
        bucket: &BucketRef,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
