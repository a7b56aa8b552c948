//! The multi-line order's steps: each one script on one slot (the user's
//! home, or one bucket of one pool), with its precondition and its effect.
//!
//! Any driver may take any step the store allows: the first driver, a retry
//! with the same request id, the sweeper. A step that would change nothing
//! (a replay, a refused compare-and-set) is not a transition. A step's read
//! of another slot is the driver's earlier read, which may be stale: a take
//! of the next line, and the commit, need every earlier line *taken once*
//! (its take record), not still taken.
//!
//! A held order's steps (a release with holds): the decision of an open
//! hold at the home, each line's confirm or give-back in its pool, and the
//! record's end.

use super::state::*;
use super::{Bounds, POOLS, Release, Variant};

/// One transition of the model.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// At the user's home: answer from the order's record, or reserve its
    /// units under the limit and leave a pending record (or refuse: limit).
    Reserve(u8),
    /// The walk of an order's line (a pool) takes its next step: one
    /// `take.lua` at the first bucket of the ring it has not passed.
    Take(u8, u8),
    /// At the home: pending → bought, the order's record written.
    Commit(u8),
    /// At the home: pending → refused, the refusal's record written.
    Abort(u8),
    /// The undo of a refused order's line takes its next step: one untake at
    /// the first bucket of the ring a walk has not passed.
    Undo(u8, u8),
    /// At the home: refused → released, the units back under the limit,
    /// once every line is closed.
    Release(u8),
    /// At the home: an open hold → confirming (the buyer's confirm).
    Confirm(u8),
    /// At the home: an open hold → cancelling (the buyer's cancel).
    Cancel(u8),
    /// At the home: an open hold → expiring (its deadline passed).
    Expire(u8),
    /// The confirm of a confirming order's line takes its next step: one
    /// `confirm_line.lua` at the first bucket of the ring holding the
    /// line's take (`T` → `K`) or its confirmed marker.
    ConfirmLine(u8, u8),
    /// The give-back of a cancelling or expiring order's line takes its
    /// next step: one `undo_line.lua` (held) at the first bucket of the
    /// ring holding the line's take (`T` → `U`, the unit back) or its
    /// undone marker.
    GiveBack(u8, u8),
    /// At the home, once every line is finished: confirming → confirmed
    /// (`move_hold`), or cancelling / expiring → cancelled / expired with
    /// the units back under the limit (`release_order`).
    End(u8),
}

/// Units of an order: one a line, one line a pool.
const QTY: u8 = POOLS as u8;

/// The release before any order: each pool's units in its first bucket.
pub fn initial(b: &Bounds) -> State {
    let orders = b.requests();
    State {
        pools: (0..POOLS)
            .map(|k| {
                (0..b.buckets[k])
                    .map(|j| Bucket {
                        stock: b.stock[k][j as usize],
                        markers: vec![Marker::None; orders],
                    })
                    .collect()
            })
            .collect(),
        users: vec![0; b.orders.len()],
        reqs: vec![Rec::None; orders],
        lines: vec![vec![Line::default(); POOLS]; orders],
        bought: vec![0; orders],
        refused: vec![0; orders],
        told: vec![Told::None; orders],
    }
}

/// Every action (cheap: [`apply`] decides). The holds' actions only on a
/// release with holds.
pub fn candidates(b: &Bounds, out: &mut Vec<Action>) {
    for r in 0..b.requests() as u8 {
        out.extend([
            Action::Reserve(r),
            Action::Commit(r),
            Action::Abort(r),
            Action::Release(r),
        ]);
        for k in 0..POOLS as u8 {
            out.extend([Action::Take(r, k), Action::Undo(r, k)]);
        }
        if b.holds {
            out.extend([
                Action::Confirm(r),
                Action::Cancel(r),
                Action::Expire(r),
                Action::End(r),
            ]);
            for k in 0..POOLS as u8 {
                out.extend([Action::ConfirmLine(r, k), Action::GiveBack(r, k)]);
            }
        }
    }
}

/// Where a walk of order `r`'s line in pool `k` stops: the first bucket of
/// the ring whose marker it does not pass (a short one; in the broken
/// variants an undone or a confirmed one too), or none when it passes them
/// all.
pub fn stop(p: &Release, s: &State, r: usize, k: usize, variant: Variant) -> Option<usize> {
    p.bounds
        .ring(k, p.bounds.user(r))
        .find(|&j| !match s.pools[k][j].markers[r] {
            Marker::Short => true,
            Marker::Undone => variant.walk_past_undone,
            Marker::Confirmed => variant.walk_past_confirmed,
            Marker::None | Marker::Taken => false,
        })
}

