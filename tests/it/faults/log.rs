//! What a schedule was told: every answer to every request id, when its
//! call was made, and every answer about each order (`told`).
//!
//! Answers to purchases are classified by what they claim about the
//! request: bought, refused (final), refused for its token (not kept under
//! the request id: a retry with the same id may buy once its allowance
//! came back), "nothing deducted", not on sale, no order (after the close,
//! from the ledger), or unknown. Answers about an
//! order — the status its 201 showed, confirms, cancels — make its story.

use std::collections::{BTreeMap, HashMap};

use shardstock::EngineError;
use shardstock::domain::ids::OrderId;
use shardstock::domain::model::{Order, OrderStatus};
use shardstock::domain::token::TokenRefusal;
use shardstock::engine::{
    CancelOutcome, ConfirmOutcome, ConfirmRefusal, PurchaseOutcome, PurchaseRequest, Refusal,
};
use shardstock::store::StoreError;

use super::offers::OfferLog;
use super::plan::Carry;
use super::tokens::Rotation;
use super::told::{Call, Story, Told, Via};

/// What one answer to a purchase says about the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 201: this order.
    Bought(OrderId, u32),
    /// A final refusal (sold out, over the limit): nothing deducted.
    Refused(String),
    /// The request's token was refused (`Refusal::Token`): this call made
    /// no order, and no earlier one did (a replay answers its record before
    /// any token check). Not final: the store keeps no record of it, so a
    /// retry may buy (an allowance a sold-out saga gave back), or be
    /// refused for another reason (the token expired since).
    TokenRefused(TokenRefusal),
    /// An error that says nothing was deducted: 503 without `outcome`, or
    /// `Contention` ("nothing was bought, retry").
    NothingDeducted(String),
    /// The event is not on sale (its window ended, or it closed and the
    /// ledger cannot tell yet): says nothing about the request.
    NotOnSale,
    /// After the close, the ledger's answer to a retry: this request made no
    /// order (the HTTP layer's 409 "no order was made for request id").
    NoOrder,
    /// `OutcomeUnknown`, a dropped call, or an unexpected error.
    Unknown(String),
}

impl Answer {
    /// What a purchase's outcome (an order or a refusal) says.
    pub fn of(out: &PurchaseOutcome) -> Self {
        match &out.result {
            Ok(order) => Self::Bought(order.order_id.clone(), order.quantity),
            Err(Refusal::SoldOut { .. }) => Self::Refused("sold out".into()),
            Err(Refusal::LimitExceeded { .. }) => Self::Refused("over the limit".into()),
            Err(Refusal::Token(why)) => Self::TokenRefused(*why),
        }
    }

    /// What a purchase's error says.
    pub fn of_error(e: &EngineError) -> Self {
        match e {
            EngineError::Store(StoreError::Unavailable(why)) => {
                Self::NothingDeducted(format!("unavailable: {why}"))
            }
            EngineError::Contention { .. } => Self::NothingDeducted(e.to_string()),
            EngineError::NotOnSale { .. } => Self::NotOnSale,
            e => Self::Unknown(e.to_string()),
        }
    }

    /// A final answer: a replay must give it again.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Bought(..) | Self::Refused(_))
    }

    /// An answer that says the request made no order.
    pub fn says_no_order(&self) -> bool {
        matches!(self, Self::Refused(_) | Self::NoOrder)
    }
}

/// One answer, and when its call was made (the schedule's clock, which
/// stamps orders).
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    pub sent_ms: i64,
    pub answered_ms: i64,
    /// A 201 of a fresh purchase (not a replay): this call bought.
    pub fresh: bool,
}

/// A request (one request id) and every answer it got, in order.
#[derive(Debug, Clone)]
pub struct Sent {
    pub req: PurchaseRequest,
    pub replies: Vec<Reply>,
}

impl Sent {
    pub fn answers(&self) -> impl Iterator<Item = &Answer> {
        self.replies.iter().map(|r| &r.answer)
    }
}

