//! Real concurrency on every backend: 64 tasks, 5,000+ attempts, quantities 1–3,
//! retries with the same request id (later and at the same time), cancels, and
//! demand far above supply. Checked by invariants, not by timing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rand::Rng;
use shardstock::domain::keys::BucketRef;
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::{PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::store::Store;
use shardstock::{Engine, EngineError};

use crate::harness::{event_id, on_every_backend, purchase_final, req, spec, standalone, user};

on_every_backend!(a_sale_under_real_concurrency_keeps_every_invariant);

/// Batches that linger for company (`batching.max_wait_us`) keep every invariant too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lingering_batches_keep_every_invariant_on_redis() {
    let store = standalone("concurrency").await.store().clone();
    let opts = shardstock::EngineOptions {
        batch_wait: std::time::Duration::from_millis(1),
        ..shardstock::EngineOptions::default()
    };
    a_sale_under_real_concurrency_keeps_every_invariant(Engine::new(store, opts)).await;
}

/// Every bucket in one shared lane (`batching.shared_lanes = 1`): a call
/// carries all 16 buckets' purchases in flight, one group each
/// (`purchase_groups.lua`), and every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_lane_for_every_bucket_keeps_every_invariant_on_redis() {
    let store = standalone("concurrency").await.store().clone();
    let opts = shardstock::EngineOptions {
        shared_lanes: 1,
        ..shardstock::EngineOptions::default()
    };
    a_sale_under_real_concurrency_keeps_every_invariant(Engine::new(store, opts)).await;
}

const TASKS: usize = 64;
const ATTEMPTS: usize = 5_000;
const STOCK: u64 = 1_500;
const BUCKETS: u32 = 16;
const USERS: usize = 600;
const LIMIT: u32 = 4;

#[derive(Default)]
struct Ledger {
    /// Completed requests with a request id, and their first answer.
    answered: Vec<(PurchaseRequest, PurchaseOutcome)>,
    /// Net units each user holds (bought − cancelled).
    held: HashMap<String, i64>,
    orders: Vec<(String, u32, String)>,
    replays_checked: u64,
    cancelled_units: u64,
}

fn same_answer(a: &PurchaseOutcome, b: &PurchaseOutcome) -> bool {
    a.result == b.result
}

fn settle(ledger: &Mutex<Ledger>, req: &PurchaseRequest, out: &PurchaseOutcome) {
    let mut l = ledger.lock().unwrap();
    if let Ok(order) = &out.result
        && !out.replayed
    {
        *l.held.entry(req.user.to_string()).or_default() += i64::from(order.quantity);
        l.orders.push((
            order.order_id.to_string(),
            order.quantity,
            req.user.to_string(),
        ));
    }
    if req.request_id.is_some() && !out.replayed {
        l.answered.push((req.clone(), out.clone()));
    }
}

