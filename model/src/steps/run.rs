//! The steps of an engine's runs (`control::reshard`, `control::lifecycle::
//! close`): each is one store step (or, where noted, one per bucket of a
//! layout taken as one action), after which the engine may stop.
//!
//! A step answers how the run goes on: the next step, a jump (another pass
//! of the reshard's drain), or the end (done, fenced, the lease lost), when
//! the run releases the lease if it still holds it.

use super::{Outcome, Step, finish, release_hold};
use crate::Protocol;
use crate::state::*;

enum Next {
    Go,
    Jump(u8),
    End,
}

/// Takes engine `e`'s step `step` (the one at its program counter).
pub fn step(p: &Protocol, s: &mut State, e: usize, step: Step) {
    let Some(run) = s.engines[e] else { return };
    let program = p.program(run.kind);
    if program.get(run.pc as usize) != Some(&step) {
        return;
    }
    let t = run.token;
    let next = match step {
        Step::Begin => match s.meta.status {
            Status::OnSale if !s.meta.resharded => {
                s.meta.status = Status::Resharding;
                s.meta.resharded = true;
                Next::Go
            }
            Status::Resharding => Next::Go,
            _ => Next::End,
        },
        Step::InitNew => {
            for b in p.layout(1) {
                s.buckets[b].exists = true; // SET NX: stock 0 when created
            }
            Next::Go
        }
        Step::Fence => {
            // A reshard fences both layouts, a close every layout: here both,
            // in order, up to the first bucket that answers a higher fence
            // (`mover::take_over` stops there).
            let mut next = Next::Go;
            for b in 0..p.bounds.buckets() {
                let bk = &mut s.buckets[b];
                if bk.exists {
                    if bk.fence > t {
                        next = Next::End;
                        break;
                    }
                    bk.fence = t;
                }
            }
            next
        }
        Step::Seal(b) => {
            let bk = &mut s.buckets[b as usize];
            if bk.exists {
                bk.sealed = true;
            }
            Next::Go
        }
        Step::Settle(b) => {
            settle(p, s, b as usize);
            Next::Go
        }
        Step::Restore(j) => restore(p, s, j as usize, t),
        Step::Out(i) => out(p, s, i as usize, t, run.pass),
        Step::In(i) => transfer_in(s, i as usize, t, false),
        Step::Clear(i) => clear(s, i as usize, t),
        Step::CheckEmpty => {
            let empty = p.layout(0).all(|b| {
                let bk = &s.buckets[b];
                bk.stock == 0 && bk.xfer.iter().all(|j| !j.open)
            });
            let first_out = program
                .iter()
                .position(|s| matches!(s, Step::Out(_)))
                .expect("a reshard drains") as u8;
            if empty {
                Next::Go
            } else if run.pass < 1 {
                Next::Jump(first_out)
            } else {
                Next::End
            }
        }
        Step::Switch => {
            let holder = s.lease
                == Some(Lease {
                    owner: e as u8,
                    token: t,
                    lapsed: false,
                });
            if s.meta.status == Status::Resharding && holder {
                s.meta.status = Status::OnSale;
                s.meta.generation = 1;
            }
            Next::End
        }
        Step::Complete(b) => {
            let b = b as usize;
            if !s.buckets[b].exists || s.buckets[b].xfer.iter().all(|j| !j.open) {
                // "ST": a layout not created; or nothing open: `complete_open`
                // calls no step on the bucket (no CLEAR, so no fence raised:
                // a layout a stalled reshard created after the close fenced
                // stays unfenced, as in the store; the trace replay found it).
                Next::Go
            } else if s.buckets[b].fence > t {
                Next::End
            } else {
                match transfer_in(s, b, t, true) {
                    Next::End => Next::End,
                    _ => clear(s, b, t),
                }
            }
        }
        Step::Void(b) => {
            let b = b as usize;
            let current = s.buckets[b].generation == s.meta.generation;
            if s.buckets[b].exists && (current || p.variant.close_voids_every_layout) {
                for o in 0..p.bounds.requests() {
                    if s.buckets[b].idx[o] == Entry::Held {
                        release_hold(p, s, b, o, Entry::Expired);
                        s.ledger[o].e += 1;
                    }
                }
            }
            Next::Go
        }
        Step::Retire(b) => {
            let bk = &mut s.buckets[b as usize];
            if bk.exists && bk.sealed {
                s.leftover += bk.stock;
                bk.stock = 0;
            }
            Next::Go
        }
        Step::LedgerClose => {
            s.meta.ledger_closed = true;
            Next::End
        }
    };
    match next {
        Next::Go => {
            s.engines[e] = Some(Run {
                pc: run.pc + 1,
                ..run
            })
        }
        Next::Jump(pc) => {
            s.engines[e] = Some(Run {
                pc,
                pass: run.pass + 1,
                ..run
            })
        }
        Next::End => {
            s.engines[e] = None;
            if s.lease.is_some_and(|l| l.owner == e as u8 && l.token == t) {
                s.lease = None;
            }
        }
    }
}

