//! The multi-line order's steps: each one script on one slot (the user's
//! home, or one bucket of one pool), with its precondition and its effect.
//!
//! Any driver may take any step the store allows: the first driver, a retry
//! with the same request id, the sweeper. A step that would change nothing
//! (a replay, a refused compare-and-set) is not a transition. A step's read
//! of another slot is the driver's earlier read, which may be stale: a take
//! of the next line, and the commit, need every earlier line *taken once*
//! (its take record), not still taken.

use super::state::*;
use super::{Bounds, POOLS, Release};

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
                        stock: if j == 0 { b.stock[k] } else { 0 },
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

/// Every action (cheap: [`apply`] decides).
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
    }
}

/// Where a walk of order `r`'s line in pool `k` stops: the first bucket of
/// the ring whose marker it does not pass (a short one; in the broken
/// variant an undone one too), or none when it passes them all.
pub fn stop(p: &Release, s: &State, r: usize, k: usize, past_undone: bool) -> Option<usize> {
    p.bounds.ring(k, p.bounds.user(r)).find(|&j| {
        !matches!(
            (s.pools[k][j].markers[r], past_undone),
            (Marker::Short, _) | (Marker::Undone, true)
        )
    })
}

/// Whether order `r`'s line `k` is closed to every walk: its walk stops at
/// an undone marker, or passes every bucket.
pub fn closed(p: &Release, s: &State, r: usize, k: usize) -> bool {
    stop(p, s, r, k, false).is_none_or(|j| s.pools[k][j].markers[r] == Marker::Undone)
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
        Rec::Pending | Rec::Refused => {}
    }
}

/// `take.lua` at the bucket the line's walk stops at, once the order was
/// reserved and every earlier line taken: a unit and its marker, or a short
/// marker. A marker there already (its own take, an undone one) is replayed.
fn take(p: &Release, s: &mut State, r: usize, k: usize) {
    if matches!(s.reqs[r], Rec::None | Rec::Limit) || !taken_before(s, r, k) {
        return;
    }
    let Some(j) = stop(p, s, r, k, p.variant.walk_past_undone) else {
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
/// record with it. A line's take is undone only after a refusal, which the
/// compare-and-set excludes, so a commit that applies finds every take
/// standing.
fn commit(p: &Release, s: &mut State, r: usize) {
    let decidable = match s.reqs[r] {
        Rec::Pending => true,
        Rec::Refused | Rec::Released => p.variant.commit_unchecked,
        _ => false,
    };
    if decidable && taken_before(s, r, POOLS) {
        s.reqs[r] = Rec::Bought;
        s.bought[r] += 1;
        s.told[r] = Told::Bought;
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
    let Some(j) = stop(p, s, r, k, false) else {
        return; // every bucket short: no walk takes here
    };
    let bucket = &mut s.pools[k][j];
    match bucket.markers[r] {
        Marker::Taken => {
            bucket.stock += 1;
            s.lines[r][k].v += 1;
        }
        Marker::None => {}
        Marker::Short | Marker::Undone => return,
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
