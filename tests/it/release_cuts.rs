//! A release pool resharded or closed while one of its orders is not ended
//! (docs/DESIGN.md, "Releases", As built: a pool's reshard and close).
//!
//! An engine stops after an order's first line is taken (the order pending,
//! its take in the pool's layout; or refused by the sweeper, whose undo
//! failed); the pool is then resharded, or closed.
//! The reshard or close refuses the order and gives its take back in the
//! sealed layout (a reshard of a pool the order has no take in leaves it to
//! its retry, which buys once); a sweep ends it (its other lines undone, the limit
//! released). Then: per pool sold + remaining == stock, the user's count is
//! what it was told bought, a retry with the request id answers the same
//! refusal, a bought order's lines stand, and after every pool is closed the
//! database alone agrees (the oracle; the bought lines exactly the
//! confirmed orders). Before the fix the reshard lost the take's units (the
//! undo after the switch walked the new layout) and the close counted a
//! refused order's line as confirmed.

use std::sync::Arc;
use std::time::Duration;

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::saga_sweeper::SagaSweepOptions;
use shardstock::control::{lifecycle, release_sweeper, reshard};
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::model::OrderStatus;
use shardstock::domain::release::HomeRecord;
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::engine::{CrashPoint, LinesOutcome, LinesRefusal, LinesRequest};
use shardstock::ledger::Ledger;
use shardstock::store::Releases;
use shardstock::{Engine, EngineError, EngineOptions, Store};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Faulty, When};
use crate::harness::{event_id, ledger_for, on_every_backend, user};

const STOCK: u64 = 6;

fn spec() -> ReleaseSpec {
    ReleaseSpec {
        id: event_id("cut"),
        pools: (0..3)
            .map(|k| PoolSpec {
                name: pool(k),
                stock: STOCK,
                buckets: 2,
                auto_buckets: None,
            })
            .collect(),
        per_user_limit: Some(6),
        max_per_order: 3,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        homes: 4,
    }
}

fn pool(k: usize) -> EventId {
    EventId::parse(format!("p{k}")).unwrap()
}

fn request(spec: &ReleaseSpec, u: &str, rid: &str, lines: &[(usize, u32)]) -> LinesRequest {
    LinesRequest {
        release: spec.id.clone(),
        user: user(u),
        lines: lines.iter().map(|&(k, q)| (pool(k), q)).collect(),
        request_id: Some(RequestId::parse(rid).unwrap()),
    }
}

fn sweep_now() -> SagaSweepOptions {
    SagaSweepOptions {
        interval: Duration::from_millis(10),
        stale_after: Duration::ZERO,
        per_bucket: 64,
    }
}

fn flusher<S: Store>(engine: &Arc<Engine<S>>, ledger: &Ledger) -> Flusher<S> {
    Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("cut-{}", rand::random::<u32>()),
        FlushOptions {
            batch: 500,
            workers: 2,
            idle: Duration::from_millis(10),
            claim_idle_ms: 500,
        },
    )
}

/// A release with one order bought (`kept`: 2 of p0, 1 of p1) and one cut
/// off after its first line's take (`gone`: 1 of each pool, request `g1`).
async fn order_cut_off<S: Store>(
    engine: &Arc<Engine<S>>,
    ledger: &Ledger,
) -> (ReleaseSpec, LinesOutcome) {
    let spec = spec();
    lifecycle::create_release(engine, ledger, spec.clone())
        .await
        .unwrap();
    let kept = engine
        .buy_lines(&request(&spec, "kept", "k1", &[(0, 2), (1, 1)]))
        .await
        .unwrap();
    assert!(kept.result.is_ok(), "{kept:?}");
    engine.inject_crash(CrashPoint::AfterTake);
    let crashed = engine
        .buy_lines(&request(&spec, "gone", "g1", &[(0, 1), (1, 1), (2, 1)]))
        .await;
    engine.inject_crash(CrashPoint::None);
    assert!(
        matches!(crashed, Err(EngineError::InjectedCrash(_))),
        "{crashed:?}"
    );
    assert_eq!(
        remaining(engine, &spec, 0).await,
        STOCK - 3,
        "its first line taken"
    );
    assert_eq!(units(engine, &spec, "gone").await, 3);
    (spec, kept)
}

async fn remaining<S: Store>(engine: &Engine<S>, spec: &ReleaseSpec, k: usize) -> u64 {
    engine
        .view(&spec.pool_event(k).unwrap())
        .await
        .unwrap()
        .remaining
}

