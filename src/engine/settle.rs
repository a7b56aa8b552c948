//! Ending a saga without driving it, and what its end leaves behind.
//!
//! `settle_pending` ends a pending saga from its probe markers alone, never
//! probing: the first take its markers show (by pass, then ring order) is
//! confirmed, every other take of the saga is given back, or, with no take,
//! the saga is aborted. A close or a reshard uses it on sealed buckets, the
//! sweeper (`control::saga_sweeper`) on live ones; `finish` arbitrates, so it ends
//! a saga once whoever else is at it. `clear_markers` deletes a saga's
//! markers once it has ended, except takes that stand (`saga.rs` says why).

use futures::future::try_join_all;

use super::saga::Saga;
use super::{Engine, EngineError};
use crate::domain::model::{EventMeta, RequestRecord};
use crate::domain::routing::ring;
use crate::store::{Finish, FinishReply, Store};

impl<S: Store> Engine<S> {
    /// Deletes the saga's markers in the first `positions` buckets of its ring
    /// (all passes), except takes that stand. Best effort: what a failure
    /// leaves behind expires with the markers' lifetime.
    pub(super) async fn clear_markers(&self, meta: &EventMeta, saga: &Saga, positions: u32) {
        let passes = self.opts.max_passes;
        let cleared = try_join_all(
            ring(saga.home, meta.spec.buckets)
                .take(positions as usize)
                .map(|j| {
                    let bucket = Self::bucket(meta, j);
                    async move { self.store.clear_markers(&bucket, &saga.rid, passes).await }
                }),
        )
        .await;
        if let Err(e) = cleared {
            tracing::debug!(event = %meta.spec.id, error = %e, "probe markers left to expire");
        }
    }

    /// Ends a pending saga from its markers alone, without probing: if it took
    /// units somewhere, the first take (by pass, then ring order) is confirmed
    /// and any other is given back; if it took nothing, it is aborted (the
    /// quota released, the record gone: a retry starts afresh). Works on
    /// sealed buckets, where the saga itself can no longer probe (the end of a
    /// sale, a reshard), and on live ones for the sweeper: a driver still at
    /// work finds the saga ended at its `finish` and gives back what it took.
    /// Idempotent; true when this call ended the saga.
    pub async fn settle_pending(
        &self,
        meta: &EventMeta,
        home: u32,
        rid: &str,
        record: &RequestRecord,
    ) -> Result<bool, EngineError> {
        let RequestRecord::Pending {
            qty,
            order_id,
            user,
            at_ms,
        } = record
        else {
            return Ok(false);
        };
        let saga = Saga {
            home,
            rid: rid.to_owned(),
            keep: !rid.starts_with('~'),
            limited: meta.spec.per_user_limit.is_some(),
            user: user.clone(),
            qty: *qty,
            order_id: order_id.clone(),
            started_ms: *at_ms,
            marker_ttl_ms: self.opts.marker_ttl.as_millis() as u64,
            pay_by: None,
            tokens: meta.spec.tokens.is_some(),
        }
        .held(meta);
        let n = meta.spec.buckets;
        // This saga's takes: (probes, bucket, pass); takes of another order
        // (an aborted saga of the same request id) are its driver's to undo.
        let mut takes = Vec::new();
        for (position, j) in ring(home, n).enumerate() {
            let bucket = Self::bucket(meta, j);
            for (pass, oid) in self
                .store
                .take_markers(&bucket, rid, self.opts.max_passes)
                .await?
            {
                if oid == saga.order_id {
                    takes.push(((pass - 1) * n + position as u32 + 1, j, pass));
                }
            }
        }
        takes.sort();
        let reply = match takes.first() {
            None => self.finish_with(meta, &saga, Finish::Abort).await?,
            Some(&(probes, bucket, _)) => {
                let kept = Finish::Bought {
                    order_id: saga.order_id.clone(),
                    bucket,
                    probes,
                };
                self.finish_with(meta, &saga, kept).await?
            }
        };
        // The take the saga ended with, if any: every other one goes back.
        let stands = match &reply {
            FinishReply::Done => takes.first().map(|&(p, b, _)| (p, b)),
            FinishReply::Already(RequestRecord::Bought {
                order_id,
                bucket,
                probes,
                ..
            }) if *order_id == saga.order_id => Some((*probes, *bucket)),
            _ => None,
        };
        for &(probes, j, pass) in &takes {
            if stands == Some((probes, j)) {
                continue;
            }
            let source = Self::bucket(meta, j);
            let untaken = self
                .store
                .untake(&source, self.clock.now_ms(), &saga.take_args(pass))
                .await;
            self.activity.wrote(&source);
            // Also when the take was undone before: whoever undid it may have
            // died before voiding the sold-out marks.
            untaken?;
            crate::engine::mover::units_came_back(&self.store, &meta.spec.id, meta).await?;
        }
        self.clear_markers(meta, &saga, n).await;
        Ok(reply == FinishReply::Done)
    }
}
