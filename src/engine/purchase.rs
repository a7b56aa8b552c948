//! Purchases: the one-call fast path.
//!
//! The home step on `home(user)` checks the request id, the per-user limit and
//! the stock, and buys — one store call, batched with the other purchases of
//! that bucket in flight. When the home bucket is short it reserves the user's
//! quota and leaves a pending record, and the saga (`saga.rs`) takes over. A
//! replayed request id answers what its record says, or re-drives its saga; a
//! home step that failed in transit is resolved from what it would have written.
//!
//! Every answer is true: once the home step has applied (a pending saga, a
//! quota reserved), a failure of the store is `OutcomeUnknown`, never "nothing
//! was deducted". `purchase_detached` runs the purchase as its own task, so a
//! caller that goes away (a client disconnect, the request timeout) never
//! abandons a saga half way; one that ends anyway (a crash) is ended by the
//! sweeper (`control::saga_sweeper`).
//!
//! One file on purpose (about 600 lines): the fast path and the saga's
//! entry share the routing, the retry of a stale layout and the answer's
//! shape; apart, each half would need the other's private steps.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::slice;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::FutureExt;
use tracing::Instrument;

#[cfg(feature = "fault-injection")]
use super::CrashPoint;
use super::saga::{Driver, Saga};
use super::{Engine, EngineError};
use crate::domain::ids::{EventId, OrderId, RequestId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventMeta, EventStatus, Order, RequestRecord};
use crate::domain::routing::{home, user_hash};
use crate::domain::token::{self, TokenRefusal, TokenUse};
use crate::store::{PurchaseEntry, PurchaseReply, Store, StoreError};

/// A purchase as the engine receives it (ids already validated).
#[derive(Clone)]
pub struct PurchaseRequest {
    pub event: EventId,
    pub user: UserId,
    pub quantity: u32,
    pub request_id: Option<RequestId>,
    /// The access token (events under the `token` access mode; ignored
    /// under `open`).
    pub access_token: Option<String>,
}

/// Without the access token: a bearer credential, never in a log line.
impl std::fmt::Debug for PurchaseRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurchaseRequest")
            .field("event", &self.event)
            .field("user", &self.user)
            .field("quantity", &self.quantity)
            .field("request_id", &self.request_id)
            .field("access_token", &self.access_token.as_ref().map(|_| "…"))
            .finish()
    }
}

/// Why a purchase was refused: a business answer, not a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    SoldOut {
        remaining: u64,
    },
    LimitExceeded {
        limit: u32,
        held: u64,
    },
    /// A `token` event refused the purchase's token (nothing was bought).
    Token(TokenRefusal),
}

/// The answer to a purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurchaseOutcome {
    pub result: Result<Order, Refusal>,
    /// The request id had been seen before: this answers the original request.
    pub replayed: bool,
}

pub(super) type Answer = Result<Order, Refusal>;

/// Refuses what may not be bought now.
fn check_on_sale(meta: &EventMeta, now: i64) -> Result<(), EngineError> {
    let refused = |why, starts_at| {
        Err(EngineError::NotOnSale {
            event: meta.spec.id.clone(),
            why,
            starts_at,
        })
    };
    match meta.status {
        EventStatus::OnSale | EventStatus::Resharding => {}
        EventStatus::Creating => return refused("being created", None),
        EventStatus::Closed => return refused("closed", None),
    }
    if let Some(opens) = meta.spec.starts_at.filter(|&s| now < s) {
        return refused("not started", Some(opens));
    }
    if meta.spec.ends_at.is_some_and(|e| now >= e) {
        return refused("ended", None);
    }
    Ok(())
}

