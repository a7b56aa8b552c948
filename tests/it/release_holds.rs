//! Holds on a release order, on every backend: confirm, cancel and expiry
//! act on the whole order (docs/DESIGN.md, "Holds on a release order").
//!
//! - Tasks buy mixed orders as holds; about 30% never pay, some cancel, the
//!   rest confirm, some twice at once, and purchases are replayed by request
//!   id; then confirms race the expiry (an instance whose clock is just
//!   before `pay_by` against a sweeper just past it). Live: per pool held
//!   and confirmed units + remaining == stock, each user's count the units
//!   of their orders held or confirmed. Swept: nothing left listed, each
//!   order's status what its client was last told. Then every pool closed
//!   and read from the database alone (the oracle): confirmed + leftover ==
//!   stock, no order ended two ways, and each line's status its order's.
//! - The same with every store step failing now and then, before or after
//!   it applied, under confirm, cancel and the sweep.
//! - An engine gone between a home decision and its lines: the sweeper and
//!   a racing call finish them, each line once.
//! - A pool's close decides the held orders with a line in it (expired, all
//!   their lines) and leaves confirmed ones confirmed.
//! - Every sweeper away for longer than the markers' lifetime: a held
//!   order's takes still stand, so its confirm and give-back find them, and
//!   once their own markers expired a replay answers done, units back once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::{lifecycle, release_sweeper};
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::keys::HomeRef;
use shardstock::domain::model::OrderStatus;
use shardstock::domain::release::{HoldState, HomeRecord, PoolSpec, ReleaseSpec};
use shardstock::domain::routing::user_hash;
use shardstock::engine::{
    HoldRefusal, LinesRefusal, LinesRequest, ManualClock, ReleaseOrder, ReleaseOrderStatus,
};
use shardstock::{Engine, EngineError, EngineOptions, Store};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Fault, Faulty, Mode, Rule, When};
use crate::harness::{event_id, ledger_for, on_every_backend, user};

const HOLD_S: u32 = 60;

fn spec(pools: usize, stock: u64, buckets: u32, limit: Option<u32>) -> ReleaseSpec {
    ReleaseSpec {
        id: event_id("hrel"),
        pools: (0..pools)
            .map(|k| PoolSpec {
                name: pool(k),
                stock,
                buckets,
                auto_buckets: None,
            })
            .collect(),
        per_user_limit: limit,
        max_per_order: 3,
        starts_at: None,
        ends_at: None,
        hold_seconds: Some(HOLD_S),
        homes: 8,
    }
}

fn pool(k: usize) -> EventId {
    EventId::parse(format!("p{k}")).unwrap()
}

fn request(spec: &ReleaseSpec, u: &str, lines: Vec<(EventId, u32)>, rid: &str) -> LinesRequest {
    LinesRequest {
        release: spec.id.clone(),
        user: user(u),
        lines,
        request_id: Some(RequestId::parse(rid).unwrap()),
    }
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
    picked.into_iter().map(|k| (pool(k), 1)).collect()
}

fn sweep_now() -> shardstock::control::saga_sweeper::SagaSweepOptions {
    shardstock::control::saga_sweeper::SagaSweepOptions {
        interval: Duration::from_millis(10),
        stale_after: Duration::ZERO,
        per_bucket: 64,
    }
}

/// What a buyer does with a held order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    NeverPay,
    Cancel,
    Confirm,
    /// Confirms at the deadline, racing the sweeper.
    Race,
}

/// One bought order: what its client was last told.
#[derive(Debug, Clone)]
struct Told {
    user: String,
    rid: String,
    order: ReleaseOrder,
    fate: Fate,
}

type Book = Arc<Mutex<HashMap<String, Told>>>;

/// Purchases whose answer every attempt lost to a fault: asked again once
/// healed.
type Lost = Arc<Mutex<Vec<(String, String, LinesRequest)>>>;

