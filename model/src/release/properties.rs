//! What every reachable state of a release must satisfy: the promises of
//! issue 45 (per pool, sold + remaining == stock; no partial order; no user
//! over the limit) and of docs/DESIGN.md's "Releases" (decided once; a
//! refusal ends with nothing taken and its reservation released, by the
//! sweeper alone if every driver is gone); and of "Holds on a release
//! order" (a hold decided once; a confirmed order's lines all confirmed
//! once, a cancelled or expired one's all given back once; the user's count
//! is the units of its orders not released).
//!
//! As in [`crate::properties`], `always` properties are the checks and
//! `sometimes` ones witnesses that the bound reaches what the checks are
//! about.

use stateright::{Model, Property};

use super::state::*;
use super::steps::Action;
use super::{POOLS, Release};

pub const CONSERVATION: &str =
    "per pool: remaining + sold + taken by undecided or refused orders == stock";
pub const WHOLE: &str = "a bought order has every line taken once and none undone";
pub const HELD: &str = "a held order has every line taken once and none undone; \
     a confirmed one every line confirmed once and none given back; \
     a cancelled or expired one every line given back once and none confirmed";
pub const EMPTY: &str = "a released, cancelled or expired order has no line taken";
pub const ONCE: &str = "an order is decided once (one record, bought, held or refused), \
     each line taken, undone, confirmed and given back at most once";
pub const LIMIT: &str = "no user's units across the release exceed the limit or its reservation";
pub const COUNTED: &str = "each user's count is the units of its orders reserved and not released";
pub const ANSWERS: &str = "every answer is its order's record";
pub const SWEPT: &str = "with every driver gone, the sweeper alone ends every order: \
     none pending, refused or held, every count its bought and confirmed orders, \
     nothing taken for a refusal";
pub const ENDS: &str = "with no step left, every order is bought, confirmed, released, \
     cancelled, expired or refused by the limit";

pub const BOUGHT: &str = "witness: an order is bought";
pub const UNDONE: &str = "witness: a refused order's take is given back";
pub const LIMITED: &str = "witness: an order is refused by the limit";
pub const AGAIN: &str = "witness: a released reservation lets the user's next order buy";
pub const CONFIRMED: &str = "witness: a held order is confirmed";
pub const CANCELLED: &str = "witness: a held order is cancelled";
pub const EXPIRED: &str = "witness: a held order expires";

/// Every property, checks then witnesses.
pub fn all() -> Vec<Property<Release>> {
    vec![
        Property::always(CONSERVATION, conserved),
        Property::always(WHOLE, |_, s: &State| whole(s)),
        Property::always(HELD, |_, s: &State| held(s)),
        Property::always(EMPTY, |_, s: &State| empty(s)),
        Property::always(ONCE, |_, s: &State| once(s)),
        Property::always(LIMIT, limits_hold),
        Property::always(COUNTED, counted),
        Property::always(ANSWERS, |_, s: &State| answers_true(s)),
        Property::always(SWEPT, swept),
        Property::always(ENDS, |p, s| !stuck(p, s) || settled(s)),
        Property::sometimes(BOUGHT, |_, s: &State| s.bought.iter().any(|&n| n > 0)),
        Property::sometimes(UNDONE, |_, s: &State| {
            s.lines.iter().flatten().any(|l| l.v > 0)
        }),
        Property::sometimes(LIMITED, |_, s: &State| s.reqs.contains(&Rec::Limit)),
        Property::sometimes(AGAIN, again),
        Property::sometimes(CONFIRMED, |_, s: &State| s.reqs.contains(&Rec::Confirmed)),
        Property::sometimes(CANCELLED, |_, s: &State| s.reqs.contains(&Rec::Cancelled)),
        Property::sometimes(EXPIRED, |_, s: &State| s.reqs.contains(&Rec::Expired)),
    ]
}

/// Per pool, the units in its buckets and those the orders' lines keep
/// (sold, or taken by an order not decided or not undone yet) add up to
/// its stock; and the take records match the markers a take left (taken,
/// or taken and confirmed).
pub fn conserved(p: &Release, s: &State) -> bool {
    (0..POOLS).all(|k| {
        let remaining: u32 = s.pools[k].iter().map(|b| u32::from(b.stock)).sum();
        let kept: u32 = s.lines.iter().map(|l| u32::from(l[k].standing())).sum();
        let marked = s.pools[k]
            .iter()
            .flat_map(|b| &b.markers)
            .filter(|&&m| matches!(m, Marker::Taken | Marker::Confirmed))
            .count() as u32;
        remaining + kept == u32::from(p.bounds.pool_stock(k)) && marked == kept
    })
}

/// A bought order keeps one unit of every line, taken once, never undone.
pub fn whole(s: &State) -> bool {
    s.reqs
        .iter()
        .zip(&s.lines)
        .all(|(rec, lines)| *rec != Rec::Bought || lines.iter().all(|l| l.t == 1 && l.v == 0))
}

/// A held order keeps every line taken once and never undone; confirmed,
/// each line confirmed once and never given back; cancelled or expired,
/// each given back once and never confirmed.
pub fn held(s: &State) -> bool {
    s.reqs.iter().zip(&s.lines).all(|(rec, lines)| {
        let taken = |l: &Line| l.t == 1 && l.v == 0;
        lines.iter().all(|l| match rec {
            Rec::Held(Hold::Open) => taken(l) && l.c == 0 && l.g == 0,
            Rec::Held(Hold::Confirming) => taken(l) && l.g == 0,
            Rec::Held(Hold::Cancelling | Hold::Expiring) => taken(l) && l.c == 0,
            Rec::Confirmed => taken(l) && l.c == 1 && l.g == 0,
            Rec::Cancelled | Rec::Expired => taken(l) && l.g == 1 && l.c == 0,
            _ => l.c == 0 && l.g == 0,
        })
    })
}