/// Counts what a `token` event's answer decided of its token
/// (`shardstock_token_checks_total`): `consumed` when it bought (on the fast
/// path, or the saga's finish), else the refusal, where the engine learns it
/// (the home step answers the refusal `verify` found, or `used`). A replay
/// checked no token; a valid token's purchase refused for another reason
/// (sold out, the per-user limit) consumed nothing: neither is counted.
fn count_token_check(out: &PurchaseOutcome) {
    let outcome = match &out.result {
        _ if out.replayed => return,
        Ok(_) => "consumed",
        Err(Refusal::Token(why)) => why.outcome(),
        Err(_) => return,
    };
    crate::metrics::count_token_check(outcome);
}

pub(super) fn order(
    meta: &EventMeta,
    user: &UserId,
    qty: u32,
    order_id: OrderId,
    bucket: u32,
    probes: u32,
) -> Order {
    Order {
        order_id,
        event_id: meta.spec.id.clone(),
        user_id: user.clone(),
        quantity: qty,
        bucket,
        probes,
        status: None,
        pay_by: None,
    }
}

/// After the home step applied, a store failure leaves the outcome unknown;
/// refusals, contention and a layout change keep their meaning (the purchase
/// loop retries a stale layout with the same request id).
fn after_home_of(saga: &Saga, e: EngineError) -> EngineError {
    match e {
        // Without a client request id the purchase loop would start a second
        // saga beside the one a reshard settles: say the outcome is unknown.
        EngineError::Store(StoreError::Stale(why)) if !saga.keep => {
            EngineError::OutcomeUnknown(why)
        }
        EngineError::Store(
            StoreError::Unavailable(why) | StoreError::Moving(why) | StoreError::Protocol(why),
        ) => EngineError::OutcomeUnknown(why),
        EngineError::Mover(m) => EngineError::OutcomeUnknown(m.to_string()),
        other => other,
    }
}

impl<S: Store> Engine<S> {
    /// [`Engine::purchase`], run to its end whatever the caller does: the
    /// caller may go away (its future dropped by a client disconnect or a
    /// timeout) and the purchase still finishes, so no saga is left half way
    /// by a caller. It runs in the caller's task, and becomes a task of its
    /// own only if the caller drops it unfinished ([`Detached`]): a task per
    /// purchase cost every one a spawn, a schedule and a cross-task wake.
    ///
    /// The request comes back with the answer (moved, not copied: a caller
    /// that must look further, as after a close, still has it), unless the
    /// purchase panicked.
    pub async fn purchase_detached(
        self: &Arc<Self>,
        req: PurchaseRequest,
    ) -> (
        Result<PurchaseOutcome, EngineError>,
        Option<PurchaseRequest>,
    ) {
        let engine = self.clone();
        // It keeps the caller's span (the request's, for traces and logs),
        // also when it goes on as a task of its own.
        match Detached::new(
            async move {
                let answer = engine.purchase(&req).await;
                (answer, req)
            }
            .in_current_span(),
        )
        .await
        {
            Ok((answer, req)) => (answer, Some(req)),
            Err(panic) => (
                Err(EngineError::OutcomeUnknown(format!(
                    "the purchase panicked: {}",
                    panic_message(&panic)
                ))),
                None,
            ),
        }
    }

    /// Buys `quantity` units for a user: the fast path when the home bucket
    /// can serve, else the probe saga. Idempotent by request id.
    ///
    /// "Nothing deducted" is said of the request, not of this call: with a
    /// client request id an earlier attempt may have bought, and a failure
    /// before this call read the request's record (the event's meta, a layout
    /// that kept changing) cannot know. Those answer `OutcomeUnknown`, which
    /// a retry with the same id resolves; without a request id they keep
    /// their meaning (nothing was deducted).
    pub async fn purchase(&self, req: &PurchaseRequest) -> Result<PurchaseOutcome, EngineError> {
        let answer = self.with_hold(self.purchase_once(req).await).await;
        if req.request_id.is_none() {
            return answer;
        }
        match answer {
            Err(EngineError::Store(
                StoreError::Unavailable(why) | StoreError::Moving(why) | StoreError::Protocol(why),
            )) => Err(EngineError::OutcomeUnknown(format!(
                "{why} (an earlier attempt with this request id may have bought)"
            ))),
            Err(EngineError::Contention { passes: 0 }) => Err(EngineError::OutcomeUnknown(
                "the event's layout kept changing before the request's record was read".into(),
            )),
            other => other,
        }
    }

