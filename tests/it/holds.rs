//! Holds (issue 14): purchases on events with `hold_seconds` are held until
//! confirmed; unpaid ones expire and their units sell again.
//!
//! Every test runs on memory, standalone Redis and the 3-master Cluster, each
//! with a ledger (SQLite for memory, PostgreSQL otherwise), so the audit
//! checks every scenario. Time is a `ManualClock` moved by hand (no test
//! waits for a deadline). The deadline index is deployment-wide and a sweep
//! judges deadlines by its own engine's clock, so each Redis test runs in a
//! namespace of its own (`on_every_backend!(namespace_per_test: …)`; the
//! plain matrix shares one per suite: a test that moves its clock an hour on
//! would expire a neighbour's holds).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::hold_expiry::{ExpiryOptions, sweep_due};
use shardstock::control::lifecycle;
use shardstock::control::rebalancer::{Policy, RebalanceOptions, Rebalancer};
use shardstock::domain::ids::{EventId, OrderId, RequestId};
use shardstock::domain::model::{Order, OrderStatus};
use shardstock::engine::{ConfirmRefusal, EngineError, ManualClock, PurchaseRequest, Refusal};
use shardstock::ledger::Ledger;
use shardstock::store::Store;
use shardstock::{Engine, EngineOptions};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Faulty, When};
use crate::harness::{
    event_id, on_every_backend, pg_url, purchase_final, spec, sqlite_url, user, user_homed_at,
};

on_every_backend!(
    namespace_per_test:
    a_hold_answers_its_deadline_and_confirms_once,
    an_unpaid_hold_expires_once_and_its_units_sell_again,
    a_cancelled_hold_is_released_at_once_and_cannot_be_confirmed,
    a_hold_bought_through_the_ring_is_held_at_home,
    thirty_percent_never_pay_and_their_units_sell_to_later_buyers,
    confirm_racing_expiry_ends_each_order_one_way,
    a_sweep_cut_at_any_step_is_finished_by_the_next,
    holds_survive_a_reshard_and_a_rebalancer_move,
    a_close_voids_live_holds_and_accounts_for_their_units,
    a_resumed_reshard_never_brings_back_holds_that_expired_meanwhile,
    a_close_after_a_reshard_leaves_paid_holds_confirmed_and_voids_live_ones_once,
    a_hold_bought_through_the_ring_reaches_the_ledger_held_at_once,
    a_confirm_or_cancel_during_a_stopped_reshard_answers_try_again,
    a_retry_whose_first_answer_was_lost_shows_its_hold,
    a_retry_that_drives_an_earlier_calls_saga_answers_a_replay,
    an_instance_that_missed_a_reshard_reads_orders_where_they_live,
);

const HOLD_S: u32 = 60;

struct Rig<S: Store> {
    engine: Arc<Engine<S>>,
    clock: ManualClock,
    ledger: Ledger,
    flusher: Flusher<S>,
    stop: CancellationToken,
}

