//! Held orders: confirm, expiry, and the hold shown in a purchase's answer.
//!
//! On an event with `hold_seconds` every purchase is a hold: the step that
//! buys it records the deadline in the order's home bucket (see
//! `store::holds`). `confirm` and the sweeper's `expire_due` are single
//! steps on that bucket, each deciding by the deadline it finds, so a race
//! ends one way. Units an expiry puts back void the sold-out marks as a
//! cancel's do (`mover::units_came_back`).

use super::purchase::PurchaseOutcome;
use super::{Engine, EngineError};
use crate::domain::ids::OrderId;
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventStatus, OrderView};
use crate::store::{ConfirmReply, ExpireReply, Store, StoreError};

/// Where a bucket's layout stands for its holds.
enum Layout {
    /// The event's layout: its holds are the ones that count.
    Current,
    /// Being filled by a reshard: its holds are copies until the switch.
    Filling,
    /// A layout the event left (or never had): its holds moved on.
    Left,
}

/// The answer to a confirm that did not confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmRefusal {
    /// The deadline passed: the units went back on sale.
    Expired(OrderView),
    Cancelled(OrderView),
}

/// The answer to a confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmOutcome {
    pub result: Result<OrderView, ConfirmRefusal>,
    /// Nothing changed (confirmed, expired or cancelled before).
    pub already: bool,
}

impl<S: Store> Engine<S> {
    /// Confirms a held order (idempotent). Past its deadline it is expired
    /// here if the sweeper has not done it yet.
    ///
    /// One store call: unlike a cancel it does not read the meta first. A
    /// closed event's buckets are sealed (then gone): `confirm.lua` answers
    /// stale, and a closed event is told apart after the layout reloads.
    pub async fn confirm(&self, raw: &str) -> Result<ConfirmOutcome, EngineError> {
        let confirmed = self
            .on_order_home(raw, |bucket, oid| async move {
                let reply = self.store.confirm(&bucket, self.clock.now_ms(), &oid).await;
                self.activity.wrote(&bucket);
                reply
            })
            .await;
        let (order_id, event, reply) = match confirmed {
            Ok(done) => done,
            // Its home bucket is sealed: the event closed, or a reshard is
            // moving it (then nothing changed, and a retry finds the new
            // layout). It said "no such order" during a long reshard, and
            // the HTTP layer then told a buyer the event was closed.
            Err(EngineError::Store(StoreError::Stale(why))) => {
                if let Ok((_, event, _)) = OrderId::parse(raw)
                    && let Ok(meta) = self.reload(&event).await
                    && meta.status == EventStatus::Closed
                {
                    return Err(EngineError::NotOnSale {
                        event,
                        why: "closed",
                        starts_at: None,
                    });
                }
                return Err(StoreError::Stale(why).into());
            }
            Err(e) => return Err(e),
        };
        let view = |entry| OrderView::new(order_id.clone(), event.clone(), entry);
        Ok(match reply {
            ConfirmReply::Confirmed(e) => ConfirmOutcome {
                result: Ok(view(e)),
                already: false,
            },
            ConfirmReply::AlreadyConfirmed(e) => ConfirmOutcome {
                result: Ok(view(e)),
                already: true,
            },
            ConfirmReply::Cancelled(e) => ConfirmOutcome {
                result: Err(ConfirmRefusal::Cancelled(view(e))),
                already: true,
            },
            ConfirmReply::Expired { entry, now } => {
                if now {
                    let meta = self.meta(&event).await?;
                    crate::engine::mover::units_came_back(&self.store, &event, &meta).await?;
                }
                ConfirmOutcome {
                    result: Err(ConfirmRefusal::Expired(view(entry))),
                    already: !now,
                }
            }
            ConfirmReply::NotFound => return Err(EngineError::UnknownOrder(raw.to_owned())),
        })
    }

