//! The order streams in memory: a queue of entries per bucket, each marked with
//! the consumer it was delivered to and when, like a consumer group's PEL.

use std::time::{Duration, Instant};

use super::MemoryStore;
use crate::domain::keys::BucketRef;
use crate::domain::stream::{StreamEntry, StreamId};
use crate::store::{StoreError, Streams};

impl Streams for MemoryStore {
    /// Mirrors `lua/stream_read.lua`. Entries are delivered in order, so the
    /// ones never delivered are the stream's tail.
    async fn stream_read(
        &self,
        b: &BucketRef,
        _consumer: &str,
        count: usize,
        claim_idle_ms: Option<u64>,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        let now = Instant::now();
        let idle = claim_idle_ms.map(Duration::from_millis);
        self.with(b, |bk| {
            let mut out = Vec::new();
            // Claimed first (left pending long enough), then new: like XAUTOCLAIM + XREADGROUP.
            if let Some(idle) = idle {
                for slot in bk.stream.iter_mut() {
                    if out.len() >= count {
                        break;
                    }
                    let pending = !slot.acked
                        && slot
                            .delivered
                            .is_some_and(|at| now.duration_since(at) >= idle);
                    if pending {
                        slot.delivered = Some(now);
                        out.push(slot.entry.clone());
                    }
                }
            }
            let fresh = bk.stream.partition_point(|s| s.delivered.is_some());
            for slot in bk.stream.range_mut(fresh..) {
                if out.len() >= count {
                    break;
                }
                slot.delivered = Some(now);
                out.push(slot.entry.clone());
            }
            out
        })
    }

    /// Mirrors `lua/stream_ack.lua`: the acknowledged entries are marked, and
    /// the head of the stream is dropped up to the first entry a consumer
    /// still needs (pending or never delivered).
    async fn stream_ack(&self, b: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            for id in ids {
                if let Ok(i) = bk.stream.binary_search_by(|s| s.entry.id.cmp(id))
                    && bk.stream[i].delivered.is_some()
                {
                    bk.stream[i].acked = true;
                }
            }
            let before = bk.stream.len();
            while bk.stream.front().is_some_and(|s| s.acked) {
                bk.stream.pop_front();
            }
            (before - bk.stream.len()) as u64
        })
    }

    async fn stream_len(&self, b: &BucketRef) -> Result<u64, StoreError> {
        // A missing bucket has no stream: length 0, as XLEN answers.
        Ok(self.with(b, |bk| bk.stream.len() as u64).unwrap_or(0))
    }
}