    async fn purchase_once(&self, req: &PurchaseRequest) -> Result<PurchaseOutcome, EngineError> {
        let mut meta = self.meta(&req.event).await?;
        let hash = user_hash(&req.user);
        let (rid, keep) = match &req.request_id {
            // Request ids are scoped per user: the same id from two users is two requests.
            Some(r) => ([req.user.as_str(), "/", r.as_str()].concat(), true),
            None => {
                let mut rid = String::with_capacity(17);
                rid.push('~');
                crate::domain::ids::push_hex16(&mut rid, rand::random::<u64>());
                (rid, false)
            }
        };
        let order_id = OrderId::generate(&req.event, hash);
        let mut stale = 0;
        loop {
            if meta.status == EventStatus::Resharding {
                meta = Box::pin(self.after_reshard(&req.event)).await?;
            }
            if let Err(refused) = check_on_sale(&meta, self.clock.now_ms()) {
                return Box::pin(self.after_window(&meta, req, hash, &rid, keep, refused)).await;
            }
            if req.quantity == 0 || req.quantity > meta.spec.max_per_order {
                return Err(EngineError::Invalid {
                    field: "quantity",
                    reason: format!("must be between 1 and {}", meta.spec.max_per_order),
                });
            }
            let saga = Saga {
                home: home(hash, meta.spec.buckets),
                rid: rid.clone(),
                keep,
                limited: meta.spec.per_user_limit.is_some(),
                user: req.user.clone(),
                qty: req.quantity,
                order_id: order_id.clone(),
                started_ms: self.clock.now_ms(),
                marker_ttl_ms: self.opts.marker_ttl.as_millis() as u64,
                pay_by: None,
                tokens: meta.spec.tokens.is_some(),
            }
            .held(&meta);
            // Checked before the home step, with no store read: signature,
            // user, expiry. The home step checks and consumes its allowance
            // (or answers the request id's record, without this check).
            let token = meta.spec.tokens.as_ref().map(|access| {
                token::verify(
                    access,
                    &req.event,
                    &req.user,
                    req.access_token.as_deref(),
                    self.clock.now_ms(),
                )
            });
            match self.attempt(&meta, saga, token).await {
                Err(EngineError::Store(StoreError::Stale(_))) if stale < 3 => {
                    stale += 1;
                    meta = Box::pin(self.after_reshard(&req.event)).await?;
                }
                // The layout kept changing under us (a long reshard): nothing was bought.
                Err(EngineError::Store(StoreError::Stale(_))) => {
                    return Err(EngineError::Contention { passes: 0 });
                }
                other => {
                    if let (Some(_), Ok(out)) = (&meta.spec.tokens, &other) {
                        count_token_check(out);
                    }
                    return other;
                }
            }
        }
    }

    /// A purchase the event refuses now. A retry with the client's request
    /// id whose sale ended since an earlier attempt still learns what that
    /// attempt did: its record, read where it lives, answers (a saga left
    /// pending is driven to its end). Only once the window ended: before it
    /// opens nothing can have been recorded, and after a close the ledger
    /// answers (the HTTP layer asks it).
    async fn after_window(
        &self,
        meta: &EventMeta,
        req: &PurchaseRequest,
        hash: u64,
        rid: &str,
        keep: bool,
        refused: EngineError,
    ) -> Result<PurchaseOutcome, EngineError> {
        if !keep || !matches!(refused, EngineError::NotOnSale { why: "ended", .. }) {
            return Err(refused);
        }
        let home = home(hash, meta.spec.buckets);
        let record = match self
            .store
            .request_record(&Self::bucket(meta, home), rid)
            .await
        {
            Ok(Some(record)) => record,
            Ok(None) | Err(StoreError::Stale(_)) => return Err(refused),
            Err(e) => return Err(e.into()),
        };
        let saga = Saga {
            home,
            rid: rid.to_owned(),
            keep,
            limited: meta.spec.per_user_limit.is_some(),
            user: req.user.clone(),
            qty: req.quantity,
            order_id: OrderId::generate(&req.event, hash),
            started_ms: self.clock.now_ms(),
            marker_ttl_ms: self.opts.marker_ttl.as_millis() as u64,
            pay_by: None,
            tokens: meta.spec.tokens.is_some(),
        };
        self.replay(meta, saga, record).await
    }

