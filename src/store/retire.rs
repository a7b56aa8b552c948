//! The end of a bucket, and its rebuild: steps for a bucket that stops selling.
//!
//! A close or a reshard seals a layout's buckets (purchases, takes and
//! transfers answer stale; finish, untake and cancel still work, so sagas under
//! way end cleanly), ends the sagas still pending there, moves what the buckets
//! remember about their users into their successors (`contents` → `restore`),
//! turns their leftover stock into a stream entry (`retire`) and lets them
//! expire once flushed. The audit reads a bucket in one step (`audit_bucket`).

use std::collections::HashSet;
use std::future::Future;

use super::StoreError;
use crate::domain::ids::{OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{OrderEntry, RequestRecord};
use crate::domain::stream::{RecordKind, StreamId};

/// Everything the audit needs from one bucket, read atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketAudit {
    pub stock: u64,
    pub adds: u64,
    pub sealed: bool,
    /// The last id the stream has generated (entries after it are newer than this read).
    pub last_id: StreamId,
    /// Open transfers out of this bucket: (xid, target, units).
    pub open: Vec<(String, u32, u64)>,
    /// Transfer ids applied into this bucket.
    pub applied: HashSet<String>,
    /// Entries still in the stream: (id, kind, qty).
    pub entries: Vec<(StreamId, RecordKind, u64)>,
    /// Units in live holds of users homed here (counted in `sold`).
    pub held: u64,
}

/// What a bucket remembers about its users (moved by a reshard).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketContents {
    pub holdings: Vec<(UserId, u64)>,
    pub orders: Vec<(OrderId, OrderEntry)>,
    /// Final records of client request ids (`<user>/<id>`).
    pub records: Vec<(String, RequestRecord)>,
}

/// The answer of [`Retirement::restore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreReply {
    /// Written; the bucket's fence is now at least the writer's token.
    Restored,
    /// The bucket has accepted a higher token (a newer reshard run or a close
    /// took the mover lease): nothing was written.
    Fenced { highest: u64 },
}

/// Steps on a bucket that stops selling, and on the one that takes its place.
pub trait Retirement {
    /// Seals the bucket (no more purchases, takes or transfers); returns its
    /// stock (`lua/seal.lua`).
    fn seal(&self, bucket: &BucketRef) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Moves a sealed bucket's stock into a leftover entry; `None` if not
    /// sealed (`lua/retire.lua`).
    fn retire(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// One atomic read for the conservation audit (`lua/audit_bucket.lua`).
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
    /// bucket being rebuilt (Redis lost its state) or filled by a reshard
    /// (`lua/restore.lua`), fenced like a transfer: a writer whose `token` is
    /// lower than the bucket's fence writes nothing (a rebuild into a fresh
    /// layout passes 0).
    fn restore(
        &self,
        bucket: &BucketRef,
        token: u64,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
    ) -> impl Future<Output = Result<RestoreReply, StoreError>> + Send;

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
