//! Releases: multi-line orders bought all or nothing over pools, on every
//! backend.
//!
//! - 64 tasks buy mixed orders of 1–3 lines over 10 pools, some retried with
//!   the same request id at once and later: per pool sold + remaining ==
//!   stock, no user over the release-wide limit, each user's count is the
//!   units of the orders they were told bought, every replay answers as the
//!   original, no order left pending; then, quiet, no false sold-out per
//!   pool; then every pool closed and read from the database alone (the
//!   oracle): each bought order's lines confirmed, no refused order with a
//!   line, confirmed + leftover == stock per pool, and every line's row
//!   names its release order (the lines of one order, and only they, share
//!   it). Also on memory and Redis with batching off.
//! - Faults: every store step failing, delayed or timing out before or
//!   after it applied, calls dropped mid-way; healed, retried and swept:
//!   the same promises, and each request's answer once final never changes.
//! - An engine that stops after a line's take: the sweeper ends the order
//!   exactly once (every take given back, the limit released), or a retry
//!   with the request id finishes it; two sweepers and a retry race to end
//!   one order once.
//! - The release model's traces (`shardstock_model::release`) replayed on
//!   the store's steps: `release_replay.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::{lifecycle, release_sweeper};
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::engine::{CrashPoint, LinesOutcome, LinesRefusal, LinesRequest};
use shardstock::{Engine, EngineError, EngineOptions, Store};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Faulty, Mode, Rule};
use crate::harness::{event_id, ledger_for, on_every_backend, user};

const POOLS: usize = 10;

/// A request as asked: user, request id, lines.
pub(crate) type Asked = (String, String, Vec<(EventId, u32)>);
const STOCK: u64 = 24;
const LIMIT: u32 = 5;

fn release_spec(pools: usize, stock: u64, buckets: u32, limit: Option<u32>) -> ReleaseSpec {
    ReleaseSpec {
        id: event_id("rel"),
        pools: (0..pools)
            .map(|k| PoolSpec {
                name: EventId::parse(format!("p{k}")).unwrap(),
                stock,
                buckets,
                auto_buckets: None,
            })
            .collect(),
        per_user_limit: limit,
        max_per_order: 3,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        homes: 8,
    }
}

pub(crate) fn pool(k: usize) -> EventId {
    EventId::parse(format!("p{k}")).unwrap()
}

/// An order of 1–3 distinct pools, 3 units at most.
fn random_lines(rng: &mut impl Rng, pools: usize) -> Vec<(EventId, u32)> {
    let n = rng.random_range(1..=3usize.min(pools));
    let mut picked: Vec<usize> = Vec::new();
    while picked.len() < n {
        let k = rng.random_range(0..pools);
        if !picked.contains(&k) {
            picked.push(k);
        }
    }
    let mut left = 3u32;
    picked
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let rest = (n - i - 1) as u32;
            let q = rng.random_range(1..=(left - rest).min(2));
            left -= q;
            (pool(k), q)
        })
        .collect()
}

pub(crate) fn request(
    spec: &ReleaseSpec,
    u: &str,
    lines: Vec<(EventId, u32)>,
    rid: Option<String>,
) -> LinesRequest {
    LinesRequest {
        release: spec.id.clone(),
        user: user(u),
        lines,
        request_id: rid.map(|r| RequestId::parse(r).unwrap()),
    }
}

/// What every final answer said, by request.
#[derive(Default)]
pub(crate) struct Book {
    /// Final answers by (user, request id).
    pub(crate) answers: HashMap<(String, String), LinesOutcome>,
    /// Units bought per user and per pool (from the answers).
    bought_user: HashMap<String, u64>,
    bought_pool: HashMap<String, u64>,
    /// The bought orders' line order ids, and the refused orders' requests.
    bought_lines: Vec<String>,
    /// Each bought line's release order id.
    line_orders: HashMap<String, String>,
    replays: u32,
}

