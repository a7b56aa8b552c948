//! The rebalancer on every backend: fencing, crash recovery of transfers, skew
//! control under skewed demand, and live resharding during a sale.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use shardstock::control::flusher::FlushOptions;
use shardstock::control::rebalancer::{Policy, RebalanceOptions, Rebalancer};
use shardstock::domain::ids::EventId;
use shardstock::domain::keys::BucketRef;
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::{ManualClock, PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::ledger::Ledger;
use shardstock::store::{Store, TransferReply};
use shardstock::{Engine, EngineError};
use tokio_util::sync::CancellationToken;

use crate::harness::{
    event_id, eventually, ledger_for, on_every_backend, req, spec, user, user_homed_at,
};

on_every_backend!(
    a_stale_leader_is_fenced_by_every_bucket_and_moves_nothing,
    a_crash_between_out_and_in_is_completed_by_the_next_leader,
    skewed_demand_stays_on_the_fast_path_with_the_rebalancer_on,
    resharding_16_4_32_during_a_sale_keeps_every_invariant,
    the_end_of_the_sale_window_closes_the_event,
    an_audit_racing_transfers_counts_every_unit_once,
);

/// How long a test waits for a lease to lapse or a sale to move on.
const WAIT: Duration = Duration::from_secs(30);

fn options(lease_ttl_ms: u64) -> RebalanceOptions {
    RebalanceOptions {
        resizing: Default::default(),
        interval: Duration::from_millis(10),
        lease_ttl_ms,
        policy: Policy {
            horizon_s: 0.05,
            skew_threshold: 1.5,
            gather_below: 0.1,
            max_moves: 8,
        },
    }
}

fn flush() -> FlushOptions {
    FlushOptions {
        batch: 500,
        workers: 2,
        idle: Duration::from_millis(10),
        claim_idle_ms: 1_000,
    }
}

fn rebalancer<S: Store>(engine: &Arc<Engine<S>>, ledger: &Ledger, ttl: u64) -> Rebalancer<S> {
    Rebalancer::new(engine.clone(), ledger.clone(), flush(), options(ttl))
}

async fn drain<S: Store>(engine: &Engine<S>, event: &EventId, b: u32, n: u32, salt: &str) {
    let left = engine.view(event).await.unwrap().buckets[b as usize].remaining;
    for i in 0..left {
        let u = user_homed_at(b, n, &format!("{salt}{i}"));
        engine
            .purchase(&req(event, &u, 1, None))
            .await
            .unwrap()
            .result
            .unwrap();
    }
}

fn counter(event: &EventId, name: &str) -> f64 {
    let text = shardstock::app::metrics_handle().render();
    let label = format!("{name}{{event=\"{event}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&label))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn a_stale_leader_is_fenced_by_every_bucket_and_moves_nothing<S: Store>(engine: Engine<S>) {
    shardstock::app::metrics_handle();
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("stale");
    shardstock::control::lifecycle::create(&engine, &ledger, spec(&id, 800, 8))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let mut a = rebalancer(&engine, &ledger, 100);
    let mut b = rebalancer(&engine, &ledger, 5_000);
    drain(&engine, &id, 0, 8, "x").await;
    assert!(a.lead(&id, &stop).await.unwrap().is_some(), "A leads");
    drain(&engine, &id, 0, 8, "y").await;
    // A plans a round under its token… and pauses past its leases.
    let meta = engine.meta(&id).await.unwrap();
    let planned = a
        .plan(&meta)
        .await
        .unwrap()
        .expect("A holds the mover lease");
    assert!(
        !planned.moves.is_empty(),
        "bucket 0 is empty: A wants to refill it"
    );
    let changes = counter(&id, "shardstock_leader_changes_total");
    let round = eventually("B to take over once A's leases lapse", WAIT, async || {
        b.lead(&id, &stop).await.unwrap()
    })
    .await;
    assert!(round.units > 0 && !round.fenced);
    assert!(counter(&id, "shardstock_leader_changes_total") > changes);
    // A wakes up and carries on with its old token: every bucket refuses it.
    let before = engine.view(&id).await.unwrap();
    let rejections = counter(&id, "shardstock_fencing_rejections_total");
    let stale = a.execute(&meta, planned).await.unwrap();
    assert!(stale.fenced && stale.units == 0, "{stale:?}");
    assert_eq!(engine.view(&id).await.unwrap(), before, "no unit moved");
    assert_eq!(
        counter(&id, "shardstock_fencing_rejections_total"),
        rejections + 1.0
    );
}

async fn a_crash_between_out_and_in_is_completed_by_the_next_leader<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("crashx");
    shardstock::control::lifecycle::create(&engine, &ledger, spec(&id, 80, 4))
        .await
        .unwrap();
    let store = engine.store();
    // A mover journals 7 units out of bucket 2 for bucket 0, then dies.
    let token = store.acquire_lease(&id, "dead", 50).await.unwrap().unwrap();
    let b2 = BucketRef::new(&id, 0, 2);
    assert_eq!(
        store
            .transfer_out(&b2, token, "dead.1", 0, 7)
            .await
            .unwrap(),
        TransferReply::Applied(7)
    );
    let audit = shardstock::control::audit::audit(&engine, &ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced && audit.in_transfer == 7, "{audit:?}");
    // Once the dead mover's lease (50 ms) lapses, the next leader's round
    // completes its transfer.
    let mut next = rebalancer(&engine, &ledger, 5_000);
    let stop = CancellationToken::new();
    eventually("the next leader to run a round", WAIT, async || {
        next.lead(&id, &stop).await.unwrap()
    })
    .await;
    let view = engine.view(&id).await.unwrap();
    assert_eq!((view.in_transfer, view.remaining), (0, 80));
    let audit = shardstock::control::audit::audit(&engine, &ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced && audit.in_transfer == 0, "{audit:?}");
}

/// Runs a skewed sale (80% of buyers homed at 2 of 16 buckets) to ~70% sold;
/// returns (share of purchases on the fast path, mean skew ratio sampled).
async fn skewed_sale<S: Store>(
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    rebalance: bool,
) -> (f64, f64) {
    let id = event_id(if rebalance { "skew-on" } else { "skew-off" });
    shardstock::control::lifecycle::create(&engine, &ledger, spec(&id, 3_200, 16))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    if rebalance {
        let (mut r, id, stop) = (
            rebalancer(&engine, &ledger, 2_000),
            id.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = r.lead(&id, &stop).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (engine, id, done) = (engine.clone(), id.clone(), done.clone());
        tokio::spawn(async move {
            let mut skews = Vec::new();
            while !done.load(Ordering::Relaxed) {
                skews.push(engine.view(&id).await.unwrap().skew);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            skews.iter().sum::<f64>() / skews.len().max(1) as f64
        })
    };
    let (fast, total) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (engine, id, fast, total) =
                (engine.clone(), id.clone(), fast.clone(), total.clone());
            tokio::spawn(async move {
                for i in 0..140 {
                    let hot = rand::rng().random_bool(0.8);
                    let b = if hot {
                        [3, 11][i % 2]
                    } else {
                        rand::rng().random_range(0..16)
                    };
                    let u = user_homed_at(b, 16, &format!("{t}-{i}"));
                    if let Ok(order) = engine
                        .purchase(&req(&id, &u, 1, None))
                        .await
                        .unwrap()
                        .result
                    {
                        total.fetch_add(1, Ordering::Relaxed);
                        fast.fetch_add(u64::from(order.probes == 0), Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    stop.cancel();
    let skew = sampler.await.unwrap();
    let share = fast.load(Ordering::Relaxed) as f64 / total.load(Ordering::Relaxed) as f64;
    (share, skew)
}

async fn skewed_demand_stays_on_the_fast_path_with_the_rebalancer_on<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let (off_share, off_skew) = skewed_sale(engine.clone(), ledger.clone(), false).await;
    let (on_share, on_skew) = skewed_sale(engine.clone(), ledger.clone(), true).await;
    println!(
        "{}: fast-path share {:.1}% off -> {:.1}% on; mean skew ratio {:.2} off -> {:.2} on",
        engine.store().kind(),
        off_share * 100.0,
        on_share * 100.0,
        off_skew,
        on_skew
    );
    assert!(
        on_share > off_share,
        "fast-path share {on_share} (on) vs {off_share} (off)"
    );
    assert!(
        on_skew < off_skew,
        "skew {on_skew} (on) vs {off_skew} (off)"
    );
}

/// Every purchase answered during a sale, with its request.
type Answers = Arc<Mutex<Vec<(PurchaseRequest, PurchaseOutcome)>>>;

/// Waits until the sale has moved on: 300 more answers and two more balanced
/// audits (so a step lands mid-sale on a fast machine and a slow one alike).
async fn headway(answers: &Answers, audited: &AtomicU64) {
    let answered = || answers.lock().unwrap().len();
    let (a, b) = (answered(), audited.load(Ordering::Relaxed));
    eventually("the sale to move on", WAIT, async || {
        (answered() >= a + 300 && audited.load(Ordering::Relaxed) >= b + 2).then_some(())
    })
    .await;
}

async fn resharding_16_4_32_during_a_sale_keeps_every_invariant<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("reshard");
    let mut s = spec(&id, 6_000, 16);
    s.per_user_limit = Some(5);
    s.max_per_order = 3;
    shardstock::control::lifecycle::create(&engine, &ledger, s)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Answers = Arc::default();
    let audited = Arc::new(AtomicU64::new(0));
    let auditor = {
        let (engine, ledger, id, stop, audited) = (
            engine.clone(),
            ledger.clone(),
            id.clone(),
            stop.clone(),
            audited.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match shardstock::control::audit::audit(&engine, &ledger, &id).await {
                    Ok(a) => {
                        assert!(
                            a.balanced,
                            "sold + remaining != stock during the reshard: {a:?}"
                        );
                        audited.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(shardstock::control::ControlError::Busy(_)) => {}
                    Err(e) => panic!("audit failed: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            audited.load(Ordering::Relaxed)
        })
    };
    let buyers: Vec<_> = (0..24)
        .map(|t| {
            let (engine, id, stop, answers) =
                (engine.clone(), id.clone(), stop.clone(), answers.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    // Paced, so the sale is still running through both reshards.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let r = req(
                        &id,
                        &format!("u-{}", (t * 13 + i) % 2_000),
                        1 + (i % 3) as u32,
                        Some(&format!("t{t}-{i}")),
                    );
                    match engine.purchase(&r).await {
                        Ok(out) => answers.lock().unwrap().push((r, out)),
                        Err(EngineError::Contention { .. }) => {}
                        Err(e) => panic!("purchase failed during a reshard: {e}"),
                    }
                }
            })
        })
        .collect();
    for buckets in [4, 32] {
        headway(&answers, &audited).await;
        let view = shardstock::control::reshard::reshard(&engine, &id, buckets)
            .await
            .unwrap();
        assert_eq!(view.bucket_count, buckets);
    }
    headway(&answers, &audited).await;
    stop.store(true, Ordering::Relaxed);
    for b in buyers {
        b.await.unwrap();
    }
    let audits = auditor.await.unwrap();
    assert!(audits > 5, "only {audits} audits ran");
    // Whatever is left still sells, one unit at a time.
    let mut late = 0;
    loop {
        match engine
            .purchase(&req(&id, &format!("late-{late}"), 1, None))
            .await
            .unwrap()
            .result
        {
            Ok(_) => late += 1,
            Err(Refusal::SoldOut { remaining: 0 }) => break,
            Err(other) => panic!("{other:?}"),
        }
    }
    let answers = answers.lock().unwrap().clone();
    let mut held: HashMap<String, u64> = HashMap::new();
    let mut sold = 0;
    for (r, out) in &answers {
        if let (Ok(order), false) = (&out.result, out.replayed) {
            *held.entry(r.user.to_string()).or_default() += u64::from(order.quantity);
            sold += u64::from(order.quantity);
        }
    }
    assert_eq!(sold + late, 6_000, "units sold == stock");
    let meta = engine.meta(&id).await.unwrap();
    for (u, n) in &held {
        assert!(*n <= 5, "{u} holds {n}");
        let uid = user(u.as_str());
        let b = BucketRef::new(
            &id,
            meta.generation,
            home(user_hash(&uid), meta.spec.buckets),
        );
        assert_eq!(
            engine.store().user_units(&b, &uid).await.unwrap(),
            *n,
            "{u}'s count moved with the reshards"
        );
    }
    // Every request id still answers what it answered first.
    for (r, first) in answers.iter().filter(|(_, o)| !o.replayed).step_by(7) {
        let again = engine.purchase(r).await.unwrap();
        assert!(again.replayed, "{r:?}");
        assert_eq!(again.result, first.result, "{r:?}");
    }
    println!(
        "{}: {} answers, {sold} units before, {late} after, {audits} balanced audits, generation {}",
        engine.store().kind(),
        answers.len(),
        meta.generation
    );
}

/// The window's end is read from the engine's clock: the test moves a manual
/// clock to it instead of sleeping.
async fn the_end_of_the_sale_window_closes_the_event<S: Store>(engine: Engine<S>) {
    let clock = ManualClock::starting_now();
    let engine = Arc::new(engine.with_clock(clock.clone().into()));
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("window");
    let mut s = spec(&id, 40, 4);
    let ends_at = clock.now_ms() + 1_500;
    s.ends_at = Some(ends_at);
    shardstock::control::lifecycle::create(&engine, &ledger, s)
        .await
        .unwrap();
    for i in 0..10 {
        engine
            .purchase(&req(&id, &format!("u-{i}"), 1, None))
            .await
            .unwrap()
            .result
            .unwrap();
    }
    let stop = CancellationToken::new();
    let mut leader = rebalancer(&engine, &ledger, 2_000);
    leader.lead(&id, &stop).await.unwrap();
    assert!(
        !ledger.event(&id).await.unwrap().unwrap().closed,
        "still on sale"
    );
    clock.set(ends_at);
    leader.lead(&id, &stop).await.unwrap();
    assert!(
        ledger.event(&id).await.unwrap().unwrap().closed,
        "the leader closed it at the window's end"
    );
    let t = ledger.totals(&id).await.unwrap().unwrap();
    assert_eq!((t.sold, t.released, t.leftover), (10, 0, 30));
    let audit = shardstock::control::audit::audit(&engine, &ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced && audit.sold_unflushed == 0, "{audit:?}");
}

/// Audits run while a mover shuttles units between buckets as fast as it can:
/// every audit balances. (A reader that saw a bucket before an OUT and the
/// target after the IN counted those units twice: the reshard test caught it
/// once in many runs. OUT now bumps the bucket's change counter, so the
/// audit's second collect sees the move and reads again.)
async fn an_audit_racing_transfers_counts_every_unit_once<S: Store>(engine: Engine<S>) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("race");
    shardstock::control::lifecycle::create(&engine, &ledger, spec(&id, 800, 8))
        .await
        .unwrap();
    let meta = engine.meta(&id).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let mover = {
        let (engine, meta, stop, moved) =
            (engine.clone(), meta.clone(), stop.clone(), moved.clone());
        tokio::spawn(async move {
            let store = engine.store();
            let lease = shardstock::engine::Lease::acquire(
                store,
                &meta.spec.id,
                "racer",
                Duration::from_secs(60),
            )
            .await
            .unwrap()
            .expect("the lease is free");
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
            while !stop.load(Ordering::Relaxed) {
                let from = rng.random_range(0..8u32);
                let to = (from + rng.random_range(1..8u32)) % 8;
                let units = rng.random_range(1..40u64);
                shardstock::engine::mover::transfer(store, &meta, lease.token(), from, to, units)
                    .await
                    .unwrap();
                moved.fetch_add(1, Ordering::Relaxed);
                // A busy rebalancer, not a flood: the audit must find a calm
                // instant to read in.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut audits = 0;
    while audits < 100 || moved.load(Ordering::Relaxed) < 200 {
        match shardstock::control::audit::audit(&engine, &ledger, &id).await {
            Ok(a) => {
                assert!(a.balanced, "an audit racing transfers: {a:?}");
                audits += 1;
            }
            Err(shardstock::control::ControlError::Busy(_)) => {}
            Err(e) => panic!("audit failed: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    mover.await.unwrap();
}

/// Ten thousand transfers on one event, a rebalancer round every few ms (each
/// under a fresh token, as the leader's rounds are): what the buckets
/// remember of transfers stays bounded by a constant, not by the transfers
/// made. Each round's takeover lets the buckets forget the ids of transfers
/// the round before closed (`domain::transfer`); before, every transfer left
/// a tombstone in its source's journal and an id in its target's applied set
/// for the life of the event, and every short take, view, plan and audit
/// read them whole. The store's own reads are the measure: the audit's
/// applied ids on every backend, and on Redis the hashes' lengths.
async fn transfer_state_stays_bounded<S: Store>(engine: Engine<S>, hlen: impl Fn(&str) -> u64) {
    const BUCKETS: u32 = 4;
    const TRANSFERS: u64 = 10_000;
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("bounded");
    engine.create_event(spec(&id, 400, BUCKETS)).await.unwrap();
    let mut leader = rebalancer(&engine, &ledger, 2_000);
    let ring: Vec<shardstock::control::rebalancer::Move> = (0..BUCKETS)
        .map(|b| shardstock::control::rebalancer::Move {
            from: b,
            to: (b + 1) % BUCKETS,
            units: 1,
        })
        .collect();
    let mut sizes = Vec::new();
    let mut made = 0;
    while made < TRANSFERS {
        let meta = engine.reload(&id).await.unwrap();
        let mut planned = leader
            .plan(&meta)
            .await
            .unwrap()
            .expect("the lease is free");
        planned.moves = ring.clone();
        let round = leader.execute(&meta, planned).await.unwrap();
        assert_eq!(round.transfers, u64::from(BUCKETS), "{round:?}");
        made += round.transfers;
        if made % 1_000 == 0 {
            let mut most = (0, 0, 0);
            for b in 0..BUCKETS {
                let bucket = BucketRef::new(&id, meta.generation, b);
                let audit = engine.store().audit_bucket(&bucket).await.unwrap();
                let keys = bucket.keys_in(&crate::harness::namespace("rebalancer"));
                most.0 = most.0.max(audit.applied.len() as u64);
                most.1 = most.1.max(hlen(&keys.xfer));
                most.2 = most.2.max(hlen(&keys.xin));
            }
            sizes.push((made, most));
        }
    }
    let view = engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.in_transfer), (400, 0));
    // A round moves one unit into and out of each bucket: its target keeps
    // the ids of this round and the one before, its source this round's
    // tombstone.
    for (made, (applied, journal, xin)) in &sizes {
        assert!(
            *applied <= 2 && *journal <= 1 && *xin <= 2,
            "after {made} transfers a bucket remembers {applied} applied ids, \
             a journal of {journal} and an applied set of {xin}: {sizes:?}"
        );
    }
}

mod bounded_transfers {
    use crate::harness::{namespace, shared_cluster};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_memory() {
        super::transfer_state_stays_bounded(crate::harness::memory(), |_| 0).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_redis() {
        let engine = crate::harness::standalone(crate::harness::suite_of(module_path!())).await;
        assert!(namespace("rebalancer").starts_with("it"));
        super::transfer_state_stays_bounded(engine, |key| {
            shardstock_bench::cluster::redis_cli(6379, &["hlen", key])
                .trim()
                .parse()
                .unwrap()
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_cluster() {
        let engine = crate::harness::cluster(crate::harness::suite_of(module_path!())).await;
        let port = shared_cluster().ports[0];
        super::transfer_state_stays_bounded(engine, move |key| {
            shardstock_bench::cluster::redis_cli(port, &["-c", "hlen", key])
                .trim()
                .parse()
                .unwrap()
        })
        .await;
    }
}