async fn rig<S: Store>(engine: Engine<S>) -> Rig<S> {
    let url = if engine.store().kind() == "memory" {
        sqlite_url()
    } else {
        pg_url()
    };
    let ledger = Ledger::connect(&url, 4).await.unwrap();
    let clock = ManualClock::starting_now();
    let engine = Arc::new(engine.with_clock(clock.clone().into()));
    let flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("test-{}", rand::random::<u32>()),
        flush_options(),
    );
    Rig {
        engine,
        clock,
        ledger,
        flusher,
        stop: CancellationToken::new(),
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

impl<S: Store> Rig<S> {
    /// An event of `stock` units in `buckets`, purchases held `HOLD_S`,
    /// `limit` units per user.
    async fn create(&self, prefix: &str, stock: u64, buckets: u32, limit: u32) -> EventId {
        let id = event_id(prefix);
        let mut s = spec(&id, stock, buckets);
        s.hold_seconds = Some(HOLD_S);
        s.per_user_limit = Some(limit);
        lifecycle::create(&self.engine, &self.ledger, s)
            .await
            .unwrap();
        id
    }

    async fn buy(&self, event: &EventId, u: &str, qty: u32) -> Result<Order, Refusal> {
        let req = PurchaseRequest {
            event: event.clone(),
            user: user(u),
            quantity: qty,
            request_id: Some(RequestId::parse(format!("r-{u}-{}", rand::random::<u32>())).unwrap()),
            access_token: None,
        };
        purchase_final(&self.engine, &req).await.unwrap().result
    }

    async fn sweep(&self) -> u64 {
        sweep_due(&self.engine, &ExpiryOptions::default(), 64)
            .await
            .unwrap()
    }

    /// Past every deadline of holds made so far.
    fn after_deadlines(&self) {
        self.clock
            .advance(Duration::from_secs(u64::from(HOLD_S) + 1));
    }

    /// Flushes every bucket and checks the audit balances; returns it.
    async fn audit(&mut self, event: &EventId) -> shardstock::control::audit::Audit {
        let meta = self.engine.reload(event).await.unwrap();
        self.flusher
            .drain(&meta.all_buckets(), &self.stop)
            .await
            .unwrap();
        let audit = shardstock::control::audit::audit(&self.engine, &self.ledger, event)
            .await
            .unwrap();
        assert!(audit.balanced, "{audit:?}");
        audit
    }

    async fn status(&self, order: &OrderId) -> OrderStatus {
        match self.engine.order(order.as_str()).await {
            Ok(view) => view.status,
            Err(_) => {
                let (oid, event, _) = OrderId::parse(order.as_str()).unwrap();
                self.ledger
                    .order(&oid, &event)
                    .await
                    .unwrap()
                    .expect("in the ledger")
                    .status
            }
        }
    }
}

async fn a_hold_answers_its_deadline_and_confirms_once<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("hold", 10, 2, 4).await;
    let now = r.clock.now_ms();
    let order = r.buy(&id, "u-1", 2).await.unwrap();
    assert_eq!(order.status, Some(OrderStatus::Held));
    assert_eq!(order.pay_by, Some(now + i64::from(HOLD_S) * 1000));
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held, view.sold), (8, 2, 2));
    let seen = r.engine.order(order.order_id.as_str()).await.unwrap();
    assert_eq!(
        (seen.status, seen.pay_by),
        (OrderStatus::Held, order.pay_by)
    );

    r.clock.advance(Duration::from_secs(u64::from(HOLD_S) - 1));
    let first = r.engine.confirm(order.order_id.as_str()).await.unwrap();
    assert!(!first.already);
    assert_eq!(first.result.unwrap().status, OrderStatus::Confirmed);
    // Idempotent, also after the deadline: a confirmed order stays confirmed.
    r.after_deadlines();
    let again = r.engine.confirm(order.order_id.as_str()).await.unwrap();
    assert!(again.already);
    assert_eq!(again.result.unwrap().status, OrderStatus::Confirmed);
    assert_eq!(r.sweep().await, 0, "a confirmed order never expires");
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held, view.sold), (8, 0, 2));
    let audit = r.audit(&id).await;
    assert_eq!((audit.held, audit.sold_flushed, audit.released), (0, 2, 0));
    assert_eq!(r.status(&order.order_id).await, OrderStatus::Confirmed);
    let (oid, event, _) = OrderId::parse(order.order_id.as_str()).unwrap();
    let row = r.ledger.order(&oid, &event).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.pay_by),
        (OrderStatus::Confirmed, order.pay_by)
    );
}

async fn an_unpaid_hold_expires_once_and_its_units_sell_again<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("expire", 2, 1, 2).await;
    let order = r.buy(&id, "u-1", 2).await.unwrap();
    assert_eq!(
        r.buy(&id, "u-2", 1).await,
        Err(Refusal::SoldOut { remaining: 0 })
    );
    assert_eq!(r.sweep().await, 0, "nothing is due before the deadline");
    r.after_deadlines();
    assert_eq!(r.sweep().await, 1);
    assert_eq!(r.sweep().await, 0, "expired once");
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held), (2, 0));
    assert_eq!(r.status(&order.order_id).await, OrderStatus::Expired);
    // The buyer's count dropped: the same user may buy the limit again.
    let again = r.buy(&id, "u-1", 2).await.unwrap();
    assert_eq!(again.status, Some(OrderStatus::Held));
    assert_eq!(
        r.buy(&id, "u-1", 1).await,
        Err(Refusal::LimitExceeded { limit: 2, held: 2 }),
        "the count dropped exactly once"
    );
    // Confirming the expired order: refused, nothing changes.
    let late = r.engine.confirm(order.order_id.as_str()).await.unwrap();
    assert!(
        matches!(late.result, Err(ConfirmRefusal::Expired(_))),
        "{late:?}"
    );
    let cancel = r.engine.cancel(order.order_id.as_str()).await.unwrap();
    assert!(cancel.already);
    assert_eq!(cancel.order.status, OrderStatus::Expired);
    assert_eq!(r.engine.view(&id).await.unwrap().remaining, 0);
    let audit = r.audit(&id).await;
    assert_eq!((audit.held, audit.sold_flushed, audit.released), (2, 4, 2));
}

async fn a_cancelled_hold_is_released_at_once_and_cannot_be_confirmed<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("cancel", 3, 1, 3).await;
    let order = r.buy(&id, "u-1", 3).await.unwrap();
    let cancel = r.engine.cancel(order.order_id.as_str()).await.unwrap();
    assert!(!cancel.already);
    assert_eq!(cancel.order.status, OrderStatus::Cancelled);
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held), (3, 0));
    let confirm = r.engine.confirm(order.order_id.as_str()).await.unwrap();
    assert!(matches!(confirm.result, Err(ConfirmRefusal::Cancelled(_))));
    r.after_deadlines();
    assert_eq!(r.sweep().await, 0, "a cancelled hold never expires");
    assert_eq!(r.engine.view(&id).await.unwrap().remaining, 3);
    let audit = r.audit(&id).await;
    assert_eq!((audit.held, audit.sold_flushed, audit.released), (0, 3, 3));
    assert_eq!(r.status(&order.order_id).await, OrderStatus::Cancelled);
}

