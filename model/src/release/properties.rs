//! What every reachable state of a release must satisfy: the promises of
//! issue 45 (per pool, sold + remaining == stock; no partial order; no user
//! over the limit) and of docs/DESIGN.md's "Releases" (decided once; a
//! refusal ends with nothing taken and its reservation released, by the
//! sweeper alone if every driver is gone).
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
pub const EMPTY: &str = "a released order has no line taken";
pub const ONCE: &str = "an order is decided once (one record, bought or refused), \
     each line taken and undone at most once";
pub const LIMIT: &str = "no user's units across the release exceed the limit or its reservation";
pub const ANSWERS: &str = "every answer is its order's record";
pub const SWEPT: &str = "with every driver gone, the sweeper alone ends every order: \
     none pending or refused, every count its bought orders, nothing taken for a refusal";
pub const ENDS: &str = "with no step left, every order is bought, released or refused by the limit";

pub const BOUGHT: &str = "witness: an order is bought";
pub const UNDONE: &str = "witness: a refused order's take is given back";
pub const LIMITED: &str = "witness: an order is refused by the limit";
pub const AGAIN: &str = "witness: a released reservation lets the user's next order buy";

/// Every property, checks then witnesses.
pub fn all() -> Vec<Property<Release>> {
    vec![
        Property::always(CONSERVATION, conserved),
        Property::always(WHOLE, |_, s: &State| whole(s)),
        Property::always(EMPTY, |_, s: &State| empty(s)),
        Property::always(ONCE, |_, s: &State| once(s)),
        Property::always(LIMIT, limits_hold),
        Property::always(ANSWERS, |_, s: &State| answers_true(s)),
        Property::always(SWEPT, swept),
        Property::always(ENDS, |p, s| !stuck(p, s) || settled(s)),
        Property::sometimes(BOUGHT, |_, s: &State| s.bought.iter().any(|&n| n > 0)),
        Property::sometimes(UNDONE, |_, s: &State| {
            s.lines.iter().flatten().any(|l| l.v > 0)
        }),
        Property::sometimes(LIMITED, |_, s: &State| s.reqs.contains(&Rec::Limit)),
        Property::sometimes(AGAIN, again),
    ]
}

/// Per pool, the units in its buckets and those the orders' lines keep
/// (sold, or taken by an order not decided or not undone yet) add up to
/// its stock; and the take records match the markers a take left.
pub fn conserved(p: &Release, s: &State) -> bool {
    (0..POOLS).all(|k| {
        let remaining: u32 = s.pools[k].iter().map(|b| u32::from(b.stock)).sum();
        let kept: u32 = s.lines.iter().map(|l| u32::from(l[k].standing())).sum();
        let marked = s.pools[k]
            .iter()
            .flat_map(|b| &b.markers)
            .filter(|&&m| m == Marker::Taken)
            .count() as u32;
        remaining + kept == u32::from(p.bounds.stock[k]) && marked == kept
    })
}

/// A bought order keeps one unit of every line, taken once, never undone.
pub fn whole(s: &State) -> bool {
    s.reqs
        .iter()
        .zip(&s.lines)
        .all(|(rec, lines)| *rec != Rec::Bought || lines.iter().all(|l| l.t == 1 && l.v == 0))
}

/// A released order keeps nothing.
pub fn empty(s: &State) -> bool {
    s.reqs
        .iter()
        .zip(&s.lines)
        .all(|(rec, lines)| *rec != Rec::Released || lines.iter().all(|l| l.standing() == 0))
}

/// At most one decision record an order, never both; at most one take
/// record a line, and no more voids than takes.
pub fn once(s: &State) -> bool {
    let decided = s.bought.iter().zip(&s.refused).all(|(&b, &r)| b + r <= 1);
    decided && s.lines.iter().flatten().all(|l| l.t <= 1 && l.v <= l.t)
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

/// A client told bought, refused or limit has that record at the home.
pub fn answers_true(s: &State) -> bool {
    s.told.iter().zip(&s.reqs).all(|(told, rec)| match told {
        Told::None => true,
        Told::Bought => *rec == Rec::Bought,
        Told::Refused => *rec == Rec::Released,
        Told::Limit => *rec == Rec::Limit,
    })
}

/// No order is undecided, or refused with its reservation still counted.
pub fn settled(s: &State) -> bool {
    !s.reqs
        .iter()
        .any(|r| matches!(r, Rec::Pending | Rec::Refused))
}

/// The sweeper alone, from `s`: for each order it finds pending, commit
/// (every line taken) or abort; then undo every line of a refused one and
/// release it (one undo a line: it stops where a walk stops, and closes
/// that bucket). It must end every order, leave each user's count at its
/// bought orders' units, and keep every check.
pub fn swept(p: &Release, s: &State) -> bool {
    let mut s = s.clone();
    for r in 0..s.reqs.len() as u8 {
        let mut steps = vec![Action::Commit(r), Action::Abort(r)];
        steps.extend((0..POOLS as u8).map(|k| Action::Undo(r, k)));
        steps.push(Action::Release(r));
        for a in steps {
            if let Some(next) = p.next_state(&s, a) {
                s = next;
            }
        }
    }
    let counts = (0..p.bounds.orders.len()).all(|u| {
        let bought = (0..s.reqs.len())
            .filter(|&r| p.bounds.user(r) == u && s.reqs[r] == Rec::Bought)
            .count();
        usize::from(s.users[u]) == bought * POOLS
    });
    settled(&s) && counts && conserved(p, &s) && whole(&s) && empty(&s)
}

/// A user has an order released and another bought.
fn again(p: &Release, s: &State) -> bool {
    let has =
        |u: usize, rec: Rec| (0..s.reqs.len()).any(|r| p.bounds.user(r) == u && s.reqs[r] == rec);
    (0..p.bounds.orders.len()).any(|u| has(u, Rec::Released) && has(u, Rec::Bought))
}

/// No action changes anything.
pub fn stuck(p: &Release, s: &State) -> bool {
    let mut actions = Vec::new();
    p.actions(s, &mut actions);
    actions.into_iter().all(|a| p.next_state(s, a).is_none())
}
