//! The steps of token purchases and offers: each one script on one slot (a
//! user's home, a bucket, the waiting list's slot), with its precondition
//! and its effect. A step that would change nothing (a replay, a refused
//! check) is not a transition unless it changes the answer.

use super::state::*;
use super::{Admission, Bounds, Carry};

/// One transition of the model.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// `purchase.lua` at the request's home: answer from its record, or
    /// check and consume the token with the take (or reserve it for a saga).
    Purchase(u8),
    /// `take.lua`: the saga's walk takes its next step.
    Take(u8),
    /// `finish.lua` at the home: the reservation made a consumption with the
    /// order (a take found) or given back (short everywhere).
    Finish(u8),
    /// The buyer pays the request's held order.
    Pay(u8),
    /// The hold expires (the sweeper) or is cancelled: its unit leaves the
    /// home for the waiting list's slot.
    Return(u8),
    /// A returned unit's transfer from this bucket arrives at the list.
    Arrive(u8),
    /// A token's expiry passes.
    Expire(u8),
    /// At the list's slot: the next user in line gets an offer.
    Offer,
    /// An offer's deadline passes.
    Due(u8),
    /// The sweeper at the list's slot passes an open offer past its deadline.
    Pass(u8),
    /// The user at that position buys with its offer token, at the list.
    Claim(u8),
    /// The close seals a bucket: its stock and live holds leftover.
    Close(u8),
    /// The close seals the list's slot: units aside and open offers leftover.
    CloseList,
}

/// The event before any purchase.
pub fn initial(b: &Bounds) -> State {
    let n = b.requests.len();
    let line = b.line as usize;
    State {
        buckets: (0..b.buckets)
            .map(|j| Bucket {
                stock: if j == 0 { b.stock } else { 0 },
                xfer: 0,
                markers: vec![Marker::None; n],
                sealed: false,
            })
            .collect(),
        tokens: vec![Token::default(); b.tokens as usize],
        reqs: vec![Rec::None; n],
        orders: vec![Order::None; n],
        consumed: vec![0; n],
        ordered: vec![0; n],
        told: vec![Told::None; n],
        aside: 0,
        offers: vec![Offer::None; line],
        due: vec![false; line],
        passes: vec![0; line],
        claims: vec![0; line],
        told_line: vec![Told::None; line],
        list_sealed: false,
        leftover: 0,
        reopened: 0,
    }
}

/// Every action (cheap: [`apply`] decides).
pub fn candidates(b: &Bounds, out: &mut Vec<Action>) {
    for r in 0..b.requests.len() as u8 {
        out.extend([
            Action::Purchase(r),
            Action::Take(r),
            Action::Finish(r),
            Action::Pay(r),
            Action::Return(r),
        ]);
    }
    for j in 0..b.buckets {
        out.extend([Action::Arrive(j), Action::Close(j)]);
    }
    if b.expiry {
        out.extend((0..b.tokens).map(Action::Expire));
    }
    out.push(Action::Offer);
    for p in 0..b.line {
        out.extend([Action::Due(p), Action::Pass(p), Action::Claim(p)]);
    }
    out.push(Action::CloseList);
}