async fn a_hold_bought_through_the_ring_is_held_at_home<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("ring", 4, 4, 10).await;
    // Empty bucket 0 (held, confirmed), then a buyer homed there probes the ring.
    let u0 = user_homed_at(0, 4, "home");
    let first = r.buy(&id, &u0, 1).await.unwrap();
    assert_eq!((first.bucket, first.probes), (0, 0));
    r.engine
        .confirm(first.order_id.as_str())
        .await
        .unwrap()
        .result
        .unwrap();
    let probed = r.buy(&id, &u0, 1).await.unwrap();
    assert!(probed.probes > 0, "{probed:?}");
    assert_eq!(probed.status, Some(OrderStatus::Held));
    assert!(probed.pay_by.is_some());
    assert_eq!(r.engine.view(&id).await.unwrap().held, 1);
    r.after_deadlines();
    assert_eq!(r.sweep().await, 1);
    // The units come back at the buyer's home, as a cancel's do.
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!(
        (view.remaining, view.held, view.buckets[0].remaining),
        (3, 0, 1)
    );
    let audit = r.audit(&id).await;
    assert_eq!((audit.released, audit.remaining), (1, 3));
    assert_eq!(r.status(&probed.order_id).await, OrderStatus::Expired);
}

async fn thirty_percent_never_pay_and_their_units_sell_to_later_buyers<S: Store>(
    engine: Engine<S>,
) {
    let mut r = rig(engine).await;
    let stock = 200;
    let id = r.create("unpaid", stock, 8, 1).await;
    // 200 buyers at once; every tenth in three never pays.
    let tasks: Vec<_> = (0..stock)
        .map(|i| {
            let (engine, id) = (r.engine.clone(), id.clone());
            tokio::spawn(async move {
                let req = PurchaseRequest {
                    event: id,
                    user: user(format!("first-{i}")),
                    quantity: 1,
                    request_id: Some(RequestId::parse(format!("r{i}")).unwrap()),
                    access_token: None,
                };
                let order = purchase_final(&engine, &req).await.unwrap().result.unwrap();
                assert_eq!(order.status, Some(OrderStatus::Held));
                if i % 10 >= 3 {
                    let confirmed = engine.confirm(order.order_id.as_str()).await.unwrap();
                    assert_eq!(confirmed.result.unwrap().status, OrderStatus::Confirmed);
                }
                order.order_id
            })
        })
        .collect();
    let mut first = Vec::new();
    for t in tasks {
        first.push(t.await.unwrap());
    }
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held), (0, 60));
    assert_eq!(
        r.buy(&id, "late-early", 1).await,
        Err(Refusal::SoldOut { remaining: 0 })
    );
    r.after_deadlines();
    // The sweep runs while later buyers arrive: they buy what comes back.
    let sweeper = {
        let engine = r.engine.clone();
        tokio::spawn(async move {
            sweep_due(&engine, &ExpiryOptions::default(), 64)
                .await
                .unwrap()
        })
    };
    let mut later = Vec::new();
    let mut i = 0;
    while later.len() < 60 {
        i += 1;
        assert!(i < 20_000, "the expired units never came back on sale");
        match r.buy(&id, &format!("late-{i}"), 1).await {
            Ok(order) => {
                let c = r.engine.confirm(order.order_id.as_str()).await.unwrap();
                assert_eq!(c.result.unwrap().status, OrderStatus::Confirmed);
                later.push(order.order_id);
            }
            Err(Refusal::SoldOut { .. }) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(sweeper.await.unwrap() + r.sweep().await, 60);
    assert_eq!(
        r.buy(&id, "late-last", 1).await,
        Err(Refusal::SoldOut { remaining: 0 })
    );
    let audit = r.audit(&id).await;
    assert_eq!((audit.remaining, audit.held, audit.released), (0, 0, 60));
    assert_eq!(
        audit.sold_flushed - audit.released,
        stock,
        "confirmed == stock"
    );
    // No unit sold twice: every order ends one way, confirmed units == stock.
    let mut confirmed = 0;
    let mut ids = HashSet::new();
    for (i, oid) in first.iter().chain(&later).enumerate() {
        assert!(ids.insert(oid.clone()), "order {oid} answered twice");
        let status = r.status(oid).await;
        let want = if i < first.len() && i % 10 < 3 {
            OrderStatus::Expired
        } else {
            OrderStatus::Confirmed
        };
        assert_eq!(status, want, "{oid}");
        confirmed += u64::from(status == OrderStatus::Confirmed);
    }
    assert_eq!(confirmed, stock);
}

async fn confirm_racing_expiry_ends_each_order_one_way<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let n = 120;
    let id = r.create("race", n, 4, 1).await;
    let mut orders = Vec::new();
    for i in 0..n {
        orders.push(r.buy(&id, &format!("u-{i}"), 1).await.unwrap());
    }
    // The sweeper's clock is past every deadline, the buyers' one short of
    // it: whichever step reaches an order's bucket first decides it.
    let sweeper = Arc::new(
        Engine::new(r.engine.store().clone(), EngineOptions::default())
            .with_clock(ManualClock::at(r.clock.now_ms() + i64::from(HOLD_S) * 1000 + 1).into()),
    );
    r.clock.advance(Duration::from_secs(u64::from(HOLD_S) - 1));
    let sweeps = {
        let sweeper = sweeper.clone();
        tokio::spawn(async move {
            let opts = ExpiryOptions {
                per_bucket: 3,
                ..ExpiryOptions::default()
            };
            let mut expired = 0;
            for _ in 0..200 {
                expired += sweep_due(&sweeper, &opts, 1).await.unwrap();
                tokio::task::yield_now().await;
            }
            expired
        })
    };
    let confirms: Vec<_> = orders
        .iter()
        .map(|o| {
            let (engine, oid) = (r.engine.clone(), o.order_id.clone());
            tokio::spawn(async move { engine.confirm(oid.as_str()).await.unwrap() })
        })
        .collect();
    let mut confirmed = 0;
    for (o, c) in orders.iter().zip(confirms) {
        let answer = c.await.unwrap();
        let status = r.status(&o.order_id).await;
        match answer.result {
            Ok(view) => {
                assert_eq!(view.status, OrderStatus::Confirmed);
                assert_eq!(status, OrderStatus::Confirmed, "{}", o.order_id);
                confirmed += 1;
            }
            Err(ConfirmRefusal::Expired(_)) => {
                assert_eq!(status, OrderStatus::Expired, "{}", o.order_id);
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let expired = sweeps.await.unwrap()
        + sweep_due(&sweeper, &ExpiryOptions::default(), 64)
            .await
            .unwrap();
    assert_eq!(confirmed + expired, n, "each order ended exactly one way");
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.held), (expired, 0));
    let audit = r.audit(&id).await;
    assert_eq!((audit.released, audit.sold_flushed), (expired, n));
}

async fn a_sweep_cut_at_any_step_is_finished_by_the_next<S: Store>(engine: Engine<S>) {
    // A `Faulty` store's steps nest deeper than a debug test thread's 2 MiB
    // stack allow (as in `faults`): run on large stacks.
    crate::harness::on_large_stacks(move || sweeps_cut_at_every_step(engine)).await;
}

async fn sweeps_cut_at_every_step<S: Store>(engine: Engine<S>) {
    let r = rig(engine).await;
    let steps = [
        ("due_holds", When::Before),
        ("expire_holds", When::Before),
        ("expire_holds", When::After),
        ("bump_seq", When::After),
        ("reschedule_holds", When::Before),
        ("reschedule_holds", When::After),
    ];
    for (step, when) in steps {
        let faulty = Faulty::plain(r.engine.store().clone());
        let cut = Arc::new(
            Engine::new(faulty.clone(), EngineOptions::default())
                .with_clock(r.clock.clone().into()),
        );
        let mut fr = Rig {
            engine: cut.clone(),
            clock: r.clock.clone(),
            ledger: r.ledger.clone(),
            flusher: Flusher::new(
                cut,
                r.ledger.clone(),
                format!("test-{}", rand::random::<u32>()),
                flush_options(),
            ),
            stop: CancellationToken::new(),
        };
        let id = fr.create("cut", 6, 2, 3).await;
        let mut orders = Vec::new();
        for i in 0..3 {
            orders.push(fr.buy(&id, &format!("u-{i}"), 2).await.unwrap());
        }
        fr.engine
            .confirm(orders[0].order_id.as_str())
            .await
            .unwrap();
        fr.after_deadlines();
        faulty.arm(step, faulty.calls(step) + 1, when);
        // The process dies mid-sweep: the step fails (before it ran, or
        // after, its reply lost) and the sweep stops there.
        let cut = sweep_due(&fr.engine, &ExpiryOptions::default(), 64).await;
        assert!(
            cut.is_err(),
            "{step} {when:?}: the armed step failed the sweep"
        );
        faulty.heal();
        // The next sweep (of any instance) finishes the job.
        fr.sweep().await;
        assert_eq!(fr.sweep().await, 0, "{step} {when:?}");
        let view = fr.engine.view(&id).await.unwrap();
        assert_eq!((view.remaining, view.held), (4, 0), "{step} {when:?}");
        assert_eq!(fr.status(&orders[0].order_id).await, OrderStatus::Confirmed);
        for o in &orders[1..] {
            assert_eq!(fr.status(&o.order_id).await, OrderStatus::Expired, "{step}");
        }
        // Units came back and counts dropped once: the limit allows 3 again,
        // and not a unit more.
        fr.buy(&id, "u-1", 3).await.unwrap();
        assert_eq!(
            fr.buy(&id, "u-1", 1).await,
            Err(Refusal::LimitExceeded { limit: 3, held: 3 }),
            "{step} {when:?}"
        );
        let audit = fr.audit(&id).await;
        assert_eq!(
            (audit.released, audit.sold_flushed, audit.held),
            (4, 9, 3),
            "{step} {when:?}: each expiry released once"
        );
    }
}

async fn holds_survive_a_reshard_and_a_rebalancer_move<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("move", 40, 4, 2).await;
    let mut orders = Vec::new();
    for i in 0..12 {
        orders.push(r.buy(&id, &format!("u-{i}"), 2).await.unwrap());
    }
    assert_eq!(r.engine.view(&id).await.unwrap().held, 24);
    let view = shardstock::control::reshard::reshard(&r.engine, &id, 7)
        .await
        .unwrap();
    assert_eq!((view.bucket_count, view.held, view.remaining), (7, 24, 16));
    let mut rebalancer = Rebalancer::new(
        r.engine.clone(),
        r.ledger.clone(),
        flush_options(),
        RebalanceOptions {
            resizing: Default::default(),
            interval: Duration::from_millis(10),
            lease_ttl_ms: 2_000,
            policy: Policy {
                horizon_s: 0.05,
                skew_threshold: 1.0,
                gather_below: 1.0,
                max_moves: 8,
            },
        },
    );
    let meta = r.engine.reload(&id).await.unwrap();
    let (moves, _) = rebalancer.consolidate_now(&meta).await.unwrap();
    assert!(!moves.is_empty(), "the rebalancer moved units");
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.held, view.remaining), (24, 16));
    // Half confirm, half expire, in the new layout.
    for o in &orders[..6] {
        let c = r.engine.confirm(o.order_id.as_str()).await.unwrap();
        assert_eq!(c.result.unwrap().status, OrderStatus::Confirmed);
    }
    r.after_deadlines();
    assert_eq!(r.sweep().await, 6);
    for o in &orders[6..] {
        assert_eq!(r.status(&o.order_id).await, OrderStatus::Expired);
    }
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!((view.held, view.remaining), (0, 28));
    // Expired buyers' counts dropped in their new home: they buy again.
    r.buy(&id, "u-11", 2).await.unwrap();
    let audit = r.audit(&id).await;
    assert_eq!((audit.released, audit.held), (12, 2));
}

