//! Release orders in the schedules: a small release (2–3 pools) sold
//! alongside the schedule's event, through the same faulty engines.
//!
//! Drawn from a generator of its own (the seed's other draws are as they
//! were), in half the schedules: two buyers send multi-line orders (some
//! dropped mid-call, some replayed) while a third actor reshards one pool
//! and closes another (or the same) mid-order: the close is dropped after
//! a few ms, or cut right after it sealed the pool, and finished when the
//! schedule settles. Settled on the healed store: a stopped reshard
//! resumed, the close finished, the release sweeper run with no wait, and
//! every request asked again. Checked (`release_orders`): a final answer
//! never changes; no order left pending; per pool still open, units told
//! bought + remaining == stock; each user's count is the units it was told
//! bought, within the limit; then every pool closed and read from the
//! database alone: the oracle per pool, and the confirmed orders exactly
//! the bought orders' lines (no refused order has a confirmed line).
//!
//! Half of these releases hold their orders (`release_holds`): the buyers
//! confirm, cancel, die after a decision or leave orders to expire, a
//! sweeper actor runs, and the reshard must be refused. There "bought"
//! above reads "confirmed in the end", and each order ends as told.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardstock::Engine;
use shardstock::control::checkpoint::{self, Checkpoint, Flow};
use shardstock::control::flusher::Flusher;
use shardstock::control::saga_sweeper::SagaSweepOptions;
use shardstock::control::{lifecycle, release_sweeper, reshard};
use shardstock::domain::ids::EventId;
use shardstock::domain::model::{EventStatus, OrderStatus};
use shardstock::engine::LinesRefusal;
use shardstock::ledger::Ledger;
use shardstock::store::{Leases, Releases, Store};
use tokio_util::sync::CancellationToken;

use super::client::maybe_crash;
use super::clock::ScheduleClock;
use super::release_holds::{self as holds, HoldBook};
pub use super::release_plan::ReleasePlan;
use super::release_plan::{Book, Buy, USERS, kind};
use super::rig::flush_options;
use super::settle::Violations;
use crate::harness::faulty::Faulty;
use crate::harness::{eventually, user};

const CHECK: &str = "release_orders";

/// A release sold during a schedule.
pub struct ReleaseRun<S: Store> {
    plan: ReleasePlan,
    seed: u64,
    ledger: Ledger,
    book: Mutex<Book>,
    closed_ok: Mutex<bool>,
    /// What each held order's clients were told.
    held: Mutex<HoldBook>,
    /// Promises broken during the run (a reshard of a held pool that ran).
    broken: Mutex<Vec<String>>,
    plain: Arc<Engine<Faulty<S>>>,
    clock: Arc<ScheduleClock>,
}

impl<S: Store> ReleaseRun<S> {
    /// Creates the release (on the plain engine) for `plan`.
    pub async fn start(
        plan: ReleasePlan,
        seed: u64,
        plain: &Arc<Engine<Faulty<S>>>,
        ledger: &Ledger,
        clock: &Arc<ScheduleClock>,
    ) -> Arc<Self> {
        lifecycle::create_release(plain, ledger, plan.spec.clone())
            .await
            .expect("create the release");
        Arc::new(Self {
            plan,
            seed,
            ledger: ledger.clone(),
            book: Mutex::new(Book::default()),
            closed_ok: Mutex::new(false),
            held: Mutex::default(),
            broken: Mutex::default(),
            plain: plain.clone(),
            clock: clock.clone(),
        })
    }

    fn tally(&self, what: impl Into<String>) {
        *self
            .book
            .lock()
            .unwrap()
            .tally
            .entry(what.into())
            .or_default() += 1;
    }

    /// The release's pools: the events its lines are orders of.
    pub fn pools(&self) -> Vec<EventId> {
        (0..self.plan.spec.pools.len())
            .map(|k| self.plan.pool(k))
            .collect()
    }

    pub fn summary(&self) -> String {
        let book = self.book.lock().unwrap();
        let mut tally: Vec<_> = book.tally.iter().collect();
        tally.sort();
        format!(
            "release of {} pools{}, {} requests, {:?}",
            self.plan.spec.pools.len(),
            self.plan
                .holds
                .as_ref()
                .map_or(String::new(), |h| format!(" held {} s", h.seconds)),
            book.sent.len(),
            tally
        )
    }