impl Book {
    /// Records a final answer; a replay must answer as the first did.
    pub(crate) fn note(&mut self, u: &str, rid: &str, out: &LinesOutcome) {
        let key = (u.to_owned(), rid.to_owned());
        if let Some(first) = self.answers.get(&key) {
            let same = match (&first.result, &out.result) {
                // A limit refusal replays with the user's count now.
                (
                    Err(LinesRefusal::LimitExceeded { limit: a, .. }),
                    Err(LinesRefusal::LimitExceeded { limit: b, .. }),
                ) => a == b,
                (a, b) => a == b,
            };
            assert!(same, "request {key:?}: first {first:?}, then {out:?}");
            self.replays += 1;
            return;
        }
        if let Ok(order) = &out.result {
            assert!(!order.lines.is_empty());
            for line in &order.lines {
                *self.bought_user.entry(u.to_owned()).or_default() += u64::from(line.quantity);
                *self
                    .bought_pool
                    .entry(line.pool.as_str().rsplit('.').next().unwrap().to_owned())
                    .or_default() += u64::from(line.quantity);
                self.bought_lines.push(line.order_id.to_string());
                self.line_orders
                    .insert(line.order_id.to_string(), order.order_id.to_string());
            }
        }
        if let Err(LinesRefusal::SoldOut { short }) = &out.result {
            assert!(!short.is_empty());
            for s in short {
                assert!(
                    s.remaining < u64::from(s.quantity),
                    "a short line with enough left: {s:?}"
                );
            }
        }
        self.answers.insert(key, out.clone());
    }
}

/// The promises on the store: per pool sold + remaining == stock, each
/// user's count == what they were told bought (within the limit), nothing
/// pending.
pub(crate) async fn check_store<S: Store>(
    engine: &Engine<S>,
    spec: &ReleaseSpec,
    book: &Book,
    users: &[String],
) {
    for k in 0..spec.pools.len() {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        let sold = book.bought_pool.get(&format!("p{k}")).copied().unwrap_or(0);
        assert_eq!(
            sold + view.remaining,
            spec.pools[k].stock,
            "pool p{k}: told bought {sold}, remaining {}",
            view.remaining
        );
    }
    for u in users {
        let held = engine
            .release_units(&spec.id, &user(u.as_str()))
            .await
            .unwrap();
        let bought = book.bought_user.get(u).copied().unwrap_or(0);
        assert_eq!(held, bought, "user {u}: count {held}, told bought {bought}");
        if let Some(limit) = spec.per_user_limit {
            assert!(
                held <= u64::from(limit),
                "user {u} holds {held} over {limit}"
            );
        }
    }
    for h in 0..spec.homes {
        let home = shardstock::domain::keys::HomeRef::new(&spec.id, h);
        let left = engine
            .store()
            .stale_orders(&home, i64::MAX, 1_000)
            .await
            .unwrap();
        assert!(left.is_empty(), "orders not ended: {left:?}");
    }
}

/// Quiet: every pool with units left sells one to a new buyer (no false
/// sold-out), and an order of more than a pool has is refused naming it.
pub(crate) async fn check_no_false_sold_out<S: Store>(
    engine: &Engine<S>,
    spec: &ReleaseSpec,
    book: &mut Book,
) {
    for k in 0..spec.pools.len() {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        let u = format!("quiet-{k}");
        let rid = format!("q{k}");
        let want = view.remaining.clamp(1, 3) as u32;
        let out = engine
            .buy_lines(&request(spec, &u, vec![(pool(k), want)], Some(rid.clone())))
            .await
            .unwrap();
        if view.remaining >= u64::from(want) {
            assert!(
                out.result.is_ok(),
                "pool p{k} has {} left: {out:?}",
                view.remaining
            );
        } else {
            assert_eq!(
                out.result,
                Err(LinesRefusal::SoldOut {
                    short: vec![shardstock::engine::ShortLine {
                        pool: spec.pool_event(k).unwrap(),
                        quantity: want,
                        remaining: view.remaining
                    }]
                })
            );
        }
        book.note(&u, &rid, &out);
    }
}