async fn a_close_voids_live_holds_and_accounts_for_their_units<S: Store>(engine: Engine<S>) {
    let mut r = rig(engine).await;
    let id = r.create("close", 10, 2, 3).await;
    let kept = r.buy(&id, "u-1", 3).await.unwrap();
    let live = r.buy(&id, "u-2", 3).await.unwrap();
    r.engine.confirm(kept.order_id.as_str()).await.unwrap();
    let view = lifecycle::close(&r.engine, &r.ledger, &mut r.flusher, &id, &r.stop)
        .await
        .unwrap();
    // The live hold was voided: its units are leftover, with the unsold ones.
    assert_eq!((view.status, view.leftover), ("closed", Some(7)));
    assert_eq!(r.status(&kept.order_id).await, OrderStatus::Confirmed);
    assert_eq!(r.status(&live.order_id).await, OrderStatus::Expired);
    let audit = shardstock::control::audit::audit(&r.engine, &r.ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced, "{audit:?}");
    assert_eq!(
        (
            audit.sold_flushed,
            audit.released,
            audit.leftover,
            audit.held
        ),
        (6, 3, 7, 0)
    );
    // The database alone agrees: 3 confirmed units and 7 left over, the live
    // hold expired once, the paid one confirmed.
    let sale = crate::harness::oracle::closed_sale(&r.ledger, &id, 10).await;
    assert!(sale.broken.is_empty(), "{:#?}", sale.broken);
    let status = |o: &shardstock::domain::ids::OrderId| sale.orders[o.as_str()].status;
    assert_eq!(
        (status(&kept.order_id), status(&live.order_id)),
        (OrderStatus::Confirmed, OrderStatus::Expired)
    );
    let confirm = r.engine.confirm(live.order_id.as_str()).await;
    assert!(
        confirm.is_err(),
        "a closed sale confirms nothing: {confirm:?}"
    );
    // Past the deadline the sweeper finds nothing to expire, and drops the
    // closed event's buckets from its index.
    r.after_deadlines();
    assert_eq!(r.sweep().await, 0);
    let due = r.engine.store().due_holds(i64::MAX, 1024).await.unwrap();
    assert!(due.iter().all(|(b, _)| b.event != id), "{due:?}");
}