    /// Expires up to `count` holds of a home bucket that are due now (the
    /// sweeper); units that came back void the event's sold-out marks.
    ///
    /// Only in the event's current layout: `Ok(None)` while a reshard fills
    /// the bucket's layout (its holds are copies until the switch, and the
    /// old layout's are the ones that count: sealed, they wait), `Stale` for
    /// a layout the event left (its holds moved on). An expiry in a layout
    /// being filled returned a hold's units, and a resumed run restored the
    /// hold and let it expire again.
    pub(crate) async fn expire_due(
        &self,
        bucket: &BucketRef,
        count: u32,
    ) -> Result<Option<ExpireReply>, EngineError> {
        match self.layout_of(bucket).await? {
            Layout::Current => {}
            Layout::Filling => return Ok(None),
            Layout::Left => {
                return Err(StoreError::Stale(format!(
                    "{} is not the event's layout",
                    bucket.name()
                ))
                .into());
            }
        }
        let reply = self
            .store
            .expire_holds(bucket, self.clock.now_ms(), count, false)
            .await;
        self.activity.wrote(bucket);
        let reply = reply?;
        if !reply.expired.is_empty() {
            let meta = self.meta(&bucket.event).await?;
            crate::engine::mover::units_came_back(&self.store, &bucket.event, &meta).await?;
        }
        Ok(Some(reply))
    }

    /// Which layout of its event `bucket` is in: read from the cache, and
    /// again from the store when the cache disagrees (a cache lags, it is
    /// never ahead: a layout the store says is current stays the one that
    /// counts until a reshard seals it, and a sealed bucket refuses).
    async fn layout_of(&self, bucket: &BucketRef) -> Result<Layout, EngineError> {
        let cached = self.meta(&bucket.event).await?;
        let meta = if cached.generation == bucket.generation {
            cached
        } else {
            self.reload(&bucket.event).await?
        };
        Ok(if meta.generation == bucket.generation {
            Layout::Current
        } else if meta.status == EventStatus::Resharding
            && meta.reshard_to.map(|(g, _)| g) == Some(bucket.generation)
        {
            Layout::Filling
        } else {
            Layout::Left
        })
    }

    /// Voids every live hold of a sealed bucket of the event's current layout
    /// (a close): their units go back to the bucket before it turns into
    /// leftover. Returns the units. Never called on another layout: a
    /// reshard's old layout holds copies of holds that moved on (maybe
    /// confirmed since), a layout being filled holds copies of holds that
    /// still count where they were.
    pub async fn void_holds(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        let mut units = 0;
        loop {
            let reply = match self
                .store
                .expire_holds(bucket, self.clock.now_ms(), 512, true)
                .await
            {
                Err(StoreError::Stale(_)) => return Ok(units),
                other => other?,
            };
            self.activity.wrote(bucket);
            units += reply
                .expired
                .iter()
                .map(|(_, e)| u64::from(e.qty))
                .sum::<u64>();
            // Every call takes what it read out of the index and the queue
            // (the queue's entries of confirmed orders expire nothing), so
            // it ends when nothing is left.
            if reply.next.is_none() {
                return Ok(units);
            }
        }
    }

    /// A purchase's answer on an event with holds shows the hold: answers
    /// built from a stored record (a replay) read the order's entry for it.
    pub(super) async fn with_hold(
        &self,
        answer: Result<PurchaseOutcome, EngineError>,
    ) -> Result<PurchaseOutcome, EngineError> {
        // Only a replay can lack the hold (every fresh answer on an event
        // with holds carries it), so other purchases pay nothing here.
        let Ok(PurchaseOutcome {
            result: Ok(order),
            replayed: true,
        }) = &answer
        else {
            return answer;
        };
        if order.pay_by.is_some() {
            return answer;
        }
        match self.meta(&order.event_id).await {
            Ok(meta) if meta.spec.hold_seconds.is_some() => {}
            _ => return answer,
        }
        let Ok(view) = Box::pin(self.order(order.order_id.as_str())).await else {
            return answer;
        };
        let mut answer = answer;
        if let Ok(PurchaseOutcome {
            result: Ok(order), ..
        }) = &mut answer
        {
            order.pay_by = view.pay_by;
            order.status = view.pay_by.map(|_| view.status);
        }
        answer
    }
}
