//! One randomized schedule: what it does (a [`Plan`] drawn from a seed) and
//! what every answer was (the [`Log`]).
//!
//! A plan is a spec, a fault rate and a list of operations per actor; actors
//! run side by side, each on one of the engines, each engine on its own
//! `Faulty` wrapper of the one shared store. The plan is a pure function of
//! the seed; the interleaving of the actors is not (it is real concurrency),
//! but the fault decisions are keyed by call count per step, so a seed
//! reproduces the same kinds of trouble.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::rebalancer::{Policy, RebalanceOptions, Rebalancer};
use shardstock::control::{lifecycle, reshard};
use shardstock::domain::ids::{EventId, OrderId, RequestId};
use shardstock::domain::model::{EventSpec, EventStatus};
use shardstock::engine::mover;
use shardstock::engine::{Lease, PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::ledger::Ledger;
use shardstock::store::{Store, StoreError};
use shardstock::{Engine, EngineError, EngineOptions};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Faulty, Mode, Rule};
use crate::harness::{event_id, spec, user};

/// Engines per schedule, and actors (tasks) over them.
pub const ENGINES: usize = 3;
const ACTORS: usize = 4;
/// Buyers per schedule: few, so per-user limits bite.
const USERS: usize = 12;

/// One thing an actor does.
#[derive(Debug, Clone)]
pub enum Op {
    /// A new request; `crash`: the caller drops it after this long.
    Buy {
        user: usize,
        qty: u32,
        crash: Option<Duration>,
    },
    /// The same request id again, of a request answered before (`pick` among them).
    Replay {
        pick: usize,
    },
    /// Cancel a bought order (`pick` among them).
    Cancel {
        pick: usize,
        crash: Option<Duration>,
    },
    /// The rebalancer's mover by hand: lease, take over, one transfer.
    Transfer {
        from: u32,
        to: u32,
        units: u64,
    },
    /// One round of the engine's rebalancer: leadership, a round of moves,
    /// or the resumption of a stalled reshard.
    Rebalance,
    Reshard {
        buckets: u32,
    },
    Close {
        crash: Option<Duration>,
    },
    Flush,
}

/// A schedule, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub spec: EventSpec,
    /// Of each store step, in every engine.
    pub fault_rate: f64,
    pub max_delay: Duration,
    pub actors: Vec<Vec<Op>>,
}

impl Plan {
    pub fn draw(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let id = event_id("fault");
        let mut spec = spec(&id, rng.random_range(20..=60), rng.random_range(2..=8));
        spec.max_per_order = 3;
        spec.per_user_limit = rng.random_bool(2.0 / 3.0).then(|| rng.random_range(2..=5));
        let crash = |rng: &mut StdRng| {
            rng.random_bool(0.15)
                .then(|| Duration::from_millis(rng.random_range(0..25)))
        };
        // Half the schedules reshard (a reshard is many steps: under faults
        // it often stops half way and the event waits for its resumption).
        let reshards = rng.random_bool(0.5);
        let mut actors: Vec<Vec<Op>> = (0..ACTORS)
            .map(|_| {
                (0..rng.random_range(15..=30))
                    .map(|_| match rng.random_range(0..100) {
                        0..50 => Op::Buy {
                            user: rng.random_range(0..USERS),
                            qty: rng.random_range(1..=3),
                            crash: crash(&mut rng),
                        },
                        50..64 => Op::Replay {
                            pick: rng.random_range(0..1000),
                        },
                        64..76 => Op::Cancel {
                            pick: rng.random_range(0..1000),
                            crash: crash(&mut rng),
                        },
                        76..82 => Op::Transfer {
                            from: rng.random_range(0..8),
                            to: rng.random_range(0..8),
                            units: rng.random_range(1..=6),
                        },
                        82..89 => Op::Rebalance,
                        89..92 if reshards => Op::Reshard {
                            buckets: rng.random_range(1..=8),
                        },
                        _ => Op::Flush,
                    })
                    .collect()
            })
            .collect();
        // A quarter of the schedules close the sale while it runs.
        if rng.random_bool(0.25) {
            let actor = rng.random_range(0..ACTORS);
            let at = rng.random_range(actors[actor].len() / 2..=actors[actor].len());
            let crash = crash(&mut rng);
            actors[actor].insert(at, Op::Close { crash });
        }
        Plan {
            seed,
            spec,
            fault_rate: rng.random_range(0.005..0.06),
            max_delay: Duration::from_millis(rng.random_range(2..=20)),
            actors,
        }
    }

    /// Whether the schedule reshards the event.
    pub fn reshards(&self) -> bool {
        self.actors
            .iter()
            .flatten()
            .any(|op| matches!(op, Op::Reshard { .. }))
    }