/// A reshard that restored held orders into the new layout and stopped there
/// (its process died), then the holds' deadlines passed while the event was
/// still resharding, then another run resumed it. The holds expire exactly
/// once, whoever sweeps and whenever: their units come back once, no order
/// has two expiries, and the sale holds its stock, not more. Before the fix
/// the sweeper expired the copies in the unfinished layout, the resumed run
/// restored them as held again and they expired a second time: 1.8x the
/// stock on sale, with the audit balanced.
async fn a_resumed_reshard_never_brings_back_holds_that_expired_meanwhile<S: Store>(
    engine: Engine<S>,
) {
    use shardstock::control::checkpoint::{self, Checkpoint, Flow};
    let mut r = rig(engine).await;
    let id = r.create("resurrect", 20, 2, 4).await;
    let mut orders = Vec::new();
    for i in 0..5 {
        orders.push(r.buy(&id, &format!("u-{i}"), 2).await.unwrap());
    }
    checkpoint::inject(
        &id,
        Arc::new(|cp| {
            Box::pin(async move {
                if cp == Checkpoint::ReshardRestored {
                    Flow::Crash
                } else {
                    Flow::Go
                }
            })
        }),
    );
    let cut = shardstock::control::reshard::reshard(&r.engine, &id, 3).await;
    assert!(cut.is_err(), "the run stops after restoring: {cut:?}");
    checkpoint::clear(&id);
    // The deadlines pass while the event waits for its reshard; sweepers run.
    r.after_deadlines();
    let early = r.sweep().await;
    let view = shardstock::control::reshard::reshard(&r.engine, &id, 3)
        .await
        .unwrap();
    assert_eq!(view.bucket_count, 3);
    let late = r.sweep().await;
    assert_eq!(
        early + late,
        5,
        "each hold expires once ({early} while resharding, {late} after)"
    );
    assert_eq!(r.sweep().await, 0, "nothing is left to expire");
    let view = r.engine.view(&id).await.unwrap();
    assert_eq!(
        (view.remaining, view.held, view.sold),
        (20, 0, 0),
        "every unit back on sale once"
    );
    for o in &orders {
        assert_eq!(r.status(&o.order_id).await, OrderStatus::Expired);
    }
    let audit = r.audit(&id).await;
    assert_eq!(audit.released, 10, "{audit:?}");
    lifecycle::close(&r.engine, &r.ledger, &mut r.flusher, &id, &r.stop)
        .await
        .unwrap();
    let sale = crate::harness::oracle::closed_sale(&r.ledger, &id, 20).await;
    assert!(sale.broken.is_empty(), "{:#?}", sale.broken);
}

