//! What every reachable state of an event under admission control must
//! satisfy: the promises of issue 46 (no unit sold without a valid token,
//! no token past its allowance, a replay answers the original order, every
//! unit bought or, at close, leftover; returned units not on open sale
//! while a position in line waits; positions given in line order, each to
//! one ticket; an offer taken or passed once) and of docs/DESIGN.md's
//! "Fair drops" (no consumption without its order, no order without its
//! consumption).
//!
//! As in [`crate::properties`], `always` properties are the checks and
//! `sometimes` ones witnesses that the bound reaches what the checks are
//! about.

use stateright::{Model, Property};

use super::state::*;
use super::steps::Action;
use super::{Admission, Carry};

pub const VALID: &str = "no unit is sold without a valid token: every order's request \
     carries its user's own token";
pub const ALLOWANCE: &str =
    "no token buys past its allowance (consumed + reserved, and its consumption records)";
pub const PAIRED: &str = "no token consumed without its order, no order without its token's \
     consumption (each at most once)";
pub const ANSWERS: &str = "every answer is its request's record: a replay answers the \
     original order (an offer's after the close answers closed)";
pub const CONSERVATION: &str = "stock == sold (paid + offers taken) + open stock + held \
     (holds + taken by a pending saga) + aside + reserved tickets + open offers + leftover";
pub const CLOSED: &str = "once every bucket is closed, every unit is bought or leftover";
pub const NOT_REOPENED: &str =
    "no unit goes (back) on open sale while a position in line is not given";
pub const LINE: &str = "positions are given in line order, each to one ticket and each \
     ticket one position; an offer opens at the position its ticket was given";
pub const ONCE: &str = "an offer is taken at most once (with its order), passed at most \
     once, never both";
pub const ENDS: &str = "with no step left but the closes, no saga is pending and no unit \
     waits aside, in a reserved ticket or in an open offer: every returned unit was offered \
     and its offer ended (or it went to sale)";

pub const FAST: &str = "witness: a token buys on the fast path";
pub const SAGA: &str = "witness: a token buys through the saga";
pub const REUSED: &str = "witness: a token's second request is refused (used)";
pub const FOREIGN: &str = "witness: another user's token is refused";
pub const EXPIRED: &str = "witness: an expired token is refused";
pub const RETURNED: &str = "witness: a returned unit is offered in each bucket";
pub const PASSED: &str = "witness: an offer passes and the next user buys with its offer";
pub const CUT_OFF: &str = "witness: a later position is offered while an earlier one's \
     ticket is still reserved (a round cut off between the list and the bucket)";
pub const TO_SALE: &str = "witness: every position given, a unit goes to open sale";
pub const CANCELLED: &str =
    "witness: a bought offer is cancelled and its unit offered to the next position";
pub const LEFTOVER: &str = "witness: the close leaves an open offer's unit leftover";

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
        Property::always(ONCE, |_, s: &State| once(s)),
        // Settled first: the cheap test spares most states the search for
        // a step that changes something.
        Property::always(ENDS, |m, s| settled(s) || !quiet(m, s)),
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
        Property::sometimes(RETURNED, |_, s: &State| {
            s.buckets
                .iter()
                .all(|b| b.tickets.iter().any(|t| matches!(t, Ticket::Open { .. })))
        }),
        Property::sometimes(PASSED, |_, s: &State| {
            s.passes.first() == Some(&1) && s.claims.get(1) == Some(&1)
        }),
        Property::sometimes(CUT_OFF, |_, s: &State| cut_off(s)),
        Property::sometimes(TO_SALE, |_, s: &State| s.reopened && s.passes.contains(&1)),
        Property::sometimes(CANCELLED, |_, s: &State| {
            let (Some((j0, t0)), Some((j1, t1))) = (s.list.placed[0], s.list.placed[1]) else {
                return false;
            };
            s.cancelled[0] && j0 == j1 && t1 > t0 && s.ticket_at(1) != Some(Ticket::Reserved)
        }),
        Property::sometimes(LEFTOVER, |_, s: &State| {
            s.buckets.iter().any(|b| {
                b.tickets
                    .iter()
                    .any(|t| matches!(t, Ticket::Closed(Some(_))))
            })
        }),
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

/// Each request's consumption and order records are equal and at most one.
pub fn paired(s: &State) -> bool {
    s.consumed
        .iter()
        .zip(&s.ordered)
        .all(|(&c, &o)| c == o && o <= 1)
}

/// A client told bought has its order; told refused or sold out has that
/// record (the answer a replay gets is the original's). An offer's buyer
/// told bought has its position's ticket taken; told late, not taken;
/// told closed, the ticket's bucket sealed.
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
            Told::Late | Told::Closed => false,
        });
    let line = s.told_line.iter().enumerate().all(|(p, t)| {
        let taken = s.ticket_at(p) == Some(Ticket::Taken(p as u8));
        let sealed = s.list.placed[p].is_some_and(|(j, _)| s.buckets[j as usize].sealed);
        match t {
            Told::None => true,
            Told::Bought => taken && s.claims[p] == 1,
            Told::Late => !taken,
            Told::Closed => sealed,
            _ => false,
        }
    });
    requests && line
}