    async fn attempt(
        &self,
        meta: &EventMeta,
        saga: Saga,
        token: Option<TokenUse>,
    ) -> Result<PurchaseOutcome, EngineError> {
        let bucket = Self::bucket(meta, saga.home);
        let entry = PurchaseEntry {
            user: saga.user.clone(),
            qty: saga.qty,
            limit: meta.spec.per_user_limit.unwrap_or(0),
            rid: saga.rid.clone(),
            keep: saga.keep,
            order_id: saga.order_id.clone(),
            pay_by: saga.pay_by,
            token,
        };
        let limit = entry.limit;
        let reply = match self
            .home_step(&bucket, meta.spec.buckets, entry)
            .instrument(tracing::debug_span!("home", bucket = saga.home))
            .await
        {
            Ok(reply) => reply,
            // The rare paths are boxed: their state would otherwise make
            // every purchase's future (moved into its box whole) kilobytes larger.
            Err(e @ (StoreError::Unavailable(_) | StoreError::Moving(_))) => {
                return Box::pin(self.resolve(meta, saga, e)).await;
            }
            Err(e) => return Err(e.into()),
        };
        #[cfg(feature = "fault-injection")]
        self.crash_at(CrashPoint::AfterHome)?;
        let fresh = |result| PurchaseOutcome {
            result,
            replayed: false,
        };
        match reply {
            PurchaseReply::Bought { .. } => Ok(fresh(Ok(order(
                meta,
                &saga.user,
                saga.qty,
                saga.order_id,
                saga.home,
                0,
            )
            .held_until(saga.pay_by)))),
            PurchaseReply::LimitExceeded { held } => {
                Ok(fresh(Err(Refusal::LimitExceeded { limit, held })))
            }
            PurchaseReply::Pending { .. } => Box::pin(self.drive(meta, &saga, Driver::First))
                .await
                .map(fresh)
                .map_err(|e| after_home_of(&saga, e)),
            PurchaseReply::SoldOut { remaining } => Ok(fresh(Err(Refusal::SoldOut { remaining }))),
            PurchaseReply::Replay(record) => Box::pin(self.replay(meta, saga, record)).await,
            PurchaseReply::TokenRefused(why) => Ok(fresh(Err(Refusal::Token(why)))),
        }
    }

    /// The home step: through the bucket's batcher, or on its own. `buckets`
    /// is the event's bucket count (the batcher spreads an event of fewer
    /// buckets than its shared lanes over them).
    async fn home_step(
        &self,
        bucket: &BucketRef,
        buckets: u32,
        entry: PurchaseEntry,
    ) -> Result<PurchaseReply, StoreError> {
        match &self.batcher {
            Some(batcher) => {
                batcher
                    .home(bucket, buckets, self.clock.now_ms(), entry)
                    .await
            }
            None => {
                // Boxed: a store call's state (on Redis several kilobytes)
                // would otherwise be part of every purchase's future.
                let replies = Box::pin(self.store.purchase(
                    bucket,
                    self.clock.now_ms(),
                    slice::from_ref(&entry),
                ))
                .await;
                self.activity.wrote(bucket);
                replies?
                    .pop()
                    .ok_or_else(|| StoreError::Protocol("empty home reply".into()))
            }
        }
    }

