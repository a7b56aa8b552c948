//! The exhaustive check: every interleaving of the store's steps for a small
//! bound, against every property; and the two defects found by reading
//! (commit 7a3d97b), found again by the checker in the variants that bring
//! them back. Then the same for a release's multi-line order
//! ([`shardstock_model::release`], designed before it is built): every
//! interleaving of its steps, with holds and without, and four broken
//! variants that the checker must catch. And fair drops' token purchases and the waiting list's
//! offers as built ([`shardstock_model::admission`]), with six broken
//! variants.
//!
//! `SHARDSTOCK_MODEL=large cargo test -p shardstock-model --test check
//! every_interleaving -- --nocapture` checks the larger bound
//! ([`Bounds::LARGE`]), `SHARDSTOCK_MODEL=cancels` the CI bound with cancels
//! ([`Bounds::CANCELS`]), `SHARDSTOCK_MODEL=release-large` (same command,
//! filter `multi_line`) the release's larger bound
//! ([`release::Bounds::LARGE`]), `SHARDSTOCK_MODEL=release-holds-large`
//! (filter `held_multi_line`) the larger bound of a release with holds
//! ([`release::Bounds::HOLDS_LARGE`]; `cargo test` checks
//! [`release::Bounds::HOLDS`]), `SHARDSTOCK_MODEL=admission-large` (filter
//! `token_purchase`) the admission model's ([`admission::Bounds::LARGE`]),
//! `SHARDSTOCK_MODEL=admission-cancels` its CI bound with bought offers
//! cancelled ([`admission::Bounds::CANCELS`]);
//! `SHARDSTOCK_MODEL_THREADS` sets the
//! checker's threads (2 by default: the machines have 2 cores);
//! `SHARDSTOCK_MODEL_SECONDS` stops the check after that long (then it is
//! not exhaustive, and says so).

use std::time::Instant;

use shardstock_model::admission::{self, Admission, properties as adm};
use shardstock_model::properties as prop;
use shardstock_model::release::{self, Release, properties as rel};
use shardstock_model::{Bounds, Protocol, Variant};
use stateright::{Checker, HasDiscoveries, Model};

fn time_limit() -> Option<std::time::Duration> {
    std::env::var("SHARDSTOCK_MODEL_SECONDS")
        .ok()
        .and_then(|t| t.parse().ok())
        .map(std::time::Duration::from_secs)
}

