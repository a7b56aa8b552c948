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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::control::checkpoint::{self, Checkpoint, Flow};
use shardstock::control::flusher::Flusher;
use shardstock::control::saga_sweeper::SagaSweepOptions;
use shardstock::control::{lifecycle, release_sweeper, reshard};
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::model::{EventStatus, OrderStatus};
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::engine::{LinesOutcome, LinesRefusal, LinesRequest};
use shardstock::ledger::Ledger;
use shardstock::store::{Leases, Releases, Store};
use shardstock::{Engine, EngineError};
use tokio_util::sync::CancellationToken;

use super::client::maybe_crash;
use super::rig::flush_options;
use super::settle::Violations;
use crate::harness::faulty::Faulty;
use crate::harness::{event_id, eventually, user};

const CHECK: &str = "release_orders";
const USERS: usize = 6;

/// One buyer's step.
#[derive(Debug, Clone)]
enum Buy {
    /// A new request of `(pool, quantity)` lines; dropped after `crash`.
    New {
        user: usize,
        lines: Vec<(usize, u32)>,
        crash: Option<Duration>,
    },
    /// An earlier request again (`pick` among them).
    Replay { pick: usize },
}

/// The release's part of a schedule.
#[derive(Debug, Clone)]
pub struct ReleasePlan {
    spec: ReleaseSpec,
    buyers: [Vec<Buy>; 2],
    /// The pool resharded, to this many buckets, after this long.
    reshard: (usize, u32, Duration),
    /// The pool closed after this long; cut right after it sealed (else
    /// dropped after the duration's tenth).
    close: (usize, Duration, bool),
}

impl ReleasePlan {
    /// Half the schedules sell a release too.
    pub fn draw(seed: u64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e1e_a5e5);
        if !rng.random_bool(0.5) {
            return None;
        }
        let pools = rng.random_range(2..=3);
        let spec = ReleaseSpec {
            id: event_id("frel"),
            pools: (0..pools)
                .map(|k| PoolSpec {
                    name: EventId::parse(format!("p{k}")).unwrap(),
                    stock: rng.random_range(6..=14),
                    buckets: rng.random_range(2..=4),
                    auto_buckets: None,
                })
                .collect(),
            per_user_limit: rng.random_bool(0.5).then(|| rng.random_range(3..=6)),
            max_per_order: 3,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            homes: 4,
        };
        let buyer = |rng: &mut StdRng| {
            (0..rng.random_range(8..=14))
                .map(|_| {
                    if rng.random_bool(0.2) {
                        return Buy::Replay {
                            pick: rng.random_range(0..1000),
                        };
                    }
                    let n = rng.random_range(1..=pools);
                    let mut lines: Vec<(usize, u32)> = Vec::new();
                    while lines.len() < n {
                        let k = rng.random_range(0..pools);
                        if lines.iter().all(|l| l.0 != k) {
                            lines.push((k, 1));
                        }
                    }
                    if n < 3 && rng.random_bool(0.4) {
                        lines[0].1 = 2;
                    }
                    Buy::New {
                        user: rng.random_range(0..USERS),
                        lines,
                        crash: rng
                            .random_bool(0.2)
                            .then(|| Duration::from_millis(rng.random_range(0..20))),
                    }
                })
                .collect::<Vec<_>>()
        };
        let buyers = [buyer(&mut rng), buyer(&mut rng)];
        let reshard = (
            rng.random_range(0..pools),
            rng.random_range(1..=5),
            Duration::from_millis(rng.random_range(0..60)),
        );
        let close = (
            rng.random_range(0..pools),
            Duration::from_millis(rng.random_range(20..120)),
            rng.random_bool(0.5),
        );
        Some(Self {
            spec,
            buyers,
            reshard,
            close,
        })
    }

    fn pool(&self, k: usize) -> EventId {
        self.spec.pool_event(k).unwrap()
    }

    fn request(&self, u: usize, rid: &str, lines: &[(usize, u32)]) -> LinesRequest {
        LinesRequest {
            release: self.spec.id.clone(),
            user: user(format!("ru{u}")),
            lines: lines
                .iter()
                .map(|&(k, q)| (self.spec.pools[k].name.clone(), q))
                .collect(),
            request_id: Some(RequestId::parse(rid).unwrap()),
        }
    }
}

