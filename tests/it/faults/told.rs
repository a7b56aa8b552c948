//! What the clients were told about one order, and which statuses the
//! database may then show for it once the sale is closed.
//!
//! An order lives on a small path: on an event with holds it is taken held,
//! then confirmed, cancelled or expired (a confirmed order can still be
//! cancelled); on an event without holds it is taken confirmed, then maybe
//! cancelled. Every answer about the order ([`Heard`]) either states where
//! it stood while the call ran (a confirm that answered, a cancel, a replay
//! of its purchase that shows its status), or says that a call may have
//! moved it (a confirm or cancel that failed or was dropped: unknown), or
//! says nothing of its state (a 201 without a status, a call refused because
//! the sale closed).
//!
//! The database's final status is true when some path of the order explains
//! every answer ([`Story::may_end`]):
//! - every stated status lies on the path;
//! - the order reached "confirmed" only through a confirm (one that answered
//!   it, or an unknown one), "cancelled" only through a cancel: nobody else
//!   knows its id. "Expired" needs no call: the sweeper, a late confirm and a
//!   close all expire a hold;
//! - it ends off "held": a close voids every live hold.
//!
//! And the answers were true when given if, moreover, a call that ended
//! before another began saw the order no later on that path than the other
//! one did: answers in real time never go back ([`Story::may_end_in_order`]).
//! Calls that overlapped may have been served in either order.
//!
//! So a hold never confirmed reads `expired` (or `cancelled` after a cancel
//! that may have applied), never `confirmed`; an order a client was told is
//! confirmed reads `confirmed` unless a cancel may have followed.

use shardstock::domain::model::OrderStatus;

/// Which call an unknown answer was to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Confirm,
    Cancel,
}

/// What one answer told a client about an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// A 201 that shows no status (an event without holds; a replay on one
    /// with holds whose order could not be read): the order exists.
    Bought,
    /// A 201 on an event with holds, or a replay that shows the hold.
    Held,
    /// A confirm that answered (or a replay showing it).
    Confirmed,
    /// A cancel that answered, a confirm refused because of a cancel, or a
    /// replay showing it.
    Cancelled,
    /// A confirm refused because the deadline passed, a cancel of an expired
    /// hold, or a replay showing it.
    Expired,
    /// A confirm or cancel refused before it touched the order (closed).
    Refused,
    /// A confirm or cancel that failed or was dropped: it may have applied.
    Unknown(Call),
}

impl Told {
    /// What a status shown in an answer tells.
    pub fn status(s: OrderStatus) -> Self {
        match s {
            OrderStatus::Held => Self::Held,
            OrderStatus::Confirmed => Self::Confirmed,
            OrderStatus::Cancelled => Self::Cancelled,
            OrderStatus::Expired => Self::Expired,
        }
    }

    /// The status this answer states the order had, if it states one.
    fn stated(self) -> Option<OrderStatus> {
        match self {
            Self::Held => Some(OrderStatus::Held),
            Self::Confirmed => Some(OrderStatus::Confirmed),
            Self::Cancelled => Some(OrderStatus::Cancelled),
            Self::Expired => Some(OrderStatus::Expired),
            Self::Bought | Self::Refused | Self::Unknown(_) => None,
        }
    }
}

/// Which call an answer came from (for a report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A purchase's first answer.
    Purchase,
    /// A purchase with a request id seen before, answered by the engine.
    Replay,
    /// A purchase after the close, answered from the ledger.
    Ledger,
    Confirm,
    Cancel,
    /// A claim of a waiting list's offer (`faults::offers`).
    Offer,
}

/// One answer, from which call, and when that call began and ended (the
/// schedule's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    pub told: Told,
    pub via: Via,
    pub sent_ms: i64,
    pub answered_ms: i64,
}

/// Every answer about one order, as logged.
#[derive(Debug, Clone, Default)]
pub struct Story {
    pub heard: Vec<Heard>,
}

/// The paths an order can take, from its first status.
const WITH_HOLDS: &[&[OrderStatus]] = {
    use OrderStatus::*;
    &[
        &[Held],
        &[Held, Confirmed],
        &[Held, Confirmed, Cancelled],
        &[Held, Cancelled],
        &[Held, Expired],
    ]
};
const WITHOUT_HOLDS: &[&[OrderStatus]] = {
    use OrderStatus::*;
    &[&[Confirmed], &[Confirmed, Cancelled]]
};

impl Story {
    pub fn hear(&mut self, told: Told, via: Via, sent_ms: i64, answered_ms: i64) {
        self.heard.push(Heard {
            told,
            via,
            sent_ms,
            answered_ms,
        });
    }

    /// Whether any answer was `told`.
    pub fn was(&self, told: Told) -> bool {
        self.heard.iter().any(|h| h.told == told)
    }

    /// Whether, as far as its client knows, the order may still change:
    /// nothing told it was cancelled or expired.
    pub fn is_live(&self) -> bool {
        !self.was(Told::Cancelled) && !self.was(Told::Expired)
    }

    /// The statuses the database may show once the sale is closed (see the
    /// module docs); empty when no path explains the answers.
    pub fn may_end(&self, holds: bool) -> Vec<OrderStatus> {
        self.ends(holds, false)
    }

    /// [`Story::may_end`], with every answer true when it was given: none
    /// shows the order earlier on its path than an answer given before its
    /// call began.
    pub fn may_end_in_order(&self, holds: bool) -> Vec<OrderStatus> {
        self.ends(holds, true)
    }

