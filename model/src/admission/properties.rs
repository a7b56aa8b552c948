//! What every reachable state of an event under admission control must
//! satisfy: the promises of issue 46 (no unit sold without a valid token,
//! no token past its allowance, a replay answers the original order, every
//! unit bought, offered or, at close, leftover; returned units not on open
//! sale while users wait; offers passed in line order) and of
//! docs/DESIGN.md's "Fair drops" (no consumption without its order, no
//! order without its consumption).
//!
//! As in [`crate::properties`], `always` properties are the checks and
//! `sometimes` ones witnesses that the bound reaches what the checks are
//! about.

use stateright::{Model, Property};

use super::state::*;
use super::{Admission, Carry};

pub const VALID: &str = "no unit is sold without a valid token: every order's request \
     carries its user's own token";
pub const ALLOWANCE: &str =
    "no token buys past its allowance (consumed + reserved, and its consumption records)";
pub const PAIRED: &str = "no token consumed without its order, no order without its token's \
     consumption (each at most once), an offer taken with its order";
pub const ANSWERS: &str =
    "every answer is its request's record: a replay answers the original order";
pub const CONSERVATION: &str = "stock == open stock + returned in transfer + aside + offered \
     + taken by a pending saga + held + paid + offers taken + leftover";
pub const CLOSED: &str = "once every slot is closed and nothing in transfer, \
     every unit is bought or leftover";
pub const NOT_REOPENED: &str = "no unit goes back on open sale while users wait in line";
pub const LINE: &str = "offers are made in line order, and each passes at most once";
pub const ENDS: &str = "with no step left, no saga is pending and no transfer in flight";

pub const FAST: &str = "witness: a token buys on the fast path";
pub const SAGA: &str = "witness: a token buys through the saga";
pub const REUSED: &str = "witness: a token's second request is refused (used)";
pub const FOREIGN: &str = "witness: another user's token is refused";
pub const EXPIRED: &str = "witness: an expired token is refused";
pub const RETURNED: &str = "witness: a returned unit is offered";
pub const PASSED: &str = "witness: an offer passes and the next user buys with its offer";
pub const LEFTOVER: &str = "witness: the close leaves an offered unit leftover";

/// Every property, checks then witnesses.
pub fn all() -> Vec<Property<Admission>> {
    vec![
        Property::always(VALID, valid),
        Property::always(ALLOWANCE, within_allowance),
        Property::always(PAIRED, |_, s: &State| paired(s)),
        Property::always(ANSWERS, |_, s: &State| answers_true(s)),
        Property::always(CONSERVATION, conserved),
        Property::always(CLOSED, closed_sale),
        Property::always(NOT_REOPENED, |_, s: &State| not_reopened(s)),
        Property::always(LINE, |_, s: &State| in_line(s)),
        Property::always(ENDS, |m, s| !stuck(m, s) || settled(s)),
        Property::sometimes(FAST, |m, s: &State| {
            (0..s.reqs.len())
                .any(|r| s.ordered[r] > 0 && m.bounds.home(m.bounds.requests[r].0 as usize) == 0)
        }),
        Property::sometimes(SAGA, |m, s: &State| {
            (0..s.reqs.len())
                .any(|r| s.ordered[r] > 0 && m.bounds.home(m.bounds.requests[r].0 as usize) != 0)
        }),
        Property::sometimes(REUSED, |_, s: &State| {
            s.told.contains(&Told::Refused(Why::Used))
        }),
        Property::sometimes(FOREIGN, |m, s: &State| {
            (0..s.reqs.len()).any(|r| {
                matches!(m.bounds.requests[r].1, Carry::Of(_))
                    && s.told[r] == Told::Refused(Why::Token)
            })
        }),
        Property::sometimes(EXPIRED, |_, s: &State| {
            s.told.contains(&Told::Refused(Why::Expired))
        }),
        Property::sometimes(RETURNED, |_, s: &State| s.offers.contains(&Offer::Open)),
        Property::sometimes(PASSED, |_, s: &State| {
            s.passes.first() == Some(&1) && s.claims.get(1) == Some(&1)
        }),
        Property::sometimes(LEFTOVER, |_, s: &State| s.offers.contains(&Offer::Closed)),
    ]
}

/// Every request with an order carries its own user's token.
pub fn valid(m: &Admission, s: &State) -> bool {
    (0..s.reqs.len()).all(|r| s.ordered[r] == 0 || m.bounds.requests[r].1 == Carry::Own)
}

