//! The steps of token purchases and offers: each one script on one slot (a
//! user's home, a bucket, the waiting list's slot), with its precondition
//! and its effect. A step that would change nothing (a replay, a refused
//! check) is not a transition unless it changes the answer.

use super::state::*;
use super::{Admission, Bounds, Carry};

/// One transition of the model. The waiting list's steps are those of a
/// sweeper's round (`engine::offer_round`), each an action of its own, so a
/// round cut off between any two, and rounds of several instances
/// interleaved, are explored: a round asks `Assign` and `Open` for tickets
/// an earlier `Reserve` answered, so any existing ticket may be asked.
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
    /// The hold expires (`expire_holds.lua`, `confirm.lua` found late) or
    /// is cancelled (`cancel.lua`): its unit is given back at its home, in
    /// the same step (aside while the bucket's list is on).
    Return(u8),
    /// A token's expiry passes, while a request of its user is still to
    /// be checked: once each is decided no step reads the flag (a replay
    /// answers its record), and setting it then would only double the
    /// states of the waiting list's steps that follow.
    Expire(u8),
    /// `reserve_offers.lua` at the bucket: every unit aside becomes a
    /// reserved ticket.
    Reserve(u8),
    /// `assign_offer.lua` at the list's slot, for (bucket, ticket): the next
    /// position once, the same one when asked again, or nobody left.
    Assign(u8, u8),
    /// `open_offer.lua` at the bucket, with what the list answered: a
    /// reserved ticket opened once as its position's offer, or (nobody
    /// left) its unit and every unit aside back in stock, the list off.
    Open(u8, u8),
    /// An open offer's deadline passes.
    Due(u8, u8),
    /// `pass_offers.lua` at the bucket: every open offer past its deadline
    /// passed, each unit back aside.
    Pass(u8),
    /// The user at that position buys with its offer token: the engine
    /// reads the position's ticket at the list (`o:<pos>`, written once),
    /// `claim_offer.lua` at the ticket's bucket takes it.
    Claim(u8),
    /// `cancel.lua` on a bought offer's order, at the bucket it is homed
    /// at (the ticket's: its order id routes there): cancelled once, its
    /// unit given back there (aside, for the next position).
    Cancel(u8),
    /// The close of a bucket: sealed, live holds voided, and `retire.lua`'s
    /// leftover (stock, units aside, reserved and open tickets).
    Close(u8),
}

/// The event before any purchase: the draw opened every bucket's list
/// before any winner had a token (`waitlist_on.lua`), and wrote the line.
pub fn initial(b: &Bounds) -> State {
    let n = b.requests.len();
    let line = b.line as usize;
    State {
        buckets: (0..b.buckets)
            .map(|j| Bucket {
                stock: if j == 0 { b.stock } else { 0 },
                markers: vec![Marker::None; n],
                sealed: false,
                on: true,
                aside: 0,
                tickets: Vec::new(),
            })
            .collect(),
        tokens: vec![Token::default(); b.tokens as usize],
        reqs: vec![Rec::None; n],
        orders: vec![Order::None; n],
        consumed: vec![0; n],
        ordered: vec![0; n],
        told: vec![Told::None; n],
        list: List {
            next: 0,
            given: vec![Vec::new(); b.buckets as usize],
            placed: vec![None; line],
        },
        passes: vec![0; line],
        claims: vec![0; line],
        cancelled: vec![false; line],
        told_line: vec![Told::None; line],
        leftover: 0,
        reopened: false,
    }
}

