//! Orders after the sale: lookup and cancel, in the order's home bucket, and
//! the stored answer of a client's request id.
//!
//! An order id carries its user's routing hash, so its home bucket is known
//! under any bucket count. A cancel puts the units back on sale in that home
//! bucket and lowers the user's count in one step, then bumps the event's seq
//! (units appeared: any sold-out decision spanning the cancel must re-probe).

use std::time::Duration;

use super::purchase::PurchaseOutcome;
use super::saga::Saga;
use super::{Engine, EngineError, Lease};
use crate::domain::ids::{EventId, OrderId, RequestId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventMeta, EventStatus, OrderStatus, OrderView, RequestRecord};
use crate::domain::routing::{home, user_hash};
use crate::store::{CancelReply, Store, StoreError};

/// The answer to a cancel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelOutcome {
    pub order: OrderView,
    /// It had been cancelled before: nothing changed.
    pub already: bool,
}

impl<S: Store> Engine<S> {
    fn order_home(meta: &EventMeta, user_hash: u64) -> BucketRef {
        Self::bucket(meta, home(user_hash, meta.spec.buckets))
    }

    /// Runs `step` on the order's home bucket, reloading the layout once if stale.
    pub(super) async fn on_order_home<T, F, Fut>(
        &self,
        raw: &str,
        step: F,
    ) -> Result<(OrderId, EventId, T), EngineError>
    where
        F: Fn(BucketRef, OrderId) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let (order_id, event, hash) =
            OrderId::parse(raw).map_err(|_| EngineError::UnknownOrder(raw.to_owned()))?;
        let mut meta = match self.meta(&event).await {
            Err(EngineError::UnknownEvent(_)) => {
                return Err(EngineError::UnknownOrder(raw.to_owned()));
            }
            other => other?,
        };
        for attempt in 0..3 {
            match step(Self::order_home(&meta, hash), order_id.clone()).await {
                Ok(v) => return Ok((order_id, event, v)),
                Err(StoreError::Stale(_)) if attempt < 2 => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    meta = self.after_reshard(&event).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(EngineError::UnknownOrder(raw.to_owned()))
    }

    /// What a client's request id was answered in a live event, read without
    /// acting on it: the order as it is now (a replay), a refusal, or `None`
    /// (no record: never sent, or sent without an id). A purchase still under
    /// way is `OutcomeUnknown`; a closed event is `NotOnSale` (its buckets
    /// are sealed: the ledger answers). Request ids are the user's own, so
    /// another user's id finds nothing.
    pub(crate) async fn request_answer(
        &self,
        event: &EventId,
        user: &UserId,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseOutcome>, EngineError> {
        let mut meta = self.meta(event).await?;
        let hash = user_hash(user);
        let rid = [user.as_str(), "/", request_id.as_str()].concat();
        for attempt in 0..3 {
            if meta.status == EventStatus::Closed {
                return Err(EngineError::NotOnSale {
                    event: event.clone(),
                    why: "closed",
                    starts_at: None,
                });
            }
            let bucket = Self::order_home(&meta, hash);
            let record = match self.store.request_record(&bucket, &rid).await {
                Ok(record) => record,
                Err(StoreError::Stale(_)) if attempt < 2 => {
                    meta = self.after_reshard(event).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let record = match record {
                None => return Ok(None),
                Some(RequestRecord::Pending { .. }) => {
                    return Err(EngineError::OutcomeUnknown(
                        "the purchase is under way".into(),
                    ));
                }
                Some(record) => record,
            };
            let saga = Saga {
                home: home(hash, meta.spec.buckets),
                rid,
                keep: true,
                limited: meta.spec.per_user_limit.is_some(),
                user: user.clone(),
                qty: record.qty(),
                order_id: OrderId::generate(event, hash),
                started_ms: self.clock.now_ms(),
                marker_ttl_ms: self.opts.marker_ttl.as_millis() as u64,
                pay_by: None,
                tokens: meta.spec.tokens.is_some(),
            };
            let mut answer = self.answer(&meta, &saga, record)?;
            // The order as it is now: held, confirmed, cancelled or expired.
            if let Ok(order) = &mut answer
                && let Ok(view) = self.order(order.order_id.as_str()).await
            {
                order.pay_by = view.pay_by;
                order.status = Some(view.status)
                    .filter(|s| view.pay_by.is_some() || *s != OrderStatus::Confirmed);
            }
            return Ok(Some(PurchaseOutcome {
                result: answer,
                replayed: true,
            }));
        }
        Err(EngineError::Contention { passes: 0 })
    }

    /// The order as its home bucket knows it (orders of a live event).
    pub async fn order(&self, raw: &str) -> Result<OrderView, EngineError> {
        let (order_id, event, entry) = self
            .on_order_home(raw, |bucket, oid| async move {
                let read = self.store.order_entry(&bucket, &oid).await?;
                // A sealed bucket of a layout the event has left shows the
                // order as the reshard found it, not as it is now: an
                // instance that missed the reshard answered `held` after a
                // confirm or a cancel in the new layout (fault seed
                // 20261930). Sealed buckets are rare (a close, a reshard):
                // only then is the layout read again.
                if read.sealed {
                    let now = self.store.load_meta(&bucket.event).await?;
                    if now.is_none_or(|m| m.generation != bucket.generation) {
                        return Err(StoreError::Stale(bucket.tag()));
                    }
                }
                Ok(read.entry)
            })
            .await?;
        let entry = entry.ok_or_else(|| EngineError::UnknownOrder(raw.to_owned()))?;
        Ok(OrderView::new(order_id, event, entry))
    }

    /// Cancels an order: its units go back on sale, the user's count drops.
    /// Cancelling twice changes nothing.
    pub async fn cancel(&self, raw: &str) -> Result<CancelOutcome, EngineError> {
        let (order_id, event, reply) = self
            .on_order_home(raw, |bucket, oid| async move {
                if let Some(meta) = self.store.load_meta(&bucket.event).await?
                    && meta.status == EventStatus::Closed
                {
                    return Ok(None);
                }
                let cancelled = self.store.cancel(&bucket, self.clock.now_ms(), &oid).await;
                self.activity.wrote(&bucket);
                cancelled.map(Some)
            })
            .await?;
        let Some(reply) = reply else {
            return Err(EngineError::NotOnSale {
                event,
                why: "closed",
                starts_at: None,
            });
        };
        let (entry, already) = match reply {
            CancelReply::Cancelled(entry) => (entry, false),
            CancelReply::AlreadyCancelled(entry) => (entry, true),
            CancelReply::NotFound => return Err(EngineError::UnknownOrder(raw.to_owned())),
        };
        // A repeated cancel runs this too: the first may have failed or died
        // after putting the units back and before voiding the sold-out marks,
        // and its retry is what finishes that (an extra seq bump costs one
        // call and at most one more probe of the ring).
        let meta = self.meta(&event).await?;
        crate::engine::mover::units_came_back(&self.store, &event, &meta).await?;
        let mut order = OrderView::new(order_id, event, entry);
        // An expired hold stays expired; anything else is cancelled now.
        if !already || order.status != OrderStatus::Expired {
            order.status = OrderStatus::Cancelled;
        }
        Ok(CancelOutcome { order, already })
    }

    /// Takes the event's mover lease for one saga, waiting a little if another
    /// mover holds it. `None` when it stayed busy.
    pub(super) async fn mover_lease(&self, meta: &EventMeta) -> Result<Option<Lease>, EngineError> {
        let owner = Lease::owner(&self.instance, "saga");
        Ok(Lease::wait(
            &self.store,
            &meta.spec.id,
            &owner,
            self.opts.gather_lease_ttl,
            self.opts.gather_wait,
        )
        .await?)
    }
}