/// Holds moved by a finished reshard, some confirmed in the new layout, some
/// left live, then a close while the old layout is still listed (its streams
/// not pruned yet). The confirmed orders stay confirmed in the database, the
/// live ones expire once, and the leftover is what was not paid for. Before
/// the fix the close voided the old layout's copy of every moved hold: paid
/// orders read `expired`, and live ones were voided twice.
async fn a_close_after_a_reshard_leaves_paid_holds_confirmed_and_voids_live_ones_once<S: Store>(
    engine: Engine<S>,
) {
    let mut r = rig(engine).await;
    let id = r.create("moved-close", 20, 2, 4).await;
    let mut orders = Vec::new();
    for i in 0..4 {
        orders.push(r.buy(&id, &format!("u-{i}"), 2).await.unwrap());
    }
    let view = shardstock::control::reshard::reshard(&r.engine, &id, 3)
        .await
        .unwrap();
    assert_eq!(view.bucket_count, 3);
    let meta = r.engine.reload(&id).await.unwrap();
    assert!(!meta.retired.is_empty(), "the old layout is still listed");
    for o in &orders[..2] {
        let c = r.engine.confirm(o.order_id.as_str()).await.unwrap();
        assert_eq!(c.result.unwrap().status, OrderStatus::Confirmed);
    }
    let view = lifecycle::close(&r.engine, &r.ledger, &mut r.flusher, &id, &r.stop)
        .await
        .unwrap();
    assert_eq!(view.leftover, Some(16), "{view:?}");
    for o in &orders[..2] {
        assert_eq!(r.status(&o.order_id).await, OrderStatus::Confirmed, "paid");
    }
    for o in &orders[2..] {
        assert_eq!(r.status(&o.order_id).await, OrderStatus::Expired, "voided");
    }
    let sale = crate::harness::oracle::closed_sale(&r.ledger, &id, 20).await;
    assert!(sale.broken.is_empty(), "{:#?}", sale.broken);
    let audit = shardstock::control::audit::audit(&r.engine, &r.ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced, "{audit:?}");
    assert_eq!((audit.released, audit.leftover), (4, 16), "{audit:?}");
}