/// Everything the schedule was told.
#[derive(Debug, Clone)]
pub struct Log {
    /// The event's `hold_seconds`, in ms: every fresh 201 is a hold.
    hold_ms: Option<i64>,
    /// By client request id.
    pub sent: HashMap<String, Sent>,
    /// In the order they were first answered.
    pub order: Vec<String>,
    /// Every answer about each order a client learnt of.
    pub stories: HashMap<OrderId, Story>,
    /// Those orders, in the order they were first told.
    pub told: Vec<OrderId>,
    /// How the operations went, e.g. `reshard ok: 2` (for the summary).
    pub tally: BTreeMap<String, u32>,
    /// Answers no schedule should ever get, by the check they break (e.g. a
    /// bought order unknown to cancel).
    pub errors: Vec<(&'static str, String)>,
    /// Token schedules: what each purchase carried, by request id (the
    /// settling's quiet buyers carry their own).
    pub carried: HashMap<String, Carry>,
    /// A draw schedule's waiting list: its line, claims and rounds.
    pub offers: OfferLog,
    /// A token schedule's key rotation, once it applied (`faults::tokens`).
    pub rotation: Option<Rotation>,
}

impl Log {
    /// The log of a schedule whose event holds purchases `hold_seconds`.
    pub fn new(hold_seconds: Option<u32>) -> Self {
        Self {
            hold_ms: hold_seconds.map(|s| i64::from(s) * 1000),
            sent: HashMap::new(),
            order: Vec::new(),
            stories: HashMap::new(),
            told: Vec::new(),
            tally: BTreeMap::new(),
            errors: Vec::new(),
            carried: HashMap::new(),
            offers: OfferLog::default(),
            rotation: None,
        }
    }

    /// Whether the event holds its purchases.
    pub fn holds(&self) -> bool {
        self.hold_ms.is_some()
    }

    /// Records what a client heard back from a purchase made at `sent_ms`:
    /// an outcome (an order or a refusal; from the ledger, after the close),
    /// or what an error says. Returns the answer.
    pub fn answered(
        &mut self,
        req: &PurchaseRequest,
        heard: Result<(&PurchaseOutcome, Via), Answer>,
        sent_ms: i64,
        answered_ms: i64,
    ) -> Answer {
        let fresh = matches!(&heard, Ok((out, Via::Purchase)) if out.result.is_ok());
        let answer = match heard {
            Ok((out, via)) => {
                if let Ok(order) = &out.result {
                    self.bought(order, via, sent_ms, answered_ms);
                }
                Answer::of(out)
            }
            Err(answer) => answer,
        };
        let rid = req.request_id.as_ref().expect("every request has an id");
        let rid = rid.as_str().to_owned();
        let sent = self.sent.entry(rid.clone()).or_insert_with(|| Sent {
            req: req.clone(),
            replies: Vec::new(),
        });
        if sent.replies.is_empty() {
            self.order.push(rid);
        }
        let kind = match &answer {
            Answer::Bought(..) => "201",
            Answer::Refused(_) => "refused",
            Answer::TokenRefused(_) => "token refused",
            Answer::NothingDeducted(_) => "nothing deducted",
            Answer::NotOnSale => "not on sale",
            Answer::NoOrder => "no order",
            Answer::Unknown(_) => "unknown",
        };
        sent.replies.push(Reply {
            answer: answer.clone(),
            sent_ms,
            answered_ms,
            fresh,
        });
        self.count(format!("buy {kind}"));
        answer
    }

    /// A 201: what it shows of the order. A fresh one (not a replay) shows a
    /// hold with its deadline on an event with holds, and neither elsewhere.
    fn bought(&mut self, order: &Order, via: Via, sent_ms: i64, answered_ms: i64) {
        if via == Via::Purchase {
            let shape_ok = match self.hold_ms {
                Some(hold) => {
                    order.status == Some(OrderStatus::Held)
                        && order
                            .pay_by
                            .is_some_and(|p| (sent_ms + hold..=answered_ms + hold).contains(&p))
                }
                None => order.status.is_none() && order.pay_by.is_none(),
            };
            if !shape_ok {
                self.errors.push((
                    "holds_answered",
                    format!(
                        "a fresh 201 (call {sent_ms}..{answered_ms} ms, holds {:?} ms) shows {:?} until {:?}: {order:?}",
                        self.hold_ms, order.status, order.pay_by
                    ),
                ));
            }
        }
        let told = order.status.map_or(Told::Bought, Told::status);
        self.hear(&order.order_id, told, via, sent_ms, answered_ms);
    }

