//! What every reachable state must satisfy: the oracle from the database
//! alone (`tests/it/harness/oracle.rs`) and the promises the fault schedules
//! check (`tests/it/faults.rs`), stated over the model's store and ledger.
//!
//! `always` properties are the checks (a discovery is a counterexample);
//! `sometimes` properties are witnesses that the bound reaches what the
//! checks are about (a reshard that switches, a hold that expires, a close),
//! so a model that stopped reaching them fails its test instead of passing
//! vacuously. Names are constants, so tests ask for them without typos.

use stateright::{Model, Property};

use crate::Protocol;
use crate::state::*;

pub const CONSERVATION: &str =
    "conservation: stock + in transfer + leftover + live orders == units on sale";
pub const ONE_END: &str = "no order has records that end it differently";
pub const ANSWERS: &str = "every answer is true";
pub const LIMIT: &str = "per-user limits hold";
pub const STRANDED: &str = "nothing stranded in a sealed layout";
pub const CLOSED_SALE: &str =
    "a closed sale: confirmed + leftover == stock, nothing held, nothing deducted for a refusal";
pub const ENDS: &str =
    "with no step left, the sale is closed (every saga, reshard and close ended)";

pub const SWITCHED: &str = "witness: a reshard switches";
pub const EXPIRED: &str = "witness: a hold expires";
pub const CONFIRMED_THEN_CLOSED: &str =
    "witness: a confirmed order in a closed sale after a reshard";
pub const SAGA_BOUGHT: &str = "witness: a saga buys";

/// Every property, checks then witnesses.
pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(CONSERVATION, conserved),
        Property::always(ONE_END, |_, s: &State| s.ledger.iter().all(one_end)),
        Property::always(ANSWERS, |_, s: &State| answers_true(s)),
        Property::always(LIMIT, limits_hold),
        Property::always(STRANDED, |p, s| !stranded(p, s)),
        Property::always(CLOSED_SALE, |p, s: &State| {
            !s.meta.ledger_closed || closed_sale(p, s)
        }),
        Property::always(ENDS, |p, s: &State| s.meta.ledger_closed || !stuck(p, s)),
        Property::sometimes(SWITCHED, |_, s: &State| s.meta.generation == 1),
        Property::sometimes(EXPIRED, |_, s: &State| s.ledger.iter().any(|r| r.e > 0)),
        Property::sometimes(CONFIRMED_THEN_CLOSED, |_, s: &State| {
            s.meta.ledger_closed && s.meta.generation == 1 && s.ledger.iter().any(|r| r.k > 0)
        }),
        Property::sometimes(SAGA_BOUGHT, |_, s: &State| s.ledger.iter().any(|r| r.h > 0)),
    ]
}

/// Units in stock, in transfers not yet applied at their target, recorded
/// as leftover, and kept by orders the ledger derives as held or confirmed,
/// add up to the units on sale. An order released twice (two expiries) puts
/// a unit back twice and breaks it, which the audit's own equation, a sum of
/// records, does not see.
pub fn conserved(p: &Protocol, s: &State) -> bool {
    let stock: u32 = s.buckets.iter().map(|b| u32::from(b.stock)).sum();
    let moving: u32 = s
        .buckets
        .iter()
        .flat_map(|b| b.xfer.iter())
        .filter(|j| j.open && !s.buckets[j.target as usize].xin.contains(&j.xid))
        .map(|j| u32::from(j.units))
        .sum();
    let live: u32 = s.ledger.iter().map(|r| u32::from(r.live())).sum();
    stock + moving + u32::from(s.leftover) + live == u32::from(p.bounds.stock)
}

/// The oracle's rule: at most one release (cancel or expiry), at most one
/// confirm, never a confirm and an expiry, at most one hold record, and no
/// take voided more often than taken.
pub fn one_end(r: &Records) -> bool {
    r.c + r.e <= 1 && r.k <= 1 && !(r.k > 0 && r.e > 0) && r.h <= 1 && r.v <= r.t
}

/// What a client was told, against what the ledger says of its order.
pub fn answers_true(s: &State) -> bool {
    s.ledger
        .iter()
        .zip(&s.told)
        .zip(&s.paid)
        .all(|((r, told), paid)| {
            let bought = *told != Told::Bought || r.t > r.v;
            let paid = match paid {
                Told::Confirmed => r.derive() == Derived::Confirmed,
                Told::Expired => r.e > 0 && r.k == 0 && r.c == 0,
                Told::Cancelled => r.c > 0,
                _ => true,
            };
            bought && paid
        })
}

/// No user keeps more units than the limit (held or confirmed, a saga's
/// take included).
pub fn limits_hold(p: &Protocol, s: &State) -> bool {
    let Some(limit) = p.bounds.limit else {
        return true;
    };
    let per = p.bounds.requests_per_user as usize;
    (0..p.bounds.users as usize).all(|u| {
        let held: u8 = s.ledger[u * per..(u + 1) * per]
            .iter()
            .map(Records::live)
            .sum();
        held <= limit
    })
}

/// Units in a layout the event left (after the switch, while on sale), or
/// anywhere but the leftover once the ledger closed.
pub fn stranded(p: &Protocol, s: &State) -> bool {
    let holds_units = |b: &Bucket| b.stock > 0 || b.xfer.iter().any(|j| j.open);
    if s.meta.ledger_closed {
        return s.buckets.iter().any(holds_units);
    }
    s.meta.generation == 1
        && s.meta.status == Status::OnSale
        && s.buckets[p.layout(0)].iter().any(holds_units)
}

/// The oracle after the close: confirmed units and the leftover add up to
/// the stock, no order is still held, and a refusal deducted nothing.
pub fn closed_sale(p: &Protocol, s: &State) -> bool {
    let confirmed: u32 = s
        .ledger
        .iter()
        .filter(|r| r.derive() == Derived::Confirmed)
        .count() as u32;
    let held = s.ledger.iter().any(|r| r.derive() == Derived::Held);
    let refused_deducted =
        s.ledger.iter().zip(&s.told).any(|(r, told)| {
            matches!(told, Told::SoldOut | Told::Limit | Told::TryAgain) && r.t > r.v
        });
    confirmed + u32::from(s.leftover) == u32::from(p.bounds.stock) && !held && !refused_deducted
}

/// No action changes anything: with the faults stopped (the budget spent),
/// nothing is left to do.
pub fn stuck(p: &Protocol, s: &State) -> bool {
    let mut actions = Vec::new();
    p.actions(s, &mut actions);
    actions.into_iter().all(|a| p.next_state(s, a).is_none())
}