    /// Answers a request id that has a record: the stored answer, or the
    /// result of re-driving a pending saga.
    async fn replay(
        &self,
        meta: &EventMeta,
        mut saga: Saga,
        record: RequestRecord,
    ) -> Result<PurchaseOutcome, EngineError> {
        if record.qty() != saga.qty {
            return Err(EngineError::IdempotencyConflict(saga.rid));
        }
        let result = match record {
            RequestRecord::Pending {
                order_id, at_ms, ..
            } => {
                saga.order_id = order_id;
                saga.started_ms = at_ms;
                saga.pay_by = meta.spec.pay_by(at_ms);
                self.drive(meta, &saga, Driver::Again)
                    .await
                    .map_err(|e| after_home_of(&saga, e))?
            }
            done => self.answer(meta, &saga, done)?,
        };
        Ok(PurchaseOutcome {
            result,
            replayed: true,
        })
    }

    /// The answer a final record stands for.
    pub(super) fn answer(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        record: RequestRecord,
    ) -> Result<Answer, EngineError> {
        Ok(match record {
            RequestRecord::Bought {
                qty,
                order_id,
                bucket,
                probes,
            } => {
                // This saga's own order: its deadline is known (a fast-path
                // record replayed is another call's: `with_hold` reads it).
                let pay_by = saga.pay_by.filter(|_| order_id == saga.order_id);
                Ok(order(meta, &saga.user, qty, order_id, bucket, probes).held_until(pay_by))
            }
            RequestRecord::LimitExceeded { limit, held, .. } => {
                Err(Refusal::LimitExceeded { limit, held })
            }
            RequestRecord::SoldOut { remaining, .. } => Err(Refusal::SoldOut { remaining }),
            RequestRecord::Pending { .. } => {
                return Err(StoreError::Protocol("finish answered a pending record".into()).into());
            }
        })
    }

    /// The home step failed in transit (`failed`: unavailable, or refused
    /// while slots moved): it may or may not have run. Look at what it would
    /// have written before answering.
    async fn resolve(
        &self,
        meta: &EventMeta,
        saga: Saga,
        failed: StoreError,
    ) -> Result<PurchaseOutcome, EngineError> {
        let bucket = Self::bucket(meta, saga.home);
        for delay_ms in [20, 100, 400] {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            let (entry, record) = match (
                self.store
                    .order_entry(&bucket, &saga.order_id)
                    .await
                    .map(|read| read.entry),
                self.store.request_record(&bucket, &saga.rid).await,
            ) {
                (Ok(entry), Ok(record)) => (entry, record),
                _ => continue,
            };
            return match (entry, record) {
                (Some(e), _) => Ok(PurchaseOutcome {
                    result: Ok(order(meta, &saga.user, e.qty, saga.order_id, e.bucket, 0)
                        .held_until(e.pay_by)),
                    replayed: false,
                }),
                // Another call's pending record with another quantity: as
                // `replay` answers it. Driven with this call's quantity, its
                // finish would count that, not what the home reserved (the
                // per-user count and a token's allowance off by the
                // difference: a one-unit token's saga finished as five).
                (None, Some(record @ RequestRecord::Pending { .. }))
                    if record.qty() != saga.qty =>
                {
                    Err(EngineError::IdempotencyConflict(saga.rid))
                }
                (
                    None,
                    Some(RequestRecord::Pending {
                        order_id, at_ms, ..
                    }),
                ) => {
                    // The pending record may be another call's with this
                    // request id: drive that saga, under its order id. Then
                    // it answers an earlier call (a replay: its hold began
                    // then). It answered as fresh, with a pay-by older than
                    // this call (fault seed 20261641).
                    let replayed = order_id != saga.order_id;
                    let mut saga = saga;
                    saga.order_id = order_id;
                    saga.started_ms = at_ms;
                    saga.pay_by = meta.spec.pay_by(at_ms);
                    Ok(PurchaseOutcome {
                        result: self
                            .drive(meta, &saga, Driver::Again)
                            .await
                            .map_err(|e| after_home_of(&saga, e))?,
                        replayed,
                    })
                }
                // An earlier call's answer with this request id (this call's
                // own order would have its entry): a replay, whose hold the
                // purchase's answer then reads. It answered as a fresh 201
                // without the hold's status and pay-by.
                (None, Some(record)) if saga.keep => Ok(PurchaseOutcome {
                    result: self.answer(meta, &saga, record)?,
                    replayed: true,
                }),
                // Nothing written: the step never ran.
                _ => Err(failed.into()),
            };
        }
        Err(EngineError::OutcomeUnknown(failed.detail().to_owned()))
    }
}