/// Applies `a` to `s` (unchanged when the step refuses or changes nothing).
pub fn apply(m: &Admission, s: &mut State, a: Action) {
    let b = &m.bounds;
    match a {
        Action::Purchase(r) => purchase(m, s, r as usize),
        Action::Take(r) => take(b, s, r as usize),
        Action::Finish(r) => finish(m, s, r as usize),
        Action::Pay(r) => {
            if s.orders[r as usize] == Order::Held {
                s.orders[r as usize] = Order::Paid;
            }
        }
        Action::Return(r) => {
            let home = b.home(b.requests[r as usize].0 as usize);
            if s.orders[r as usize] == Order::Held && !s.buckets[home].sealed {
                s.orders[r as usize] = Order::Returned;
                s.buckets[home].xfer += 1;
            }
        }
        Action::Arrive(j) => {
            let bucket = &mut s.buckets[j as usize];
            if bucket.xfer > 0 {
                bucket.xfer -= 1;
                if s.list_sealed {
                    s.leftover += 1;
                } else {
                    s.aside += 1;
                }
            }
        }
        Action::Expire(t) => s.tokens[t as usize].expired = true,
        Action::Offer => {
            let c = s.cursor();
            if !s.list_sealed && s.aside > 0 && c < s.offers.len() {
                s.aside -= 1;
                s.offers[c] = Offer::Open;
            }
        }
        Action::Due(p) => {
            if s.offers[p as usize] == Offer::Open {
                s.due[p as usize] = true;
            }
        }
        Action::Pass(p) => pass(m, s, p as usize),
        Action::Claim(p) => claim(s, p as usize),
        Action::Close(j) => close(b, s, j as usize),
        Action::CloseList => {
            if !s.list_sealed && s.buckets.iter().all(|x| x.sealed) {
                s.list_sealed = true;
                s.leftover += s.aside;
                s.aside = 0;
                for o in s.offers.iter_mut().filter(|o| **o == Offer::Open) {
                    *o = Offer::Closed;
                    s.leftover += 1;
                }
            }
        }
    }
}

/// The token check of request `r` at its home: the refusal, if any.
fn check(b: &Bounds, s: &State, r: usize) -> Option<Why> {
    let (u, carry) = b.requests[r];
    match carry {
        Carry::Forged => Some(Why::Token),
        Carry::Of(v) if v != u => Some(Why::Token),
        _ => {
            let t = &s.tokens[u as usize];
            if t.expired {
                Some(Why::Expired)
            } else if t.used + t.reserved >= b.allowance {
                Some(Why::Used)
            } else {
                None
            }
        }
    }
}

/// The home step. A known request is answered from its record; a new one
/// has its token checked, and, in the same step, consumed with the take
/// (fast path) or reserved with the pending record (saga). In the broken
/// variant the check is a step of its own that admits the request, and the
/// next home step consumes and takes without checking again.
fn purchase(m: &Admission, s: &mut State, r: usize) {
    let b = &m.bounds;
    let u = b.requests[r].0 as usize;
    let home = b.home(u);
    match s.reqs[r] {
        Rec::None if s.buckets[home].sealed => refuse(s, r, Why::Closed),
        Rec::None => match check(b, s, r) {
            Some(why) => refuse(s, r, why),
            None if m.variant.check_before_take => s.reqs[r] = Rec::Admitted,
            None => admit(m, s, r),
        },
        Rec::Admitted if !s.buckets[home].sealed => admit(m, s, r),
        Rec::Admitted | Rec::Pending => {}
        Rec::Bought => s.told[r] = Told::Bought,
        Rec::SoldOut => s.told[r] = Told::SoldOut,
        Rec::Refused(why) => s.told[r] = Told::Refused(why),
    }
}

/// A refusal at the home step, kept under the request id.
fn refuse(s: &mut State, r: usize, why: Why) {
    s.reqs[r] = Rec::Refused(why);
    s.told[r] = Told::Refused(why);
}

/// The token consumed with the take at the home, or reserved for a saga
/// when the home is short (or the sale sold out on one bucket).
fn admit(m: &Admission, s: &mut State, r: usize) {
    let b = &m.bounds;
    let u = b.requests[r].0 as usize;
    let home = b.home(u);
    if s.buckets[home].stock > 0 {
        s.buckets[home].stock -= 1;
        s.tokens[u].used += 1;
        buy(s, r);
    } else if b.buckets > 1 {
        if !m.variant.saga_unreserved {
            s.tokens[u].reserved += 1;
        }
        s.reqs[r] = Rec::Pending;
    } else {
        s.reqs[r] = Rec::SoldOut;
        s.told[r] = Told::SoldOut;
    }
}

/// The order held at the home, its consumption and order records written.
fn buy(s: &mut State, r: usize) {
    s.orders[r] = Order::Held;
    s.consumed[r] += 1;
    s.ordered[r] += 1;
    s.reqs[r] = Rec::Bought;
    s.told[r] = Told::Bought;
}