    /// The buyers and the reshard and close, side by side, over `engines`.
    pub async fn run(self: &Arc<Self>, engines: &[Arc<Engine<Faulty<S>>>]) {
        let buyers = (0..2).map(|b| {
            let (me, engine) = (self.clone(), engines[b % engines.len()].clone());
            tokio::spawn(async move { me.buy_all(b, &engine).await })
        });
        let mut buyers: Vec<_> = buyers.collect();
        if let Some(h) = &self.plan.holds {
            let (me, engine, sweeps) = (self.clone(), engines[0].clone(), h.sweeps.clone());
            buyers.push(tokio::spawn(async move { me.sweep(&engine, sweeps).await }));
        }
        let engine = engines[engines.len() - 1].clone();
        let (pool, buckets, after) = self.plan.reshard;
        tokio::time::sleep(after).await;
        let resharded = Box::pin(reshard::reshard(&engine, &self.plan.pool(pool), buckets)).await;
        self.tally(match resharded {
            Err(shardstock::control::ControlError::HeldPool { .. }) => "reshard refused".to_owned(),
            // To the count it has: nothing to do, nothing refused.
            Ok(_) if self.plan.holds.is_some() && buckets != self.plan.spec.pools[pool].buckets => {
                self.broken
                    .lock()
                    .unwrap()
                    .push(format!("pool p{pool} of a release with holds resharded"));
                "reshard ok".to_owned()
            }
            Ok(_) => "reshard ok".to_owned(),
            Err(e) => format!(
                "reshard failed: {}",
                e.to_string().split(':').next().unwrap_or("")
            ),
        });
        let (pool, after, cut) = self.plan.close;
        tokio::time::sleep(after).await;
        let id = self.plan.pool(pool);
        if cut {
            checkpoint::inject(
                &id,
                Arc::new(|cp| {
                    let crash = cp == Checkpoint::CloseSealed;
                    Box::pin(async move { if crash { Flow::Crash } else { Flow::Go } })
                }),
            );
        }
        let mut flusher = Flusher::new(
            engine.clone(),
            self.ledger.clone(),
            format!("rel-closer-{}", self.seed),
            flush_options(),
        );
        let stop = CancellationToken::new();
        let crash = (!cut).then(|| after / 10);
        let closing = lifecycle::close(&engine, &self.ledger, &mut flusher, &id, &stop);
        let closed = maybe_crash(crash, Box::pin(closing)).await;
        checkpoint::clear(&id);
        *self.closed_ok.lock().unwrap() = matches!(closed, Some(Ok(_)));
        self.tally(match closed {
            Some(Ok(_)) => "close ok",
            Some(Err(_)) => "close failed",
            None => "close dropped",
        });
        for b in buyers {
            b.await.expect("a release buyer panicked");
        }
    }

    /// The sweeper actor of a release with holds: its rounds, some dropped.
    async fn sweep(&self, engine: &Engine<Faulty<S>>, rounds: Vec<(Duration, Option<Duration>)>) {
        for round in rounds {
            self.tally(holds::sweep_round(engine, &self.plan.spec.id, round).await);
        }
    }

    /// The hold acts of buyer `b` due before its step `i`, each on an order
    /// told bought.
    async fn act_on_holds(&self, b: usize, i: usize, engine: &Engine<Faulty<S>>) {
        let Some(h) = &self.plan.holds else {
            return;
        };
        for &(_, pick, act, crash) in h.acts[b].iter().filter(|a| a.0 == i) {
            let bought = self.book.lock().unwrap().bought();
            let Some((u, rid, oid)) = bought.get(pick % bought.len().max(1)) else {
                continue;
            };
            let on = (oid.as_str(), format!("ru{u}"), rid.as_str());
            let what = holds::act(
                (engine, &self.plain),
                &self.plan.spec,
                &self.held,
                (on.0, &on.1, on.2),
                (act, crash),
            )
            .await;
            self.tally(what);
        }
    }

    async fn buy_all(&self, b: usize, engine: &Engine<Faulty<S>>) {
        for (i, step) in self.plan.buyers[b].iter().enumerate() {
            self.act_on_holds(b, i, engine).await;
            let (u, rid, lines, crash) = match step {
                Buy::New { user, lines, crash } => {
                    let rid = format!("r{}-b{b}-{i}", self.seed);
                    self.book
                        .lock()
                        .unwrap()
                        .sent
                        .push((*user, rid.clone(), lines.clone()));
                    (*user, rid, lines.clone(), *crash)
                }
                Buy::Replay { pick } => {
                    let sent = self.book.lock().unwrap().sent.clone();
                    if sent.is_empty() {
                        continue;
                    }
                    let (u, rid, lines) = sent[pick % sent.len()].clone();
                    (u, rid, lines, None)
                }
            };
            let req = self.plan.request(u, &rid, &lines);
            match maybe_crash(crash, Box::pin(engine.buy_lines(&req))).await {
                Some(Ok(out)) => {
                    self.tally(match &out.result {
                        Ok(_) => "bought",
                        Err(LinesRefusal::SoldOut { .. }) => "sold out",
                        Err(LinesRefusal::LimitExceeded { .. }) => "over the limit",
                        Err(LinesRefusal::GaveUp) => "gave up",
                    });
                    if let Ok(order) = &out.result {
                        self.held.lock().unwrap().told(order);
                    }
                    self.book.lock().unwrap().note(&rid, &out);
                }
                Some(Err(e)) => self.tally(format!("error: {}", kind(&e))),
                None => self.tally("dropped"),
            }
        }
    }