    pub fn ops(&self) -> usize {
        self.actors.iter().map(Vec::len).sum()
    }

    /// The options of engine `i`: batched and not, short waits (a schedule
    /// must not wait 5 s for a reshard its own fault stalled).
    pub fn engine_options(i: usize) -> EngineOptions {
        EngineOptions {
            max_batch: i.is_multiple_of(2).then_some(8),
            reshard_wait: Duration::from_millis(300),
            gather_wait: Duration::from_millis(200),
            ..EngineOptions::default()
        }
    }

    /// The rule every engine's wrapper follows. `release_lease` is spared: a
    /// lease that is never given back only expires after its TTL (30 s for a
    /// reshard), which shows nothing new and would make schedules wait.
    pub fn rules<S: Store>(&self, faulty: &Faulty<S>) {
        faulty.everywhere(Rule {
            probability: self.fault_rate,
            mode: Mode::Any {
                max_delay: self.max_delay,
            },
        });
        faulty.rule(
            "release_lease",
            Rule {
                probability: 0.0,
                mode: Mode::Any {
                    max_delay: self.max_delay,
                },
            },
        );
    }
}

/// What one answer to a purchase says about the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 201: this order.
    Bought(OrderId, u32),
    /// A final refusal (sold out, over the limit): nothing deducted.
    Refused(String),
    /// An error that says nothing was deducted: 503 without `outcome`, or
    /// `Contention` ("nothing was bought, retry").
    NothingDeducted(String),
    /// The event is not on sale (closed): says nothing about a replay.
    NotOnSale,
    /// `OutcomeUnknown`, a dropped call, or an unexpected error.
    Unknown(String),
}

impl Answer {
    pub fn of(result: Result<PurchaseOutcome, EngineError>) -> Self {
        match result {
            Ok(PurchaseOutcome {
                result: Ok(order), ..
            }) => Self::Bought(order.order_id, order.quantity),
            Ok(PurchaseOutcome {
                result: Err(Refusal::SoldOut { .. }),
                ..
            }) => Self::Refused("sold out".into()),
            Ok(PurchaseOutcome {
                result: Err(Refusal::LimitExceeded { .. }),
                ..
            }) => Self::Refused("over the limit".into()),
            Err(EngineError::Store(StoreError::Unavailable(why))) => {
                Self::NothingDeducted(format!("unavailable: {why}"))
            }
            Err(e @ EngineError::Contention { .. }) => Self::NothingDeducted(e.to_string()),
            Err(EngineError::NotOnSale { .. }) => Self::NotOnSale,
            Err(e) => Self::Unknown(e.to_string()),
        }
    }

    /// A final answer: a replay must give it again.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Bought(..) | Self::Refused(_))
    }
}

/// One answer, and when its call was made (wall-clock ms, the engines' clock).
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    pub sent_ms: i64,
}

/// A request (one request id) and every answer it got, in order.
#[derive(Debug, Clone)]
pub struct Sent {
    pub req: PurchaseRequest,
    pub replies: Vec<Reply>,
}

impl Sent {
    pub fn answers(&self) -> impl Iterator<Item = &Answer> {
        self.replies.iter().map(|r| &r.answer)
    }
}

/// Now, in ms since the epoch: the engines' system clock, which stamps orders.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64
}

/// What the cancels of one order add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// A cancel answered: the order is cancelled.
    Yes,
    /// Every cancel was refused before it touched anything (the sale was closed).
    No,
    /// Some cancel failed or was dropped, and none answered.
    Unknown,
}

impl Cancelled {
    /// The sum of two attempts.
    pub fn and(self, other: Self) -> Self {
        match (self, other) {
            (Self::Yes, _) | (_, Self::Yes) => Self::Yes,
            (Self::Unknown, _) | (_, Self::Unknown) => Self::Unknown,
            _ => Self::No,
        }
    }

    /// What one cancel's result says.
    pub fn of<T>(result: Option<Result<T, EngineError>>) -> Self {
        match result {
            Some(Ok(_)) => Self::Yes,
            Some(Err(EngineError::NotOnSale { .. })) => Self::No,
            _ => Self::Unknown,
        }
    }
}

/// Everything the schedule was told.
#[derive(Debug, Default, Clone)]
pub struct Log {
    /// By client request id.
    pub sent: HashMap<String, Sent>,
    /// In the order they were first answered.
    pub order: Vec<String>,
    /// Orders a cancel was sent for, and what the cancels add up to.
    pub cancels: HashMap<OrderId, Cancelled>,
    /// How the operations went, e.g. `reshard ok: 2` (for the summary).
    pub tally: std::collections::BTreeMap<String, u32>,
    /// Answers no schedule should ever get (e.g. a bought order unknown to cancel).
    pub errors: Vec<String>,
}