/// Where a held order's confirm or give-back of line `k` stops: the first
/// bucket of the ring with the line's take or `at`, the marker that step
/// leaves (a bucket with neither is one the walk passed, or a marker of the
/// other step, which these scripts pass), or none.
pub fn finish_stop(p: &Release, s: &State, r: usize, k: usize, at: Marker) -> Option<usize> {
    p.bounds.ring(k, p.bounds.user(r)).find(|&j| {
        let m = s.pools[k][j].markers[r];
        m == Marker::Taken || m == at
    })
}

/// Whether order `r`'s line `k` is closed to every walk: its walk stops at
/// an undone marker, or passes every bucket.
pub fn closed(p: &Release, s: &State, r: usize, k: usize) -> bool {
    stop(p, s, r, k, Variant::DESIGNED).is_none_or(|j| s.pools[k][j].markers[r] == Marker::Undone)
}

/// Whether a held order's line `k` is finished by the step that leaves
/// `at`: its walk finds no take before that marker.
pub fn finished(p: &Release, s: &State, r: usize, k: usize, at: Marker) -> bool {
    finish_stop(p, s, r, k, at).is_none_or(|j| s.pools[k][j].markers[r] == at)
}

/// Whether every line before `k` was taken once (its take record).
fn taken_before(s: &State, r: usize, k: usize) -> bool {
    s.lines[r][..k].iter().all(|l| l.t > 0)
}

/// Applies `a` to `s` (unchanged when the step refuses or changes nothing).
pub fn apply(p: &Release, s: &mut State, a: Action) {
    match a {
        Action::Reserve(r) => reserve(p, s, r as usize),
        Action::Take(r, k) => take(p, s, r as usize, k as usize),
        Action::Commit(r) => commit(p, s, r as usize),
        Action::Abort(r) => abort(p, s, r as usize),
        Action::Undo(r, k) => undo(p, s, r as usize, k as usize),
        Action::Release(r) => {
            let r = r as usize;
            if s.reqs[r] == Rec::Refused && (0..POOLS).all(|k| closed(p, s, r, k)) {
                release(p, s, r);
            }
        }
        Action::Confirm(r) => decide_hold(s, r as usize, Hold::Confirming),
        Action::Cancel(r) => decide_hold(s, r as usize, Hold::Cancelling),
        Action::Expire(r) => decide_hold(s, r as usize, Hold::Expiring),
        Action::ConfirmLine(r, k) => confirm_line(p, s, r as usize, k as usize),
        Action::GiveBack(r, k) => give_back(p, s, r as usize, k as usize),
        Action::End(r) => end(p, s, r as usize),
    }
}

/// The home step: a known request is answered from its record (a pending or
/// refused one is driven on by the other steps); a new one reserves.
fn reserve(p: &Release, s: &mut State, r: usize) {
    let u = p.bounds.user(r);
    match s.reqs[r] {
        Rec::None if s.users[u] + QTY > p.bounds.limit => {
            s.reqs[r] = Rec::Limit;
            s.told[r] = Told::Limit;
        }
        Rec::None => {
            s.users[u] += QTY;
            s.reqs[r] = Rec::Pending;
        }
        Rec::Limit => s.told[r] = Told::Limit,
        Rec::Bought => s.told[r] = Told::Bought,
        Rec::Released => s.told[r] = Told::Refused,
        Rec::Confirmed => s.told[r] = Told::Confirmed,
        Rec::Cancelled => s.told[r] = Told::Cancelled,
        Rec::Expired => s.told[r] = Told::Expired,
        Rec::Pending | Rec::Refused | Rec::Held(_) => {}
    }
}

/// `take.lua` at the bucket the line's walk stops at, once the order was
/// reserved and every earlier line taken: a unit and its marker, or a short
/// marker. A marker there already (its own take, an undone or a confirmed
/// one) is replayed. A walk may run late, after the order was decided: its
/// driver read the record pending before.
fn take(p: &Release, s: &mut State, r: usize, k: usize) {
    if matches!(s.reqs[r], Rec::None | Rec::Limit) || !taken_before(s, r, k) {
        return;
    }
    let Some(j) = stop(p, s, r, k, p.variant) else {
        return; // short everywhere: the driver aborts
    };
    let bucket = &mut s.pools[k][j];
    if bucket.markers[r] != Marker::None {
        return;
    }
    if bucket.stock >= 1 {
        bucket.stock -= 1;
        bucket.markers[r] = Marker::Taken;
        s.lines[r][k].t += 1;
    } else {
        bucket.markers[r] = Marker::Short;
    }
}