    /// On the healed store: finishes the reshard and the close, sweeps,
    /// asks every request again, and checks (module docs).
    pub async fn settle_and_check(
        &self,
        plain: &Arc<Engine<Faulty<S>>>,
        engines: &[Arc<Engine<Faulty<S>>>],
        v: &mut Violations,
    ) {
        let spec = &self.plan.spec;
        let stop = CancellationToken::new();
        let mut flusher = Flusher::new(
            plain.clone(),
            self.ledger.clone(),
            format!("rel-settle-{}", self.seed),
            flush_options(),
        );
        // A reshard stopped by a fault resumes: on the engine that ran it
        // (its lease, if a lost reply left it held, is that engine's own),
        // else once a call dropped while it held the pool's mover lease (a
        // line's consolidation) left it to expire, as the schedule's
        // settling waits for its event's.
        for k in 0..spec.pools.len() {
            let id = self.plan.pool(k);
            let Ok(meta) = plain.reload(&id).await else {
                continue;
            };
            let Some((_, to)) = meta
                .reshard_to
                .filter(|_| meta.status == EventStatus::Resharding)
            else {
                continue;
            };
            let ran = &engines[engines.len() - 1];
            if Box::pin(reshard::reshard(ran, &id, to)).await.is_ok() {
                continue;
            }
            eventually(
                "the mover lease of a dropped holder to expire",
                Duration::from_secs(40),
                async || matches!(plain.store().lease_holder(&id).await, Ok(None)).then_some(()),
            )
            .await;
            if let Err(e) = Box::pin(reshard::reshard(plain, &id, to)).await {
                v.push((CHECK, format!("pool p{k}: the reshard did not resume: {e}")));
            }
        }
        let closing = self.plan.pool(self.plan.close.0);
        if !*self.closed_ok.lock().unwrap()
            && let Err(e) = Box::pin(lifecycle::close(
                plain,
                &self.ledger,
                &mut flusher,
                &closing,
                &stop,
            ))
            .await
        {
            v.push((CHECK, format!("the cut-off close did not finish: {e}")));
            return;
        }
        let sweep = SagaSweepOptions {
            stale_after: Duration::ZERO,
            ..SagaSweepOptions::default()
        };
        // Every deadline passed: the sweep expires what was left held.
        if let Some(h) = &self.plan.holds {
            self.clock
                .advance(Duration::from_secs(u64::from(h.seconds) + 1));
        }
        for b in self.broken.lock().unwrap().drain(..) {
            v.push((CHECK, b));
        }
        // Every request again; one the store never saw may be reserved now
        // and, with a line in the closed pool, end only at the next sweep.
        let sent = self.book.lock().unwrap().sent.clone();
        for round in 0..3 {
            if let Err(e) = release_sweeper::sweep_release(plain, &spec.id, &sweep).await {
                v.push((CHECK, format!("the release sweep failed: {e}")));
                return;
            }
            let mut unknown = 0;
            for (u, rid, lines) in &sent {
                let req = self.plan.request(*u, rid, lines);
                match plain.buy_lines(&req).await {
                    Ok(out) => {
                        if let Ok(order) = &out.result {
                            self.held.lock().unwrap().told(order);
                        }
                        self.book.lock().unwrap().note(rid, &out)
                    }
                    Err(e) if round == 2 => {
                        v.push((CHECK, format!("request {rid}: no final answer: {e}")))
                    }
                    Err(_) => unknown += 1,
                }
            }
            if unknown == 0 {
                break;
            }
        }
        // A request the store never saw, reserved and bought just now, is
        // held until a deadline still ahead: past it, one more sweep.
        if let Some(h) = &self.plan.holds {
            self.clock
                .advance(Duration::from_secs(u64::from(h.seconds) + 1));
            if let Err(e) = release_sweeper::sweep_release(plain, &spec.id, &sweep).await {
                v.push((CHECK, format!("the release sweep failed: {e}")));
            }
        }
        let (changed, finals) = {
            let book = self.book.lock().unwrap();
            (book.changed.clone(), book.finals.clone())
        };
        for c in changed {
            v.push((CHECK, c));
        }
        // With holds, what was bought is what ended confirmed.
        let statuses = match self.plan.holds {
            Some(_) => Some(holds::final_statuses(plain, spec, &self.held, v).await),
            None => None,
        };
        let kept = |o: &shardstock::engine::ReleaseOrder| {
            statuses.as_ref().is_none_or(|s| {
                s.get(o.order_id.as_str())
                    == Some(&shardstock::engine::ReleaseOrderStatus::Confirmed)
            })
        };
        for h in 0..spec.homes {
            let home = shardstock::domain::keys::HomeRef::new(&spec.id, h);
            match plain.store().stale_orders(&home, i64::MAX, 100).await {
                Ok(left) if left.is_empty() => {}
                Ok(left) => v.push((CHECK, format!("orders not ended: {left:?}"))),
                Err(e) => v.push((CHECK, format!("home {h} unread: {e}"))),
            }
        }
        let mut sold: HashMap<EventId, u64> = HashMap::new();
        let mut held: HashMap<String, u64> = HashMap::new();
        let mut lines = Vec::new();
        let mut orders = Vec::new();
        for (u, rid, _) in &sent {
            if let Some(Ok(order)) = finals.get(rid).map(|o| &o.result) {
                orders.push(order.clone());
                if !kept(order) {
                    continue;
                }
                for line in &order.lines {
                    *sold.entry(line.pool.clone()).or_default() += u64::from(line.quantity);
                    *held.entry(format!("ru{u}")).or_default() += u64::from(line.quantity);
                    lines.push(line.order_id.to_string());
                }
            }
        }
        for u in 0..USERS {
            let name = format!("ru{u}");
            let want = held.get(&name).copied().unwrap_or(0);
            match plain.release_units(&spec.id, &user(name.as_str())).await {
                Ok(n) if n == want => {}
                Ok(n) => v.push((CHECK, format!("user {name}: count {n}, told bought {want}"))),
                Err(e) => v.push((CHECK, format!("user {name}: count unread: {e}"))),
            }
            if let Some(limit) = spec.per_user_limit
                && want > u64::from(limit)
            {
                v.push((CHECK, format!("user {name} bought {want} over {limit}")));
            }
        }
        for k in 0..spec.pools.len() {
            let id = self.plan.pool(k);
            if id == closing {
                continue;
            }
            match plain.view(&id).await {
                Ok(view) => {
                    let bought = sold.get(&id).copied().unwrap_or(0);
                    if bought + view.remaining != spec.pools[k].stock {
                        v.push((
                            CHECK,
                            format!(
                                "pool p{k}: told bought {bought}, remaining {}, stock {}",
                                view.remaining, spec.pools[k].stock
                            ),
                        ));
                    }
                }
                Err(e) => v.push((CHECK, format!("pool p{k}: no view: {e}"))),
            }
        }
        // Every pool closed and read from the database alone.
        let mut confirmed = Vec::new();
        let mut db = HashMap::new();
        for k in 0..spec.pools.len() {
            let id = self.plan.pool(k);
            if id != closing
                && let Err(e) = Box::pin(lifecycle::close(
                    plain,
                    &self.ledger,
                    &mut flusher,
                    &id,
                    &stop,
                ))
                .await
            {
                v.push((CHECK, format!("pool p{k}: the close failed: {e}")));
                continue;
            }
            let sale =
                crate::harness::oracle::closed_sale(&self.ledger, &id, spec.pools[k].stock).await;
            for b in sale.broken {
                v.push((CHECK, format!("pool p{k}: {b}")));
            }
            db.extend(sale.orders.iter().map(|(oid, o)| (oid.clone(), o.status)));
            confirmed.extend(
                sale.orders
                    .into_iter()
                    .filter(|(_, o)| o.status == OrderStatus::Confirmed)
                    .map(|(oid, _)| oid),
            );
        }
        confirmed.sort();
        lines.sort();
        if confirmed != lines {
            v.push((
                CHECK,
                format!("confirmed lines {confirmed:?}, the bought orders' lines {lines:?}"),
            ));
        }
        if let Some(statuses) = &statuses {
            holds::check_lines(&orders, statuses, &db, v);
        }
    }
}
