//! Holds in the release schedules (`releases`): in a share of them, decided
//! by the seed from a generator of its own (the release's other draws are as
//! they were), the release holds every order `hold_seconds` (1–2 s of the
//! schedule's clock, which the event's plan also moves past deadlines).
//!
//! The buyers then also act on orders they were told bought: confirm or
//! cancel them (some calls dropped mid-way, between the home's decision and
//! the lines or between two lines), or play an engine that died right after
//! its decision at the home (the record moved to confirming, cancelling or
//! expiring, no line touched); the rest are left to expire. A sweeper actor
//! runs rounds of the release sweeper on a faulty engine (some dropped). A
//! reshard of a pool of a release with holds must be refused (`HeldPool`):
//! the actor asserts that instead of resharding.
//!
//! What each client was told is kept per order ([`HoldBook`]): a final status
//! (confirmed, cancelled, expired) once told stays the order's, and an order
//! told only "held" ends expired, or confirmed or cancelled when such a call
//! was made. After the settle (the clock past every deadline, the sweeper
//! run) every order is read: none left held, each as told; from the database
//! alone, every line of an order has its order's status.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::control::release_sweeper;
use shardstock::control::saga_sweeper::SagaSweepOptions;
use shardstock::domain::keys::HomeRef;
use shardstock::domain::model::OrderStatus;
use shardstock::domain::release::{HoldState, HomeRecord, ReleaseSpec};
use shardstock::domain::routing::user_hash;
use shardstock::engine::{HoldRefusal, ReleaseOrder, ReleaseOrderStatus};
use shardstock::store::{Decided, Releases, Store};
use shardstock::{Engine, EngineError};

use super::client::maybe_crash;
use super::settle::Violations;
use crate::harness::faulty::Faulty;
use crate::harness::user;

const CHECK: &str = "release_orders";

/// What a buyer does with an order it was told bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Confirm,
    Cancel,
    /// An engine that moved the record to this state at the home and died
    /// before any line.
    Die(HoldState),
}

/// A buyer's act on a held order, `(position, pick, act, crash)`: before
/// its step `position`, acts on the `pick`-th order told bought (modulo),
/// the call dropped after `crash`.
pub type HoldStep = (usize, usize, Act, Option<Duration>);

/// The holds of a schedule's release.
#[derive(Debug, Clone)]
pub struct HoldPlan {
    pub seconds: u32,
    /// Per buyer, its acts.
    pub acts: [Vec<HoldStep>; 2],
    /// The sweeper actor's rounds, each after this long; dropped after the
    /// second duration when given.
    pub sweeps: Vec<(Duration, Option<Duration>)>,
}

impl HoldPlan {
    /// Half the release schedules hold their orders.
    pub fn draw(seed: u64, steps: [usize; 2]) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x401d_0c0d);
        if !rng.random_bool(0.5) {
            return None;
        }
        let seconds = rng.random_range(1..=2);
        let acts = steps.map(|n| {
            (0..rng.random_range(n / 3..=n / 2 + 1))
                .map(|_| {
                    let act = match rng.random_range(0..10) {
                        0..=4 => Act::Confirm,
                        5..=7 => Act::Cancel,
                        8 => Act::Die(HoldState::Confirming),
                        _ => Act::Die(if rng.random_bool(0.5) {
                            HoldState::Cancelling
                        } else {
                            HoldState::Expiring
                        }),
                    };
                    let crash = rng
                        .random_bool(0.25)
                        .then(|| Duration::from_millis(rng.random_range(0..15)));
                    (
                        rng.random_range(1..n),
                        rng.random_range(0..1000),
                        act,
                        crash,
                    )
                })
                .collect()
        });
        let sweeps = (0..rng.random_range(1..=3))
            .map(|_| {
                (
                    Duration::from_millis(rng.random_range(10..150)),
                    rng.random_bool(0.3)
                        .then(|| Duration::from_millis(rng.random_range(0..10))),
                )
            })
            .collect();
        Some(Self {
            seconds,
            acts,
            sweeps,
        })
    }
}

/// What the clients of one order were told, and asked.
#[derive(Debug, Default, Clone)]
struct Told {
    /// The first final status told (confirmed, cancelled, expired).
    last: Option<ReleaseOrderStatus>,
    confirm: bool,
    cancel: bool,
}

/// Per order id, what its clients were told.
#[derive(Debug, Default)]
pub struct HoldBook {
    told: HashMap<String, Told>,
    /// Order ids with two final statuses told, and what.
    clashes: Vec<String>,
}

impl HoldBook {
    /// An answer that showed `order`.
    pub fn told(&mut self, order: &ReleaseOrder) {
        let t = self.told.entry(order.order_id.to_string()).or_default();
        if order.status == ReleaseOrderStatus::Held {
            return;
        }
        match t.last {
            Some(was) if was != order.status => self.clashes.push(format!(
                "order {}: told {was:?}, then {:?}",
                order.order_id, order.status
            )),
            Some(_) => {}
            None => t.last = Some(order.status),
        }
    }

    fn asked(&mut self, order_id: &str, act: Act) {
        let t = self.told.entry(order_id.to_owned()).or_default();
        match act {
            Act::Confirm | Act::Die(HoldState::Confirming) => t.confirm = true,
            Act::Cancel | Act::Die(HoldState::Cancelling) => t.cancel = true,
            Act::Die(_) => {}
        }
    }
}