/// A released order keeps nothing.
pub fn empty(s: &State) -> bool {
    s.reqs.iter().zip(&s.lines).all(|(rec, lines)| {
        !matches!(rec, Rec::Released | Rec::Cancelled | Rec::Expired)
            || lines.iter().all(|l| l.standing() == 0)
    })
}

/// At most one decision record an order, never both; at most one take
/// record a line, no more voids than takes, and at most one confirm or
/// give-back record a line, never both.
pub fn once(s: &State) -> bool {
    let decided = s.bought.iter().zip(&s.refused).all(|(&b, &r)| b + r <= 1);
    decided
        && s.lines
            .iter()
            .flatten()
            .all(|l| l.t <= 1 && l.v <= l.t && l.c + l.g <= 1)
}

/// Per user, the units its orders keep stay within its reservation at its
/// home, and that within the limit.
pub fn limits_hold(p: &Release, s: &State) -> bool {
    (0..p.bounds.orders.len()).all(|u| {
        let kept: u8 = (0..s.reqs.len())
            .filter(|&r| p.bounds.user(r) == u)
            .flat_map(|r| &s.lines[r])
            .map(Line::standing)
            .sum();
        kept <= s.users[u] && s.users[u] <= p.bounds.limit
    })
}

/// Per user, its count at its home is its orders' units from the reserve
/// to their release (a refusal, a cancel or an expiry).
pub fn counted(p: &Release, s: &State) -> bool {
    (0..p.bounds.orders.len()).all(|u| {
        let orders = (0..s.reqs.len())
            .filter(|&r| p.bounds.user(r) == u && s.reqs[r].counted())
            .count();
        usize::from(s.users[u]) == orders * POOLS
    })
}

/// A client told an answer has that record at the home: every answer is
/// final, so it never changes.
pub fn answers_true(s: &State) -> bool {
    s.told.iter().zip(&s.reqs).all(|(told, rec)| match told {
        Told::None => true,
        Told::Bought => *rec == Rec::Bought,
        Told::Refused => *rec == Rec::Released,
        Told::Limit => *rec == Rec::Limit,
        Told::Confirmed => *rec == Rec::Confirmed,
        Told::Cancelled => *rec == Rec::Cancelled,
        Told::Expired => *rec == Rec::Expired,
    })
}

/// No order is undecided, refused with its reservation still counted, or
/// held.
pub fn settled(s: &State) -> bool {
    !s.reqs
        .iter()
        .any(|r| matches!(r, Rec::Pending | Rec::Refused | Rec::Held(_)))
}

/// The sweeper alone, from `s`: for each order it finds pending, commit
/// (every line taken) or abort; then undo every line of a refused one and
/// release it (one undo a line: it stops where a walk stops, and closes
/// that bucket). A hold it expires once its deadline passed (if still
/// open), and finishes as decided: each line confirmed or given back (one
/// step a line), then the record ended. It must end every order, leave
/// each user's count at its bought and confirmed orders' units, and keep
/// every check.
pub fn swept(p: &Release, s: &State) -> bool {
    let mut s = s.clone();
    for r in 0..s.reqs.len() as u8 {
        let mut steps = vec![Action::Commit(r), Action::Abort(r)];
        steps.extend((0..POOLS as u8).map(|k| Action::Undo(r, k)));
        steps.push(Action::Release(r));
        steps.push(Action::Expire(r));
        steps.extend((0..POOLS as u8).map(|k| Action::ConfirmLine(r, k)));
        steps.extend((0..POOLS as u8).map(|k| Action::GiveBack(r, k)));
        steps.push(Action::End(r));
        for a in steps {
            if let Some(next) = p.next_state(&s, a) {
                s = next;
            }
        }
    }
    let counts = (0..p.bounds.orders.len()).all(|u| {
        let bought = (0..s.reqs.len())
            .filter(|&r| p.bounds.user(r) == u && matches!(s.reqs[r], Rec::Bought | Rec::Confirmed))
            .count();
        usize::from(s.users[u]) == bought * POOLS
    });
    settled(&s) && counts && conserved(p, &s) && whole(&s) && held(&s) && empty(&s)
}

/// A user has an order released (refused, cancelled or expired) and
/// another bought (or held, or confirmed).
fn again(p: &Release, s: &State) -> bool {
    let has = |u: usize, recs: &[Rec]| {
        (0..s.reqs.len()).any(|r| p.bounds.user(r) == u && recs.contains(&s.reqs[r]))
    };
    let released = [Rec::Released, Rec::Cancelled, Rec::Expired];
    let bought = [
        Rec::Bought,
        Rec::Confirmed,
        Rec::Held(Hold::Open),
        Rec::Held(Hold::Confirming),
    ];
    (0..p.bounds.orders.len()).any(|u| has(u, &released) && has(u, &bought))
}

/// No action changes anything.
pub fn stuck(p: &Release, s: &State) -> bool {
    let mut actions = Vec::new();
    p.actions(s, &mut actions);
    actions.into_iter().all(|a| p.next_state(s, a).is_none())
}
