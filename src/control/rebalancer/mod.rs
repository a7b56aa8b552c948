//! The rebalancer: one leader per event, fenced transfers, skew control, and
//! the end of the sale.
//!
//! Every instance runs the loop; for each event, the instance holding the
//! leadership lease (`SET NX PX`, renewed every round — a heartbeat) acts. A
//! round takes the mover lease, whose fresh token is strictly higher than any
//! before, raises every bucket's fence to it (so a leader that paused past its
//! lease is refused by every bucket, not only by the ones the new leader
//! touches), completes any transfer a crashed mover left open, reads the
//! buckets, and makes the moves `policy::plan` asks for. The leader also
//! closes an event whose sale window has ended, finishes a close that was cut
//! off mid-way (status `closed`, the ledger not closed, the mover lease free
//! for [`ABANDONED_CLOSE`]), resumes a reshard that stalled, and retires the
//! keys of old layouts once their streams are flushed. An adaptive event
//! (`buckets = "auto"` or `{ min, max }`) is resharded by its leader when
//! `resize::resize` says so, after the round's plan has measured its demand.
//!
//! Which events the loop visits follows activity (`schedule`): the events this
//! process sells, every round; the others one per round, and led only when
//! they need a leader; retired ones never.
//!
//! `plan` and `execute` are separate so a test can pause a leader between them.

pub mod policy;
pub mod resize;
pub mod schedule;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::control::ControlError;
use crate::control::checkpoint::{self, Checkpoint};
use crate::control::flusher::{FlushOptions, Flusher};
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventMeta, EventStatus};
use crate::engine::mover::{self, MoverError};
use crate::engine::{Engine, EngineError, Lease};
use crate::ledger::Ledger;
use crate::metrics as m;
use crate::store::{Store, StoreError};

pub use policy::{Move, Policy};
pub use resize::Resizing;

/// Tunables (from `[rebalancer]`).
#[derive(Debug, Clone)]
pub struct RebalanceOptions {
    pub interval: Duration,
    pub lease_ttl_ms: u64,
    pub policy: Policy,
    /// When adaptive events change their bucket count.
    pub resizing: Resizing,
}

/// How long a close must look abandoned (status `closed`, the ledger not
/// closed, nobody holding the mover lease) before the leader finishes it.
pub const ABANDONED_CLOSE: Duration = Duration::from_secs(30);

/// What a leader knows about an event between rounds.
#[derive(Debug, Default)]
struct Led {
    term: u64,
    generation: u32,
    demand: Vec<u64>,
    rates: Vec<f64>,
    at: Option<Instant>,
    /// Units in the buckets at the last round's plan.
    remaining: u64,
    /// `rates` hold a measurement (not the zeros of a fresh layout).
    measured: bool,
    /// When this leader last resized the event.
    resized: Option<Instant>,
}

/// A round's moves, planned under a mover token.
#[derive(Debug, Clone)]
pub struct Planned {
    pub token: u64,
    lease: Lease,
    pub moves: Vec<Move>,
}

/// What a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub transfers: u64,
    pub units: u64,
    /// A bucket refused this mover's token: it is stale and stopped.
    pub fenced: bool,
}

pub struct Rebalancer<S: Store> {
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    flush: FlushOptions,
    opts: RebalanceOptions,
    owner: String,
    led: HashMap<EventId, Led>,
    /// Closed events whose close is known to be complete (the ledger has them
    /// closed): never looked at again.
    closed: HashSet<EventId>,
    /// Closed events whose close looked abandoned, and since when (ms on the
    /// engine's clock).
    abandoned: HashMap<EventId, i64>,
}

impl<S: Store> Rebalancer<S> {
    pub fn new(
        engine: Arc<Engine<S>>,
        ledger: Ledger,
        flush: FlushOptions,
        opts: RebalanceOptions,
    ) -> Self {
        // Unique per rebalancer: two in one process must not share a lease.
        let owner = format!("{}/leader-{:08x}", engine.instance(), rand::random::<u32>());
        Self {
            engine,
            ledger,
            flush,
            opts,
            owner,
            led: HashMap::new(),
            closed: HashSet::new(),
            abandoned: HashMap::new(),
        }
    }

