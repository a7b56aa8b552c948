//! The engines of one schedule, running its plan: each actor's operations in
//! order, the actors side by side, every answer into the [`Log`] (the calls
//! a client makes, and how their answers are read: `client`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardstock::Engine;
use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::hold_expiry::{ExpiryOptions, sweep_due};
use shardstock::control::rebalancer::{Policy, RebalanceOptions, Rebalancer};
use shardstock::control::{lifecycle, reshard};
use shardstock::domain::ids::EventId;
use shardstock::domain::model::EventStatus;
use shardstock::engine::{Lease, PurchaseRequest, mover};
use shardstock::ledger::Ledger;
use shardstock::store::Store;
use tokio_util::sync::CancellationToken;

use super::client::maybe_crash;
use super::clock::ScheduleClock;
use super::log::Log;
use super::plan::{Carry, ENGINES, Op, Plan, WINDOW};
use crate::harness::faulty::Faulty;
use crate::harness::req;

/// The engines of a schedule and what they share.
pub struct Rig<S: Store> {
    pub plan: Plan,
    pub id: EventId,
    pub engines: Vec<Arc<Engine<Faulty<S>>>>,
    /// One rebalancer per engine (a leader keeps its state between rounds).
    pub rebalancers: Vec<tokio::sync::Mutex<Rebalancer<Faulty<S>>>>,
    pub ledger: Ledger,
    /// Every engine's time (the settling engine's too).
    pub clock: Arc<ScheduleClock>,
    pub log: Mutex<Log>,
    pub stop: CancellationToken,
}

/// A rebalancer of engine `engine`: short leases, levelling eagerly.
pub fn rebalancer<S: Store>(
    engine: &Arc<Engine<Faulty<S>>>,
    ledger: &Ledger,
) -> Rebalancer<Faulty<S>> {
    let opts = RebalanceOptions {
        resizing: Default::default(),
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

    pub(super) fn tally(&self, what: &str) {
        self.log.lock().unwrap().count(what.to_owned());
    }

    /// Notes that a close begins now (`OfferLog::closing_ms`: the earliest).
    pub(super) fn closing(&self) {
        let now = self.clock.now_ms();
        let mut log = self.log.lock().unwrap();
        let at = log.offers.closing_ms.get_or_insert(now);
        *at = (*at).min(now);
    }

    /// A purchase by user `user_index`, carrying what `carry` says on a
    /// token schedule (logged with its request id, for the checks).
    fn request(&self, user_index: usize, qty: u32, rid: String, carry: Carry) -> PurchaseRequest {
        let mut r = req(&self.id, &Plan::user(user_index), qty, Some(&rid));
        if self.plan.tokens.is_some() {
            r.access_token = self.plan.token(&self.id, user_index, carry);
            self.log.lock().unwrap().carried.insert(rid, carry);
        }
        r
    }

    async fn apply(&self, engine: &Arc<Engine<Faulty<S>>>, actor: usize, i: usize, op: Op) {
        let store = engine.store();
        match op {
            Op::Buy {
                user,
                qty,
                crash,
                carry,
            } => {
                let rid = format!("s{}-a{actor}-{i}", self.plan.seed);
                let req = self.request(user, qty, rid, carry);
                self.purchase(engine, &req, crash).await;
            }
            Op::Replay { pick } => {
                let all = self.log.lock().unwrap().replayable();
                if !all.is_empty() {
                    self.purchase(engine, &all[pick % all.len()], None).await;
                }
            }
            Op::Cancel { pick, crash } => {
                let all = self.log.lock().unwrap().cancellable();
                if !all.is_empty() {
                    self.cancel(engine, &all[pick % all.len()], crash).await;
                }
            }
            Op::Confirm { pick, crash } => {
                let all = self.log.lock().unwrap().confirmable();
                if !all.is_empty() {
                    self.confirm(engine, &all[pick % all.len()], crash).await;
                }
            }
            Op::Expire => {
                let swept = Box::pin(sweep_due(engine, &ExpiryOptions::default(), 4)).await;
                self.tally(match swept {
                    Ok(0) => "expire none",
                    Ok(_) => "expire some",
                    Err(_) => "expire failed",
                });
            }
            Op::Advance => {
                self.clock.advance(self.plan.advance_by());
                self.tally("clock past deadlines");
            }
            Op::End => {
                self.clock.advance(WINDOW);
                self.tally("clock past the window");
            }
            Op::Offers { both } => self.offers_op(actor, both).await,
            Op::Claims => self.claims_op(engine).await,
            Op::PassOffers => self.pass_offers_op(),
            Op::Rotate { crash } => self.rotate_op(engine, crash).await,
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
                self.closing();
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