/// Retries a call whose outcome a fault may hide (`OutcomeUnknown`, a store
/// error) until it answers; `None` when it never did (asked again later).
async fn retried<T, F, Fut>(attempts: u32, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, EngineError>>,
{
    for _ in 0..attempts {
        match call().await {
            Ok(v) => return Some(v),
            Err(EngineError::OutcomeUnknown(_) | EngineError::Store(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    None
}

/// The answer of a confirm or cancel as the status its client is told.
fn told(result: &Result<ReleaseOrder, HoldRefusal>) -> ReleaseOrder {
    match result {
        Ok(o)
        | Err(HoldRefusal::Expired(o) | HoldRefusal::Cancelled(o) | HoldRefusal::Confirmed(o)) => {
            o.clone()
        }
    }
}

/// Buys an order and acts out its fate (before the deadline), with retries.
async fn buy_one<S: Store>(
    engine: &Engine<S>,
    spec: &ReleaseSpec,
    (book, lost): (&Book, &Lost),
    u: &str,
    rid: &str,
) {
    let (lines, fate) = {
        let mut rng = rand::rng();
        let x: f64 = rng.random();
        let fate = if x < 0.15 {
            Fate::NeverPay
        } else if x < 0.30 {
            Fate::Race
        } else if x < 0.45 {
            Fate::Cancel
        } else {
            Fate::Confirm
        };
        (random_lines(&mut rng, spec.pools.len()), fate)
    };
    let req = request(spec, u, lines, rid);
    let Some(out) = retried(4, || engine.buy_lines(&req)).await else {
        lost.lock()
            .unwrap()
            .push((u.to_owned(), rid.to_owned(), req));
        return;
    };
    let mut order = match out.result {
        Ok(order) => order,
        Err(
            LinesRefusal::SoldOut { .. }
            | LinesRefusal::LimitExceeded { .. }
            | LinesRefusal::GaveUp,
        ) => return,
    };
    assert_eq!(order.status, ReleaseOrderStatus::Held, "{order:?}");
    assert!(order.pay_by.is_some());
    let id = order.order_id.to_string();
    // A replay by request id answers the same order.
    if rand::rng().random_bool(0.3)
        && let Some(again) = retried(4, || engine.buy_lines(&req)).await
    {
        assert!(again.replayed);
        assert_eq!(
            again.result.as_ref().ok(),
            Some(&order),
            "a replay answers the same"
        );
    }
    let twice = rand::rng().random_bool(0.3);
    let act = |cancel: bool| {
        let (engine, release, id) = (engine, spec.id.clone(), id.clone());
        async move {
            retried(6, || async {
                if cancel {
                    engine.cancel_release_order(&release, &id).await
                } else {
                    engine.confirm_release_order(&release, &id).await
                }
            })
            .await
        }
    };
    match fate {
        Fate::Cancel | Fate::Confirm => {
            let cancel = fate == Fate::Cancel;
            let (a, b) = if twice {
                let (a, b) = tokio::join!(act(cancel), act(cancel));
                (a, b)
            } else {
                (act(cancel).await, None)
            };
            let want = if cancel {
                ReleaseOrderStatus::Cancelled
            } else {
                ReleaseOrderStatus::Confirmed
            };
            for out in [a, b].into_iter().flatten() {
                let o = told(&out.result);
                assert_eq!(o.status, want, "{out:?}");
                assert!(out.result.is_ok(), "{out:?}");
                order = o;
            }
        }
        Fate::NeverPay | Fate::Race => {}
    }
    book.lock().unwrap().insert(
        id,
        Told {
            user: u.to_owned(),
            rid: rid.to_owned(),
            order,
            fate,
        },
    );
}

/// Per pool, units of orders held or confirmed + remaining == stock; each
/// user's count the units of their orders held or confirmed.
async fn check_live<S: Store>(engine: &Engine<S>, spec: &ReleaseSpec, book: &Book) {
    let book = book.lock().unwrap().clone();
    let mut per_pool: HashMap<EventId, u64> = HashMap::new();
    let mut per_user: HashMap<String, u64> = HashMap::new();
    for t in book.values() {
        if matches!(
            t.order.status,
            ReleaseOrderStatus::Held | ReleaseOrderStatus::Confirmed
        ) {
            for l in &t.order.lines {
                *per_pool.entry(l.pool.clone()).or_default() += u64::from(l.quantity);
                *per_user.entry(t.user.clone()).or_default() += u64::from(l.quantity);
            }
        }
    }
    for k in 0..spec.pools.len() {
        let event = spec.pool_event(k).unwrap();
        let view = engine.view(&event).await.unwrap();
        let sold = per_pool.get(&event).copied().unwrap_or(0);
        assert_eq!(
            sold + view.remaining,
            spec.pools[k].stock,
            "pool p{k}: held or confirmed {sold}, remaining {}",
            view.remaining
        );
    }
    let users: std::collections::HashSet<&String> = book.values().map(|t| &t.user).collect();
    for u in users {
        let held = engine.release_units(&spec.id, &user(u)).await.unwrap();
        assert_eq!(held, per_user.get(u).copied().unwrap_or(0), "user {u}");
        if let Some(limit) = spec.per_user_limit {
            assert!(held <= u64::from(limit), "user {u} holds {held}");
        }
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

/// Closes every pool; the oracle per pool, and every line's status in the
/// database its order's status as its client was last told.
async fn check_ledger<S: Store>(
    engine: Arc<Engine<S>>,
    ledger: shardstock::ledger::Ledger,
    spec: &ReleaseSpec,
    book: &HashMap<String, Told>,
) {
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("hrel-{}", rand::random::<u32>()),
        flush_options(),
    );
    let stop = CancellationToken::new();
    let mut db: HashMap<String, OrderStatus> = HashMap::new();
    for k in 0..spec.pools.len() {
        let id = spec.pool_event(k).unwrap();
        lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
            .await
            .unwrap();
        let sale = crate::harness::oracle::closed_sale(&ledger, &id, spec.pools[k].stock).await;
        assert!(sale.broken.is_empty(), "pool p{k}: {:?}", sale.broken);
        db.extend(sale.orders.into_iter().map(|(oid, o)| (oid, o.status)));
    }
    for t in book.values() {
        let want = match t.order.status {
            ReleaseOrderStatus::Confirmed => OrderStatus::Confirmed,
            ReleaseOrderStatus::Cancelled => OrderStatus::Cancelled,
            ReleaseOrderStatus::Expired => OrderStatus::Expired,
            ReleaseOrderStatus::Held => panic!("order {} still held: {t:?}", t.order.order_id),
        };
        for l in &t.order.lines {
            assert_eq!(
                db.get(l.order_id.as_str()),
                Some(&want),
                "line {} of {t:?}",
                l.order_id
            );
        }
    }
}

/// Nothing left listed at any home.
async fn check_nothing_listed<S: Store>(engine: &Engine<S>, spec: &ReleaseSpec) {
    for h in 0..spec.homes {
        let home = HomeRef::new(&spec.id, h);
        let left = engine
            .store()
            .stale_orders(&home, i64::MAX, 1_000)
            .await
            .unwrap();
        assert!(left.is_empty(), "orders not ended: {left:?}");
    }
}

async fn mixed_holds<S: Store>(engine: Engine<S>, faults: bool) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let faulty = Faulty::new(engine.store().clone(), seed);
    let plain = Arc::new(engine.with_clock(clock.clone().into()));
    let spec = spec(10, 16, 2, Some(4));
    lifecycle::create_release(&plain, &ledger, spec.clone())
        .await
        .unwrap();
    let buyer = Arc::new(
        Engine::new(faulty.clone(), EngineOptions::default()).with_clock(clock.clone().into()),
    );
    if faults {
        faulty.everywhere(Rule {
            probability: 0.05,
            mode: Mode::Any {
                max_delay: Duration::from_millis(3),
            },
        });
    }
    let book: Book = Arc::default();
    let lost: Lost = Arc::default();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (engine, spec, book, lost) =
                (buyer.clone(), spec.clone(), book.clone(), lost.clone());
            tokio::spawn(async move {
                for i in 0..3 {
                    let u = format!("u{}", rand::rng().random_range(0..60));
                    buy_one(&engine, &spec, (&book, &lost), &u, &format!("t{t}-{i}")).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    if faults {
        faulty.heal();
        tokio::time::sleep(Duration::from_millis(100)).await;
        println!("{} faults injected", faulty.injected().len());
    }
    // A purchase whose answer was lost, asked again: a hold never paid.
    let lost = std::mem::take(&mut *lost.lock().unwrap());
    for (u, rid, req) in lost {
        if let Ok(order) = plain.buy_lines(&req).await.unwrap().result {
            let told = Told {
                user: u,
                rid,
                order,
                fate: Fate::NeverPay,
            };
            book.lock()
                .unwrap()
                .insert(told.order.order_id.to_string(), told);
        }
    }
    // Every order a client did not learn the end of, asked again.
    let entries: Vec<Told> = book.lock().unwrap().values().cloned().collect();
    for t in &entries {
        let now = plain
            .release_order(&spec.id, t.order.order_id.as_str())
            .await
            .unwrap();
        if now.status != t.order.status {
            // A confirm or cancel whose answer a fault hid: asked again.
            let out = match t.fate {
                Fate::Cancel => {
                    plain
                        .cancel_release_order(&spec.id, now.order_id.as_str())
                        .await
                }
                _ => {
                    plain
                        .confirm_release_order(&spec.id, now.order_id.as_str())
                        .await
                }
            }
            .unwrap();
            book.lock()
                .unwrap()
                .get_mut(now.order_id.as_str())
                .unwrap()
                .order = told(&out.result);
        }
    }
    let n = book.lock().unwrap().len();
    assert!(n > 10, "only {n} orders bought");
    check_live(&plain, &spec, &book).await;
    // The deadline: racers confirm from an instance just before it while
    // sweepers just past it expire what is due.
    let pay_by = spec.pay_by(clock.now_ms()).unwrap();
    let early = Arc::new(
        Engine::new(faulty.clone(), EngineOptions::default())
            .with_clock(ManualClock::at(pay_by - 1).into()),
    );
    let late = Arc::new(
        Engine::new(faulty.clone(), EngineOptions::default())
            .with_clock(ManualClock::at(pay_by).into()),
    );
    if faults {
        faulty.everywhere(Rule {
            probability: 0.05,
            mode: Mode::Any {
                max_delay: Duration::from_millis(3),
            },
        });
    }
    let racers: Vec<Told> = book
        .lock()
        .unwrap()
        .values()
        .filter(|t| t.fate == Fate::Race)
        .cloned()
        .collect();
    let confirms = racers.iter().map(|t| {
        let (early, release, id) = (early.clone(), spec.id.clone(), t.order.order_id.to_string());
        tokio::spawn(async move {
            let out = retried(6, || early.confirm_release_order(&release, &id)).await;
            (id, out)
        })
    });
    let confirms: Vec<_> = confirms.collect();
    for _ in 0..3 {
        let _ = release_sweeper::sweep_release(&late, &spec.id, &sweep_now()).await;
    }
    for c in confirms {
        let (id, out) = c.await.unwrap();
        if let Some(out) = out {
            let o = told(&out.result);
            assert!(
                matches!(
                    o.status,
                    ReleaseOrderStatus::Confirmed | ReleaseOrderStatus::Expired
                ),
                "{out:?}"
            );
            book.lock().unwrap().get_mut(&id).unwrap().order = o;
        }
    }
    faulty.heal();
    tokio::time::sleep(Duration::from_millis(100)).await;
    while release_sweeper::sweep_release(&late, &spec.id, &sweep_now())
        .await
        .is_err()
    {}
    check_nothing_listed(&plain, &spec).await;
    // Each order's status is what its client was last told; the ones never
    // answered (never paid, or a racer whose answer a fault hid) learn it.
    let entries: Vec<Told> = book.lock().unwrap().values().cloned().collect();
    for t in &entries {
        let now = late
            .release_order(&spec.id, t.order.order_id.as_str())
            .await
            .unwrap();
        match (t.fate, t.order.status) {
            (Fate::NeverPay, _) => assert_eq!(now.status, ReleaseOrderStatus::Expired),
            (_, ReleaseOrderStatus::Held) => assert!(
                matches!(
                    now.status,
                    ReleaseOrderStatus::Confirmed | ReleaseOrderStatus::Expired
                ),
                "{now:?}"
            ),
            (_, was) => assert_eq!(now.status, was, "{t:?}"),
        }
        // A replay of the purchase answers the order as it stands.
        let req = request(
            &spec,
            &t.user,
            now.lines
                .iter()
                .map(|l| {
                    (
                        EventId::parse(l.pool.as_str().split_once('.').unwrap().1).unwrap(),
                        l.quantity,
                    )
                })
                .collect(),
            &t.rid,
        );
        let again = late.buy_lines(&req).await.unwrap();
        assert_eq!(again.result.as_ref().ok(), Some(&now));
        let id = now.order_id.to_string();
        book.lock().unwrap().get_mut(&id).unwrap().order = now;
    }
    // A paid order is not cancelled; an expired one is not confirmed.
    let entries: Vec<Told> = book.lock().unwrap().values().cloned().collect();
    for t in entries.iter().take(20) {
        let id = t.order.order_id.as_str();
        let confirm = late.confirm_release_order(&spec.id, id).await.unwrap();
        let cancel = late.cancel_release_order(&spec.id, id).await.unwrap();
        assert!(confirm.already && cancel.already);
        match t.order.status {
            ReleaseOrderStatus::Confirmed => {
                assert!(confirm.result.is_ok());
                assert!(matches!(cancel.result, Err(HoldRefusal::Confirmed(_))));
            }
            ReleaseOrderStatus::Expired => {
                assert!(matches!(confirm.result, Err(HoldRefusal::Expired(_))));
                assert!(matches!(cancel.result, Err(HoldRefusal::Expired(_))));
            }
            ReleaseOrderStatus::Cancelled => {
                assert!(matches!(confirm.result, Err(HoldRefusal::Cancelled(_))));
                assert!(cancel.result.is_ok());
            }
            ReleaseOrderStatus::Held => panic!("{t:?}"),
        }
    }
    check_live(&plain, &spec, &book).await;
    let book = book.lock().unwrap().clone();
    let count = |s| book.values().filter(|t| t.order.status == s).count();
    println!(
        "{} orders: {} confirmed, {} cancelled, {} expired",
        book.len(),
        count(ReleaseOrderStatus::Confirmed),
        count(ReleaseOrderStatus::Cancelled),
        count(ReleaseOrderStatus::Expired)
    );
    assert!(count(ReleaseOrderStatus::Expired) > 0 && count(ReleaseOrderStatus::Confirmed) > 0);
    check_ledger(plain, ledger, &spec, &book).await;
}

async fn held_orders_confirm_cancel_and_expire_whole<S: Store>(engine: Engine<S>) {
    on_large_stacks(engine, false).await;
}

async fn held_orders_keep_every_promise_under_faults<S: Store>(engine: Engine<S>) {
    on_large_stacks(engine, true).await;
}

/// Runs [`mixed_holds`] on large stacks (`harness::on_large_stacks`): in a
/// debug build the futures of an order's confirm or give-back under a
/// faulty store's retries nest deep enough to overflow a tokio worker's
/// 2 MiB (CI saw it once, the Cluster under faults).
async fn on_large_stacks<S: Store>(engine: Engine<S>, faults: bool) {
    crate::harness::on_large_stacks(move || mixed_holds(engine, faults)).await;
}

/// The home and request key of a user's request (as `engine::release`).
fn home_of(spec: &ReleaseSpec, u: &str, rid: &str) -> (HomeRef, String) {
    (
        HomeRef::new(&spec.id, spec.home(user_hash(&user(u)))),
        format!("{u}/{rid}"),
    )
}

/// Moves a held order's record as an engine that died right after its
/// decision at the home would have left it.
async fn decide_and_die<S: Store>(
    engine: &Engine<S>,
    spec: &ReleaseSpec,
    u: &str,
    rid: &str,
    to: HoldState,
) {
    let (home, key) = home_of(spec, u, rid);
    let Some(open @ HomeRecord::Held(..)) = engine.store().home_record(&home, &key).await.unwrap()
    else {
        panic!("no held record");
    };
    let HomeRecord::Held(head, pay_by, HoldState::Open) = open.clone() else {
        panic!("{open:?}");
    };
    let next = HomeRecord::Held(head, pay_by, to);
    let moved = engine
        .store()
        .move_hold(&home, &key, &open, &next, false)
        .await
        .unwrap();
    assert_eq!(moved, shardstock::store::Decided::Done);
}

/// An engine gone between its decision at the home and the lines: a
/// confirm's lines are confirmed, an expiry's given back, each once, by the
/// sweepers and a racing call; the database agrees.
async fn a_decision_whose_engine_died_is_finished_once<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let engine = Arc::new(engine.with_clock(clock.clone().into()));
    let spec = spec(3, 6, 2, None);
    lifecycle::create_release(&engine, &ledger, spec.clone())
        .await
        .unwrap();
    let all = || vec![(pool(0), 1), (pool(1), 1), (pool(2), 1)];
    let buy = |u: &'static str, rid: &'static str| {
        let (engine, req) = (engine.clone(), request(&spec, u, all(), rid));
        async move { engine.buy_lines(&req).await.unwrap().result.unwrap() }
    };
    let paid = buy("a", "1").await;
    let lapsed = buy("b", "1").await;
    let cancelled = buy("c", "1").await;
    decide_and_die(&engine, &spec, "a", "1", HoldState::Confirming).await;
    decide_and_die(&engine, &spec, "b", "1", HoldState::Expiring).await;
    decide_and_die(&engine, &spec, "c", "1", HoldState::Cancelling).await;
    let opts = sweep_now();
    let (s1, s2, cancel_paid, confirm_lapsed, cancel_again) = tokio::join!(
        release_sweeper::sweep_release(&engine, &spec.id, &opts),
        release_sweeper::sweep_release(&engine, &spec.id, &opts),
        engine.cancel_release_order(&spec.id, paid.order_id.as_str()),
        engine.confirm_release_order(&spec.id, lapsed.order_id.as_str()),
        engine.cancel_release_order(&spec.id, cancelled.order_id.as_str()),
    );
    s1.unwrap();
    s2.unwrap();
    assert!(matches!(
        cancel_paid.unwrap().result,
        Err(HoldRefusal::Confirmed(_))
    ));
    assert!(matches!(
        confirm_lapsed.unwrap().result,
        Err(HoldRefusal::Expired(_))
    ));
    assert!(cancel_again.unwrap().result.is_ok());
    check_nothing_listed(&engine, &spec).await;
    for k in 0..3 {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        assert_eq!(
            view.remaining, 5,
            "pool p{k}: the paid line sold, the others back once"
        );
    }
    assert_eq!(engine.release_units(&spec.id, &user("a")).await.unwrap(), 3);
    assert_eq!(engine.release_units(&spec.id, &user("b")).await.unwrap(), 0);
    assert_eq!(engine.release_units(&spec.id, &user("c")).await.unwrap(), 0);
    let mut book = HashMap::new();
    for (order, u) in [(paid, "a"), (lapsed, "b"), (cancelled, "c")] {
        let now = engine
            .release_order(&spec.id, order.order_id.as_str())
            .await
            .unwrap();
        book.insert(
            now.order_id.to_string(),
            Told {
                user: u.into(),
                rid: "1".into(),
                order: now,
                fate: Fate::Confirm,
            },
        );
    }
    let status = |u: &str| {
        book.values()
            .find(|t| t.user == u)
            .map(|t| t.order.status)
            .unwrap()
    };
    assert_eq!(status("a"), ReleaseOrderStatus::Confirmed);
    assert_eq!(status("b"), ReleaseOrderStatus::Expired);
    assert_eq!(status("c"), ReleaseOrderStatus::Cancelled);
    check_ledger(engine, ledger, &spec, &book).await;
}

/// A pool's close expires the held orders with a line in it, every line
/// (in the other pools too), and leaves confirmed ones; an order held
/// elsewhere stays held and may still be confirmed.
async fn a_pools_close_expires_its_held_orders_whole<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let spec = spec(3, 6, 2, None);
    lifecycle::create_release(&engine, &ledger, spec.clone())
        .await
        .unwrap();
    let buy = |u: &'static str, lines: Vec<(EventId, u32)>| {
        let (engine, req) = (engine.clone(), request(&spec, u, lines, "1"));
        async move { engine.buy_lines(&req).await.unwrap().result.unwrap() }
    };
    let held = buy("c", vec![(pool(0), 1), (pool(1), 2)]).await;
    let elsewhere = buy("d", vec![(pool(1), 1), (pool(2), 1)]).await;
    let paid = buy("e", vec![(pool(0), 2)]).await;
    assert!(
        engine
            .confirm_release_order(&spec.id, paid.order_id.as_str())
            .await
            .unwrap()
            .result
            .is_ok()
    );
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("hrel-{}", rand::random::<u32>()),
        flush_options(),
    );
    let stop = CancellationToken::new();
    lifecycle::close(
        &engine,
        &ledger,
        &mut flusher,
        &spec.pool_event(0).unwrap(),
        &stop,
    )
    .await
    .unwrap();
    let now = engine
        .release_order(&spec.id, held.order_id.as_str())
        .await
        .unwrap();
    assert_eq!(now.status, ReleaseOrderStatus::Expired);
    let p1 = engine.view(&spec.pool_event(1).unwrap()).await.unwrap();
    assert_eq!(p1.remaining, 5, "the held order's line in p1 came back");
    assert_eq!(engine.release_units(&spec.id, &user("c")).await.unwrap(), 0);
    let confirmed = engine
        .confirm_release_order(&spec.id, elsewhere.order_id.as_str())
        .await
        .unwrap();
    assert!(confirmed.result.is_ok(), "{confirmed:?}");
    let sale = crate::harness::oracle::closed_sale(&ledger, &spec.pool_event(0).unwrap(), 6).await;
    assert!(sale.broken.is_empty(), "{:?}", sale.broken);
    let line = |o: &ReleaseOrder, k: usize| {
        o.lines
            .iter()
            .find(|l| l.pool == spec.pool_event(k).unwrap())
            .unwrap()
            .order_id
            .to_string()
    };
    assert_eq!(sale.orders[&line(&held, 0)].status, OrderStatus::Expired);
    assert_eq!(sale.orders[&line(&paid, 0)].status, OrderStatus::Confirmed);
    for k in 1..3 {
        lifecycle::close(
            &engine,
            &ledger,
            &mut flusher,
            &spec.pool_event(k).unwrap(),
            &stop,
        )
        .await
        .unwrap();
        let sale =
            crate::harness::oracle::closed_sale(&ledger, &spec.pool_event(k).unwrap(), 6).await;
        assert!(sale.broken.is_empty(), "pool p{k}: {:?}", sale.broken);
    }
    let p1 = crate::harness::oracle::closed_sale(&ledger, &spec.pool_event(1).unwrap(), 6).await;
    assert_eq!(p1.orders[&line(&held, 1)].status, OrderStatus::Expired);
    assert_eq!(
        p1.orders[&line(&elsewhere, 1)].status,
        OrderStatus::Confirmed
    );
}

on_every_backend!(namespace_per_test, unbatched:
    held_orders_confirm_cancel_and_expire_whole,
);

on_every_backend!(namespace_per_test:
    held_orders_confirm_cancel_and_expire_whole,
    held_orders_keep_every_promise_under_faults,
    a_decision_whose_engine_died_is_finished_once,
    a_pools_close_expires_its_held_orders_whole,
    open_holds_do_not_hide_a_crashed_order_from_the_sweeper,
    the_hold_expirer_ends_a_hold_in_its_first_round_at_its_deadline,
    held_lines_outlive_their_markers_lifetime,
    a_late_walk_stops_at_its_confirmed_take,
);

/// The release hold expirer (`release_sweeper::holds_round`, every 200 ms
/// in the app) ends an unpaid order in its first round at its `pay_by`,
/// not at the sweeper's next 5 s round, and reads a release's homes only
/// when a hold may be due: a round says when (`HoldSweep::next_due`, the
/// earliest deadline it left, or the round plus `hold_seconds`).
async fn the_hold_expirer_ends_a_hold_in_its_first_round_at_its_deadline<S: Store>(
    engine: Engine<S>,
) {
    use shardstock::control::hold_expiry::ExpiryOptions;
    use shardstock::control::release_sweeper::{DueReleases, holds_round};
    use shardstock::engine::HoldSweep;

    let clock = ManualClock::starting_now();
    let engine = engine.with_clock(clock.clone().into());
    let spec = spec(2, 10, 2, None);
    engine.create_release(spec.clone()).await.unwrap();
    let empty = engine
        .sweep_release_holds(&spec.id, 64, None)
        .await
        .unwrap();
    assert_eq!(
        empty,
        HoldSweep {
            ended: 0,
            next_due: spec.pay_by(clock.now_ms()).unwrap()
        },
        "nothing held: due no sooner than an order reserved now"
    );
    clock.advance(Duration::from_secs(1));
    let held = engine
        .buy_lines(&request(&spec, "a", vec![(pool(0), 1), (pool(1), 1)], "1"))
        .await
        .unwrap()
        .result
        .unwrap();
    let pay_by = held.pay_by.expect("a hold");
    let opts = ExpiryOptions::default();
    let mut due = DueReleases::default();
    assert_eq!(holds_round(&engine, &opts, &mut due).await, 0);
    assert_eq!(due.next(&spec.id), Some(pay_by), "its deadline, read once");
    clock.set(pay_by - 1);
    assert_eq!(holds_round(&engine, &opts, &mut due).await, 0);
    clock.set(pay_by);
    assert_eq!(
        holds_round(&engine, &opts, &mut due).await,
        1,
        "ended in the first round at its pay_by"
    );
    let order = engine
        .release_order(&spec.id, held.order_id.as_str())
        .await
        .unwrap();
    assert_eq!(order.status, ReleaseOrderStatus::Expired);
    for k in 0..2 {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        assert_eq!(view.remaining, 10, "pool p{k}: the line given back");
    }
    assert_eq!(engine.release_units(&spec.id, &user("a")).await.unwrap(), 0);
    assert_eq!(
        due.next(&spec.id),
        Some(pay_by + i64::from(HOLD_S) * 1_000),
        "nothing held: due no sooner than an order reserved now"
    );
}

/// A home full of open holds (more than a sweep round lists a home) does
/// not hide an order whose engine died after its first take: a held order
/// waits in `pend` at its `pay_by`, so the listing of orders pending since
/// the sweeper's bound finds the crashed one first and the round ends it.
/// Before, every hold kept its start there and 64 older holds filled the
/// round, leaving the crashed order's units off sale and its user's limit
/// reserved until the holds ended.
async fn open_holds_do_not_hide_a_crashed_order_from_the_sweeper<S: Store>(engine: Engine<S>) {
    let mut spec = spec(2, 200, 2, None);
    spec.homes = 1;
    engine.create_release(spec.clone()).await.unwrap();
    let held = 70;
    for i in 0..held {
        let out = engine
            .buy_lines(&request(
                &spec,
                &format!("h{i}"),
                vec![(pool(0), 1)],
                &format!("h{i}"),
            ))
            .await
            .unwrap();
        assert!(out.result.is_ok(), "{out:?}");
    }
    engine.inject_crash(shardstock::engine::CrashPoint::AfterTake);
    let crashed = engine
        .buy_lines(&request(
            &spec,
            "gone",
            vec![(pool(0), 1), (pool(1), 1)],
            "g1",
        ))
        .await;
    engine.inject_crash(shardstock::engine::CrashPoint::None);
    assert!(crashed.is_err(), "{crashed:?}");
    let remaining = async |k: usize| {
        engine
            .view(&spec.pool_event(k).unwrap())
            .await
            .unwrap()
            .remaining
    };
    assert_eq!(
        remaining(0).await,
        200 - held - 1,
        "the crashed order's take"
    );
    shardstock::control::release_sweeper::sweep_release(&engine, &spec.id, &sweep_now())
        .await
        .unwrap();
    assert_eq!(
        remaining(0).await,
        200 - held,
        "one round gave the take back"
    );
    assert_eq!(
        engine.release_units(&spec.id, &user("gone")).await.unwrap(),
        0,
        "and released the limit"
    );
    let again = engine
        .buy_lines(&request(
            &spec,
            "gone",
            vec![(pool(0), 1), (pool(1), 1)],
            "g1",
        ))
        .await
        .unwrap();
    assert!(again.replayed && again.result.is_err(), "{again:?}");
    // The holds are still open, still listed for their own sweep.
    let home = HomeRef::new(&spec.id, 0);
    let listed = engine
        .store()
        .stale_orders(&home, i64::MAX, 1_000)
        .await
        .unwrap();
    assert_eq!(listed.len(), held as usize, "{listed:?}");
    // A pool of a release with holds keeps its bucket count: a reshard
    // would not carry the held orders' markers.
    let refused =
        shardstock::control::reshard::reshard(&engine, &spec.pool_event(0).unwrap(), 4).await;
    assert!(
        matches!(
            refused,
            Err(shardstock::control::ControlError::HeldPool { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(remaining(0).await, 200 - held, "nothing moved");
}

/// Every sweeper away for longer than the markers' lifetime (a real 200 ms
/// `marker_ttl`, a 1 s hold: short decisions and the markers of finished
/// lines expire, real time, on every backend), the engines' clock still
/// before the deadline. A held order's take has no lifetime: the confirm
/// finds every line (before, `confirm_line` found no marker and the order
/// stayed `confirming`), the cancel and the expiry give every line back
/// (before, `undo_line` closed the bucket and returned nothing: units off
/// sale, a false sold-out). Then, every finished marker expired too, each
/// step replayed answers done and moves no unit again.
async fn held_lines_outlive_their_markers_lifetime<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let opts = EngineOptions {
        marker_ttl: Duration::from_millis(200),
        ..EngineOptions::default()
    };
    let engine =
        Arc::new(Engine::new(engine.store().clone(), opts).with_clock(clock.clone().into()));
    let mut spec = spec(3, 5, 2, None);
    spec.hold_seconds = Some(1);
    lifecycle::create_release(&engine, &ledger, spec.clone())
        .await
        .unwrap();
    // Five buyers of every pool sell each out: later walks pass a short
    // bucket (its decision a marker that expires) before their take.
    let users = ["a", "b", "c", "d", "e"];
    let book: Book = Arc::default();
    let all = || vec![(pool(0), 1), (pool(1), 1), (pool(2), 1)];
    for u in users {
        let order = engine
            .buy_lines(&request(&spec, u, all(), "1"))
            .await
            .unwrap()
            .result
            .unwrap();
        let told = Told {
            user: u.into(),
            rid: "1".into(),
            order,
            fate: Fate::Confirm,
        };
        book.lock()
            .unwrap()
            .insert(told.order.order_id.to_string(), told);
    }
    let oid = |u: &str| {
        book.lock()
            .unwrap()
            .values()
            .find(|t| t.user == u)
            .unwrap()
            .order
            .order_id
            .to_string()
    };
    let tell = |o: ReleaseOrder| {
        let id = o.order_id.to_string();
        book.lock().unwrap().get_mut(&id).unwrap().order = o;
    };
    let away = || tokio::time::sleep(Duration::from_millis(1_600));
    away().await;
    // The engines' clock is still before the deadline: confirms and a cancel.
    for u in ["a", "e"] {
        let paid = engine
            .confirm_release_order(&spec.id, &oid(u))
            .await
            .unwrap()
            .result
            .unwrap();
        assert_eq!(paid.status, ReleaseOrderStatus::Confirmed);
        tell(paid);
    }
    let cancelled = engine
        .cancel_release_order(&spec.id, &oid("b"))
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(cancelled.status, ReleaseOrderStatus::Cancelled);
    tell(cancelled);
    check_live(&engine, &spec, &book).await;
    // Past the deadline, the sweeper expires the rest.
    clock.advance(Duration::from_secs(2));
    release_sweeper::sweep_release(&engine, &spec.id, &sweep_now())
        .await
        .unwrap();
    for u in ["c", "d"] {
        let now = engine.release_order(&spec.id, &oid(u)).await.unwrap();
        assert_eq!(now.status, ReleaseOrderStatus::Expired, "{u}");
        tell(now);
    }
    check_live(&engine, &spec, &book).await;
    check_nothing_listed(&engine, &spec).await;
    for k in 0..3 {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        assert_eq!(view.remaining, 3, "pool p{k}: all but the paid lines back");
    }
    // An engine that confirmed e's lines and died before the record's end.
    let (home, key) = home_of(&spec, "e", "1");
    let Some(ended @ HomeRecord::Held(_, _, HoldState::Confirmed)) =
        engine.store().home_record(&home, &key).await.unwrap()
    else {
        panic!("e not confirmed");
    };
    let HomeRecord::Held(head, pay_by, _) = ended.clone() else {
        unreachable!()
    };
    let confirming = HomeRecord::Held(head, pay_by, HoldState::Confirming);
    let moved = engine
        .store()
        .move_hold(&home, &key, &ended, &confirming, false)
        .await
        .unwrap();
    assert_eq!(moved, shardstock::store::Decided::Done);
    // Every marker of the finished lines expired: what is driven again
    // finds none and answers done (the confirm's lines were done before).
    away().await;
    let e = engine.release_order(&spec.id, &oid("e")).await.unwrap();
    assert_eq!(e.status, ReleaseOrderStatus::Confirmed, "{e:?}");
    let again = engine
        .confirm_release_order(&spec.id, &oid("a"))
        .await
        .unwrap();
    assert!(
        matches!(again.result, Ok(ref o) if o.status == ReleaseOrderStatus::Confirmed),
        "{again:?}"
    );
    let again = engine
        .cancel_release_order(&spec.id, &oid("b"))
        .await
        .unwrap();
    assert!(
        matches!(again.result, Ok(ref o) if o.status == ReleaseOrderStatus::Cancelled),
        "{again:?}"
    );
    // Purchases replayed answer from their records.
    for (u, rid) in [("a", "1"), ("c", "1")] {
        let out = engine
            .buy_lines(&request(&spec, u, all(), rid))
            .await
            .unwrap();
        assert!(out.replayed, "{out:?}");
    }
    check_live(&engine, &spec, &book).await;
    for k in 0..3 {
        let view = engine.view(&spec.pool_event(k).unwrap()).await.unwrap();
        assert_eq!(view.remaining, 3, "pool p{k}: units back once");
    }
    let units = |u: &'static str| {
        let engine = engine.clone();
        let id = spec.id.clone();
        async move { engine.release_units(&id, &user(u)).await.unwrap() }
    };
    for u in ["a", "e"] {
        assert_eq!(units(u).await, 3, "{u}");
    }
    for u in ["b", "c", "d"] {
        assert_eq!(units(u).await, 0, "{u}");
    }
    let book = book.lock().unwrap().clone();
    check_ledger(engine, ledger, &spec, &book).await;
}

/// A driver whose walk comes late (its first take delayed past another
/// driver's walk and commit, and the buyer's confirm) meets the line's take
/// confirmed (`K`) in the first bucket of its ring and stops there: it takes
/// nothing further on. Seed 1269490 of the fault schedules found the late
/// walk reading `K` as a short bucket and taking the line a second time in
/// the next one, a unit held for good; both oracles (live, and the database
/// after the close) count it.
async fn a_late_walk_stops_at_its_confirmed_take<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let engine = Arc::new(engine);
    let spec = spec(1, 6, 3, None);
    lifecycle::create_release(&engine, &ledger, spec.clone())
        .await
        .unwrap();
    let late = Faulty::plain(engine.store().clone());
    late.arm_fault(
        "take_line",
        1,
        Fault::Delay(Duration::from_millis(500)),
        When::Before,
    );
    let late = Arc::new(Engine::new(late, EngineOptions::default()));
    let req = request(&spec, "a", vec![(pool(0), 1)], "1");
    let slow = {
        let (late, req) = (late.clone(), req.clone());
        tokio::spawn(async move { late.buy_lines(&req).await })
    };
    // The late driver reserved (its record pending), and its take waits.
    let (home, key) = home_of(&spec, "a", "1");
    crate::harness::eventually(
        "the late driver's reserve",
        Duration::from_secs(5),
        async || {
            matches!(
                engine.store().home_record(&home, &key).await,
                Ok(Some(HomeRecord::Pending(_)))
            )
            .then_some(())
        },
    )
    .await;
    let order = engine.buy_lines(&req).await.unwrap().result.unwrap();
    let paid = engine
        .confirm_release_order(&spec.id, order.order_id.as_str())
        .await
        .unwrap();
    assert!(paid.result.is_ok(), "{paid:?}");
    let told = slow.await.unwrap().unwrap();
    assert!(
        matches!(&told.result, Ok(o) if o.order_id == order.order_id),
        "the late driver answers the order: {told:?}"
    );
    let event = spec.pool_event(0).unwrap();
    assert_eq!(
        engine.view(&event).await.unwrap().remaining,
        5,
        "one unit sold, taken once"
    );
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("hrel-{}", rand::random::<u32>()),
        flush_options(),
    );
    lifecycle::close(
        &engine,
        &ledger,
        &mut flusher,
        &event,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let sale = crate::harness::oracle::closed_sale(&ledger, &event, 6).await;
    assert!(sale.broken.is_empty(), "{:?}", sale.broken);
}
