//! The actions: one store step each, with its script's precondition and
//! effect, and the two runs an engine drives (a reshard, a close) as
//! programs of steps an engine may stop after.
//!
//! An action that would change nothing (a refused step, a replay already
//! answered) is not a transition: [`crate::Protocol`] drops it. Clients,
//! sagas' drivers and the sweepers keep no state of their own beyond what
//! the store and the answers hold, so a step any of them could take next is
//! enabled whenever the store allows it: a driver that died and a retry
//! that re-drives are the same action taken later, or never.
//!
//! `tests/it/model_replay.rs` (the service's tests) holds these effects to
//! the scripts: it replays random traces of these actions as the store
//! steps they stand for, on every backend, and compares the store with the
//! model's state after each one. A change to a step here or to its script
//! there that makes them differ fails it at that step.

use crate::state::*;
use crate::{Bounds, Protocol};

/// How a saga ends at its home bucket (`finish.lua`'s outcome).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    Bought,
    SoldOut,
    Abort,
}

/// One step of a run, in the order the run takes them.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Step {
    /// `begin_reshard.lua`: on sale → resharding (or resumed).
    Begin,
    /// `init_bucket.lua` for every bucket of the new layout (`SET NX`).
    InitNew,
    /// `raise_fence.lua` on every bucket of the run's layouts.
    Fence,
    /// `seal.lua` on one bucket.
    Seal(u8),
    /// `settle_pending` of every saga pending at one bucket (`finish.lua`:
    /// bought when its markers show a take, else aborted).
    Settle(u8),
    /// `restore.lua` into one new bucket of everything the old layout keeps
    /// about the users, orders and requests homed there now.
    Restore(u8),
    /// `transfer_out.lua` (drain) of one old bucket's stock.
    Out(u8),
    /// `transfer_in.lua` of one old bucket's open transfers.
    In(u8),
    /// `transfer_clear.lua` of one old bucket's applied transfers.
    Clear(u8),
    /// The run reads the old layout: empty, or another pass.
    CheckEmpty,
    /// `end_reshard.lua`: the switch, under the lease.
    Switch,
    /// A close's `mover::take_over` of one bucket's open transfers (IN, CLEAR).
    Complete(u8),
    /// `expire_holds.lua` with `void`.
    Void(u8),
    /// `retire.lua`: the stock into a leftover record.
    Retire(u8),
    /// The flusher drains, the ledger closes the event.
    LedgerClose,
}

/// One transition of the model.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// `purchase.lua` at the request's home in the current layout.
    Purchase(u8),
    /// `take.lua`: one probe of the request's saga at a bucket.
    Take(u8, u8),
    /// `finish.lua` at the saga's home.
    Finish(u8, Outcome),
    /// `untake.lua` of the saga's take at a bucket.
    Untake(u8, u8),
    /// The clock passes an order's pay-by deadline.
    Due(u8),
    /// `expire_holds.lua` (the sweeper) of one order at a bucket.
    Expire(u8, u8),
    /// `confirm.lua` at the order's home in the current layout.
    Confirm(u8),
    /// `cancel.lua` at the order's home in the current layout.
    Cancel(u8),
    /// An engine takes the mover lease and starts (or resumes) the reshard.
    StartReshard(u8),
    /// An engine sets the status closed and seizes the lease.
    StartClose(u8),
    /// An engine takes the next step of its run.
    Run(u8, Step),
    /// An engine stops: its run is forgotten, its lease stays until it lapses.
    Crash(u8),
    /// The lease's TTL runs out.
    LeaseLapse,
}

/// The steps of a run.
pub fn program(b: &Bounds, kind: RunKind) -> Vec<Step> {
    let old = 0..b.old_buckets;
    let all = 0..b.buckets() as u8;
    let mut p = Vec::new();
    match kind {
        RunKind::Reshard => {
            p.extend([Step::Begin, Step::InitNew, Step::Fence]);
            p.extend(old.clone().map(Step::Seal));
            p.extend(old.clone().map(Step::Settle));
            p.extend((b.old_buckets..b.buckets() as u8).map(Step::Restore));
            for i in old {
                p.extend([Step::Out(i), Step::In(i), Step::Clear(i)]);
            }
            p.extend([Step::CheckEmpty, Step::Switch]);
        }
        RunKind::Close => {
            p.push(Step::Fence);
            p.extend(all.clone().map(Step::Complete));
            p.extend(all.clone().map(Step::Seal));
            p.extend(all.clone().map(Step::Settle));
            p.extend(all.clone().map(Step::Void));
            p.extend(all.map(Step::Retire));
            p.push(Step::LedgerClose);
        }
    }
    p
}

