//! What a schedule was told: every answer to every request id, when its
//! call was made, and what the cancels of each order add up to.
//!
//! Answers are classified by what they claim about the request: bought,
//! refused (final), "nothing deducted", not on sale, or unknown.

use std::collections::{BTreeMap, HashMap};

use shardstock::EngineError;
use shardstock::domain::ids::OrderId;
use shardstock::engine::{PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::store::StoreError;

/// What one answer to a purchase says about the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 201: this order.
    Bought(OrderId, u32),
    /// A final refusal (sold out, over the limit): nothing deducted.
    Refused(String),
    /// An error that says nothing was deducted: 503 without `outcome`, or
    /// `Contention` ("nothing was bought, retry").
    NothingDeducted(String),
    /// The event is not on sale (closed): says nothing about a replay.
    NotOnSale,
    /// `OutcomeUnknown`, a dropped call, or an unexpected error.
    Unknown(String),
}

impl Answer {
    pub fn of(result: Result<PurchaseOutcome, EngineError>) -> Self {
        match result {
            Ok(PurchaseOutcome {
                result: Ok(order), ..
            }) => Self::Bought(order.order_id, order.quantity),
            Ok(PurchaseOutcome {
                result: Err(Refusal::SoldOut { .. }),
                ..
            }) => Self::Refused("sold out".into()),
            Ok(PurchaseOutcome {
                result: Err(Refusal::LimitExceeded { .. }),
                ..
            }) => Self::Refused("over the limit".into()),
            Err(EngineError::Store(StoreError::Unavailable(why))) => {
                Self::NothingDeducted(format!("unavailable: {why}"))
            }
            Err(e @ EngineError::Contention { .. }) => Self::NothingDeducted(e.to_string()),
            Err(EngineError::NotOnSale { .. }) => Self::NotOnSale,
            Err(e) => Self::Unknown(e.to_string()),
        }
    }

    /// A final answer: a replay must give it again.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Bought(..) | Self::Refused(_))
    }
}

/// One answer, and when its call was made (wall-clock ms, the engines' clock).
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    pub sent_ms: i64,
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

/// Now, in ms since the epoch: the engines' system clock, which stamps orders.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64
}

/// What the cancels of one order add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// A cancel answered: the order is cancelled.
    Yes,
    /// Every cancel was refused before it touched anything (the sale was closed).
    No,
    /// Some cancel failed or was dropped, and none answered.
    Unknown,
}

impl Cancelled {
    /// The sum of two attempts.
    pub fn and(self, other: Self) -> Self {
        match (self, other) {
            (Self::Yes, _) | (_, Self::Yes) => Self::Yes,
            (Self::Unknown, _) | (_, Self::Unknown) => Self::Unknown,
            _ => Self::No,
        }
    }

    /// What one cancel's result says.
    pub fn of<T>(result: Option<Result<T, EngineError>>) -> Self {
        match result {
            Some(Ok(_)) => Self::Yes,
            Some(Err(EngineError::NotOnSale { .. })) => Self::No,
            _ => Self::Unknown,
        }
    }
}

/// Everything the schedule was told.
#[derive(Debug, Default, Clone)]
pub struct Log {
    /// By client request id.
    pub sent: HashMap<String, Sent>,
    /// In the order they were first answered.
    pub order: Vec<String>,
    /// Orders a cancel was sent for, and what the cancels add up to.
    pub cancels: HashMap<OrderId, Cancelled>,
    /// How the operations went, e.g. `reshard ok: 2` (for the summary).
    pub tally: BTreeMap<String, u32>,
    /// Answers no schedule should ever get (e.g. a bought order unknown to cancel).
    pub errors: Vec<String>,
}

impl Log {
    /// Records an answer to a call made at `sent_ms`.
    pub fn answered(&mut self, req: &PurchaseRequest, answer: Answer, sent_ms: i64) {
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
            Answer::NothingDeducted(_) => "nothing deducted",
            Answer::NotOnSale => "not on sale",
            Answer::Unknown(_) => "unknown",
        };
        sent.replies.push(Reply { answer, sent_ms });
        self.count(format!("buy {kind}"));
    }

    pub fn count(&mut self, what: String) {
        *self.tally.entry(what).or_default() += 1;
    }

    /// Records a cancel's result.
    pub fn cancelled<T>(&mut self, oid: &OrderId, result: Option<Result<T, EngineError>>) {
        if let Some(Err(e @ EngineError::UnknownOrder(_))) = &result {
            self.errors
                .push(format!("cancel of {oid}, answered 201 before: {e}"));
        }
        let now = Cancelled::of(result);
        self.count(format!("cancel {now:?}"));
        let was = self.cancels.get(oid).copied().unwrap_or(Cancelled::No);
        self.cancels.insert(oid.clone(), was.and(now));
    }

    /// Requests a replay may pick: answered finally or with an unknown outcome
    /// (never one answered "nothing deducted": a retry may buy then, which
    /// would be no lie).
    pub fn replayable(&self) -> Vec<PurchaseRequest> {
        self.order
            .iter()
            .map(|rid| &self.sent[rid])
            .filter(|s| {
                s.answers()
                    .any(|a| a.is_final() || matches!(a, Answer::Unknown(_)))
            })
            .map(|s| s.req.clone())
            .collect()
    }

    /// Orders bought and not cancelled, in answer order.
    pub fn cancellable(&self) -> Vec<OrderId> {
        let mut out: Vec<OrderId> = Vec::new();
        for rid in &self.order {
            for a in self.sent[rid].answers() {
                if let Answer::Bought(oid, _) = a
                    && !out.contains(oid)
                    && self.cancels.get(oid) != Some(&Cancelled::Yes)
                {
                    out.push(oid.clone());
                }
            }
        }
        out
    }
}