impl Log {
    /// Records an answer to a call made at `sent_ms`.
    pub fn answered(&mut self, req: &PurchaseRequest, answer: Answer, sent_ms: i64) {
        let rid = req.request_id.as_ref().expect("every request has an id");
        let rid = rid.as_str().to_owned();
        let sent = self.sent.entry(rid.clone()).or_insert_with(|| Sent {
            req: req.clone(),
            replies: Vec::new(),
        });
        if sent.replies.is_empty() {
            self.order.push(rid);
        }
        let kind = match &answer {
            Answer::Bought(..) => "201",
            Answer::Refused(_) => "refused",
            Answer::NothingDeducted(_) => "nothing deducted",
            Answer::NotOnSale => "not on sale",
            Answer::Unknown(_) => "unknown",
        };
        sent.replies.push(Reply { answer, sent_ms });
        self.count(format!("buy {kind}"));
    }

    fn count(&mut self, what: String) {
        *self.tally.entry(what).or_default() += 1;
    }

    /// Records a cancel's result.
    pub fn cancelled<T>(&mut self, oid: &OrderId, result: Option<Result<T, EngineError>>) {
        if let Some(Err(e @ EngineError::UnknownOrder(_))) = &result {
            self.errors
                .push(format!("cancel of {oid}, answered 201 before: {e}"));
        }
        let now = Cancelled::of(result);
        self.count(format!("cancel {now:?}"));
        let was = self.cancels.get(oid).copied().unwrap_or(Cancelled::No);
        self.cancels.insert(oid.clone(), was.and(now));
    }

    /// Requests a replay may pick: answered finally or with an unknown outcome
    /// (never one answered "nothing deducted": a retry may buy then, which
    /// would be no lie).
    fn replayable(&self) -> Vec<PurchaseRequest> {
        self.order
            .iter()
            .map(|rid| &self.sent[rid])
            .filter(|s| {
                s.answers()
                    .any(|a| a.is_final() || matches!(a, Answer::Unknown(_)))
            })
            .map(|s| s.req.clone())
            .collect()
    }

    /// Orders bought and not cancelled, in answer order.
    fn cancellable(&self) -> Vec<OrderId> {
        let mut out: Vec<OrderId> = Vec::new();
        for rid in &self.order {
            for a in self.sent[rid].answers() {
                if let Answer::Bought(oid, _) = a
                    && !out.contains(oid)
                    && self.cancels.get(oid) != Some(&Cancelled::Yes)
                {
                    out.push(oid.clone());
                }
            }
        }
        out
    }
}

/// The engines of a schedule and what they share.
pub struct Rig<S: Store> {
    pub plan: Plan,
    pub id: EventId,
    pub engines: Vec<Arc<Engine<Faulty<S>>>>,
    /// One rebalancer per engine (a leader keeps its state between rounds).
    pub rebalancers: Vec<tokio::sync::Mutex<Rebalancer<Faulty<S>>>>,
    pub ledger: Ledger,
    pub log: Mutex<Log>,
    pub stop: CancellationToken,
}

/// A rebalancer of engine `engine`: short leases, levelling eagerly.
pub fn rebalancer<S: Store>(
    engine: &Arc<Engine<Faulty<S>>>,
    ledger: &Ledger,
) -> Rebalancer<Faulty<S>> {
    let opts = RebalanceOptions {
        interval: Duration::from_millis(10),
        lease_ttl_ms: 1_000,
        policy: Policy {
            horizon_s: 0.05,
            skew_threshold: 1.5,
            gather_below: 0.3,
            max_moves: 4,
        },
    };
    Rebalancer::new(engine.clone(), ledger.clone(), flush_options(), opts)
}

pub fn flush_options() -> FlushOptions {
    FlushOptions {
        batch: 50,
        workers: 2,
        idle: Duration::from_millis(10),
        claim_idle_ms: 200,
    }
}

/// Runs `fut`, or drops it after `crash` (a client that went away, a
/// process that died mid-call); `None` when it was dropped.
async fn maybe_crash<T>(crash: Option<Duration>, fut: impl Future<Output = T>) -> Option<T> {
    match crash {
        Some(after) => tokio::time::timeout(after, fut).await.ok(),
        None => Some(fut.await),
    }
}

impl<S: Store> Rig<S> {
    /// Runs every actor's operations, side by side.
    pub async fn run(self: &Arc<Self>) {
        let actors: Vec<_> = self
            .plan
            .actors
            .iter()
            .enumerate()
            .map(|(a, ops)| {
                let (rig, ops) = (self.clone(), ops.clone());
                tokio::spawn(async move {
                    let engine = rig.engines[a % ENGINES].clone();
                    for (i, op) in ops.into_iter().enumerate() {
                        rig.apply(&engine, a, i, op).await;
                    }
                })
            })
            .collect();
        for a in actors {
            a.await.expect("an actor panicked");
        }
    }

