//! The flusher's side of the order streams: read, acknowledge, measure.
//!
//! The entries themselves ([`StreamEntry`]) are domain types: the ledger reads
//! them too. An entry stays in its stream until the database has committed it,
//! so a stream's length is its bucket's flush lag.

use crate::domain::keys::BucketRef;
use crate::domain::stream::{StreamEntry, StreamId};

/// The flusher's consumer group on every bucket stream.
pub const FLUSH_GROUP: &str = "flusher";

section! {
    /// Steps on a bucket's order stream.
    pub trait Streams => forward_streams {
        /// Up to `count` entries for `consumer` of the flusher group: first, with
        /// `claim_idle_ms`, those a consumer left unacknowledged that long, then
        /// new ones (`lua/stream_read.lua`). Without it only new ones: the claim
        /// scans the stream's pending list, which the flusher needs only now and
        /// then, not on every read.
        fn stream_read(
            bucket: &BucketRef,
            consumer: &str,
            count: usize,
            claim_idle_ms: Option<u64>,
        ) -> Vec<StreamEntry>;

        /// Acknowledges entries the database has committed and drops the head
        /// of the stream no consumer still needs (`lua/stream_ack.lua`): what is
        /// left is every entry pending or not delivered yet, and the acknowledged
        /// ones after the oldest of those. Returns the entries dropped.
        fn stream_ack(bucket: &BucketRef, ids: &[StreamId]) -> u64;

        /// Entries still in the bucket's stream: those not flushed yet, and
        /// flushed ones after the oldest that is not (see `stream_ack`); 0 once
        /// everything is flushed, and for a bucket that does not exist.
        fn stream_len(bucket: &BucketRef) -> u64;
    }
    also {
    }
}
