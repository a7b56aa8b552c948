//! The durability setting: a purchase acknowledged only once its writes are on
//! `min_replicas` replicas (`WAIT`), off by default.
//!
//! Redis replicates asynchronously: a master that dies right after answering a
//! script can take the script's writes with it, and the replica promoted in
//! its place never had them — an order a buyer holds a 201 for, gone, and its
//! unit sold again. With `min_replicas > 0` every step that decides a
//! purchase (the home step — one call per batch, so one `WAIT` per batch —,
//! `take`, `finish`, `cancel`) is followed by `WAIT min_replicas timeout` on
//! the connection that carried it, which returns once that many replicas have
//! acknowledged *every* write sent on the connection before it. Fewer within
//! the timeout: the step fails `Unavailable` — it ran on the master, it may
//! not survive it. The engine then resolves the purchase by reading its
//! records, and those reads (`order_entry`, `request_record`) `WAIT` too, so a
//! purchase is never confirmed from writes the replicas do not have: while
//! they lag the answer is `503 backend-unavailable` with `"outcome":
//! "unknown"`, and a retry with the same request id reports what happened
//! once they catch up.
//!
//! The cost: `WAIT` blocks its connection on the server until the replicas
//! answer, and fred carries all of a process's commands to one node on one
//! connection, so each batch holds the node's other commands back for a
//! replica round trip (README, "Durability": with a local replica, −22 %
//! purchases/s batched, −51 % unbatched).
//! `WAIT` narrows the window, it does not close it in every case: the Redis
//! Cluster specification still lets a failover pick a replica that missed an
//! acknowledged write under a partition, and `WAIT` says nothing about the
//! replicas' disks (`WAITAOF`, Redis 7.2, is not used: the Redis here is 7.0).

use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use super::RedisStore;
use crate::domain::keys::{BucketRef, slot};
use crate::store::StoreError;

/// `min_replicas` replicas within `timeout`, or fail.
#[derive(Debug, Clone, Copy)]
pub(super) struct Durability {
    pub min_replicas: u32,
    pub timeout: Duration,
}

impl RedisStore {
    /// With the setting on, waits until the writes sent so far on the
    /// connection to `bucket`'s node are on `min_replicas` replicas. Off, it
    /// costs nothing (not even the bucket's key).
    pub(super) async fn replicated(&self, bucket: &BucketRef) -> Result<(), StoreError> {
        if self.durability.is_none() {
            return Ok(());
        }
        self.replicated_at(&self.keys(bucket).stock).await
    }

    /// [`RedisStore::replicated`] on the node of `key`'s slot (a release's
    /// home).
    pub(super) async fn replicated_at(&self, key: &str) -> Result<(), StoreError> {
        let Some(d) = self.durability else {
            return Ok(());
        };
        let wait = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot(key)), true);
        let args = vec![
            Value::Integer(i64::from(d.min_replicas)),
            Value::Integer(d.timeout.as_millis() as i64),
        ];
        let acked: i64 = self
            .call(|| self.client.custom(wait.clone(), args.clone()))
            .await?;
        if acked < i64::from(d.min_replicas) {
            return Err(StoreError::Unavailable(format!(
                "the writes reached {acked} of {} replicas within {:?}",
                d.min_replicas, d.timeout
            )));
        }
        Ok(())
    }
}
