//! The schedule's clients: a purchase, confirm or cancel as a client of the
//! HTTP API gets its answer, logged with when it was asked and answered.
//!
//! The engine answers a purchase while the event is open and after its
//! window ended (a request id that bought learns its order from the
//! bucket). Once the event closed the engine refuses, and the HTTP layer
//! asks the ledger instead (`http::purchases::from_ledger`); [`Rig::ask_ledger`]
//! does the same here, so late retries are judged by what a client would
//! read: the order, "no order was made" once the ledger marked the event
//! closed, or an unknown outcome while the close is under way. A confirm or
//! cancel the engine answers "no such order" is looked up in the ledger too
//! (`http::orders`): found there, the answer is "the event is closed".

use std::time::Duration;

use shardstock::domain::ids::OrderId;
use shardstock::domain::model::{EventStatus, Order};
use shardstock::engine::{PurchaseOutcome, PurchaseRequest};
use shardstock::store::{Store, StoreError};
use shardstock::{Engine, EngineError};

use super::log::Answer;
use super::rig::Rig;
use super::told::Via;
use crate::harness::faulty::Faulty;

/// Runs `fut`, or drops it after `crash` (a client that went away, a
/// process that died mid-call); `None` when it was dropped.
pub async fn maybe_crash<T>(crash: Option<Duration>, fut: impl Future<Output = T>) -> Option<T> {
    match crash {
        Some(after) => tokio::time::timeout(after, fut).await.ok(),
        None => Some(fut.await),
    }
}

impl<S: Store> Rig<S> {
    /// A purchase as a client of the HTTP API sees it, logged; returns the
    /// answer.
    pub async fn purchase(
        &self,
        engine: &Engine<Faulty<S>>,
        req: &PurchaseRequest,
        crash: Option<Duration>,
    ) -> Answer {
        let sent_ms = self.clock.now_ms();
        let heard = match maybe_crash(crash, Box::pin(engine.purchase(req))).await {
            None => Err(Answer::Unknown("dropped mid-call".into())),
            Some(Ok(out)) if out.replayed => Ok((out, Via::Replay)),
            Some(Ok(out)) => Ok((out, Via::Purchase)),
            Some(Err(e)) => match e {
                EngineError::NotOnSale { why: "closed", .. } | EngineError::UnknownEvent(_) => {
                    self.ask_ledger(req).await.map(|out| (out, Via::Ledger))
                }
                e => Err(Answer::of_error(&e)),
            },
        };
        let answered_ms = self.clock.now_ms();
        let heard = match &heard {
            Ok((out, via)) => Ok((out, *via)),
            Err(answer) => Err(answer.clone()),
        };
        self.log
            .lock()
            .unwrap()
            .answered(req, heard, sent_ms, answered_ms)
    }

    /// What the HTTP layer answers a keyed purchase the engine refused
    /// because the event closed: its order from the ledger, as
    /// `http::purchases::from_ledger` builds it.
    async fn ask_ledger(&self, req: &PurchaseRequest) -> Result<PurchaseOutcome, Answer> {
        let rid = req.request_id.as_ref().expect("every request has an id");
        let unknown = |e: shardstock::ledger::LedgerError| {
            Answer::Unknown(format!("the database did not answer ({e})"))
        };
        let Some(db) = self.ledger.event(&req.event).await.map_err(unknown)? else {
            return Err(Answer::NotOnSale);
        };
        let found = self
            .ledger
            .order_by_request(&req.event, &req.user, rid.as_str())
            .await
            .map_err(unknown)?;
        match found {
            Some(o) if o.quantity != req.quantity => Err(Answer::Unknown(format!(
                "idempotency conflict: {} units asked, the ledger's order has {}",
                req.quantity, o.quantity
            ))),
            // Only a closed ledger's word is final (http::purchases::from_ledger).
            Some(o) if db.closed => Ok(PurchaseOutcome {
                result: Ok(Order::from_view(o)),
                replayed: true,
            }),
            None if db.closed => Err(Answer::NoOrder),
            _ => Err(Answer::Unknown(
                "the event is closing; its orders are not final in the database yet".into(),
            )),
        }
    }

    /// A confirm of `oid`, logged.
    pub async fn confirm(
        &self,
        engine: &Engine<Faulty<S>>,
        oid: &OrderId,
        crash: Option<Duration>,
    ) {
        let sent_ms = self.clock.now_ms();
        let done = match maybe_crash(crash, Box::pin(engine.confirm(oid.as_str()))).await {
            Some(Err(EngineError::UnknownOrder(_))) => {
                Some(self.unknown_order(oid, "confirm").await)
            }
            done => done,
        };
        let answered_ms = self.clock.now_ms();
        self.log
            .lock()
            .unwrap()
            .confirmed(oid, done, sent_ms, answered_ms);
    }

    /// A cancel of `oid`, logged.
    pub async fn cancel(&self, engine: &Engine<Faulty<S>>, oid: &OrderId, crash: Option<Duration>) {
        let sent_ms = self.clock.now_ms();
        let done = match maybe_crash(crash, Box::pin(engine.cancel(oid.as_str()))).await {
            Some(Err(EngineError::UnknownOrder(_))) => {
                Some(self.unknown_order(oid, "cancel").await)
            }
            done => done,
        };
        let answered_ms = self.clock.now_ms();
        self.log
            .lock()
            .unwrap()
            .cancelled(oid, done, sent_ms, answered_ms);
    }

    /// What the HTTP layer answers a confirm or cancel the engine answered
    /// "no such order" (`http::orders`, `closed_or_unknown`): the ledger's
    /// order and the ledger's word that the event closed mean the sale is
    /// over (409); the order without that word, a close under way (503, try
    /// again: nothing changed); no order, 404. Saying "closed" of an event
    /// the store does not have closed is untrue: recorded.
    async fn unknown_order<T>(&self, oid: &OrderId, call: &str) -> Result<T, EngineError> {
        let (id, event, _) = OrderId::parse(oid.as_str()).expect("an order id");
        let unavailable = |e: shardstock::ledger::LedgerError| -> EngineError {
            StoreError::Unavailable(format!("the database did not answer ({e})")).into()
        };
        match self.ledger.order(&id, &event).await {
            Ok(Some(_)) => match self.ledger.event(&event).await {
                Ok(Some(db)) if db.closed => {
                    let status = self.engines[0].store().inner().load_meta(&event).await;
                    if !matches!(&status, Ok(Some(m)) if m.status == EventStatus::Closed) {
                        let status = status.map(|m| m.map(|m| m.status));
                        self.log.lock().unwrap().errors.push((
                            "bought_once",
                            format!(
                                "{call} of {oid}: answered \"event is closed\" while it is {status:?}"
                            ),
                        ));
                    }
                    Err(EngineError::NotOnSale {
                        event,
                        why: "closed",
                        starts_at: None,
                    })
                }
                Ok(_) => Err(StoreError::Stale(format!("{event} is closing")).into()),
                Err(e) => Err(unavailable(e)),
            },
            Ok(None) => Err(EngineError::UnknownOrder(oid.to_string())),
            Err(e) => Err(unavailable(e)),
        }
    }
}