async fn units<S: Store>(engine: &Engine<S>, spec: &ReleaseSpec, u: &str) -> u64 {
    engine.release_units(&spec.id, &user(u)).await.unwrap()
}

/// The sweep ends the cut-off order; a retry answers its refusal, twice.
async fn swept_and_asked_again<S: Store>(engine: &Engine<S>, spec: &ReleaseSpec) {
    release_sweeper::sweep_release(engine, &spec.id, &sweep_now())
        .await
        .unwrap();
    for h in 0..spec.homes {
        let home = shardstock::domain::keys::HomeRef::new(&spec.id, h);
        let left = engine
            .store()
            .stale_orders(&home, i64::MAX, 100)
            .await
            .unwrap();
        assert!(left.is_empty(), "orders not ended: {left:?}");
    }
    let req = request(spec, "gone", "g1", &[(0, 1), (1, 1), (2, 1)]);
    for _ in 0..2 {
        let again = engine.buy_lines(&req).await.unwrap();
        assert!(again.replayed);
        assert_eq!(again.result, Err(LinesRefusal::GaveUp));
    }
    assert_eq!(units(engine, spec, "gone").await, 0);
    assert_eq!(units(engine, spec, "kept").await, 3);
}

/// Closes the pools not closed yet and reads every pool from the database:
/// the oracle, and the confirmed orders exactly `bought`'s lines.
async fn check_ledger<S: Store>(
    engine: &Arc<Engine<S>>,
    ledger: &Ledger,
    spec: &ReleaseSpec,
    bought: &[&LinesOutcome],
) {
    let mut flusher = flusher(engine, ledger);
    let stop = CancellationToken::new();
    let mut confirmed = Vec::new();
    for k in 0..spec.pools.len() {
        let id = spec.pool_event(k).unwrap();
        lifecycle::close(engine, ledger, &mut flusher, &id, &stop)
            .await
            .unwrap();
        let sale = crate::harness::oracle::closed_sale(ledger, &id, STOCK).await;
        assert!(sale.broken.is_empty(), "pool p{k}: {:?}", sale.broken);
        for (oid, order) in sale.orders {
            if order.status == OrderStatus::Confirmed {
                confirmed.push(oid);
            }
        }
    }
    confirmed.sort();
    let mut told: Vec<String> = bought
        .iter()
        .flat_map(|o| o.result.as_ref().unwrap().lines.iter())
        .map(|l| l.order_id.to_string())
        .collect();
    told.sort();
    assert_eq!(
        confirmed, told,
        "the confirmed lines are the bought orders'"
    );
}

/// The pool of the order's taken line is resharded: the reshard refuses the
/// order and gives the take back before it moves the stock.
async fn a_pool_resharded_under_a_pending_order_gives_its_take_back<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let (spec, kept) = order_cut_off(&engine, &ledger).await;
    reshard::reshard(&engine, &spec.pool_event(0).unwrap(), 3)
        .await
        .unwrap();
    assert_eq!(
        remaining(&engine, &spec, 0).await,
        STOCK - 2,
        "the take is back in the new layout"
    );
    swept_and_asked_again(&engine, &spec).await;
    for (k, sold) in [(0, 2), (1, 1), (2, 0)] {
        assert_eq!(
            remaining(&engine, &spec, k).await + sold,
            STOCK,
            "pool p{k}"
        );
    }
    // The new layout sells, and the pool the order had not reached yet is
    // resharded too (the order ended: nothing to settle).
    let after = engine
        .buy_lines(&request(&spec, "after", "a1", &[(0, 1), (2, 2)]))
        .await
        .unwrap();
    assert!(after.result.is_ok(), "{after:?}");
    reshard::reshard(&engine, &spec.pool_event(2).unwrap(), 1)
        .await
        .unwrap();
    for (k, sold) in [(0, 3), (1, 1), (2, 2)] {
        assert_eq!(
            remaining(&engine, &spec, k).await + sold,
            STOCK,
            "pool p{k}"
        );
    }
    check_ledger(&engine, &ledger, &spec, &[&kept, &after]).await;
}

