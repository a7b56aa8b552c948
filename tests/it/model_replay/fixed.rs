//! The model checker's fixed traces (`model/tests/traces.rs`), replayed
//! against the store: on the code as it is they must match it step by step;
//! on the variant they broke, the model parts from the store where the
//! pre-fix step did something the store's step does not.

use shardstock_model::steps::{Action, Outcome, Step};

use Action::*;
use Step::*;

/// A reshard restores a hold, the sweeper expires it in the layout being
/// filled, the lease lapses and the next run restores again (the checker's
/// counterexample to the restore before 7a3d97b). On the code as it is the
/// expiry at step 12 is refused, so [`resurrected_fixed`] leaves it out.
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

/// [`RESURRECTED`] without the expiry the code as it is refuses.
pub fn resurrected_fixed() -> Vec<Action> {
    RESURRECTED
        .iter()
        .copied()
        .filter(|a| *a != Expire(2, 0))
        .collect()
}

/// A reshard moves a hold, the buyer pays in the new layout, a close runs
/// to its end (the fixed trace of "a close voids the current layout only").
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

/// The random trace of seed 105 (`random_traces_match_the_model`) that
/// found `STRAY_FENCE` on Redis, up to the step where it showed.
pub const STRAY_FENCE_TRACE: &[Action] = &[
    Purchase(5),
    Purchase(2),
    Purchase(0),
    StartReshard(1),
    Purchase(3),
    Take(2, 1),
    Due(0),
    Take(2, 0),
    Purchase(4),
    Run(1, Begin),
    Due(5),
    LeaseLapse,
    Cancel(0),
    Expire(0, 5),
    StartReshard(0),
    Crash(0),
    StartClose(0),
    Run(0, Fence),
    Finish(2, Outcome::Bought),
    Run(0, Complete(0)),
    Cancel(2),
    Cancel(5),
    Run(1, InitNew),
];
