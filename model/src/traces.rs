//! The checker's fixed traces: the two read-found defects, as the checker
//! found them in the variants that bring them back, a release's commit
//! without its compare-and-set and its late walk past a confirmed take,
//! and fair drops' token checked before the
//! take and passed offer put back on sale. `model/tests/traces.rs` plays
//! them on the model; the trace replay (`tests/it/model_replay`) plays the
//! event's two on the stores (the release's and fair drops' come with their
//! builds).

use crate::steps::Action::{self, *};
use crate::steps::Step::*;
use crate::{admission, release};

/// A reshard restores a hold into the new layout, the sweeper expires it
/// there, the run stalls (its lease lapses) and the next run restores the
/// hold again from the sealed old layout: before 7a3d97b the second restore
/// overwrote the expired entry and the hold expired twice (its unit back on
/// sale twice). Found by the checker in 24 steps.
pub const RESURRECTED: &[Action] = &[
    Purchase(0),
    StartReshard(1),
    Run(1, Begin),
    Run(1, InitNew),
    Run(1, Fence),
    Run(1, Seal(0)),
    Run(1, Seal(1)),
    Run(1, Settle(0)),
    Due(0),
    Run(1, Settle(1)),
    Run(1, Restore(2)),
    Expire(2, 0),
    LeaseLapse,
    StartReshard(0),
    Run(0, Begin),
    Run(0, InitNew),
    Run(0, Fence),
    Run(0, Seal(0)),
    Run(0, Seal(1)),
    Run(0, Settle(0)),
    Run(0, Settle(1)),
    Run(0, Restore(2)),
];

/// The sale moves to the new layout, the buyer pays there, and the close
/// voids every layout: before 7a3d97b the old layout's copy of the hold was
/// voided, and the paid order got an expiry too.
pub const PAID_THEN_CLOSED: &[Action] = &[
    Purchase(0),
    StartReshard(1),
    Run(1, Begin),
    Run(1, InitNew),
    Run(1, Fence),
    Run(1, Seal(0)),
    Run(1, Seal(1)),
    Run(1, Settle(0)),
    Run(1, Settle(1)),
    Run(1, Restore(2)),
    Run(1, Restore(3)),
    Run(1, Out(0)),
    Run(1, In(0)),
    Run(1, Clear(0)),
    Run(1, Out(1)),
    Run(1, In(1)),
    Run(1, Clear(1)),
    Run(1, CheckEmpty),
    Run(1, Switch),
    Confirm(0),
    StartClose(0),
    Run(0, Fence),
    Run(0, Complete(0)),
    Run(0, Complete(1)),
    Run(0, Complete(2)),
    Run(0, Complete(3)),
    Run(0, Seal(0)),
    Run(0, Seal(1)),
    Run(0, Seal(2)),
    Run(0, Seal(3)),
    Run(0, Settle(0)),
    Run(0, Settle(1)),
    Run(0, Settle(2)),
    Run(0, Settle(3)),
    Run(0, Void(0)),
    Run(0, Void(1)),
    Run(0, Void(2)),
    Run(0, Void(3)),
    Run(0, Retire(0)),
    Run(0, Retire(1)),
    Run(0, Retire(2)),
    Run(0, Retire(3)),
    Run(0, LedgerClose),
];

/// A release's order is reserved, the sweeper aborts it, a late driver
/// takes both lines, the undo gives the second back, and the driver commits
/// without the compare-and-set on the home's record: a bought order with a
/// line undone, refused and bought both. Found by the checker in 6 steps
/// ([`release::Variant::COMMIT_UNCHECKED`]).
pub const UNCHECKED_COMMIT: &[release::Action] = &[
    release::Action::Reserve(0),
    release::Action::Abort(0),
    release::Action::Take(0, 0),
    release::Action::Take(0, 1),
    release::Action::Undo(0, 1),
    release::Action::Commit(0),
];

/// A held release order (user 1's, homed at each pool's second bucket) is
/// taken, committed, confirmed and its first line confirmed (`T` → `K`);
/// then a late walk of that line, whose driver read the record pending
/// before the commit, reads the `K` as a short bucket and takes the line
/// again in the next bucket: a unit held for good (the bug of commit
/// 8d8b2d3, seed 1269490 of the fault schedules). Found by the checker in
/// 9 steps on [`release::Bounds::HOLDS`]
/// ([`release::Variant::WALK_PAST_CONFIRMED`]).
pub const WALK_PAST_CONFIRMED: &[release::Action] = &[
    release::Action::Reserve(0),
    release::Action::Reserve(2),
    release::Action::Take(2, 0),
    release::Action::Take(2, 1),
    release::Action::Take(2, 1),
    release::Action::Commit(2),
    release::Action::Confirm(2),
    release::Action::ConfirmLine(2, 0),
    release::Action::Take(2, 0),
];

/// Two requests of user 0 with its one-unit token: the token is checked for
/// both (in a step of its own), then each home step takes a unit and
/// consumes the token without checking again: two units for an allowance
/// of one ([`admission::Variant::CHECK_BEFORE_TAKE`]). The checker's
/// counterexample (5 steps) is the same on user 1's saga requests, where
/// the second home step reserves without checking again.
pub const CHECKED_BEFORE_TAKE: &[admission::Action] = &[
    admission::Action::Purchase(0),
    admission::Action::Purchase(1),
    admission::Action::Purchase(0),
    admission::Action::Purchase(1),
];

/// A hold expires, its unit goes aside in its bucket, becomes a ticket,
/// is given position 0 and offered; the offer's deadline passes and the
/// sweeper passes it: back on open sale while position 1 was not given
/// ([`admission::Variant::PASS_TO_OPEN_SALE`]).
pub const PASSED_TO_OPEN_SALE: &[admission::Action] = &[
    admission::Action::Purchase(0),
    admission::Action::Return(0),
    admission::Action::Reserve(0),
    admission::Action::Assign(0, 0),
    admission::Action::Open(0, 0),
    admission::Action::Due(0, 0),
    admission::Action::Pass(0),
];