/// `settle_pending` of every saga pending at bucket `b`: bought when its
/// markers show a take, else aborted.
fn settle(p: &Protocol, s: &mut State, b: usize) {
    if !s.buckets[b].exists {
        return;
    }
    for r in 0..p.bounds.requests() {
        if s.buckets[b].pend[r] {
            let g = s.buckets[b].generation;
            let took = p
                .layout(g)
                .any(|j| s.buckets[j].markers[r] == Marker::Taken);
            finish(
                p,
                s,
                r,
                if took {
                    Outcome::Bought
                } else {
                    Outcome::Abort
                },
            );
        }
    }
}

/// `restore.lua` into new bucket `j`: the users, orders and request records
/// the old layout keeps for whoever is homed at `j` now, fenced by `t`.
/// Each field only where `j` has none (`HSETNX`), or, in the variant before
/// 7a3d97b, over whatever is there (`HSET`, a hold's units counted when its
/// `ZADD` added it).
fn restore(p: &Protocol, s: &mut State, j: usize, t: u8) -> Next {
    if !s.buckets[j].exists || s.buckets[j].fence > t {
        return Next::End;
    }
    s.buckets[j].fence = t;
    let over = p.variant.restore_overwrites;
    for u in 0..p.bounds.users as usize {
        if p.home(1, u) != j {
            continue;
        }
        let from = p.home(0, u);
        if let Some(v) = s.buckets[from].users[u]
            && (over || s.buckets[j].users[u].is_none())
        {
            s.buckets[j].users[u] = Some(v);
        }
        let requests = p.bounds.requests_per_user as usize;
        for r in u * requests..(u + 1) * requests {
            let entry = s.buckets[from].idx[r];
            if entry != Entry::None && (over || s.buckets[j].idx[r] == Entry::None) {
                let bk = &mut s.buckets[j];
                let fresh = bk.idx[r] == Entry::None;
                bk.idx[r] = entry;
                if entry == Entry::Held && (fresh || (over && !bk.holds[r])) {
                    bk.holds[r] = true;
                    bk.hunits += 1;
                }
            }
            let rec = s.buckets[from].reqs[r];
            if rec != Rec::None && (over || s.buckets[j].reqs[r] == Rec::None) {
                s.buckets[j].reqs[r] = rec;
            }
        }
    }
    Next::Go
}

/// `transfer_out.lua` (drain, allowed on a sealed bucket): old bucket `i`'s
/// whole stock into the journal, towards new bucket `i mod n`.
fn out(p: &Protocol, s: &mut State, i: usize, t: u8, pass: u8) -> Next {
    let target = p.layout(1).start + i % p.bounds.new_buckets as usize;
    let bk = &mut s.buckets[i];
    if !bk.exists {
        return Next::Go;
    }
    if bk.fence > t {
        return Next::End;
    }
    bk.fence = t;
    let xid = Xid {
        source: i as u8,
        token: t,
        pass,
    };
    if bk.stock > 0 && bk.xfer.iter().all(|j| j.xid != xid) {
        bk.xfer.push(Journal {
            xid,
            target: target as u8,
            units: bk.stock,
            open: true,
        });
        bk.stock = 0;
    }
    Next::Go
}

/// `transfer_in.lua` of every open transfer out of bucket `i`; with
/// `sealed_ok`, a takeover completing what another mover left open, which a
/// sealed target takes too (`mover::complete`).
fn transfer_in(s: &mut State, i: usize, t: u8, sealed_ok: bool) -> Next {
    let open: Vec<Journal> = s.buckets[i]
        .xfer
        .iter()
        .filter(|j| j.open)
        .copied()
        .collect();
    for j in open {
        let tb = &mut s.buckets[j.target as usize];
        if !tb.exists || (tb.sealed && !sealed_ok) || tb.fence > t {
            return Next::End;
        }
        tb.fence = t;
        if !tb.xin.contains(&j.xid) {
            tb.xin.push(j.xid);
            tb.stock += j.units;
        }
    }
    Next::Go
}

/// `transfer_clear.lua` of every transfer out of `i` its target applied.
fn clear(s: &mut State, i: usize, t: u8) -> Next {
    if !s.buckets[i].exists || s.buckets[i].fence > t {
        return Next::End;
    }
    s.buckets[i].fence = t;
    let xfer = s.buckets[i].xfer.clone();
    for (n, j) in xfer.iter().enumerate() {
        if j.open && s.buckets[j.target as usize].xin.contains(&j.xid) {
            s.buckets[i].xfer[n].open = false;
        }
    }
    Next::Go
}