fn flush_options() -> FlushOptions {
    FlushOptions {
        batch: 500,
        workers: 2,
        idle: Duration::from_millis(10),
        claim_idle_ms: 500,
    }
}

/// Closes every pool and reads it from the database alone: the oracle, and
/// each bought line confirmed, no other order confirmed.
pub(crate) async fn check_ledger<S: Store>(
    engine: Arc<Engine<S>>,
    ledger: shardstock::ledger::Ledger,
    spec: &ReleaseSpec,
    book: &Book,
) {
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("rel-{}", rand::random::<u32>()),
        flush_options(),
    );
    let stop = CancellationToken::new();
    let mut confirmed = Vec::new();
    let mut by_order: HashMap<String, Vec<String>> = HashMap::new();
    for k in 0..spec.pools.len() {
        let id = spec.pool_event(k).unwrap();
        lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
            .await
            .unwrap();
        let sale = crate::harness::oracle::closed_sale(&ledger, &id, spec.pools[k].stock).await;
        assert!(sale.broken.is_empty(), "pool p{k}: {:?}", sale.broken);
        for (oid, order) in sale.orders {
            // Every line, whatever became of it, names its release order:
            // the release's id with the line's hash and tail.
            let named = order.release_order.as_ref().map(|o| o.to_string());
            let tail = oid.strip_prefix(id.as_str()).unwrap();
            assert_eq!(
                named,
                Some(format!("{}{tail}", spec.id)),
                "line {oid}: its release order in the ledger"
            );
            if order.status == shardstock::domain::model::OrderStatus::Confirmed {
                assert_eq!(
                    named.as_ref(),
                    book.line_orders.get(&oid),
                    "line {oid}: the order its buyer was told"
                );
                by_order
                    .entry(named.unwrap())
                    .or_default()
                    .push(oid.clone());
                confirmed.push(oid);
            }
        }
    }
    // All lines of one bought order, and only they, share its id.
    let mut told_by_order: HashMap<String, Vec<String>> = HashMap::new();
    for (line, order) in &book.line_orders {
        told_by_order
            .entry(order.clone())
            .or_default()
            .push(line.clone());
    }
    for lines in by_order.values_mut().chain(told_by_order.values_mut()) {
        lines.sort();
    }
    assert_eq!(by_order, told_by_order, "each order's lines in the ledger");
    confirmed.sort();
    let mut told = book.bought_lines.clone();
    told.sort();
    assert_eq!(
        confirmed, told,
        "the database's confirmed lines are the bought orders' lines"
    );
}