fn threads() -> usize {
    std::env::var("SHARDSTOCK_MODEL_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2)
}

/// Runs the checker on `model` (to the end, or to the first counterexample
/// with `first`) and prints what it explored under `label`.
fn check<M>(model: M, label: String, first: bool) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let start = Instant::now();
    let mut builder = model.checker().threads(threads());
    if first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(limit) = time_limit() {
        builder = builder.timeout(limit);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{label}\n{} unique states ({} generated), depth {}, in {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    checker
}

/// The trace of a discovery, one action a line.
fn trace<M>(checker: &impl Checker<M>, name: &'static str) -> Option<String>
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq + std::fmt::Debug,
{
    let path = checker.discovery(name)?;
    let model = checker.model();
    let mut out = String::new();
    for (i, action) in path.into_actions().into_iter().enumerate() {
        out.push_str(&format!(
            "  {:>2}. {}\n",
            i + 1,
            model.format_action(&action)
        ));
    }
    Some(out)
}

/// Whether a check ran into `SHARDSTOCK_MODEL_SECONDS` (stateright's
/// timeout ends it as done: tell it by the clock).
fn stopped(start: Instant) -> bool {
    let stopped = time_limit().is_some_and(|limit| start.elapsed() >= limit);
    if stopped {
        println!("stopped at SHARDSTOCK_MODEL_SECONDS: not exhaustive");
    }
    stopped
}

const CHECKS: [&str; 7] = [
    prop::CONSERVATION,
    prop::ONE_END,
    prop::ANSWERS,
    prop::LIMIT,
    prop::STRANDED,
    prop::CLOSED_SALE,
    prop::ENDS,
];

const WITNESSES: [&str; 4] = [
    prop::SWITCHED,
    prop::EXPIRED,
    prop::CONFIRMED_THEN_CLOSED,
    prop::SAGA_BOUGHT,
];

fn bounds() -> Bounds {
    match std::env::var("SHARDSTOCK_MODEL").as_deref() {
        Ok("large") => Bounds::LARGE,
        Ok("cancels") => Bounds::CANCELS,
        _ => Bounds::CI,
    }
}

#[test]
fn every_interleaving_of_the_steps_keeps_every_property() {
    let start = Instant::now();
    let (bounds, variant) = (bounds(), Variant::FIXED);
    let checker = check(
        Protocol::new(bounds, variant),
        format!("{variant:?}\n{bounds:?}"),
        false,
    );
    let broken: Vec<String> = CHECKS
        .iter()
        .filter_map(|name| trace(&checker, name).map(|t| format!("{name}:\n{t}")))
        .collect();
    assert!(broken.is_empty(), "counterexamples:\n{}", broken.join("\n"));
    if stopped(start) {
        return;
    }
    for name in WITNESSES {
        assert!(
            checker.discovery(name).is_some(),
            "the bound never reaches {name:?}: the check would pass vacuously"
        );
    }
}

/// Checks a variant until its first counterexample (breadth first, each
/// batch newest first: a short trace, not always the shortest); returns the
/// properties broken, with their traces.
fn find(variant: Variant) -> Vec<(&'static str, String)> {
    let checker = check(
        Protocol::new(Bounds::CI, variant),
        format!("{variant:?}\n{:?}", Bounds::CI),
        true,
    );
    CHECKS
        .iter()
        .filter_map(|name| trace(&checker, name).map(|t| (*name, t)))
        .inspect(|(name, t)| println!("{name}:\n{t}"))
        .collect()
}

#[test]
fn a_resumed_reshard_resurrecting_expired_holds_is_found() {
    let broken = find(Variant::RESURRECTING_RESTORE);
    assert!(
        broken
            .iter()
            .any(|(n, _)| *n == prop::ONE_END || *n == prop::CONSERVATION),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_close_voiding_the_old_layouts_copies_is_found() {
    let broken = find(Variant::CLOSE_VOIDS_EVERY_LAYOUT);
    assert!(
        broken
            .iter()
            .any(|(n, _)| *n == prop::ONE_END || *n == prop::ANSWERS),
        "no counterexample: {broken:?}"
    );
}

/// The release's checks ([`shardstock_model::release::properties`]).
const RELEASE_CHECKS: [&str; 10] = [
    rel::CONSERVATION,
    rel::WHOLE,
    rel::HELD,
    rel::EMPTY,
    rel::ONCE,
    rel::LIMIT,
    rel::COUNTED,
    rel::ANSWERS,
    rel::SWEPT,
    rel::ENDS,
];

const RELEASE_WITNESSES: [&str; 4] = [rel::BOUGHT, rel::UNDONE, rel::LIMITED, rel::AGAIN];

/// A release with holds reaches these too.
const HOLD_WITNESSES: [&str; 7] = [
    rel::BOUGHT,
    rel::UNDONE,
    rel::LIMITED,
    rel::AGAIN,
    rel::CONFIRMED,
    rel::CANCELLED,
    rel::EXPIRED,
];

fn release_bounds() -> release::Bounds {
    match std::env::var("SHARDSTOCK_MODEL").as_deref() {
        Ok("release-large") => release::Bounds::LARGE,
        _ => release::Bounds::CI,
    }
}

fn hold_bounds() -> release::Bounds {
    match std::env::var("SHARDSTOCK_MODEL").as_deref() {
        Ok("release-holds-large") => release::Bounds::HOLDS_LARGE,
        _ => release::Bounds::HOLDS,
    }
}

/// The trace of a discovery up to the first state that breaks it, one
/// action a line (the checker's pending states are a stack within a block,
/// so its path may go on past that state).
fn breaking_prefix<M>(checker: &impl Checker<M>, name: &'static str) -> Option<String>
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq + std::fmt::Debug,
{
    let path = checker.discovery(name)?.into_vec();
    let model = checker.model();
    let holds = model
        .properties()
        .into_iter()
        .find(|p| p.name == name)
        .expect("a property of the model")
        .condition;
    let end = path
        .iter()
        .position(|(state, _)| !holds(model, state))
        .expect("the discovery breaks it");
    let mut out = String::new();
    for (i, (_, action)) in path[..end].iter().enumerate() {
        let action = action.as_ref().expect("a step before the end");
        out.push_str(&format!("  {:>2}. {action:?}\n", i + 1));
    }
    Some(out)
}

/// Checks `model` (to the end, or to the first counterexample with
/// `first`); returns the `checks` broken, with their traces, and asserts
/// that a whole check that broke none reached every one of `witnesses`.
fn check_to_prefixes<M>(
    model: M,
    label: String,
    first: bool,
    checks: &[&'static str],
    witnesses: &[&'static str],
) -> Vec<(&'static str, String)>
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq + std::fmt::Debug,
{
    let start = Instant::now();
    let checker = check(model, label, first);
    let broken: Vec<_> = checks
        .iter()
        .filter_map(|name| breaking_prefix(&checker, name).map(|t| (*name, t)))
        .inspect(|(name, t)| println!("{name} ({} steps):\n{t}", t.lines().count()))
        .collect();
    if !first && broken.is_empty() && !stopped(start) {
        for name in witnesses {
            assert!(
                checker.discovery(name).is_some(),
                "the bound never reaches {name:?}: the check would pass vacuously"
            );
        }
    }
    broken
}

/// Checks a release variant at `bounds` (to the end, or to the first
/// counterexample with `first`); returns the checks broken, with traces.
fn release_check(
    bounds: release::Bounds,
    variant: release::Variant,
    first: bool,
) -> Vec<(&'static str, String)> {
    check_to_prefixes(
        Release::new(bounds, variant),
        format!("{variant:?}\n{bounds:?}"),
        first,
        &RELEASE_CHECKS,
        if bounds.holds {
            &HOLD_WITNESSES
        } else {
            &RELEASE_WITNESSES
        },
    )
}

#[test]
fn every_interleaving_of_a_multi_line_order_keeps_every_property() {
    let broken = release_check(release_bounds(), release::Variant::DESIGNED, false);
    assert!(broken.is_empty(), "counterexamples: {broken:?}");
}

#[test]
fn every_interleaving_of_a_held_multi_line_order_keeps_every_property() {
    let broken = release_check(hold_bounds(), release::Variant::DESIGNED, false);
    assert!(broken.is_empty(), "counterexamples: {broken:?}");
}

/// The checks a broken release variant breaks at `bounds`, first
/// counterexample only.
fn breaks_at(bounds: release::Bounds, variant: release::Variant) -> Vec<&'static str> {
    release_check(bounds, variant, true)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The checks a broken release variant breaks, first counterexample only.
fn release_breaks(variant: release::Variant) -> Vec<&'static str> {
    release_check(release::Bounds::CI, variant, true)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn a_commit_without_the_compare_and_set_is_found() {
    let broken = release_breaks(release::Variant::COMMIT_UNCHECKED);
    assert!(
        broken.contains(&rel::WHOLE) || broken.contains(&rel::ONCE),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_reservation_released_before_the_undos_is_found() {
    let broken = release_breaks(release::Variant::RELEASE_AT_DECISION);
    assert!(
        broken.contains(&rel::LIMIT) || broken.contains(&rel::EMPTY),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_walk_past_an_undone_marker_is_found() {
    let broken = release_breaks(release::Variant::WALK_PAST_UNDONE);
    assert!(
        broken.contains(&rel::EMPTY) || broken.contains(&rel::SWEPT),
        "no counterexample: {broken:?}"
    );
}

/// The bug of commit 8d8b2d3: a late walk read its line's confirmed take as
/// a short bucket and took the line again further on (a unit held for
/// good). The designed walk stops there, and the check above finds nothing.
#[test]
fn a_walk_past_a_confirmed_take_is_found() {
    let broken = breaks_at(
        release::Bounds::HOLDS,
        release::Variant::WALK_PAST_CONFIRMED,
    );
    assert!(
        broken.contains(&rel::ONCE) || broken.contains(&rel::HELD),
        "no counterexample: {broken:?}"
    );
}

/// The admission model's checks ([`shardstock_model::admission::properties`]).
const ADMISSION_CHECKS: [&str; 10] = [
    adm::VALID,
    adm::ALLOWANCE,
    adm::PAIRED,
    adm::ANSWERS,
    adm::CONSERVATION,
    adm::CLOSED,
    adm::NOT_REOPENED,
    adm::LINE,
    adm::ONCE,
    adm::ENDS,
];

const ADMISSION_WITNESSES: [&str; 10] = [
    adm::FAST,
    adm::SAGA,
    adm::REUSED,
    adm::FOREIGN,
    adm::EXPIRED,
    adm::RETURNED,
    adm::PASSED,
    adm::CUT_OFF,
    adm::TO_SALE,
    adm::LEFTOVER,
];

/// Checks an admission variant at `bounds` (to the end, or to the first
/// counterexample with `first`); returns the checks broken, with traces.
fn admission_check(
    bounds: admission::Bounds,
    variant: admission::Variant,
    first: bool,
) -> Vec<(&'static str, String)> {
    let mut witnesses = ADMISSION_WITNESSES.to_vec();
    if bounds.offer_cancels {
        witnesses.push(adm::CANCELLED);
    }
    check_to_prefixes(
        Admission::new(bounds, variant),
        format!("{variant:?}\n{bounds:?}"),
        first,
        &ADMISSION_CHECKS,
        &witnesses,
    )
}

#[test]
fn every_interleaving_of_token_purchases_and_offers_keeps_every_property() {
    let bounds = match std::env::var("SHARDSTOCK_MODEL").as_deref() {
        Ok("admission-large") => admission::Bounds::LARGE,
        Ok("admission-cancels") => admission::Bounds::CANCELS,
        _ => admission::Bounds::CI,
    };
    let broken = admission_check(bounds, admission::Variant::BUILT, false);
    assert!(broken.is_empty(), "counterexamples: {broken:?}");
}

/// The checks a broken admission variant breaks, first counterexample only.
fn admission_breaks(variant: admission::Variant) -> Vec<&'static str> {
    admission_check(admission::Bounds::CI, variant, true)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn a_token_checked_in_a_step_before_the_take_is_found() {
    let broken = admission_breaks(admission::Variant::CHECK_BEFORE_TAKE);
    assert!(
        broken.contains(&adm::ALLOWANCE),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_passed_offer_put_back_on_open_sale_is_found() {
    let broken = admission_breaks(admission::Variant::PASS_TO_OPEN_SALE);
    assert!(
        broken.contains(&adm::NOT_REOPENED),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_saga_token_consumed_only_at_the_finish_is_found() {
    let broken = admission_breaks(admission::Variant::SAGA_UNRESERVED);
    assert!(
        broken.contains(&adm::ALLOWANCE),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_returned_unit_put_in_stock_while_the_list_is_on_is_found() {
    let broken = admission_breaks(admission::Variant::GIVE_BACK_TO_STOCK);
    assert!(
        broken.contains(&adm::NOT_REOPENED),
        "no counterexample: {broken:?}"
    );
}

#[test]
fn a_ticket_given_a_new_position_when_it_asks_again_is_found() {
    let broken = admission_breaks(admission::Variant::ASSIGN_AGAIN);
    assert!(broken.contains(&adm::LINE), "no counterexample: {broken:?}");
}

#[test]
fn an_offer_opened_without_comparing_its_reserved_record_is_found() {
    let broken = admission_breaks(admission::Variant::OPEN_UNCHECKED);
    assert!(
        broken.contains(&adm::CONSERVATION) || broken.contains(&adm::ONCE),
        "no counterexample: {broken:?}"
    );
}
