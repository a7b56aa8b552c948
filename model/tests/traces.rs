//! Counterexamples the checker found, kept as fixed traces: each runs on the
//! variant it broke (and must still break it) and on the code as it is
//! (where every property holds after every step).

use shardstock_model::properties as prop;
use shardstock_model::release::{self, Release, properties as rel};
use shardstock_model::steps::{Action, Step};
use shardstock_model::traces::{PAID_THEN_CLOSED, RESURRECTED, UNCHECKED_COMMIT};
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

#[test]
fn a_release_commits_only_what_is_still_pending() {
    let model = |variant| Release::new(release::Bounds::CI, variant);
    let broken = model(release::Variant::COMMIT_UNCHECKED);
    let mut state = broken.init_states().remove(0);
    for &action in UNCHECKED_COMMIT {
        state = broken
            .next_state(&state, action)
            .expect("every step applies");
    }
    assert!(!rel::whole(&state) && !rel::once(&state));
    // As designed, the commit finds the order refused and changes nothing;
    // every check holds after every step.
    let designed = model(release::Variant::DESIGNED);
    let mut state = designed.init_states().remove(0);
    let (last, before) = UNCHECKED_COMMIT.split_last().unwrap();
    for &action in before {
        state = designed
            .next_state(&state, action)
            .expect("every step applies");
        assert!(rel::whole(&state) && rel::once(&state) && rel::swept(&designed, &state));
    }
    assert!(designed.next_state(&state, *last).is_none());
}