/// Every action of `s` (cheap: [`apply`] decides): the ticket steps for the
/// tickets that exist.
pub fn candidates(b: &Bounds, s: &State, out: &mut Vec<Action>) {
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
        out.extend([Action::Reserve(j), Action::Pass(j), Action::Close(j)]);
        for t in 0..s.buckets[j as usize].tickets.len() as u8 {
            out.extend([Action::Assign(j, t), Action::Open(j, t), Action::Due(j, t)]);
        }
    }
    if b.expiry {
        out.extend((0..b.tokens).map(Action::Expire));
    }
    out.extend((0..b.line).map(Action::Claim));
    if b.offer_cancels {
        out.extend((0..b.line).map(Action::Cancel));
    }
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
                give_back(m, s, home);
            }
        }
        Action::Expire(t) => {
            let unchecked =
                (0..s.reqs.len()).any(|r| reads(b, r, t as usize) && s.reqs[r] == Rec::None);
            if unchecked {
                s.tokens[t as usize].expired = true;
            }
        }
        Action::Reserve(j) => {
            let bucket = &mut s.buckets[j as usize];
            if !bucket.sealed {
                let n = bucket.aside as usize;
                bucket
                    .tickets
                    .extend(std::iter::repeat_n(Ticket::Reserved, n));
                bucket.aside = 0;
            }
        }
        Action::Assign(j, t) => assign(m, s, j as usize, t as usize),
        Action::Open(j, t) => open(m, s, j as usize, t as usize),
        Action::Due(j, t) => {
            let bucket = &mut s.buckets[j as usize];
            if let Ticket::Open { due, .. } = &mut bucket.tickets[t as usize] {
                *due = true;
            }
        }
        Action::Pass(j) => {
            for t in 0..s.buckets[j as usize].tickets.len() {
                pass(m, s, j as usize, t);
            }
        }
        Action::Claim(p) => claim(s, p as usize),
        Action::Cancel(p) => {
            let p = p as usize;
            if let Some((j, _)) = s.list.placed[p]
                && s.claims[p] > 0
                && !s.cancelled[p]
                && !s.buckets[j as usize].sealed
            {
                s.cancelled[p] = true;
                give_back(m, s, j as usize);
            }
        }
        Action::Close(j) => close(b, s, j as usize),
    }
}

/// `give_back` in `expire_holds.lua`, `cancel.lua` and `confirm.lua`: a
/// unit that comes back to bucket `j` goes aside while its list is on, to
/// stock (open sale) once nobody is left in line (in the broken variant,
/// to stock always).
fn give_back(m: &Admission, s: &mut State, j: usize) {
    let bucket = &mut s.buckets[j];
    if bucket.on && !m.variant.give_back_to_stock {
        bucket.aside += 1;
    } else {
        bucket.stock += 1;
        s.reopened = true;
    }
}

/// `assign_offer.lua` at the list: a ticket not asked before gets the next
/// position (written both ways) or, every position given, nobody; asked
/// again it gets its first answer (in the broken variant, a ticket with a
/// position asking again gets the next one too).
fn assign(m: &Admission, s: &mut State, j: usize, t: usize) {
    let line = s.list.placed.len() as u8;
    let first = match s.list.given(j, t) {
        Given::None => true,
        Given::At(_) => m.variant.assign_again,
        Given::Nobody => false,
    };
    if !first {
        return;
    }
    let given = &mut s.list.given[j];
    if given.len() <= t {
        given.resize(t + 1, Given::None);
    }
    if s.list.next < line {
        given[t] = Given::At(s.list.next);
        s.list.placed[s.list.next as usize] = Some((j as u8, t as u8));
        s.list.next += 1;
    } else if given[t] == Given::None {
        given[t] = Given::Nobody;
    }
}

/// `open_offer.lua` at the bucket, with the list's answer for the ticket
/// (written once: reading it here is reading what the round was told): a
/// reserved ticket (compared) opens as its position's offer; with nobody
/// left, its unit and every unit aside go to stock and the bucket's list is
/// off. A ticket the list has not answered is not opened (the round asks
/// the list first). In the broken variant the record is not compared: any
/// ticket with a position opens (again).
fn open(m: &Admission, s: &mut State, j: usize, t: usize) {
    let given = s.list.given(j, t);
    let bucket = &mut s.buckets[j];
    if bucket.sealed {
        return;
    }
    let reserved = bucket.tickets[t] == Ticket::Reserved;
    match given {
        Given::At(pos) if reserved || m.variant.open_unchecked => {
            bucket.tickets[t] = Ticket::Open { pos, due: false };
        }
        Given::Nobody if reserved => {
            bucket.tickets[t] = Ticket::ToSale;
            let back = 1 + bucket.aside;
            bucket.stock += back;
            bucket.aside = 0;
            bucket.on = false;
            s.reopened = true;
        }
        _ => {}
    }
}