    /// Entries of the leader's per-event maps (events led, closes seen done
    /// or abandoned): bounded by the open events.
    pub fn cached_entries(&self) -> usize {
        self.led.len() + self.closed.len() + self.abandoned.len()
    }

    /// Takes or keeps the leadership of `event`, and acts if it leads.
    pub async fn lead(
        &mut self,
        event: &EventId,
        stop: &CancellationToken,
    ) -> Result<Option<Round>, ControlError> {
        let store = self.engine.store();
        let Some(meta) = store.load_meta(event).await? else {
            return Ok(None);
        };
        if meta.status == EventStatus::Creating
            || (meta.status == EventStatus::Closed && self.closed.contains(event))
        {
            return Ok(None);
        }
        let ttl = self.opts.lease_ttl_ms;
        let Some(term) = store.acquire_leadership(event, &self.owner, ttl).await? else {
            if self.led.remove(event).is_some() {
                metrics::gauge!(m::LEADER, "event" => event.to_string()).set(0.0);
            }
            return Ok(None);
        };
        let led = self.led.entry(event.clone()).or_default();
        if led.term != term {
            *led = Led {
                term,
                ..Led::default()
            };
            metrics::counter!(m::LEADER_CHANGES, "event" => event.to_string()).increment(1);
            metrics::gauge!(m::LEADER, "event" => event.to_string()).set(1.0);
            tracing::info!(%event, term, "leading the event's rebalancer");
        }
        if meta.status == EventStatus::Closed {
            self.finish_close(event, stop).await?;
            return Ok(None);
        }
        if meta.status == EventStatus::Resharding {
            if let Some((_, buckets)) = meta.reshard_to
                && !Lease::is_held(store, event).await?
            {
                // Nobody holds the mover lease: the reshard stalled. Resume it.
                tracing::warn!(%event, buckets, "resuming a stalled reshard");
                crate::control::reshard::reshard_because(
                    &self.engine,
                    event,
                    buckets,
                    crate::control::reshard::Why::Resumed,
                )
                .await?;
                if let Err(e) = self.ledger.set_buckets(event, buckets).await {
                    tracing::warn!(%event, error = %e, "the database keeps the old bucket count until the next reshard");
                }
            }
            return Ok(None);
        }
        if meta
            .spec
            .ends_at
            .is_some_and(|end| self.engine.clock().now_ms() >= end)
        {
            self.close(event, stop).await?;
            tracing::info!(%event, "the sale window ended: closed");
            return Ok(None);
        }
        self.prune_retired(&meta).await?;
        let round = match self.plan(&meta).await? {
            Some(planned) => Some(self.execute(&meta, planned).await?),
            None => None,
        };
        // After the plan, which measured the demand this round.
        if meta.spec.auto_buckets.is_some() {
            self.resize(&meta).await?;
        }
        Ok(round)
    }

    /// Closes `event` (idempotent: also finishes a close cut off mid-way).
    async fn close(&self, event: &EventId, stop: &CancellationToken) -> Result<(), ControlError> {
        let consumer = format!("{}/close", self.engine.instance());
        let mut flusher = Flusher::new(
            self.engine.clone(),
            self.ledger.clone(),
            consumer,
            self.flush.clone(),
        );
        crate::control::lifecycle::close(&self.engine, &self.ledger, &mut flusher, event, stop)
            .await?;
        Ok(())
    }

