//! The model checker's fixed traces (`model/tests/traces.rs`), replayed
//! against the store: on the code as it is they must match it step by step;
//! on the variant they broke, the model parts from the store where the
//! pre-fix step did something the store's step does not.

use shardstock_model::steps::{Action, Outcome, Step};

use Action::*;
use Step::*;
pub use shardstock_model::traces::{PAID_THEN_CLOSED, RESURRECTED};

/// [`RESURRECTED`] without the expiry the code as it is refuses.
pub fn resurrected_fixed() -> Vec<Action> {
    RESURRECTED
        .iter()
        .copied()
        .filter(|a| *a != Expire(2, 0))
        .collect()
}

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