async fn sixty_four_tasks_buy_mixed_orders_all_or_nothing<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let spec = release_spec(POOLS, STOCK, 4, Some(LIMIT));
    lifecycle::create_release(&engine, &ledger, spec.clone())
        .await
        .unwrap();
    let book = Arc::new(Mutex::new(Book::default()));
    let users: Vec<String> = (0..160).map(|u| format!("u{u}")).collect();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (engine, spec, book, users) =
                (engine.clone(), spec.clone(), book.clone(), users.clone());
            tokio::spawn(async move {
                let mut earlier: Vec<Asked> = Vec::new();
                for i in 0..12 {
                    let (u, rid, lines) = {
                        let mut rng = rand::rng();
                        // Now and then a retry, later, of an earlier request.
                        if !earlier.is_empty() && rng.random_bool(0.2) {
                            earlier[rng.random_range(0..earlier.len())].clone()
                        } else {
                            let u = users[rng.random_range(0..users.len())].clone();
                            (u, format!("t{t}-{i}"), random_lines(&mut rng, POOLS))
                        }
                    };
                    let req = request(&spec, &u, lines.clone(), Some(rid.clone()));
                    let at_once = rand::rng().random_bool(0.2);
                    let (a, b) = if at_once {
                        let (a, b) = tokio::join!(engine.buy_lines(&req), engine.buy_lines(&req));
                        (a, Some(b))
                    } else {
                        (engine.buy_lines(&req).await, None)
                    };
                    for out in std::iter::once(a).chain(b) {
                        let out = out.unwrap_or_else(|e| panic!("{u} {rid}: {e}"));
                        book.lock().unwrap().note(&u, &rid, &out);
                    }
                    earlier.push((u, rid, lines));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut book = Arc::try_unwrap(book).ok().unwrap().into_inner().unwrap();
    assert!(book.replays > 0);
    let bought = book.answers.values().filter(|o| o.result.is_ok()).count();
    let short = book
        .answers
        .values()
        .filter(|o| matches!(o.result, Err(LinesRefusal::SoldOut { .. })))
        .count();
    let limited = book
        .answers
        .values()
        .filter(|o| matches!(o.result, Err(LinesRefusal::LimitExceeded { .. })))
        .count();
    println!(
        "bought {bought}, sold out {short}, over the limit {limited}, replays {}",
        book.replays
    );
    assert!(bought > 0 && short > 0, "the run must sell out some pools");
    check_store(&engine, &spec, &book, &users).await;
    check_no_false_sold_out(&engine, &spec, &mut book).await;
    let mut all = users.clone();
    all.extend((0..POOLS).map(|k| format!("quiet-{k}")));
    check_store(&engine, &spec, &book, &all).await;
    check_ledger(engine, ledger, &spec, &book).await;
}

/// [`faults_in_every_step`] on large stacks (`harness::on_large_stacks`): in
/// a debug build an order's driver, its walk, an on-demand consolidation and
/// a faulty store's retries nest deep enough to overflow the test thread's
/// 2 MiB (it did on Redis and the Cluster once the walk learnt to follow a
/// reshard).
async fn faults_in_every_step_keep_every_promise<S: Store>(engine: Engine<S>) {
    crate::harness::on_large_stacks(move || faults_in_every_step(engine)).await;
}

/// A store whose every step fails now and then: before or after it applied.
async fn faults_in_every_step<S: Store>(engine: Engine<S>) {
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let faulty = Faulty::new(engine.store().clone(), seed);
    let engine = Arc::new(Engine::new(faulty.clone(), EngineOptions::default()));
    let spec = release_spec(4, 10, 2, Some(4));
    engine.create_release(spec.clone()).await.unwrap();
    faulty.everywhere(Rule {
        probability: 0.08,
        mode: Mode::Any {
            max_delay: Duration::from_millis(5),
        },
    });
    let users: Vec<String> = (0..40).map(|u| format!("u{u}")).collect();
    let requests: Vec<Asked> = (0..200)
        .map(|i| {
            let mut rng = rand::rng();
            (
                users[rng.random_range(0..users.len())].clone(),
                format!("r{i}"),
                random_lines(&mut rng, 4),
            )
        })
        .collect();
    let book = Arc::new(Mutex::new(Book::default()));
    let tasks: Vec<_> = requests
        .chunks(8)
        .map(|chunk| {
            let (engine, spec, book, chunk) =
                (engine.clone(), spec.clone(), book.clone(), chunk.to_vec());
            tokio::spawn(async move {
                for (u, rid, lines) in chunk {
                    let req = request(&spec, &u, lines, Some(rid.clone()));
                    for _ in 0..3 {
                        // Some calls are dropped mid-way (a client that left).
                        let cut = rand::rng().random_bool(0.15);
                        let out = if cut {
                            match tokio::time::timeout(
                                Duration::from_millis(1),
                                engine.buy_lines(&req),
                            )
                            .await
                            {
                                Ok(out) => out,
                                Err(_) => continue,
                            }
                        } else {
                            engine.buy_lines(&req).await
                        };
                        match out {
                            Ok(out) => {
                                book.lock().unwrap().note(&u, &rid, &out);
                                break;
                            }
                            Err(EngineError::OutcomeUnknown(_) | EngineError::Store(_)) => {}
                            Err(e) => panic!("{u} {rid}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    faulty.heal();
    // A dropped call's last command may still be on its way.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let injected = faulty.injected();
    let on_release_steps = injected
        .iter()
        .filter(|i| shardstock::store::releases::STEPS.contains(&i.step))
        .count();
    println!(
        "{} faults injected, {on_release_steps} in release steps",
        injected.len()
    );
    assert!(on_release_steps > 0);
    // Settled: the sweeper with no wait ends what no driver finished, then
    // every request is asked again (a replay answers from its record).
    release_sweeper::sweep_release(&engine, &spec.id, &sweep_now())
        .await
        .unwrap();
    let mut book = Arc::try_unwrap(book).ok().unwrap().into_inner().unwrap();
    for (u, rid, lines) in &requests {
        let out = engine
            .buy_lines(&request(&spec, u, lines.clone(), Some(rid.clone())))
            .await
            .unwrap();
        book.note(u, rid, &out);
    }
    check_store(&engine, &spec, &book, &users).await;
    check_no_false_sold_out(&engine, &spec, &mut book).await;
}

fn sweep_now() -> shardstock::control::saga_sweeper::SagaSweepOptions {
    shardstock::control::saga_sweeper::SagaSweepOptions {
        interval: Duration::from_millis(10),
        stale_after: Duration::ZERO,
        per_bucket: 64,
    }
}

/// An engine stops after its first line's take: the sweeper aborts the
/// order, gives the take back and releases the limit, once, whoever else
/// races it; a retry then answers the refusal.
async fn an_engine_gone_between_lines_is_ended_once_by_the_sweeper<S: Store>(engine: Engine<S>) {
    let spec = release_spec(3, 4, 2, Some(3));
    let engine = Arc::new(engine);
    engine.create_release(spec.clone()).await.unwrap();
    let lines = vec![(pool(0), 1), (pool(1), 1), (pool(2), 1)];
    let req = request(&spec, "gone", lines.clone(), Some("g1".into()));
    engine.inject_crash(CrashPoint::AfterTake);
    let crashed = engine.buy_lines(&req).await;
    engine.inject_crash(CrashPoint::None);
    assert!(
        matches!(crashed, Err(EngineError::InjectedCrash(_))),
        "{crashed:?}"
    );
    let taken = engine
        .view(&spec.pool_event(0).unwrap())
        .await
        .unwrap()
        .remaining;
    assert_eq!(taken, 3, "the first line was taken");
    assert_eq!(
        engine.release_units(&spec.id, &user("gone")).await.unwrap(),
        3
    );
    // Two sweepers at once end it once.
    let opts = sweep_now();
    let (a, b) = tokio::join!(
        release_sweeper::sweep_release(&engine, &spec.id, &opts),
        release_sweeper::sweep_release(&engine, &spec.id, &opts)
    );
    assert!(a.unwrap() + b.unwrap() >= 1);
    for k in 0..3 {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        assert_eq!(view.remaining, 4, "pool p{k}: every take given back once");
    }
    assert_eq!(
        engine.release_units(&spec.id, &user("gone")).await.unwrap(),
        0
    );
    let again = engine.buy_lines(&req).await.unwrap();
    assert_eq!(again.result, Err(LinesRefusal::GaveUp));
    assert!(again.replayed);
    assert_eq!(
        release_sweeper::sweep_release(&engine, &spec.id, &opts)
            .await
            .unwrap(),
        0
    );
}

/// An engine stops after a line's take; a retry with the request id (here
/// racing a sweeper) ends the order once: bought, or refused with nothing
/// kept.
async fn a_retry_after_an_engine_stopped_between_lines_ends_the_order_once<S: Store>(
    engine: Engine<S>,
) {
    let spec = release_spec(2, 4, 2, Some(4));
    let engine = Arc::new(engine);
    engine.create_release(spec.clone()).await.unwrap();
    let req = request(
        &spec,
        "back",
        vec![(pool(0), 2), (pool(1), 1)],
        Some("b1".into()),
    );
    engine.inject_crash(CrashPoint::AfterTake);
    assert!(engine.buy_lines(&req).await.is_err());
    engine.inject_crash(CrashPoint::None);
    let opts = sweep_now();
    let (retry, swept) = tokio::join!(
        engine.buy_lines(&req),
        release_sweeper::sweep_release(&engine, &spec.id, &opts)
    );
    swept.unwrap();
    let retry = retry.unwrap();
    let again = engine.buy_lines(&req).await.unwrap();
    assert_eq!(again.result, retry.result, "decided once");
    let (r0, r1) = (
        engine
            .view(&spec.pool_event(0).unwrap())
            .await
            .unwrap()
            .remaining,
        engine
            .view(&spec.pool_event(1).unwrap())
            .await
            .unwrap()
            .remaining,
    );
    let units = engine.release_units(&spec.id, &user("back")).await.unwrap();
    match retry.result {
        Ok(order) => {
            assert_eq!(order.lines.len(), 2);
            assert_eq!((r0, r1, units), (2, 3, 3));
        }
        Err(LinesRefusal::GaveUp) => assert_eq!((r0, r1, units), (4, 4, 0)),
        other => panic!("{other:?}"),
    }
}

/// A two-line order whose second pool is sold out is refused naming it,
/// and keeps nothing of the first; the limit counts across pools.
async fn a_short_second_line_refuses_the_order_and_the_limit_spans_pools<S: Store>(
    engine: Engine<S>,
) {
    let spec = release_spec(2, 3, 2, Some(3));
    engine.create_release(spec.clone()).await.unwrap();
    let one = |u: &str, rid: &str, lines| request(&spec, u, lines, Some(rid.into()));
    let out = engine
        .buy_lines(&one("a", "1", vec![(pool(1), 3)]))
        .await
        .unwrap();
    assert!(out.result.is_ok());
    let out = engine
        .buy_lines(&one("b", "1", vec![(pool(0), 2), (pool(1), 1)]))
        .await
        .unwrap();
    assert_eq!(
        out.result,
        Err(LinesRefusal::SoldOut {
            short: vec![shardstock::engine::ShortLine {
                pool: spec.pool_event(1).unwrap(),
                quantity: 1,
                remaining: 0
            }]
        })
    );
    assert_eq!(
        engine
            .view(&spec.pool_event(0).unwrap())
            .await
            .unwrap()
            .remaining,
        3
    );
    assert_eq!(engine.release_units(&spec.id, &user("b")).await.unwrap(), 0);
    let out = engine
        .buy_lines(&one("b", "2", vec![(pool(0), 2)]))
        .await
        .unwrap();
    assert!(out.result.is_ok());
    let over = engine
        .buy_lines(&one("b", "3", vec![(pool(0), 1), (pool(1), 1)]))
        .await
        .unwrap();
    assert!(
        matches!(
            over.result,
            Err(LinesRefusal::LimitExceeded { limit: 3, held: 2 })
        ),
        "{over:?}"
    );
    let replay = engine
        .buy_lines(&one("b", "1", vec![(pool(0), 2), (pool(1), 1)]))
        .await
        .unwrap();
    assert!(replay.replayed && matches!(replay.result, Err(LinesRefusal::SoldOut { .. })));
    let conflict = engine.buy_lines(&one("b", "1", vec![(pool(0), 1)])).await;
    assert!(
        matches!(conflict, Err(EngineError::IdempotencyConflict(_))),
        "{conflict:?}"
    );
}

on_every_backend!(namespace_per_test, unbatched:
    sixty_four_tasks_buy_mixed_orders_all_or_nothing,
);

on_every_backend!(namespace_per_test:
    sixty_four_tasks_buy_mixed_orders_all_or_nothing,
    faults_in_every_step_keep_every_promise,
    an_engine_gone_between_lines_is_ended_once_by_the_sweeper,
    a_retry_after_an_engine_stopped_between_lines_ends_the_order_once,
    a_short_second_line_refuses_the_order_and_the_limit_spans_pools,
);