/// Acts out `act` on order `order_id` of `user` (request `rid`) on `engine`
/// (the record moved on `plain`'s store for `Die`); returns what to tally.
pub async fn act<S: Store>(
    (engine, plain): (&Engine<Faulty<S>>, &Engine<Faulty<S>>),
    spec: &ReleaseSpec,
    book: &std::sync::Mutex<HoldBook>,
    (order_id, u, rid): (&str, &str, &str),
    (act, crash): (Act, Option<Duration>),
) -> String {
    book.lock().unwrap().asked(order_id, act);
    if let Act::Die(to) = act {
        return die(plain, spec, u, rid, to).await;
    }
    let call = async {
        if act == Act::Confirm {
            engine.confirm_release_order(&spec.id, order_id).await
        } else {
            engine.cancel_release_order(&spec.id, order_id).await
        }
    };
    match maybe_crash(crash, Box::pin(call)).await {
        Some(Ok(out)) => {
            let order = match &out.result {
                Ok(o)
                | Err(
                    HoldRefusal::Expired(o) | HoldRefusal::Cancelled(o) | HoldRefusal::Confirmed(o),
                ) => o,
            };
            book.lock().unwrap().told(order);
            format!("{act:?}: {:?}", order.status)
        }
        Some(Err(EngineError::OutcomeUnknown(_) | EngineError::Store(_))) => {
            format!("{act:?}: unknown")
        }
        Some(Err(e)) => format!("{act:?}: error {e}"),
        None => format!("{act:?}: dropped"),
    }
}

/// One round of the sweeper actor after `after`, dropped after `crash`;
/// returns what to tally.
pub async fn sweep_round<S: Store>(
    engine: &Engine<Faulty<S>>,
    release: &shardstock::domain::ids::EventId,
    (after, crash): (Duration, Option<Duration>),
) -> &'static str {
    let opts = SagaSweepOptions {
        stale_after: Duration::from_millis(50),
        ..SagaSweepOptions::default()
    };
    tokio::time::sleep(after).await;
    let round = release_sweeper::sweep_release(engine, release, &opts);
    match maybe_crash(crash, Box::pin(round)).await {
        Some(Ok(_)) => "sweep ok",
        Some(Err(_)) => "sweep failed",
        None => "sweep dropped",
    }
}

/// Moves an open hold's record to `to` at its home, as an engine that died
/// right after that decision: no line touched, the sweeper finishes it.
async fn die<S: Store>(
    plain: &Engine<Faulty<S>>,
    spec: &ReleaseSpec,
    u: &str,
    rid: &str,
    to: HoldState,
) -> String {
    let home = HomeRef::new(&spec.id, spec.home(user_hash(&user(u))));
    let key = format!("{u}/{rid}");
    let Ok(Some(open @ HomeRecord::Held(_, _, HoldState::Open))) =
        plain.store().home_record(&home, &key).await
    else {
        return "died: not open".into();
    };
    let HomeRecord::Held(head, pay_by, _) = open.clone() else {
        unreachable!()
    };
    let next = HomeRecord::Held(head, pay_by, to);
    match plain
        .store()
        .move_hold(&home, &key, &open, &next, false)
        .await
    {
        Ok(Decided::Done) => format!("died {to:?}"),
        _ => "died: raced".into(),
    }
}

/// After the settle: reads every order told bought (which finishes a
/// decided one) and checks it against what its clients were told; returns
/// each order's final status.
pub async fn final_statuses<S: Store>(
    plain: &Engine<Faulty<S>>,
    spec: &ReleaseSpec,
    book: &std::sync::Mutex<HoldBook>,
    v: &mut Violations,
) -> HashMap<String, ReleaseOrderStatus> {
    let (told, clashes) = {
        let book = book.lock().unwrap();
        (book.told.clone(), book.clashes.clone())
    };
    for c in clashes {
        v.push((CHECK, c));
    }
    let mut finals = HashMap::new();
    for (oid, t) in told {
        let order = match plain.release_order(&spec.id, &oid).await {
            Ok(o) => o,
            Err(e) => {
                v.push((CHECK, format!("order {oid}: unread: {e}")));
                continue;
            }
        };
        let ok = match (t.last, order.status) {
            (_, ReleaseOrderStatus::Held) => false,
            (Some(was), now) => was == now,
            (None, ReleaseOrderStatus::Expired) => true,
            (None, ReleaseOrderStatus::Confirmed) => t.confirm,
            (None, ReleaseOrderStatus::Cancelled) => t.cancel,
        };
        if !ok {
            v.push((
                CHECK,
                format!(
                    "order {oid}: ends {:?}, its clients told {t:?}",
                    order.status
                ),
            ));
        }
        finals.insert(oid, order.status);
    }
    finals
}

/// From the database alone: every line of every order told bought has its
/// order's final status.
pub fn check_lines(
    orders: &[ReleaseOrder],
    finals: &HashMap<String, ReleaseOrderStatus>,
    db: &HashMap<String, OrderStatus>,
    v: &mut Violations,
) {
    for order in orders {
        let Some(status) = finals.get(order.order_id.as_str()) else {
            continue;
        };
        let want = match status {
            ReleaseOrderStatus::Confirmed => OrderStatus::Confirmed,
            ReleaseOrderStatus::Cancelled => OrderStatus::Cancelled,
            ReleaseOrderStatus::Expired => OrderStatus::Expired,
            ReleaseOrderStatus::Held => continue,
        };
        for line in &order.lines {
            let got = db.get(line.order_id.as_str());
            if got != Some(&want) {
                v.push((
                    CHECK,
                    format!(
                        "order {} ({status:?}): line {} is {got:?} in the database",
                        order.order_id, line.order_id
                    ),
                ));
            }
        }
    }
}