/// Every unit of the stock is in exactly one place.
pub fn conserved(m: &Admission, s: &State) -> bool {
    let count = |o: Order| s.orders.iter().filter(|&&x| x == o).count() as u32;
    let in_sagas = s
        .buckets
        .iter()
        .flat_map(|b| b.markers.iter().enumerate())
        .filter(|&(r, &mk)| mk == Marker::Taken && s.reqs[r] == Rec::Pending)
        .count() as u32;
    let taken = sold_offers(s) as u32;
    let buckets: u32 = s
        .buckets
        .iter()
        .map(|b| u32::from(b.stock) + u32::from(b.aside) + b.in_tickets())
        .sum();
    let total = count(Order::Paid)
        + taken
        + buckets
        + count(Order::Held)
        + in_sagas
        + u32::from(s.leftover);
    total == u32::from(m.bounds.stock)
}

/// Offers taken whose order was not cancelled.
pub fn sold_offers(s: &State) -> usize {
    s.buckets
        .iter()
        .flat_map(|b| &b.tickets)
        .filter(|t| matches!(t, Ticket::Taken(p) if !s.cancelled[*p as usize]))
        .count()
}

/// Once every bucket is sealed, units are only paid, offers taken, or
/// leftover.
pub fn closed_sale(m: &Admission, s: &State) -> bool {
    if !s.buckets.iter().all(|b| b.sealed) {
        return true;
    }
    let paid = s.orders.iter().filter(|&&o| o == Order::Paid).count();
    let taken = sold_offers(s);
    paid + taken + usize::from(s.leftover) == usize::from(m.bounds.stock)
        && !s.orders.contains(&Order::Held)
        && s.buckets
            .iter()
            .all(|b| b.aside == 0 && b.in_tickets() == 0)
}

/// No unit went (back) on open sale while a position is not given.
pub fn not_reopened(s: &State) -> bool {
    !s.waiting() || !s.reopened
}

/// The positions given are a prefix of the line (`next`), each placed at
/// one ticket that was given it and no other; every ticket opened, taken
/// or passed names the position its ticket was given.
pub fn in_line(s: &State) -> bool {
    let next = usize::from(s.list.next);
    let prefix = s
        .list
        .placed
        .iter()
        .enumerate()
        .all(|(p, placed)| placed.is_some() == (p < next));
    let placed_back = s.list.placed.iter().enumerate().all(|(p, placed)| {
        placed.is_none_or(|(j, t)| s.list.given(j as usize, t as usize) == Given::At(p as u8))
    });
    let given = s
        .list
        .given
        .iter()
        .flatten()
        .filter(|g| matches!(g, Given::At(_)))
        .count();
    let named = s.buckets.iter().enumerate().all(|(j, b)| {
        b.tickets.iter().enumerate().all(|(t, ticket)| {
            let pos = match *ticket {
                Ticket::Open { pos, .. }
                | Ticket::Taken(pos)
                | Ticket::Passed(pos)
                | Ticket::Closed(Some(pos)) => pos,
                _ => return true,
            };
            s.list.given(j, t) == Given::At(pos)
        })
    });
    prefix && placed_back && given == next && named
}

/// Per position, its order records and passes are at most one, not both,
/// and each is one exactly when the position's ticket is taken or passed.
pub fn once(s: &State) -> bool {
    (0..s.list.placed.len()).all(|p| {
        let ticket = s.ticket_at(p);
        let (c, n) = (s.claims[p], s.passes[p]);
        c + n <= 1
            && c == u8::from(ticket == Some(Ticket::Taken(p as u8)))
            && n == u8::from(ticket == Some(Ticket::Passed(p as u8)))
    })
}

/// Whether an offer is open (or ended) at a later position than a ticket
/// that was given one and is still reserved.
pub fn cut_off(s: &State) -> bool {
    let tickets = || {
        s.buckets.iter().enumerate().flat_map(|(j, b)| {
            b.tickets
                .iter()
                .enumerate()
                .map(move |(t, &ticket)| (s.list.given(j, t), ticket))
        })
    };
    tickets().any(|(g, ticket)| {
        let Given::At(p) = g else { return false };
        ticket == Ticket::Reserved
            && tickets()
                .any(|(g, ticket)| matches!(g, Given::At(q) if q > p) && ticket != Ticket::Reserved)
    })
}

/// No saga pending or admitted request; no open bucket with units aside,
/// reserved tickets or open offers.
pub fn settled(s: &State) -> bool {
    !s.reqs
        .iter()
        .any(|r| matches!(r, Rec::Pending | Rec::Admitted))
        && s.buckets
            .iter()
            .all(|b| b.sealed || (b.aside == 0 && b.in_tickets() == 0))
}

/// No action but a close changes anything.
pub fn quiet(m: &Admission, s: &State) -> bool {
    let mut actions = Vec::new();
    m.actions(s, &mut actions);
    actions
        .into_iter()
        .filter(|a| !matches!(a, Action::Close(_)))
        .all(|a| m.next_state(s, a).is_none())
}
