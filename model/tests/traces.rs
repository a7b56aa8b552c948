//! Counterexamples the checker found, kept as fixed traces: each runs on the
//! variant it broke (and must still break it) and on the code as it is
//! (where every property holds after every step).

use shardstock_model::properties as prop;
use shardstock_model::steps::{Action, Step};
use shardstock_model::{Bounds, Protocol, State, Variant};
use stateright::Model;

use Action::*;
use Step::*;

/// Plays `trace` from the initial state; every action must apply. Returns
/// each state after each action.
fn play(variant: Variant, trace: &[Action]) -> Vec<State> {
    let model = Protocol::new(Bounds::CI, variant);
    let mut state = model.init_states().remove(0);
    let mut states = Vec::new();
    for (i, &action) in trace.iter().enumerate() {
        state = model
            .next_state(&state, action)
            .unwrap_or_else(|| panic!("step {} ({action:?}) changes nothing", i + 1));
        states.push(state.clone());
    }
    states
}

/// The safety properties that fail in `state`.
fn broken(variant: Variant, state: &State) -> Vec<&'static str> {
    let model = Protocol::new(Bounds::CI, variant);
    let mut out = Vec::new();
    if !prop::conserved(&model, state) {
        out.push(prop::CONSERVATION);
    }
    if !state.ledger.iter().all(prop::one_end) {
        out.push(prop::ONE_END);
    }
    if !prop::answers_true(state) {
        out.push(prop::ANSWERS);
    }
    out
}

/// A reshard restores a hold into the new layout, the sweeper expires it
/// there, the run stalls (its lease lapses) and the next run restores the
/// hold again from the sealed old layout: before 7a3d97b the second restore
/// overwrote the expired entry and the hold expired twice (its unit back on
/// sale twice). Found by the checker in 24 steps.
const RESURRECTED: &[Action] = &[
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

#[test]
fn a_resumed_restore_never_brings_back_an_expired_hold() {
    let mut before = RESURRECTED.to_vec();
    before.push(Expire(2, 0));
    let last = play(Variant::RESURRECTING_RESTORE, &before).pop().unwrap();
    assert!(broken(Variant::RESURRECTING_RESTORE, &last).contains(&prop::ONE_END));
    assert!(broken(Variant::RESURRECTING_RESTORE, &last).contains(&prop::CONSERVATION));
    // Now: no expiry in a layout being filled (the twelfth step refuses),
    // and the restore writes nothing over an entry.
    let model = Protocol::new(Bounds::CI, Variant::FIXED);
    let states = play(Variant::FIXED, &RESURRECTED[..11]);
    assert!(
        model
            .next_state(states.last().unwrap(), Expire(2, 0))
            .is_none()
    );
}

/// The sale moves to the new layout, the buyer pays there, and the close
/// voids every layout: before 7a3d97b the old layout's copy of the hold was
/// voided, and the paid order got an expiry too.
const PAID_THEN_CLOSED: &[Action] = &[
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

#[test]
fn a_close_voids_the_current_layout_only() {
    let before = play(Variant::CLOSE_VOIDS_EVERY_LAYOUT, PAID_THEN_CLOSED);
    let voided = &before[PAID_THEN_CLOSED
        .iter()
        .position(|a| *a == Run(0, Void(0)))
        .unwrap()];
    let broke = broken(Variant::CLOSE_VOIDS_EVERY_LAYOUT, voided);
    assert!(
        broke.contains(&prop::ONE_END) && broke.contains(&prop::ANSWERS),
        "{broke:?}"
    );
    let model = Protocol::new(Bounds::CI, Variant::FIXED);
    let after = play(Variant::FIXED, PAID_THEN_CLOSED);
    for (i, state) in after.iter().enumerate() {
        assert_eq!(
            broken(Variant::FIXED, state),
            Vec::<&str>::new(),
            "after step {}",
            i + 1
        );
        assert!(!prop::stranded(&model, state), "after step {}", i + 1);
    }
    assert!(prop::closed_sale(&model, after.last().unwrap()));
}