    fn tally(&self, what: &str) {
        self.log.lock().unwrap().count(what.to_owned());
    }

    fn request(&self, user_index: usize, qty: u32, rid: String) -> PurchaseRequest {
        PurchaseRequest {
            event: self.id.clone(),
            user: user(format!("u{user_index}")),
            quantity: qty,
            request_id: Some(RequestId::parse(rid).expect("a valid request id")),
        }
    }

    async fn buy(
        &self,
        engine: &Engine<Faulty<S>>,
        req: &PurchaseRequest,
        crash: Option<Duration>,
    ) {
        let sent_ms = now_ms();
        let answer = match maybe_crash(crash, Box::pin(engine.purchase(req))).await {
            Some(result) => Answer::of(result),
            None => Answer::Unknown("dropped mid-call".into()),
        };
        self.log.lock().unwrap().answered(req, answer, sent_ms);
    }

    async fn apply(&self, engine: &Arc<Engine<Faulty<S>>>, actor: usize, i: usize, op: Op) {
        let store = engine.store();
        match op {
            Op::Buy { user, qty, crash } => {
                let req = self.request(user, qty, format!("s{}-a{actor}-{i}", self.plan.seed));
                self.buy(engine, &req, crash).await;
            }
            Op::Replay { pick } => {
                let all = self.log.lock().unwrap().replayable();
                if !all.is_empty() {
                    self.buy(engine, &all[pick % all.len()], None).await;
                }
            }
            Op::Cancel { pick, crash } => {
                let all = self.log.lock().unwrap().cancellable();
                if all.is_empty() {
                    return;
                }
                let oid = all[pick % all.len()].clone();
                let done = maybe_crash(crash, Box::pin(engine.cancel(oid.as_str()))).await;
                self.log.lock().unwrap().cancelled(&oid, done);
            }
            Op::Transfer { from, to, units } => {
                let Ok(meta) = engine.reload(&self.id).await else {
                    return;
                };
                let n = meta.spec.buckets;
                if meta.status != EventStatus::OnSale || from % n == to % n {
                    return;
                }
                let owner = Lease::owner(engine.instance(), "fault-mover");
                let ttl = Duration::from_millis(500);
                let Ok(Some(lease)) = Lease::acquire(store, &self.id, &owner, ttl).await else {
                    return;
                };
                let buckets: Vec<_> = (0..n)
                    .map(|b| shardstock::domain::keys::BucketRef::new(&self.id, meta.generation, b))
                    .collect();
                let token = lease.token();
                let moved = Box::pin(async {
                    mover::take_over(store, &meta, &buckets, token).await?;
                    mover::transfer(store, &meta, token, from % n, to % n, units).await
                })
                .await;
                self.tally(match moved {
                    Ok(0) => "transfer none",
                    Ok(_) => "transfer ok",
                    Err(_) => "transfer failed",
                });
                lease.release(store).await;
            }
            Op::Rebalance => {
                let mut rebalancer = self.rebalancers[actor % ENGINES].lock().await;
                let round = Box::pin(rebalancer.lead(&self.id, &self.stop)).await;
                self.tally(match round {
                    Ok(Some(r)) if r.units > 0 => "rebalance moved",
                    Ok(_) => "rebalance idle",
                    Err(_) => "rebalance failed",
                });
            }
            Op::Reshard { buckets } => {
                let done = Box::pin(reshard::reshard(engine, &self.id, buckets)).await;
                self.tally(if done.is_ok() {
                    "reshard ok"
                } else {
                    "reshard failed"
                });
            }
            Op::Close { crash } => {
                let mut flusher = Flusher::new(
                    engine.clone(),
                    self.ledger.clone(),
                    format!("closer-{actor}"),
                    flush_options(),
                );
                let closing =
                    lifecycle::close(engine, &self.ledger, &mut flusher, &self.id, &self.stop);
                self.tally(match maybe_crash(crash, Box::pin(closing)).await {
                    Some(Ok(_)) => "close ok",
                    Some(Err(_)) => "close failed",
                    None => "close dropped",
                });
            }
            Op::Flush => {
                let Ok(meta) = engine.reload(&self.id).await else {
                    return;
                };
                let mut flusher = Flusher::new(
                    engine.clone(),
                    self.ledger.clone(),
                    format!("flusher-{actor}"),
                    flush_options(),
                );
                let _ = Box::pin(flusher.flush_once(&meta.all_buckets(), &self.stop)).await;
            }
        }
    }
}