/// A request sent: user, request id, `(pool, quantity)` lines.
type Sent = (usize, String, Vec<(usize, u32)>);

/// Every request sent, and the first final answer of each.
#[derive(Default)]
struct Book {
    sent: Vec<Sent>,
    finals: HashMap<String, LinesOutcome>,
    changed: Vec<String>,
    tally: HashMap<String, u32>,
}

impl Book {
    fn note(&mut self, rid: &str, out: &LinesOutcome) {
        match self.finals.get(rid) {
            Some(first) if !same(&first.result, &out.result) => self
                .changed
                .push(format!("request {rid}: first {first:?}, then {out:?}")),
            Some(_) => {}
            None => {
                self.finals.insert(rid.to_owned(), out.clone());
            }
        }
    }
}

fn same(
    a: &Result<shardstock::engine::ReleaseOrder, LinesRefusal>,
    b: &Result<shardstock::engine::ReleaseOrder, LinesRefusal>,
) -> bool {
    match (a, b) {
        // A limit refusal replays with the user's count now.
        (
            Err(LinesRefusal::LimitExceeded { limit: x, .. }),
            Err(LinesRefusal::LimitExceeded { limit: y, .. }),
        ) => x == y,
        (a, b) => a == b,
    }
}

/// A short name of an error, for the tally.
fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::OutcomeUnknown(why) if why.contains("stale") => "unknown (stale)",
        EngineError::OutcomeUnknown(why) if why.contains("injected") => "unknown (injected)",
        EngineError::OutcomeUnknown(_) => "unknown",
        EngineError::Store(_) => "store",
        EngineError::NotOnSale { .. } => "not on sale",
        EngineError::Contention { .. } => "contention",
        _ => "other",
    }
}

/// A release sold during a schedule.
pub struct ReleaseRun<S: Store> {
    plan: ReleasePlan,
    seed: u64,
    ledger: Ledger,
    book: Mutex<Book>,
    closed_ok: Mutex<bool>,
    _store: std::marker::PhantomData<S>,
}

impl<S: Store> ReleaseRun<S> {
    /// Creates the release (on the plain engine) for `plan`.
    pub async fn start(
        plan: ReleasePlan,
        seed: u64,
        plain: &Arc<Engine<Faulty<S>>>,
        ledger: &Ledger,
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
            _store: std::marker::PhantomData,
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

    pub fn summary(&self) -> String {
        let book = self.book.lock().unwrap();
        let mut tally: Vec<_> = book.tally.iter().collect();
        tally.sort();
        format!(
            "release of {} pools, {} requests, {:?}",
            self.plan.spec.pools.len(),
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
        let buyers: Vec<_> = buyers.collect();
        let engine = engines[engines.len() - 1].clone();
        let (pool, buckets, after) = self.plan.reshard;
        tokio::time::sleep(after).await;
        let resharded = Box::pin(reshard::reshard(&engine, &self.plan.pool(pool), buckets)).await;
        self.tally(match resharded {
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

    async fn buy_all(&self, b: usize, engine: &Engine<Faulty<S>>) {
        for (i, step) in self.plan.buyers[b].iter().enumerate() {
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
                    Ok(out) => self.book.lock().unwrap().note(rid, &out),
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
        let (changed, finals) = {
            let book = self.book.lock().unwrap();
            (book.changed.clone(), book.finals.clone())
        };
        for c in changed {
            v.push((CHECK, c));
        }
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
        for (u, rid, _) in &sent {
            if let Some(Ok(order)) = finals.get(rid).map(|o| &o.result) {
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
    }
}