    pub fn hear(&mut self, oid: &OrderId, told: Told, via: Via, sent_ms: i64, answered_ms: i64) {
        if !self.stories.contains_key(oid) {
            self.told.push(oid.clone());
        }
        self.stories
            .entry(oid.clone())
            .or_default()
            .hear(told, via, sent_ms, answered_ms);
    }

    pub fn count(&mut self, what: String) {
        *self.tally.entry(what).or_default() += 1;
    }

    /// Records a cancel's result (`None`: the call was dropped).
    pub fn cancelled(
        &mut self,
        oid: &OrderId,
        result: Option<Result<CancelOutcome, EngineError>>,
        sent_ms: i64,
        answered_ms: i64,
    ) {
        let told = match result {
            // An expired hold stays expired: the answer says which.
            Some(Ok(out)) => Told::status(out.order.status),
            Some(Err(EngineError::NotOnSale { .. })) => Told::Refused,
            Some(Err(e @ EngineError::UnknownOrder(_))) => {
                self.errors.push((
                    "bought_once",
                    format!("cancel of {oid}, answered 201 before: {e}"),
                ));
                Told::Unknown(Call::Cancel)
            }
            Some(Err(_)) | None => Told::Unknown(Call::Cancel),
        };
        self.count(format!("cancel {told:?}"));
        self.hear(oid, told, Via::Cancel, sent_ms, answered_ms);
    }

    /// Records a confirm's result (`None`: the call was dropped).
    pub fn confirmed(
        &mut self,
        oid: &OrderId,
        result: Option<Result<ConfirmOutcome, EngineError>>,
        sent_ms: i64,
        answered_ms: i64,
    ) {
        let told = match result {
            Some(Ok(out)) => match out.result {
                Ok(view) => Told::status(view.status),
                Err(ConfirmRefusal::Expired(_)) => Told::Expired,
                Err(ConfirmRefusal::Cancelled(_)) => Told::Cancelled,
            },
            Some(Err(EngineError::NotOnSale { .. })) => Told::Refused,
            Some(Err(e @ EngineError::UnknownOrder(_))) => {
                self.errors.push((
                    "bought_once",
                    format!("confirm of {oid}, answered 201 before: {e}"),
                ));
                Told::Unknown(Call::Confirm)
            }
            Some(Err(_)) | None => Told::Unknown(Call::Confirm),
        };
        self.count(format!("confirm {told:?}"));
        self.hear(oid, told, Via::Confirm, sent_ms, answered_ms);
    }

    /// Requests a replay may pick: answered finally, with an unknown outcome
    /// or refused for their token (never one answered "nothing deducted": a
    /// retry may buy then, which would be no lie; a token refusal's retry is
    /// judged by the check `tokens`).
    pub fn replayable(&self) -> Vec<PurchaseRequest> {
        self.order
            .iter()
            .map(|rid| &self.sent[rid])
            .filter(|s| {
                s.answers().any(|a| {
                    a.is_final() || matches!(a, Answer::Unknown(_) | Answer::TokenRefused(_))
                })
            })
            .map(|s| s.req.clone())
            .collect()
    }

    /// Orders a cancel may pick: every one not told cancelled, in the order
    /// they were told (held ones too, and expired ones: a cancel of an
    /// expired hold must answer that it expired).
    pub fn cancellable(&self) -> Vec<OrderId> {
        self.told
            .iter()
            .filter(|oid| !self.stories[*oid].was(Told::Cancelled))
            .cloned()
            .collect()
    }

    /// Orders a confirm may pick: those whose client may still pay (not told
    /// cancelled or expired). On an event without holds a confirm of a
    /// bought order answers it confirmed.
    pub fn confirmable(&self) -> Vec<OrderId> {
        self.told
            .iter()
            .filter(|oid| self.stories[*oid].is_live())
            .cloned()
            .collect()
    }

    /// Orders whose `call` failed or was dropped, and whose client has not
    /// learnt since that it ended (cancelled or expired; for a confirm, also
    /// confirmed): a client retries those.
    pub fn unresolved(&self, call: Call) -> Vec<OrderId> {
        self.told
            .iter()
            .filter(|oid| {
                let story = &self.stories[*oid];
                story.was(Told::Unknown(call))
                    && story.is_live()
                    && (call == Call::Cancel || !story.was(Told::Confirmed))
            })
            .cloned()
            .collect()
    }
}