/// Per token, its record's consumed and reserved units, and the ledger's
/// consumption records of its requests, stay within the allowance; the
/// record's consumed units are its consumption records.
pub fn within_allowance(m: &Admission, s: &State) -> bool {
    let b = &m.bounds;
    s.tokens.iter().enumerate().all(|(u, t)| {
        let records: u8 = (0..s.reqs.len())
            .filter(|&r| b.requests[r].0 as usize == u && b.requests[r].1 == Carry::Own)
            .map(|r| s.consumed[r])
            .sum();
        t.used + t.reserved <= b.allowance && records == t.used
    })
}

/// Each request's consumption and order records are equal and at most one;
/// each offer's order record is one exactly when it was taken.
pub fn paired(s: &State) -> bool {
    let requests = s
        .consumed
        .iter()
        .zip(&s.ordered)
        .all(|(&c, &o)| c == o && o <= 1);
    let offers = s
        .offers
        .iter()
        .zip(&s.claims)
        .all(|(&o, &c)| c == u8::from(o == Offer::Taken));
    requests && offers
}

/// A client told bought has its order; told refused or sold out has that
/// record (the answer a replay gets is the original's).
pub fn answers_true(s: &State) -> bool {
    let requests = s
        .told
        .iter()
        .zip(&s.reqs)
        .zip(&s.ordered)
        .all(|((t, rec), &o)| match t {
            Told::None => true,
            Told::Bought => *rec == Rec::Bought && o == 1,
            Told::SoldOut => *rec == Rec::SoldOut && o == 0,
            Told::Refused(why) => *rec == Rec::Refused(*why) && o == 0,
            Told::Late => false,
        });
    let line = s.told_line.iter().zip(&s.offers).all(|(t, o)| match t {
        Told::None => true,
        Told::Bought => *o == Offer::Taken,
        Told::Late => *o != Offer::Taken,
        _ => false,
    });
    requests && line
}

/// Every unit of the stock is in exactly one place.
pub fn conserved(m: &Admission, s: &State) -> bool {
    let count = |o: Order| s.orders.iter().filter(|&&x| x == o).count() as u32;
    let offers = |o: Offer| s.offers.iter().filter(|&&x| x == o).count() as u32;
    let in_sagas = s
        .buckets
        .iter()
        .flat_map(|b| b.markers.iter().enumerate())
        .filter(|&(r, &mk)| mk == Marker::Taken && s.reqs[r] == Rec::Pending)
        .count() as u32;
    let buckets: u32 = s
        .buckets
        .iter()
        .map(|b| u32::from(b.stock) + u32::from(b.xfer))
        .sum();
    let total = buckets
        + u32::from(s.aside)
        + offers(Offer::Open)
        + in_sagas
        + count(Order::Held)
        + count(Order::Paid)
        + offers(Offer::Taken)
        + u32::from(s.leftover);
    total == u32::from(m.bounds.stock)
}

/// Once every bucket and the list are sealed and no transfer is in flight,
/// units are only paid, offers taken, or leftover.
pub fn closed_sale(m: &Admission, s: &State) -> bool {
    let closed = s.list_sealed && s.buckets.iter().all(|b| b.sealed && b.xfer == 0);
    if !closed {
        return true;
    }
    let paid = s.orders.iter().filter(|&&o| o == Order::Paid).count();
    let taken = s.offers.iter().filter(|&&o| o == Offer::Taken).count();
    let bought_or_left = paid + taken + usize::from(s.leftover);
    bought_or_left == usize::from(m.bounds.stock)
        && !s.orders.contains(&Order::Held)
        && !s.offers.contains(&Offer::Open)
        && s.aside == 0
}

/// No unit went back on open sale while a user in line waits.
pub fn not_reopened(s: &State) -> bool {
    !s.waiting() || s.reopened == 0
}

/// The offers made are a prefix of the line, and each passed at most once
/// (exactly once when it is passed).
pub fn in_line(s: &State) -> bool {
    let c = s.cursor();
    let prefix = s.offers[c..].iter().all(|&o| o == Offer::None);
    let once = s
        .offers
        .iter()
        .zip(&s.passes)
        .all(|(&o, &n)| n == u8::from(o == Offer::Passed));
    prefix && once
}

/// No saga pending or admitted request, no transfer in flight.
pub fn settled(s: &State) -> bool {
    !s.reqs
        .iter()
        .any(|r| matches!(r, Rec::Pending | Rec::Admitted))
        && s.buckets.iter().all(|b| b.xfer == 0)
}

/// No action changes anything.
pub fn stuck(m: &Admission, s: &State) -> bool {
    let mut actions = Vec::new();
    m.actions(s, &mut actions);
    actions.into_iter().all(|a| m.next_state(s, a).is_none())
}