/// The sweeper refused the cut-off order but its undo failed (the order
/// `R`, its take standing): the reshard gives the take back all the same.
async fn a_pool_resharded_under_a_refused_order_not_yet_undone_gives_its_take_back<S: Store>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let faulty = Faulty::plain(engine.store().clone());
    let engine = Arc::new(Engine::new(faulty.clone(), EngineOptions::default()));
    let (spec, kept) = order_cut_off(&engine, &ledger).await;
    faulty.arm("undo_line", 1, When::Before);
    let swept = release_sweeper::sweep_release(&engine, &spec.id, &sweep_now()).await;
    assert!(swept.is_err(), "the undo failed: {swept:?}");
    let home = shardstock::domain::keys::HomeRef::new(
        &spec.id,
        spec.home(shardstock::domain::routing::user_hash(&user("gone"))),
    );
    let left = engine
        .store()
        .stale_orders(&home, i64::MAX, 100)
        .await
        .unwrap();
    assert!(
        matches!(left.as_slice(), [(_, HomeRecord::Refused(..))]),
        "refused, not released: {left:?}"
    );
    assert_eq!(
        remaining(&engine, &spec, 0).await,
        STOCK - 3,
        "the take stands"
    );
    reshard::reshard(&engine, &spec.pool_event(0).unwrap(), 3)
        .await
        .unwrap();
    assert_eq!(remaining(&engine, &spec, 0).await, STOCK - 2, "given back");
    swept_and_asked_again(&engine, &spec).await;
    for (k, sold) in [(0, 2), (1, 1), (2, 0)] {
        assert_eq!(
            remaining(&engine, &spec, k).await + sold,
            STOCK,
            "pool p{k}"
        );
    }
    check_ledger(&engine, &ledger, &spec, &[&kept]).await;
}

/// A reshard of a pool the cut-off order had not reached leaves it pending
/// (no take there); a retry then walks that pool's new layout and buys
/// once, and replays answer the same order.
async fn a_retry_after_a_reshard_of_a_pool_not_reached_yet_buys_once<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let (spec, kept) = order_cut_off(&engine, &ledger).await;
    reshard::reshard(&engine, &spec.pool_event(2).unwrap(), 3)
        .await
        .unwrap();
    let req = request(&spec, "gone", "g1", &[(0, 1), (1, 1), (2, 1)]);
    let retry = engine.buy_lines(&req).await.unwrap();
    assert!(retry.replayed);
    assert_eq!(
        retry.result.as_ref().map(|o| o.lines.len()),
        Ok(3),
        "{retry:?}"
    );
    for _ in 0..2 {
        assert_eq!(engine.buy_lines(&req).await.unwrap().result, retry.result);
    }
    release_sweeper::sweep_release(&engine, &spec.id, &sweep_now())
        .await
        .unwrap();
    for (k, sold) in [(0, 3), (1, 2), (2, 1)] {
        assert_eq!(
            remaining(&engine, &spec, k).await + sold,
            STOCK,
            "pool p{k}"
        );
    }
    assert_eq!(units(&engine, &spec, "gone").await, 3);
    check_ledger(&engine, &ledger, &spec, &[&kept, &retry]).await;
}

/// The pool of the order's taken line is closed: the close refuses the
/// order and gives the take back before it counts the leftover, so the
/// database never holds a refused order's line as confirmed.
async fn a_pool_closed_under_a_pending_order_counts_its_take_as_leftover<S: Store>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let (spec, kept) = order_cut_off(&engine, &ledger).await;
    let id = spec.pool_event(0).unwrap();
    let mut flusher = flusher(&engine, &ledger);
    lifecycle::close(
        &engine,
        &ledger,
        &mut flusher,
        &id,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let sale = crate::harness::oracle::closed_sale(&ledger, &id, STOCK).await;
    assert!(sale.broken.is_empty(), "{:?}", sale.broken);
    let confirmed: u64 = sale
        .orders
        .values()
        .filter(|o| o.status == OrderStatus::Confirmed)
        .map(|o| u64::from(o.quantity))
        .sum();
    assert_eq!(confirmed, 2, "only the bought order's line");
    swept_and_asked_again(&engine, &spec).await;
    for (k, sold) in [(1, 1), (2, 0)] {
        assert_eq!(
            remaining(&engine, &spec, k).await + sold,
            STOCK,
            "pool p{k}"
        );
    }
    check_ledger(&engine, &ledger, &spec, &[&kept]).await;
}

on_every_backend!(namespace_per_test:
    a_pool_resharded_under_a_pending_order_gives_its_take_back,
    a_retry_after_a_reshard_of_a_pool_not_reached_yet_buys_once,
    a_pool_resharded_under_a_refused_order_not_yet_undone_gives_its_take_back,
    a_pool_closed_under_a_pending_order_counts_its_take_as_leftover,
);