/// The event as a rebalancer may leave it: layout 0 with every unit in its
/// first bucket (so a buyer homed elsewhere goes through the saga), layout 1
/// not created yet.
pub fn initial(b: &Bounds) -> State {
    let (users, reqs) = (b.users as usize, b.requests());
    let bucket = |generation: u8, index: u8, stock: u8, exists: bool| Bucket {
        generation,
        index,
        exists,
        sealed: false,
        stock,
        fence: 0,
        users: vec![None; users],
        idx: vec![Entry::None; reqs],
        holds: vec![false; reqs],
        hunits: 0,
        reqs: vec![Rec::None; reqs],
        pend: vec![false; reqs],
        markers: vec![Marker::None; reqs],
        xfer: Vec::new(),
        xin: Vec::new(),
    };
    let n = b.old_buckets;
    let mut buckets: Vec<Bucket> = (0..n)
        .map(|i| bucket(0, i, if i == 0 { b.stock } else { 0 }, true))
        .collect();
    buckets.extend((0..b.new_buckets).map(|i| bucket(1, i, 0, false)));
    State {
        buckets,
        meta: Meta {
            status: Status::OnSale,
            generation: 0,
            resharded: false,
            ledger_closed: false,
        },
        lease: None,
        next_token: 1,
        engines: vec![None; b.engines as usize],
        faults_left: b.faults,
        starts_left: 2 + 2 * b.faults,
        due: vec![false; reqs],
        ledger: vec![Records::default(); reqs],
        leftover: 0,
        told: vec![Told::None; reqs],
        paid: vec![Told::None; reqs],
        saga: vec![None; reqs],
    }
}

impl Protocol {
    /// Buckets in the layout of `generation`.
    pub fn layout(&self, generation: u8) -> std::ops::Range<usize> {
        let n0 = self.bounds.old_buckets as usize;
        if generation == 0 {
            0..n0
        } else {
            n0..self.bounds.buckets()
        }
    }

    /// The user of a request (and of its order).
    pub fn user(&self, r: usize) -> usize {
        r / self.bounds.requests_per_user as usize
    }

    /// A user's home bucket in a layout (`home(user_hash, n)`).
    pub fn home(&self, generation: u8, user: usize) -> usize {
        let l = self.layout(generation);
        l.start + user % l.len()
    }
}

/// Every action worth trying in `s` (cheap guards only; [`apply`] decides).
pub fn candidates(p: &Protocol, s: &State, out: &mut Vec<Action>) {
    let reqs = p.bounds.requests() as u8;
    let all = p.bounds.buckets() as u8;
    for r in 0..reqs {
        let ri = r as usize;
        if s.told[ri] == Told::None && s.meta.status == Status::OnSale {
            out.push(Action::Purchase(r));
        }
        if let Some(g) = s.saga[ri] {
            for j in p.layout(g) {
                out.push(Action::Take(r, j as u8));
                out.push(Action::Untake(r, j as u8));
            }
            for o in [Outcome::Bought, Outcome::SoldOut, Outcome::Abort] {
                out.push(Action::Finish(r, o));
            }
        }
        if s.ledger[ri].t > 0 {
            out.push(Action::Due(r));
            if s.due[ri] {
                for b in 0..all {
                    if s.buckets[b as usize].holds[ri] {
                        out.push(Action::Expire(b, r));
                    }
                }
            }
        }
        if s.told[ri] == Told::Bought {
            out.push(Action::Confirm(r));
            if p.bounds.cancels {
                out.push(Action::Cancel(r));
            }
        }
    }
    for e in 0..p.bounds.engines {
        match s.engines[e as usize] {
            Some(run) => {
                out.push(Action::Run(e, p.program(run.kind)[run.pc as usize]));
                out.push(Action::Crash(e));
            }
            None => {
                out.push(Action::StartReshard(e));
                out.push(Action::StartClose(e));
            }
        }
    }
    out.push(Action::LeaseLapse);
}