/// Where request `r`'s walk stops: the first bucket after the home whose
/// marker is not short.
fn stop(b: &Bounds, s: &State, r: usize) -> Option<usize> {
    let n = b.buckets as usize;
    let home = b.home(b.requests[r].0 as usize);
    (1..n)
        .map(|i| (home + i) % n)
        .find(|&j| s.buckets[j].markers[r] != Marker::Short)
}

/// `take.lua` at the bucket the walk stops at: a unit and its marker, or a
/// short marker (a sealed bucket is short).
fn take(b: &Bounds, s: &mut State, r: usize) {
    if s.reqs[r] != Rec::Pending {
        return;
    }
    let Some(j) = stop(b, s, r) else { return };
    let bucket = &mut s.buckets[j];
    if bucket.markers[r] != Marker::None {
        return;
    }
    if bucket.stock > 0 && !bucket.sealed {
        bucket.stock -= 1;
        bucket.markers[r] = Marker::Taken;
    } else {
        bucket.markers[r] = Marker::Short;
    }
}

/// `finish.lua` at the home, by compare-and-set on the pending record: the
/// token's reserved unit consumed with the order when the walk took one,
/// given back when the walk is short everywhere (in the broken variant,
/// nothing was reserved: the finish consumes without a check).
fn finish(m: &Admission, s: &mut State, r: usize) {
    let b = &m.bounds;
    if s.reqs[r] != Rec::Pending {
        return;
    }
    let u = b.requests[r].0 as usize;
    let reserved = u8::from(!m.variant.saga_unreserved);
    match stop(b, s, r) {
        None => {
            s.tokens[u].reserved -= reserved;
            s.reqs[r] = Rec::SoldOut;
            s.told[r] = Told::SoldOut;
        }
        Some(j) if s.buckets[j].markers[r] == Marker::Taken => {
            s.tokens[u].reserved -= reserved;
            s.tokens[u].used += 1;
            buy(s, r);
        }
        Some(_) => {}
    }
}

/// The sweeper at the list's slot passes an open offer past its deadline:
/// its unit goes back aside for the next offer (to open sale, in the broken
/// variant).
fn pass(m: &Admission, s: &mut State, p: usize) {
    if s.list_sealed || s.offers[p] != Offer::Open || !s.due[p] {
        return;
    }
    s.offers[p] = Offer::Passed;
    s.passes[p] += 1;
    if m.variant.pass_to_open_sale {
        s.buckets[0].stock += 1;
        s.reopened += 1;
    } else {
        s.aside += 1;
    }
}

/// The purchase with the offer token of position `p`, at the list's slot:
/// an open offer before its deadline is consumed with its order in one
/// step; a replay answers the order; any other is refused.
fn claim(s: &mut State, p: usize) {
    if s.claims[p] > 0 {
        s.told_line[p] = Told::Bought;
    } else if s.offers[p] == Offer::Open && !s.due[p] && !s.list_sealed {
        s.offers[p] = Offer::Taken;
        s.claims[p] += 1;
        s.told_line[p] = Told::Bought;
    } else if s.offers[p] != Offer::None {
        s.told_line[p] = Told::Late;
    }
}

/// The close of bucket `j`, once it settled the sagas homed there: sealed,
/// its stock and the live holds at it leftover (returned units on their way
/// to the list still arrive).
fn close(b: &Bounds, s: &mut State, j: usize) {
    let homed = |r: usize| b.home(b.requests[r].0 as usize) == j;
    let settling = (0..s.reqs.len()).any(|r| homed(r) && s.reqs[r] == Rec::Pending);
    if s.buckets[j].sealed || settling {
        return;
    }
    s.buckets[j].sealed = true;
    s.leftover += s.buckets[j].stock;
    s.buckets[j].stock = 0;
    for r in (0..s.reqs.len()).filter(|&r| homed(r)) {
        if s.orders[r] == Order::Held {
            s.orders[r] = Order::Void;
            s.leftover += 1;
        }
    }
}
