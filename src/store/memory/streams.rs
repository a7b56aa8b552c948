//! The order streams in memory: a queue of entries per bucket, each marked with
//! the consumer it was delivered to and when, like a consumer group's PEL.

use std::time::{Duration, Instant};

use super::{MemoryStore, Slot};
use crate::domain::keys::BucketRef;
use crate::domain::stream::{StreamEntry, StreamId};
use crate::store::{StoreError, Streams};

impl Streams for MemoryStore {
    /// Mirrors `lua/stream_read.lua`.
    async fn stream_read(
        &self,
        b: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: Option<u64>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let now = Instant::now();
        let idle = claim_idle_ms.map(Duration::from_millis);
        self.with(b, |bk| {
            // Claimed first (left pending long enough), then new: like XAUTOCLAIM + XREADGROUP.
            let claimable =
                |s: &Slot| matches!((&s.delivered, idle), (Some((_, at)), Some(idle)) if now.duration_since(*at) >= idle);
            let mut out = Vec::new();
            for pass in [0, 1] {
                for slot in bk.stream.iter_mut() {
                    if out.len() >= count {
                        break;
                    }
                    let take = if pass == 0 {
                        claimable(slot)
                    } else {
                        slot.delivered.is_none()
                    };
                    if take {
                        slot.delivered = Some((consumer.to_owned(), now));
                        out.push(slot.entry.clone());
                    }
                }
            }
            out
        })
    }

    /// Mirrors `lua/stream_ack.lua`.
    async fn stream_ack(&self, b: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            let before = bk.stream.len();
            bk.stream.retain(|s| !ids.contains(&s.entry.id));
            (before - bk.stream.len()) as u64
        })
    }

    async fn stream_len(&self, b: &BucketRef) -> Result<u64, StoreError> {
        // A missing bucket has no stream: length 0, as XLEN answers.
        Ok(self.with(b, |bk| bk.stream.len() as u64).unwrap_or(0))
    }
}