/// Applies `a` to `s` (unchanged when the step refuses or changes nothing).
pub fn apply(p: &Protocol, s: &mut State, a: Action) {
    match a {
        Action::Purchase(r) => purchase(p, s, r as usize),
        Action::Take(r, j) => take(p, s, r as usize, j as usize),
        Action::Finish(r, o) => finish(p, s, r as usize, o),
        Action::Untake(r, j) => untake(p, s, r as usize, j as usize),
        Action::Due(o) => {
            let o = o as usize;
            if s.buckets.iter().any(|b| b.idx[o] == Entry::Held) {
                s.due[o] = true;
            }
        }
        Action::Expire(b, o) => {
            let (b, o) = (b as usize, o as usize);
            let layout_ok =
                p.variant.expiry_any_layout || s.buckets[b].generation == s.meta.generation;
            let bk = &s.buckets[b];
            if layout_ok && bk.exists && !bk.sealed && bk.holds[o] && s.due[o] {
                s.buckets[b].holds[o] = false;
                if s.buckets[b].idx[o] == Entry::Held {
                    release_hold(p, s, b, o, Entry::Expired);
                    s.ledger[o].e += 1;
                }
            }
        }
        Action::Confirm(o) => confirm(p, s, o as usize),
        Action::Cancel(o) => cancel(p, s, o as usize),
        Action::StartReshard(e) => {
            let resumable = match s.meta.status {
                Status::OnSale => !s.meta.resharded,
                Status::Resharding => true,
                Status::Closed => false,
            };
            if p.bounds.reshard && resumable && lease_free(s) {
                start(s, e, RunKind::Reshard);
            }
        }
        Action::StartClose(e) => {
            let closing = s
                .engines
                .iter()
                .any(|r| r.is_some_and(|r| r.kind == RunKind::Close));
            if p.bounds.close && !s.meta.ledger_closed && !closing {
                // set_closed: a compare-and-set from whatever the status is.
                s.meta.status = Status::Closed;
                start(s, e, RunKind::Close);
            }
        }
        Action::Run(e, step) => crate::steps::run::step(p, s, e as usize, step),
        Action::Crash(e) => {
            if s.faults_left > 0 && s.engines[e as usize].is_some() {
                s.engines[e as usize] = None;
                s.faults_left -= 1;
            }
        }
        Action::LeaseLapse => {
            if let Some(l) = s.lease.as_mut().filter(|l| !l.lapsed && s.faults_left > 0) {
                l.lapsed = true;
                s.faults_left -= 1;
            }
        }
    }
}

fn lease_free(s: &State) -> bool {
    s.lease.is_none_or(|l| l.lapsed)
}

/// Takes a fresh token (the lease's counter) and starts a run.
fn start(s: &mut State, e: u8, kind: RunKind) {
    if s.starts_left == 0 || s.engines[e as usize].is_some() {
        return;
    }
    let token = s.next_token;
    s.next_token += 1;
    s.starts_left -= 1;
    s.lease = Some(Lease {
        owner: e,
        token,
        lapsed: false,
    });
    s.engines[e as usize] = Some(Run {
        kind,
        token,
        pc: 0,
        pass: 0,
    });
}

/// `purchase.lua` (events with holds, one unit).
fn purchase(p: &Protocol, s: &mut State, r: usize) {
    if s.meta.status != Status::OnSale || s.told[r] != Told::None || s.saga[r].is_some() {
        return;
    }
    let g = s.meta.generation;
    let u = p.user(r);
    let h = p.home(g, u);
    let b = &mut s.buckets[h];
    if !b.exists || b.sealed {
        return; // "ST": the engine reloads and waits
    }
    let held = b.users[u].unwrap_or(0);
    match b.reqs[r] {
        Rec::Bought => s.told[r] = Told::Bought,
        Rec::SoldOut => s.told[r] = Told::SoldOut,
        Rec::Limit => s.told[r] = Told::Limit,
        Rec::Pending => {}
        Rec::None if p.bounds.limit.is_some_and(|l| held + 1 > l) => {
            b.reqs[r] = Rec::Limit;
            s.told[r] = Told::Limit;
        }
        Rec::None if b.stock >= 1 => {
            b.stock -= 1;
            b.users[u] = Some(held + 1);
            b.idx[r] = Entry::Held;
            b.holds[r] = true;
            b.hunits += 1;
            b.reqs[r] = Rec::Bought;
            s.ledger[r].t += 1;
            s.told[r] = Told::Bought;
        }
        Rec::None => {
            // "P": the quota reserved, the pending record, the pend set.
            b.users[u] = Some(held + 1);
            b.reqs[r] = Rec::Pending;
            b.pend[r] = true;
            s.saga[r] = Some(g);
        }
    }
}

/// `take.lua` (one pass).
fn take(p: &Protocol, s: &mut State, r: usize, j: usize) {
    let Some(g) = s.saga[r] else { return };
    let h = p.home(g, p.user(r));
    let b = &s.buckets[j];
    if b.generation != g
        || s.buckets[h].reqs[r] != Rec::Pending
        || !b.exists
        || b.sealed
        || b.markers[r] != Marker::None
    {
        return;
    }
    let b = &mut s.buckets[j];
    if b.stock >= 1 {
        b.stock -= 1;
        b.markers[r] = Marker::Taken;
        s.ledger[r].t += 1;
    } else {
        b.markers[r] = Marker::Short;
    }
}

