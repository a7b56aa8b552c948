//! Counterexamples the checker found, kept as fixed traces: each runs on the
//! variant it broke (and must still break it) and on the code as it is
//! (where every property holds after every step).

use shardstock_model::admission::{self, Admission, properties as adm};
use shardstock_model::properties as prop;
use shardstock_model::release::{self, Release, properties as rel};
use shardstock_model::steps::{Action, Step};
use shardstock_model::traces::{
    CHECKED_BEFORE_TAKE, PAID_THEN_CLOSED, PASSED_TO_OPEN_SALE, RESURRECTED, UNCHECKED_COMMIT,
    WALK_PAST_CONFIRMED,
};
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

#[test]
fn a_late_walk_stops_at_its_confirmed_take() {
    let model = |variant| Release::new(release::Bounds::HOLDS, variant);
    let broken = model(release::Variant::WALK_PAST_CONFIRMED);
    let mut state = broken.init_states().remove(0);
    for &action in WALK_PAST_CONFIRMED {
        state = broken
            .next_state(&state, action)
            .expect("every step applies");
    }
    assert!(!rel::once(&state) && !rel::held(&state) && !rel::swept(&broken, &state));
    // As designed, the late walk stops at the confirmed take and changes
    // nothing; every check holds after every step.
    let designed = model(release::Variant::DESIGNED);
    let mut state = designed.init_states().remove(0);
    let (last, before) = WALK_PAST_CONFIRMED.split_last().unwrap();
    for &action in before {
        state = designed
            .next_state(&state, action)
            .expect("every step applies");
        assert!(
            rel::held(&state)
                && rel::once(&state)
                && rel::conserved(&designed, &state)
                && rel::swept(&designed, &state)
        );
    }
    assert!(designed.next_state(&state, *last).is_none());
}

/// Plays `trace` on the admission model as `variant` says; every step must
/// apply. Returns the states after each step.
fn admission_play(
    variant: admission::Variant,
    trace: &[admission::Action],
) -> Vec<admission::State> {
    let model = Admission::new(admission::Bounds::CI, variant);
    let mut state = model.init_states().remove(0);
    trace
        .iter()
        .map(|&action| {
            state = model
                .next_state(&state, action)
                .expect("every step applies");
            state.clone()
        })
        .collect()
}

/// Whether every admission check holds in `state`.
fn admission_holds(state: &admission::State) -> bool {
    let model = Admission::new(admission::Bounds::CI, admission::Variant::BUILT);
    model
        .properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .all(|p| (p.condition)(&model, state))
}

#[test]
fn a_token_is_checked_in_the_step_that_takes() {
    let model = Admission::new(admission::Bounds::CI, admission::Variant::CHECK_BEFORE_TAKE);
    let after = admission_play(admission::Variant::CHECK_BEFORE_TAKE, CHECKED_BEFORE_TAKE);
    assert!(!adm::within_allowance(&model, after.last().unwrap()));
    // As designed, the first request consumes the token with its take, the
    // second is refused (used), and both replays answer the same.
    let designed = Admission::new(admission::Bounds::CI, admission::Variant::BUILT);
    let mut state = designed.init_states().remove(0);
    for &action in CHECKED_BEFORE_TAKE {
        if let Some(next) = designed.next_state(&state, action) {
            state = next;
        }
        assert!(admission_holds(&state));
    }
    assert_eq!(state.told[0], admission::state::Told::Bought);
    assert_eq!(
        state.told[1],
        admission::state::Told::Refused(admission::state::Why::Used)
    );
}

#[test]
fn a_passed_offer_stays_with_the_waiting_list() {
    let after = admission_play(admission::Variant::PASS_TO_OPEN_SALE, PASSED_TO_OPEN_SALE);
    assert!(!adm::not_reopened(after.last().unwrap()));
    // As built, the passed offer's unit goes back aside in its bucket, and
    // the next user in line is offered it (a new ticket, position 1).
    let after = admission_play(admission::Variant::BUILT, PASSED_TO_OPEN_SALE);
    assert!(after.iter().all(admission_holds));
    let mut last = after.last().unwrap().clone();
    assert_eq!(last.buckets[0].aside, 1);
    assert!(!last.reopened);
    let built = Admission::new(admission::Bounds::CI, admission::Variant::BUILT);
    for action in [
        admission::Action::Reserve(0),
        admission::Action::Assign(0, 1),
        admission::Action::Open(0, 1),
    ] {
        last = built
            .next_state(&last, action)
            .expect("the next user is offered the unit");
        assert!(admission_holds(&last));
    }
    assert_eq!(
        last.buckets[0].tickets[1],
        admission::state::Ticket::Open { pos: 1, due: false }
    );
}

/// A round gives a ticket position 0 at the list and dies before the
/// bucket: the ticket stays reserved, a second unit's ticket gets position
/// 1 and opens first, and the next round asks the list again for the first
/// ticket: the same position, which it then opens. With `assign_again`,
/// the second ask answers a new position and position 0 is never offered.
#[test]
fn a_round_cut_off_between_the_list_and_the_bucket_is_finished_at_the_same_position() {
    use admission::Action::*;
    use admission::state::{Given, Ticket};
    let cut = [
        Purchase(0),
        Purchase(2),
        Take(2),
        Finish(2),
        Return(0),
        Return(2),
        Reserve(0),
        Assign(0, 0),
        Reserve(1),
        Assign(1, 0),
        Open(1, 0),
    ];
    let after = admission_play(admission::Variant::BUILT, &cut);
    assert!(after.iter().all(admission_holds));
    let mut state = after.last().unwrap().clone();
    assert_eq!(state.buckets[0].tickets[0], Ticket::Reserved);
    assert_eq!(
        state.buckets[1].tickets[0],
        Ticket::Open { pos: 1, due: false }
    );
    let built = Admission::new(admission::Bounds::CI, admission::Variant::BUILT);
    assert!(
        built.next_state(&state, Assign(0, 0)).is_none(),
        "asked again, the list answers the position it gave"
    );
    state = built
        .next_state(&state, Open(0, 0))
        .expect("the ticket opens");
    assert_eq!(
        state.buckets[0].tickets[0],
        Ticket::Open { pos: 0, due: false }
    );
    assert!(admission_holds(&state));
    assert!(
        built.next_state(&state, Open(0, 0)).is_none(),
        "opened once"
    );

    let broken = Admission::new(admission::Bounds::CI, admission::Variant::ASSIGN_AGAIN);
    let mut state = broken.init_states().remove(0);
    for action in [
        Purchase(0),
        Return(0),
        Reserve(0),
        Assign(0, 0),
        Assign(0, 0),
    ] {
        state = broken
            .next_state(&state, action)
            .expect("every step applies");
    }
    assert_eq!(state.list.given[0][0], Given::At(1));
    assert!(!adm::in_line(&state));
}