async fn a_sale_under_real_concurrency_keeps_every_invariant<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let id = event_id("conc");
    let mut s = spec(&id, STOCK, BUCKETS);
    s.per_user_limit = Some(LIMIT);
    s.max_per_order = 3;
    engine.create_event(s).await.unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (engine, ledger, id) = (engine.clone(), ledger.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..ATTEMPTS / TASKS + 1 {
                let roll: f64 = rand::rng().random();
                if roll < 0.15 {
                    // A retry of an answered request: must get the same answer.
                    let earlier = {
                        let l = ledger.lock().unwrap();
                        (!l.answered.is_empty()).then(|| {
                            l.answered[rand::rng().random_range(0..l.answered.len())].clone()
                        })
                    };
                    if let Some((req, first)) = earlier {
                        let again = engine.purchase(&req).await.unwrap();
                        assert!(again.replayed, "a retry must be marked replayed");
                        assert!(
                            same_answer(&first, &again),
                            "replay differs: {first:?} vs {again:?}"
                        );
                        ledger.lock().unwrap().replays_checked += 1;
                        continue;
                    }
                }
                if roll > 0.97 {
                    // Cancel one of the orders bought so far.
                    let pick = {
                        let mut l = ledger.lock().unwrap();
                        let n = l.orders.len();
                        (n > 0).then(|| l.orders.swap_remove(rand::rng().random_range(0..n)))
                    };
                    if let Some((oid, qty, u)) = pick {
                        let c = engine.cancel(&oid).await.unwrap();
                        assert!(!c.already);
                        let mut l = ledger.lock().unwrap();
                        *l.held.get_mut(&u).unwrap() -= i64::from(qty);
                        l.cancelled_units += u64::from(qty);
                        continue;
                    }
                }
                let u = rand::rng().random_range(0..USERS);
                let qty = rand::rng().random_range(1..=3);
                let rid = (roll < 0.9).then(|| format!("t{t}-{i}"));
                let req = req(&id, &format!("u-{u}"), qty, rid.as_deref());
                if roll > 0.8 && req.request_id.is_some() {
                    // The same request sent twice at once (a client that timed out and retried).
                    let (a, b) = tokio::join!(engine.purchase(&req), engine.purchase(&req));
                    let gave_up = |r: &Result<PurchaseOutcome, EngineError>| {
                        matches!(r, Err(EngineError::Contention { .. }))
                    };
                    if gave_up(&a) || gave_up(&b) {
                        // A driver gave up (try-again: nothing bought by it).
                        // The request's answer is what the retry a client
                        // makes with the same id says; a driver that did
                        // answer must agree with it.
                        let done: Vec<PurchaseOutcome> = [a, b]
                            .into_iter()
                            .filter(|r| !gave_up(r))
                            .map(Result::unwrap)
                            .collect();
                        let last = purchase_final(&*engine, &req).await.unwrap();
                        let first = done.iter().find(|o| !o.replayed).cloned();
                        for o in &done {
                            assert!(same_answer(o, &last), "{o:?} vs the retry's {last:?}");
                        }
                        match first {
                            Some(first) => settle(&ledger, &req, &first),
                            None => {
                                assert!(!last.replayed || !done.is_empty(), "{last:?}");
                                settle(&ledger, &req, &last);
                            }
                        }
                        continue;
                    }
                    let (a, b) = (a.unwrap(), b.unwrap());
                    assert!(
                        same_answer(&a, &b),
                        "concurrent duplicates differ: {a:?} vs {b:?}"
                    );
                    assert!(
                        a.replayed || b.replayed,
                        "one of two duplicates is a replay"
                    );
                    let first = if a.replayed { b } else { a };
                    settle(&ledger, &req, &first);
                } else {
                    match engine.purchase(&req).await {
                        Ok(out) => settle(&ledger, &req, &out),
                        Err(EngineError::Contention { .. }) => {}
                        Err(e) => panic!("purchase failed: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // Demand exceeded supply: whatever is left must still sell, one unit at a time.
    let left = engine.view(&id).await.unwrap().remaining;
    let mut sold_after = 0;
    for i in 0.. {
        match engine
            .purchase(&req(&id, &format!("u-{}", USERS + i), 1, None))
            .await
            .unwrap()
            .result
        {
            Ok(_) => sold_after += 1,
            Err(Refusal::SoldOut { remaining }) => {
                assert_eq!(remaining, 0);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(sold_after, left, "every unit left after the run sold");

    let (held, cancelled_units, replays_checked) = {
        let l = ledger.lock().unwrap();
        (l.held.clone(), l.cancelled_units, l.replays_checked)
    };
    let bought: i64 = held.values().sum();
    let view = engine.view(&id).await.unwrap();
    assert_eq!(view.remaining, 0);
    assert_eq!(view.in_transfer, 0);
    assert_eq!(
        bought as u64 + sold_after,
        STOCK,
        "units sold == stock exactly"
    );
    assert!(
        replays_checked > 100,
        "only {} replays checked",
        replays_checked
    );
    for (u, &net) in &held {
        assert!(net <= i64::from(LIMIT), "{u} holds {net} > {LIMIT}");
        let uid = user(u.as_str());
        let b = BucketRef::new(&id, 0, home(user_hash(&uid), BUCKETS));
        let stored = engine.store().user_units(&b, &uid).await.unwrap();
        assert_eq!(
            stored as i64, net,
            "{u}: the store's count matches the answers given"
        );
    }
    println!(
        "{}: {} units sold in the run, {} cancelled, {} after, {} replays checked",
        engine.store().kind(),
        bought,
        cancelled_units,
        sold_after,
        replays_checked
    );
}