    fn ends(&self, holds: bool, in_order: bool) -> Vec<OrderStatus> {
        let paths = if holds { WITH_HOLDS } else { WITHOUT_HOLDS };
        let mut out: Vec<OrderStatus> = paths
            .iter()
            .filter(|path| self.explained_by(path, in_order))
            .filter_map(|path| path.last().copied())
            .filter(|last| *last != OrderStatus::Held)
            .collect();
        out.dedup();
        out
    }

    fn explained_by(&self, path: &[OrderStatus], in_order: bool) -> bool {
        let at = |s: OrderStatus| path.iter().position(|p| *p == s);
        let stated: Vec<(usize, &Heard)> = self
            .heard
            .iter()
            .filter_map(|h| Some((at(h.told.stated()?)?, h)))
            .collect();
        let every_stated_on_path = self
            .heard
            .iter()
            .filter_map(|h| h.told.stated())
            .all(|s| at(s).is_some());
        let in_real_time_order = !in_order
            || stated.iter().all(|(i, a)| {
                stated
                    .iter()
                    .all(|(j, b)| a.answered_ms >= b.sent_ms || i <= j)
            });
        let called = |call: Call, told: Told| self.was(told) || self.was(Told::Unknown(call));
        let steps_made_by_a_call = path.iter().skip(1).all(|s| match s {
            OrderStatus::Confirmed => called(Call::Confirm, Told::Confirmed),
            OrderStatus::Cancelled => called(Call::Cancel, Told::Cancelled),
            OrderStatus::Expired | OrderStatus::Held => true,
        });
        every_stated_on_path && in_real_time_order && steps_made_by_a_call
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OrderStatus::*;

    /// A story of calls one after another (each `told` a call of its own).
    fn story(told: &[Told]) -> Story {
        let mut s = Story::default();
        for (i, t) in told.iter().enumerate() {
            s.hear(*t, Via::Replay, 10 * i as i64, 10 * i as i64 + 5);
        }
        s
    }

    #[test]
    fn a_hold_never_confirmed_ends_expired_and_never_confirmed() {
        assert_eq!(story(&[Told::Held]).may_end(true), [Expired]);
        assert_eq!(
            story(&[]).may_end(true),
            [Expired],
            "a hold nobody heard of"
        );
        assert_eq!(
            story(&[Told::Held, Told::Unknown(Call::Cancel)]).may_end(true),
            [Cancelled, Expired]
        );
        assert_eq!(
            story(&[Told::Held, Told::Refused]).may_end(true),
            [Expired],
            "a confirm refused after the close changed nothing"
        );
    }

    #[test]
    fn a_confirm_that_answered_or_may_have_applied_allows_confirmed() {
        assert_eq!(
            story(&[Told::Held, Told::Confirmed]).may_end(true),
            [Confirmed]
        );
        assert_eq!(
            story(&[Told::Held, Told::Unknown(Call::Confirm)]).may_end(true),
            [Confirmed, Expired]
        );
        assert_eq!(
            story(&[Told::Held, Told::Confirmed, Told::Unknown(Call::Cancel)]).may_end(true),
            [Confirmed, Cancelled]
        );
        assert_eq!(
            story(&[Told::Held, Told::Confirmed, Told::Cancelled]).may_end(true),
            [Cancelled]
        );
    }

    #[test]
    fn an_order_told_cancelled_or_expired_stays_so() {
        assert_eq!(
            story(&[Told::Held, Told::Expired, Told::Expired]).may_end(true),
            [Expired]
        );
        assert_eq!(
            story(&[Told::Bought, Told::Cancelled]).may_end(false),
            [Cancelled]
        );
        assert!(
            story(&[Told::Held, Told::Expired, Told::Cancelled])
                .may_end(true)
                .is_empty(),
            "expired, then cancelled: no path"
        );
        assert!(
            story(&[Told::Held, Told::Expired, Told::Confirmed])
                .may_end(true)
                .is_empty()
        );
    }

    #[test]
    fn without_holds_a_bought_order_is_confirmed_unless_a_cancel_may_have_applied() {
        assert_eq!(story(&[Told::Bought]).may_end(false), [Confirmed]);
        assert_eq!(
            story(&[Told::Bought, Told::Unknown(Call::Cancel)]).may_end(false),
            [Confirmed, Cancelled]
        );
        assert!(
            story(&[Told::Held]).may_end(false).is_empty(),
            "no holds there"
        );
    }

    #[test]
    fn answers_in_real_time_never_go_back_but_overlapping_calls_may() {
        // Confirmed, then (a call begun after that answer) shown held: the
        // database may be right, the last answer was not.
        let back = story(&[Told::Held, Told::Confirmed, Told::Held]);
        assert_eq!(back.may_end(true), [Confirmed]);
        assert!(back.may_end_in_order(true).is_empty());
        // The same two answers from calls that overlapped: the read may
        // have come first.
        let mut s = Story::default();
        s.hear(Told::Held, Via::Purchase, 0, 5);
        s.hear(Told::Confirmed, Via::Confirm, 10, 20);
        s.hear(Told::Held, Via::Replay, 15, 30);
        assert_eq!(s.may_end_in_order(true), [Confirmed]);
        // In order, the strict reading agrees with the loose one.
        let story = story(&[Told::Held, Told::Confirmed, Told::Unknown(Call::Cancel)]);
        assert_eq!(story.may_end_in_order(true), story.may_end(true));
    }
}