/// A hold bought through the ring: its take's order record lands in the bucket
/// it came from, its hold record at the buyer's home. Both buckets are marked
/// for the flusher, so the ledger says `held` within a flush round, with the
/// slow sweep off. The home was never marked (`finish` wrote the hold record
/// and nobody said so): the ledger, and a rebuild from it, said `confirmed`
/// for an unpaid hold until another write to that bucket or the sweep.
async fn a_hold_bought_through_the_ring_reaches_the_ledger_held_at_once<S: Store>(
    engine: Engine<S>,
) {
    use crate::harness::faulty::{Fault, Mode, Rule};
    // The saga's finish comes late, so the flusher has read the home bucket
    // (marked by the home step) before the hold record is written there.
    let late = Faulty::plain(engine.store().clone());
    late.rule(
        "finish",
        Rule {
            probability: 1.0,
            mode: Mode::Only(Fault::Delay(Duration::from_millis(200)), When::Before),
        },
    );
    let r = rig(Engine::new(late, engine.options().clone())).await;
    let id = r.create("ring-flush", 4, 4, 10).await;
    let u0 = user_homed_at(0, 4, "home");
    let first = r.buy(&id, &u0, 1).await.unwrap();
    assert_eq!((first.bucket, first.probes), (0, 0));
    // A flusher that reads only what this process marked: the sweep is off.
    let flusher = Flusher::new(
        r.engine.clone(),
        r.ledger.clone(),
        format!("marks-{}", rand::random::<u32>()),
        flush_options(),
    )
    .with_scan(0);
    let (stop, deadline) = (CancellationToken::new(), CancellationToken::new());
    let running = tokio::spawn(flusher.run(stop.clone(), deadline.clone()));
    crate::harness::eventually(
        "the first order in the ledger",
        Duration::from_secs(10),
        async || {
            r.ledger
                .order(&first.order_id, &id)
                .await
                .unwrap()
                .map(drop)
        },
    )
    .await;
    let probed = r.buy(&id, &u0, 1).await.unwrap();
    assert!(probed.probes > 0, "{probed:?}");
    let seen = crate::harness::eventually(
        "the ring's hold in the ledger, held",
        Duration::from_secs(10),
        async || {
            r.ledger
                .order(&probed.order_id, &id)
                .await
                .unwrap()
                .filter(|o| o.status == OrderStatus::Held)
        },
    )
    .await;
    assert_eq!(seen.pay_by, probed.pay_by);
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// A reshard stopped after its restore leaves the event resharding: the
/// order's home bucket is sealed and the new layout not yet current. A
/// confirm or a cancel then changes nothing and says so (the layout is
/// changing: retry), and once the reshard is resumed the confirm goes
/// through. It answered "no such order", which the HTTP layer, finding the
/// order in the ledger, turned into "the event is closed" (fault seeds 5036,
/// 1269488).
async fn a_confirm_or_cancel_during_a_stopped_reshard_answers_try_again<S: Store>(
    engine: Engine<S>,
) {
    use shardstock::EngineError;
    use shardstock::control::checkpoint::{self, Checkpoint, Flow};
    use shardstock::store::StoreError;
    let opts = EngineOptions {
        reshard_wait: Duration::from_millis(200),
        ..engine.options().clone()
    };
    let r = rig(Engine::new(engine.store().clone(), opts)).await;
    let id = r.create("confirm-resharding", 20, 2, 4).await;
    let order = r.buy(&id, "u-1", 1).await.unwrap();
    checkpoint::inject(
        &id,
        Arc::new(|cp| {
            Box::pin(async move {
                if cp == Checkpoint::ReshardRestored {
                    Flow::Crash
                } else {
                    Flow::Go
                }
            })
        }),
    );
    assert!(
        shardstock::control::reshard::reshard(&r.engine, &id, 3)
            .await
            .is_err()
    );
    checkpoint::clear(&id);
    let oid = order.order_id.as_str();
    let confirm = r.engine.confirm(oid).await;
    assert!(
        matches!(confirm, Err(EngineError::Store(StoreError::Stale(_)))),
        "a confirm while resharding: {confirm:?}"
    );
    let cancel = r.engine.cancel(oid).await;
    assert!(
        matches!(cancel, Err(EngineError::Store(StoreError::Stale(_)))),
        "a cancel while resharding: {cancel:?}"
    );
    shardstock::control::reshard::reshard(&r.engine, &id, 3)
        .await
        .unwrap();
    let c = r.engine.confirm(oid).await.unwrap();
    assert_eq!(c.result.unwrap().status, OrderStatus::Confirmed);
}

/// A purchase that applied while its answer was lost, retried with its
/// request id: the retry, whose own home step found the first call's record,
/// answers it as a replay showing the hold (`held`, the first call's
/// `pay_by`). It answered a fresh 201 without either (fault seed 7319047).
async fn a_retry_whose_first_answer_was_lost_shows_its_hold<S: Store>(engine: Engine<S>) {
    let faulty = Faulty::plain(engine.store().clone());
    let r = rig(Engine::new(faulty.clone(), engine.options().clone())).await;
    let id = r.create("lost-answer", 20, 2, 4).await;
    let req = PurchaseRequest {
        event: id.clone(),
        user: user("u-1"),
        quantity: 1,
        request_id: Some(RequestId::parse("lost-1").unwrap()),
        access_token: None,
    };
    let first = r.engine.purchase(&req).await.unwrap();
    let pay_by = first.result.as_ref().unwrap().pay_by;
    assert!(pay_by.is_some());
    // The retry's own home step applies (it finds the record) and its reply
    // is lost: the engine reads back what the step left.
    faulty.arm("purchase", faulty.calls("purchase") + 1, When::After);
    let retry = r.engine.purchase(&req).await.unwrap();
    let order = retry.result.as_ref().unwrap();
    assert!(retry.replayed, "{retry:?}");
    assert_eq!(
        (order.status, order.pay_by),
        (Some(OrderStatus::Held), pay_by)
    );
    assert_eq!(order.order_id, first.result.unwrap().order_id);
}

/// A purchase whose home step left a pending record (the bucket was short)
/// and whose caller never learned more; a retry with its request id, whose
/// own home step's reply was lost too, finds that record and drives the
/// earlier call's saga. It answers a replay of that call, with the hold
/// that began then. It answered as fresh, with a pay-by older than the
/// retry itself (fault seed 20261641).
async fn a_retry_that_drives_an_earlier_calls_saga_answers_a_replay<S: Store>(engine: Engine<S>) {
    let faulty = Faulty::plain(engine.store().clone());
    let r = rig(Engine::new(faulty.clone(), engine.options().clone())).await;
    // One unit a bucket: buying two always goes through the ring.
    let id = r.create("earlier-saga", 2, 2, 4).await;
    let req = PurchaseRequest {
        event: id.clone(),
        user: user("u-1"),
        quantity: 2,
        request_id: Some(RequestId::parse("earlier-1").unwrap()),
        access_token: None,
    };
    // The first call's home step runs (a pending record) and its reply is
    // lost; every read-back fails, so it cannot tell what happened.
    faulty.arm("purchase", faulty.calls("purchase") + 1, When::After);
    let reads = faulty.calls("request_record");
    for n in 1..=3 {
        faulty.arm("request_record", reads + n, When::Before);
    }
    let first = r.engine.purchase(&req).await;
    assert!(
        matches!(first, Err(EngineError::OutcomeUnknown(_))),
        "{first:?}"
    );
    let started = r.clock.now_ms();
    r.clock.advance(Duration::from_secs(5));
    // The retry's home step finds the record; its reply is lost as well.
    faulty.arm("purchase", faulty.calls("purchase") + 1, When::After);
    let retry = r.engine.purchase(&req).await.unwrap();
    assert!(retry.replayed, "{retry:?}");
    let order = retry.result.unwrap();
    assert_eq!(order.status, Some(OrderStatus::Held));
    let pay_by = order.pay_by.expect("a hold shows its pay-by");
    assert!(
        (started..started + 1_000).contains(&(pay_by - HOLD_S as i64 * 1_000)),
        "the hold began with the first call at {started}, pay-by {pay_by}"
    );
}

/// Two instances; one reshards the event and cancels a hold and confirms
/// another in the new layout. The other instance last saw the old layout
/// (sealed, its index as the reshard found it): reading the orders there, it
/// answered them `held`, after the client had been told otherwise (fault
/// seed 20261930, answers_in_order). A sealed bucket of an event still
/// selling is a stale layout: the read reloads and reads where the order
/// lives now.
async fn an_instance_that_missed_a_reshard_reads_orders_where_they_live<S: Store>(
    engine: Engine<S>,
) {
    let other = Engine::new(engine.store().clone(), engine.options().clone());
    let r = rig(engine).await;
    let other = other.with_clock(r.clock.clone().into());
    let id = r.create("missed-reshard", 20, 2, 4).await;
    let cancelled = r.buy(&id, "u-1", 2).await.unwrap();
    let confirmed = r.buy(&id, "u-2", 2).await.unwrap();
    // The other instance caches the layout of two buckets.
    for o in [&cancelled, &confirmed] {
        let seen = other.order(o.order_id.as_str()).await.unwrap();
        assert_eq!(seen.status, OrderStatus::Held);
    }
    shardstock::control::reshard::reshard(&r.engine, &id, 3)
        .await
        .unwrap();
    let c = r.engine.cancel(cancelled.order_id.as_str()).await.unwrap();
    assert_eq!(c.order.status, OrderStatus::Cancelled);
    let p = r.engine.confirm(confirmed.order_id.as_str()).await.unwrap();
    assert_eq!(p.result.unwrap().status, OrderStatus::Confirmed);
    let seen = other.order(cancelled.order_id.as_str()).await.unwrap();
    assert_eq!(seen.status, OrderStatus::Cancelled, "{seen:?}");
    let seen = other.order(confirmed.order_id.as_str()).await.unwrap();
    assert_eq!(seen.status, OrderStatus::Confirmed, "{seen:?}");
}