/// A future that is finished even if it is dropped: polled in place, it moves
/// to a task of its own (`tokio::spawn`) when dropped before it completed. A
/// panic inside it is caught and answered, as a task's would be.
struct Detached<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> Detached<T> {
    fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            future: Some(Box::pin(future)),
        }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = Result<T, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(Box::new("polled after it completed")));
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.poll_unpin(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.future = None;
                Poll::Ready(Ok(out))
            }
            Err(panic) => {
                self.future = None;
                Poll::Ready(Err(panic))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let (Some(future), Ok(runtime)) =
            (self.future.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(future);
        }
    }
}

/// What a caught panic said.
fn panic_message(panic: &Box<dyn Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn a_detached_future_dropped_half_way_still_finishes() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let call = Detached::new(async move {
            let _ = wait.await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up while the future waits.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err()
        );
        go.send(()).unwrap();
        for _ in 0..200 {
            if done.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the dropped future never finished");
    }

    /// Every purchase's future is moved into a box of its own
    /// (`purchase_detached`) and copied on the way: the sagas, replays,
    /// resolutions, meta reloads and unbatched store calls it rarely takes
    /// are boxed, so their state is not part of it. It was 3,056 bytes on
    /// the memory store and 6,600 on Redis before (928 on both after, a
    /// debug build).
    #[test]
    fn a_purchase_future_does_not_carry_its_rare_paths() {
        let engine = Engine::new(crate::store::memory::MemoryStore::new(), Default::default());
        let req = PurchaseRequest {
            event: EventId::parse("e").unwrap(),
            user: UserId::parse("u").unwrap(),
            quantity: 1,
            request_id: None,
            access_token: None,
        };
        let size = std::mem::size_of_val(&engine.purchase(&req));
        assert!(size <= 1536, "a purchase's future is {size} bytes");
        // On Redis, measured on the type (no connection needed).
        fn returned<A, B, F: std::future::Future>(_: impl Fn(A, B) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = returned(
            |e: &'static Engine<crate::store::redis::RedisStore>, r: &'static PurchaseRequest| {
                e.purchase(r)
            },
        );
        assert!(size <= 1536, "a purchase's future on Redis is {size} bytes");
    }

    #[test]
    fn every_token_refusal_is_an_outcome_of_the_token_checks_metric() {
        let mut outcomes: Vec<&str> = [
            TokenRefusal::Missing,
            TokenRefusal::Invalid,
            TokenRefusal::OtherUser,
            TokenRefusal::Expired,
            TokenRefusal::Used,
        ]
        .iter()
        .map(|r| r.outcome())
        .collect();
        outcomes.insert(0, "consumed");
        assert_eq!(outcomes, crate::metrics::TOKEN_CHECK_OUTCOMES);
    }

    #[tokio::test]
    async fn a_detached_future_that_panics_answers_the_panic() {
        let call = Detached::new(async { panic!("boom") });
        let panic = call.await.unwrap_err();
        assert_eq!(panic_message(&panic), "boom");
        assert_eq!(Detached::new(async { 7 }).await.unwrap(), 7);
    }
}