/// The commit: a driver (or the sweeper) that saw every line taken
/// compare-and-sets the record from pending to bought and writes the order's
/// record with it (on a release with holds, pending to held and open). A
/// line's take is undone only after a refusal, which the compare-and-set
/// excludes, so a commit that applies finds every take standing.
fn commit(p: &Release, s: &mut State, r: usize) {
    let decidable = match s.reqs[r] {
        Rec::Pending => true,
        Rec::Refused | Rec::Released => p.variant.commit_unchecked,
        _ => false,
    };
    if decidable && taken_before(s, r, POOLS) {
        s.bought[r] += 1;
        if p.bounds.holds {
            s.reqs[r] = Rec::Held(Hold::Open);
        } else {
            s.reqs[r] = Rec::Bought;
            s.told[r] = Told::Bought;
        }
    }
}

/// The abort: a driver whose line is short everywhere, or the sweeper that
/// finds the order stale, compare-and-sets pending to refused.
fn abort(p: &Release, s: &mut State, r: usize) {
    if s.reqs[r] != Rec::Pending {
        return;
    }
    s.reqs[r] = Rec::Refused;
    s.refused[r] += 1;
    if p.variant.release_at_decision {
        release(p, s, r);
    }
}

/// The untake at the bucket the line's walk stops at, once the order was
/// refused: a take there is given back (with its void record), a bucket no
/// walk reached is closed to a late one; an undone marker is replayed.
fn undo(p: &Release, s: &mut State, r: usize, k: usize) {
    if !matches!(s.reqs[r], Rec::Refused | Rec::Released) {
        return;
    }
    let Some(j) = stop(p, s, r, k, Variant::DESIGNED) else {
        return; // every bucket short: no walk takes here
    };
    let bucket = &mut s.pools[k][j];
    match bucket.markers[r] {
        Marker::Taken => {
            bucket.stock += 1;
            s.lines[r][k].v += 1;
        }
        Marker::None => {}
        Marker::Short | Marker::Undone | Marker::Confirmed => return,
    }
    bucket.markers[r] = Marker::Undone;
}

/// Refused → released: the order's units back under the user's limit.
fn release(p: &Release, s: &mut State, r: usize) {
    let u = p.bounds.user(r);
    s.users[u] = s.users[u].saturating_sub(QTY);
    s.reqs[r] = Rec::Released;
    s.told[r] = Told::Refused;
}

/// The compare-and-set of an open hold to `next` (`move_hold`): the one
/// decision of a held order.
fn decide_hold(s: &mut State, r: usize, next: Hold) {
    if s.reqs[r] == Rec::Held(Hold::Open) {
        s.reqs[r] = Rec::Held(next);
    }
}

/// `confirm_line.lua` at the bucket the confirm's walk stops at, once the
/// order is confirming: the take there confirmed (`T` → `K`) with its
/// confirm record; a confirmed marker is replayed.
fn confirm_line(p: &Release, s: &mut State, r: usize, k: usize) {
    if s.reqs[r] != Rec::Held(Hold::Confirming) {
        return;
    }
    if let Some(j) = finish_stop(p, s, r, k, Marker::Confirmed)
        && s.pools[k][j].markers[r] == Marker::Taken
    {
        s.pools[k][j].markers[r] = Marker::Confirmed;
        s.lines[r][k].c += 1;
    }
}

/// `undo_line.lua` for a held order at the bucket the give-back's walk
/// stops at, once the order is cancelling or expiring: the take there
/// given back (`T` → `U`, the unit back) with its cancel or expiry record;
/// an undone marker is replayed. A bucket without a marker is passed, not
/// closed: every line of a held order was taken before its commit.
fn give_back(p: &Release, s: &mut State, r: usize, k: usize) {
    if !matches!(s.reqs[r], Rec::Held(Hold::Cancelling | Hold::Expiring)) {
        return;
    }
    if let Some(j) = finish_stop(p, s, r, k, Marker::Undone)
        && s.pools[k][j].markers[r] == Marker::Taken
    {
        let bucket = &mut s.pools[k][j];
        bucket.markers[r] = Marker::Undone;
        bucket.stock += 1;
        s.lines[r][k].g += 1;
    }
}

/// A decided hold's end, once its driver finished every line: confirming
/// → confirmed; cancelling or expiring → cancelled or expired, the order's
/// units back under the user's limit.
fn end(p: &Release, s: &mut State, r: usize) {
    let (at, ended, told) = match s.reqs[r] {
        Rec::Held(Hold::Confirming) => (Marker::Confirmed, Rec::Confirmed, Told::Confirmed),
        Rec::Held(Hold::Cancelling) => (Marker::Undone, Rec::Cancelled, Told::Cancelled),
        Rec::Held(Hold::Expiring) => (Marker::Undone, Rec::Expired, Told::Expired),
        _ => return,
    };
    if !(0..POOLS).all(|k| finished(p, s, r, k, at)) {
        return;
    }
    if at == Marker::Undone {
        let u = p.bounds.user(r);
        s.users[u] = s.users[u].saturating_sub(QTY);
    }
    s.reqs[r] = ended;
    s.told[r] = told;
}