/// `finish.lua` at the saga's home (also what `settle_pending` calls).
pub(crate) fn finish(p: &Protocol, s: &mut State, r: usize, outcome: Outcome) {
    let Some(g) = s.saga[r] else { return };
    let u = p.user(r);
    let h = p.home(g, u);
    if !s.buckets[h].exists || s.buckets[h].reqs[r] != Rec::Pending {
        return; // "ST", or {"R", record} / {"NR"}: nothing changes
    }
    let layout = p.layout(g);
    let took = s.buckets[layout.clone()]
        .iter()
        .any(|b| b.markers[r] == Marker::Taken);
    let short = s.buckets[layout]
        .iter()
        .all(|b| b.markers[r] == Marker::Short);
    let b = &mut s.buckets[h];
    match outcome {
        Outcome::Bought if took => {
            b.idx[r] = Entry::Held;
            b.holds[r] = true;
            b.hunits += 1;
            b.reqs[r] = Rec::Bought;
            s.ledger[r].h += 1;
            s.told[r] = Told::Bought;
        }
        Outcome::SoldOut if short => {
            b.users[u] = b.users[u].map(|n| n.saturating_sub(1));
            b.reqs[r] = Rec::SoldOut;
            s.told[r] = Told::SoldOut;
        }
        // The sweeper (and a close or reshard settling) aborts only a saga
        // whose markers show no take; a driver gives up only without one.
        // Its read of the markers and the abort are two steps, but a driver
        // stops probing at half the markers' lifetime, long before a sweeper
        // finds the saga stale: the model takes them as one.
        Outcome::Abort if !took => {
            b.users[u] = b.users[u].map(|n| n.saturating_sub(1));
            b.reqs[r] = Rec::None;
            s.told[r] = Told::TryAgain;
        }
        _ => return,
    }
    s.buckets[h].pend[r] = false;
}

/// `untake.lua`: a driver gives back a take its saga did not end with.
fn untake(p: &Protocol, s: &mut State, r: usize, j: usize) {
    let Some(g) = s.saga[r] else { return };
    let h = p.home(g, p.user(r));
    let rec = s.buckets[h].reqs[r];
    let b = &mut s.buckets[j];
    if b.generation != g
        || !b.exists
        || b.markers[r] != Marker::Taken
        || matches!(rec, Rec::Pending | Rec::Bought)
    {
        return;
    }
    b.markers[r] = Marker::Untaken;
    b.stock += 1;
    s.ledger[r].v += 1;
}

/// A held order's units back in its bucket's stock, its entry `to`, its
/// buyer's count down (expiry, void, cancel of a hold).
pub(crate) fn release_hold(p: &Protocol, s: &mut State, b: usize, o: usize, to: Entry) {
    let u = p.user(o);
    let bk = &mut s.buckets[b];
    bk.idx[o] = to;
    bk.holds[o] = false;
    bk.hunits = bk.hunits.saturating_sub(1);
    bk.stock += 1;
    bk.users[u] = bk.users[u].map(|n| n.saturating_sub(1));
}

/// `confirm.lua`: confirms before the deadline, expires after it.
fn confirm(p: &Protocol, s: &mut State, o: usize) {
    let h = p.home(s.meta.generation, p.user(o));
    let b = &s.buckets[h];
    if !b.exists || b.sealed {
        return;
    }
    match b.idx[o] {
        Entry::Held if !s.due[o] => {
            let b = &mut s.buckets[h];
            b.idx[o] = Entry::Confirmed;
            b.holds[o] = false;
            b.hunits = b.hunits.saturating_sub(1);
            s.ledger[o].k += 1;
            s.paid[o] = Told::Confirmed;
        }
        Entry::Held => {
            release_hold(p, s, h, o, Entry::Expired);
            s.ledger[o].e += 1;
            s.paid[o] = Told::Expired;
        }
        Entry::Confirmed => s.paid[o] = Told::Confirmed,
        Entry::Expired => s.paid[o] = Told::Expired,
        Entry::Cancelled => s.paid[o] = Told::Cancelled,
        Entry::None => {}
    }
}

/// `cancel.lua`: a held or confirmed order's units back at its home.
fn cancel(p: &Protocol, s: &mut State, o: usize) {
    if !p.bounds.cancels {
        return;
    }
    let h = p.home(s.meta.generation, p.user(o));
    let b = &s.buckets[h];
    if !b.exists || b.sealed {
        return;
    }
    match b.idx[o] {
        Entry::Held => {
            release_hold(p, s, h, o, Entry::Cancelled);
            s.ledger[o].c += 1;
            s.paid[o] = Told::Cancelled;
        }
        Entry::Confirmed => {
            let u = p.user(o);
            let b = &mut s.buckets[h];
            b.idx[o] = Entry::Cancelled;
            b.stock += 1;
            b.users[u] = b.users[u].map(|n| n.saturating_sub(1));
            s.ledger[o].c += 1;
            s.paid[o] = Told::Cancelled;
        }
        Entry::Cancelled => s.paid[o] = Told::Cancelled,
        Entry::Expired => s.paid[o] = Told::Expired,
        Entry::None => {}
    }
}

pub mod run;
