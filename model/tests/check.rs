//! The exhaustive check: every interleaving of the store's steps for a small
//! bound, against every property; and the two defects found by reading
//! (commit 7a3d97b), found again by the checker in the variants that bring
//! them back.
//!
//! `SHARDSTOCK_MODEL=large cargo test -p shardstock-model --test check
//! every_interleaving -- --nocapture` checks the larger bound
//! ([`Bounds::LARGE`]), `SHARDSTOCK_MODEL=cancels` the CI bound with cancels
//! ([`Bounds::CANCELS`]); `SHARDSTOCK_MODEL_THREADS` sets the checker's threads
//! (2 by default: the machines have 2 cores); `SHARDSTOCK_MODEL_SECONDS`
//! stops the check after that long (then it is not exhaustive, and says so).

use std::time::Instant;

use shardstock_model::properties as prop;
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

/// Runs the checker (to the end, or to the first counterexample with
/// `first`) and prints what it explored.
fn check(bounds: Bounds, variant: Variant, first: bool) -> impl Checker<Protocol> {
    let start = Instant::now();
    let mut builder = Protocol::new(bounds, variant).checker().threads(threads());
    if first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(limit) = time_limit() {
        builder = builder.timeout(limit);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{variant:?}\n{bounds:?}\n{} unique states ({} generated), depth {}, in {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    checker
}

/// The trace of a discovery, one action a line.
fn trace(checker: &impl Checker<Protocol>, name: &'static str) -> Option<String> {
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
    let checker = check(bounds(), Variant::FIXED, false);
    // stateright's timeout ends the check as done: tell it by the clock.
    let stopped = time_limit().is_some_and(|limit| start.elapsed() >= limit);
    let broken: Vec<String> = CHECKS
        .iter()
        .filter_map(|name| trace(&checker, name).map(|t| format!("{name}:\n{t}")))
        .collect();
    assert!(broken.is_empty(), "counterexamples:\n{}", broken.join("\n"));
    if stopped {
        println!("stopped at SHARDSTOCK_MODEL_SECONDS: not exhaustive");
        return;
    }
    for name in WITNESSES {
        assert!(
            checker.discovery(name).is_some(),
            "the bound never reaches {name:?}: the check would pass vacuously"
        );
    }
}

/// Checks a variant until its first counterexample (breadth first: a
/// shortest one); returns the properties broken, with their traces.
fn find(variant: Variant) -> Vec<(&'static str, String)> {
    let checker = check(Bounds::CI, variant, true);
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