/// Whether request `r`'s check reads user `u`'s token record (its own
/// user's token: another user's is refused unread).
fn reads(b: &Bounds, r: usize, u: usize) -> bool {
    let (user, carry) = b.requests[r];
    user as usize == u && (carry == Carry::Own || carry == Carry::Of(user))
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

/// `pass_offers.lua` at the bucket, for ticket `t`: an open offer past its
/// deadline is passed (the record compared open) and its unit goes back aside, for the
/// next position (to open sale, in the broken variant).
fn pass(m: &Admission, s: &mut State, j: usize, t: usize) {
    let bucket = &mut s.buckets[j];
    let Ticket::Open { pos, due: true } = bucket.tickets[t] else {
        return;
    };
    if bucket.sealed {
        return;
    }
    bucket.tickets[t] = Ticket::Passed(pos);
    s.passes[pos as usize] += 1;
    if m.variant.pass_to_open_sale {
        bucket.stock += 1;
        s.reopened = true;
    } else {
        bucket.aside += 1;
    }
}

/// The purchase with the offer token of position `p`: the engine reads the
/// position's ticket at the list, `claim_offer.lua` at its bucket checks
/// the seal first ("closed", a replay too), then answers a taken record's
/// order, refuses a passed offer or one past its deadline, and takes an
/// open one with its order in one step. A user holds a token only for an
/// offer that was open (its standing mints it from the open record).
fn claim(s: &mut State, p: usize) {
    let Some((j, t)) = s.list.placed[p] else {
        return;
    };
    let bucket = &mut s.buckets[j as usize];
    let ticket = bucket.tickets[t as usize];
    if !matches!(
        ticket,
        Ticket::Open { .. } | Ticket::Taken(_) | Ticket::Passed(_) | Ticket::Closed(Some(_))
    ) {
        return;
    }
    s.told_line[p] = if bucket.sealed {
        Told::Closed
    } else {
        match ticket {
            Ticket::Taken(_) => Told::Bought,
            Ticket::Open { pos, due: false } if pos as usize == p => {
                bucket.tickets[t as usize] = Ticket::Taken(pos);
                s.claims[p] += 1;
                Told::Bought
            }
            _ => Told::Late,
        }
    };
}

/// The close of bucket `j`, once it settled the sagas homed there: sealed,
/// the live holds at it voided, and its stock, units aside and reserved or
/// open tickets retired as leftover (`retire.lua`: `stock + wl.units`).
fn close(b: &Bounds, s: &mut State, j: usize) {
    let homed = |r: usize| b.home(b.requests[r].0 as usize) == j;
    let settling = (0..s.reqs.len()).any(|r| homed(r) && s.reqs[r] == Rec::Pending);
    if s.buckets[j].sealed || settling {
        return;
    }
    let bucket = &mut s.buckets[j];
    bucket.sealed = true;
    let mut left = bucket.stock + bucket.aside + bucket.in_tickets() as u8;
    bucket.stock = 0;
    bucket.aside = 0;
    for ticket in bucket.tickets.iter_mut() {
        match *ticket {
            Ticket::Reserved => *ticket = Ticket::Closed(None),
            Ticket::Open { pos, .. } => *ticket = Ticket::Closed(Some(pos)),
            _ => {}
        }
    }
    for r in (0..s.reqs.len()).filter(|&r| homed(r)) {
        if s.orders[r] == Order::Held {
            s.orders[r] = Order::Void;
            left += 1;
        }
    }
    s.leftover += left;
}