    /// A closed event whose close was cut off (its closer died after writing
    /// `closed`: the ledger does not have it closed) is finished here, once
    /// it has looked abandoned — nobody holding the mover lease, which a
    /// close at work keeps renewed — for [`ABANDONED_CLOSE`].
    async fn finish_close(
        &mut self,
        event: &EventId,
        stop: &CancellationToken,
    ) -> Result<(), ControlError> {
        if self.ledger.event(event).await?.is_none_or(|db| db.closed) {
            self.closed.insert(event.clone());
            self.abandoned.remove(event);
            return Ok(());
        }
        let now = self.engine.clock().now_ms();
        if Lease::is_held(self.engine.store(), event).await? {
            self.abandoned.remove(event);
            return Ok(());
        }
        let since = *self.abandoned.entry(event.clone()).or_insert(now);
        if now - since < ABANDONED_CLOSE.as_millis() as i64 {
            return Ok(());
        }
        tracing::warn!(%event, "finishing a close that was cut off mid-way");
        self.close(event, stop).await?;
        self.abandoned.remove(event);
        self.closed.insert(event.clone());
        Ok(())
    }

    /// An adaptive event: reshards it when `resize::resize` says so, from
    /// the rates and stock this round's plan read.
    async fn resize(&mut self, meta: &EventMeta) -> Result<(), ControlError> {
        let (Some(range), EventStatus::OnSale) = (meta.spec.auto_buckets, meta.status) else {
            return Ok(());
        };
        let event = &meta.spec.id;
        let Some(led) = self.led.get(event) else {
            return Ok(());
        };
        let r = &self.opts.resizing;
        if led.generation != meta.generation
            || led.rates.len() != meta.spec.buckets as usize
            || led.resized.is_some_and(|at| at.elapsed() < r.min_interval)
        {
            return Ok(());
        }
        let store = self.engine.store();
        // The buckets of this layout it takes to reach every master (1 off a
        // Cluster, or on a Cluster of one master).
        let here = store.spread(event, meta.generation, range.max);
        let signals = resize::Signals {
            buckets: meta.spec.buckets,
            range,
            demand: led.rates.iter().sum(),
            remaining: led.remaining,
            sold: meta.spec.stock.saturating_sub(led.remaining),
            order_size: u64::from(meta.spec.max_per_order),
            spread: store.spread(event, meta.generation + 1, range.max),
            on_every_master: (2..=meta.spec.buckets).contains(&here),
            lanes: self.engine.shared_lanes(),
        };
        let Some((to, reason)) = resize::resize(&signals, r) else {
            return Ok(());
        };
        tracing::info!(
            %event,
            from = meta.spec.buckets,
            to,
            reason = reason.as_str(),
            demand = signals.demand.round(),
            remaining = signals.remaining,
            "adapting the bucket count"
        );
        if let Some(led) = self.led.get_mut(event) {
            led.resized = Some(Instant::now());
        }
        let why = crate::control::reshard::Why::Auto(reason);
        match crate::control::reshard::reshard_because(&self.engine, event, to, why).await {
            Ok(_) => {}
            // Another mover, a close, or a manual reshard came first: the
            // next round looks again.
            Err(ControlError::Busy(why)) => {
                tracing::info!(%event, to, %why, "the automatic reshard waits");
                return Ok(());
            }
            // A drawn draw event keeps its count (its waiting list's units
            // stay in their buckets): the adaptive count stops there.
            Err(ControlError::WaitingList(_)) => {
                tracing::debug!(%event, to, "a drawn draw keeps its bucket count");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if let Err(e) = self.ledger.set_buckets(event, to).await {
            tracing::warn!(%event, error = %e, "the database keeps the old bucket count until the next reshard");
        }
        Ok(())
    }

    /// Takes the mover lease, fences every bucket, completes open transfers
    /// and plans the round's moves. `None` when another mover holds the lease.
    pub async fn plan(&mut self, meta: &EventMeta) -> Result<Option<Planned>, ControlError> {
        let engine = self.engine.clone();
        let store = engine.store();
        let event = &meta.spec.id;
        let ttl = Duration::from_millis(self.opts.lease_ttl_ms);
        let Some(lease) = Lease::acquire(store, event, &self.owner, ttl).await? else {
            return Ok(None);
        };
        let token = lease.token();
        let planned = async {
            let buckets: Vec<BucketRef> = (0..meta.spec.buckets)
                .map(|b| BucketRef::new(event, meta.generation, b))
                .collect();
            mover::take_over(store, meta, &buckets, token)
                .await
                .map_err(EngineError::from)?;
            let states = engine.bucket_states(meta).await?;
            let stocks: Vec<u64> = states.iter().map(|s| s.stock).collect();
            let rates = self.rates(meta, states.iter().map(|s| s.demand).collect());
            if let Some(led) = self.led.get_mut(event) {
                led.remaining =
                    stocks.iter().sum::<u64>() + states.iter().map(|s| s.in_transfer).sum::<u64>();
            }
            let order_size = u64::from(meta.spec.max_per_order);
            let moves = policy::plan(
                &stocks,
                &rates,
                meta.spec.stock,
                order_size,
                &self.opts.policy,
            );
            Ok::<_, ControlError>(moves)
        }
        .await;
        match planned {
            Ok(moves) => Ok(Some(Planned {
                token,
                lease,
                moves,
            })),
            Err(e) => {
                lease.release(store).await;
                Err(e)
            }
        }
    }

    /// Consolidates now (the admin endpoint), leader or not: fragments are
    /// gathered, else the buckets levelled. Returns the moves made.
    pub async fn consolidate_now(
        &mut self,
        meta: &EventMeta,
    ) -> Result<(Vec<Move>, Round), ControlError> {
        // The leader's rounds hold the mover lease briefly: wait for a gap.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut planned = loop {
            match self.plan(meta).await? {
                Some(planned) => break planned,
                None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                None => {
                    let event = &meta.spec.id;
                    return Err(ControlError::Busy(format!(
                        "another mover is at work on {event}"
                    )));
                }
            }
        };
        let states = match self.engine.bucket_states(meta).await {
            Ok(states) => states,
            Err(e) => {
                planned.lease.release(self.engine.store()).await;
                return Err(e.into());
            }
        };
        let stocks: Vec<u64> = states.iter().map(|s| s.stock).collect();
        let rates = self
            .led
            .get(&meta.spec.id)
            .map(|l| l.rates.clone())
            .unwrap_or_default();
        let rates = if rates.len() == stocks.len() {
            rates
        } else {
            vec![0.0; stocks.len()]
        };
        let order_size = u64::from(meta.spec.max_per_order);
        planned.moves = policy::consolidate(&stocks, &rates, order_size, &self.opts.policy);
        let moves = planned.moves.clone();
        let round = self.execute(meta, planned).await?;
        Ok((moves, round))
    }

    /// Makes the planned moves; stops at the first fenced step (a stale mover).
    pub async fn execute(&self, meta: &EventMeta, planned: Planned) -> Result<Round, ControlError> {
        let store = self.engine.store();
        let event = meta.spec.id.to_string();
        let mut round = Round::default();
        let Planned {
            token,
            lease,
            moves,
        } = planned;
        for mv in &moves {
            match mover::transfer(store, meta, token, mv.from, mv.to, mv.units).await {
                Ok(0) => {}
                Ok(units) => {
                    round.transfers += 1;
                    round.units += units;
                }
                Err(MoverError::Fenced {
                    bucket,
                    token,
                    highest,
                }) => {
                    metrics::counter!(m::FENCING_REJECTIONS, "event" => event.clone()).increment(1);
                    tracing::warn!(%event, bucket, token, highest, "stale mover fenced off; stopping the round");
                    round.fenced = true;
                    break;
                }
                Err(MoverError::Store(StoreError::Stale(_))) => break,
                Err(e) => {
                    lease.release(store).await;
                    return Err(EngineError::from(e).into());
                }
            }
        }
        lease.release(store).await;
        metrics::counter!(m::REBALANCE_TRANSFERS, "event" => event.clone())
            .increment(round.transfers);
        metrics::counter!(m::REBALANCE_MOVED_UNITS, "event" => event).increment(round.units);
        Ok(round)
    }

    /// Forgets what the leader measured of `event`'s demand (its traffic
    /// began after a quiet spell): the next round takes a baseline, the one
    /// after measures the new traffic as it is, not averaged with the quiet.
    fn remeasure(&mut self, event: &EventId) {
        if let Some(led) = self.led.get_mut(event) {
            led.at = None;
            led.measured = false;
        }
    }

    /// Demand per bucket and second, smoothed (EWMA) across rounds; the
    /// first measurement of a layout is taken as it is (averaging it with
    /// the zeros before would halve it, and an adaptive event would grow a
    /// round later).
    fn rates(&mut self, meta: &EventMeta, demand: Vec<u64>) -> Vec<f64> {
        let led = self.led.entry(meta.spec.id.clone()).or_default();
        let now = Instant::now();
        let fresh = led.generation != meta.generation || led.demand.len() != demand.len();
        let rates = match (led.at, fresh) {
            (Some(at), false) => {
                let dt = now.duration_since(at).as_secs_f64().max(0.001);
                demand
                    .iter()
                    .zip(&led.demand)
                    .zip(led.rates.iter().chain(std::iter::repeat(&0.0)))
                    .map(|((d, before), old)| {
                        let now = d.saturating_sub(*before) as f64 / dt;
                        if led.measured {
                            0.5 * old + 0.5 * now
                        } else {
                            now
                        }
                    })
                    .collect()
            }
            _ => vec![0.0; demand.len()],
        };
        led.measured = led.at.is_some() && !fresh;
        led.generation = meta.generation;
        led.demand = demand;
        led.rates = rates.clone();
        led.at = Some(now);
        rates
    }

    /// Drops old layouts whose buckets hold nothing and whose streams are
    /// flushed; their keys expire.
    async fn prune_retired(&self, meta: &EventMeta) -> Result<(), ControlError> {
        if meta.retired.is_empty() {
            return Ok(());
        }
        let store = self.engine.store();
        let mut keep = Vec::new();
        for &(generation, n) in &meta.retired {
            // A stream not flushed yet is the common case right after a
            // reshard: one XLEN says so, where the audit's read would copy
            // every entry, every round, until the flusher is done.
            let mut flushed = true;
            for b in 0..n {
                let bucket = BucketRef::new(&meta.spec.id, generation, b);
                if stale_ok(store.stream_len(&bucket).await)? > 0 {
                    flushed = false;
                    break;
                }
            }
            if !flushed {
                keep.push((generation, n));
                continue;
            }
            let mut empty = true;
            for b in 0..n {
                let bucket = BucketRef::new(&meta.spec.id, generation, b);
                let drained = match store.audit_bucket(&bucket).await {
                    Ok(a) => a.stock == 0 && a.open.is_empty() && a.entries.is_empty(),
                    Err(StoreError::Stale(_)) => true,
                    Err(e) => return Err(e.into()),
                };
                empty &= drained;
            }
            if empty {
                for b in 0..n {
                    let bucket = BucketRef::new(&meta.spec.id, generation, b);
                    let _ = store.expire_bucket(&bucket, 3_600_000).await;
                }
                // No record comes from these streams again.
                self.ledger.forget_streams(
                    (0..n).map(|b| BucketRef::new(&meta.spec.id, generation, b).name()),
                );
            } else {
                keep.push((generation, n));
            }
        }
        if keep.len() != meta.retired.len() {
            checkpoint::reach(&meta.spec.id, Checkpoint::PruneRetired).await?;
            // Only if no reshard began or ended since `meta` was read (else
            // the next round looks again).
            store
                .set_retired(&meta.spec.id, meta.generation, &keep)
                .await?;
        }
        Ok(())
    }
}

/// A bucket of a layout already gone counts as empty.
fn stale_ok(r: Result<u64, StoreError>) -> Result<u64, StoreError> {
    match r {
        Err(StoreError::Stale(_)) => Ok(0),
        other => other,
    }
}
