//! The probe saga: what a purchase does when its home bucket is short.
//!
//! The home step reserved the user's quota and left a pending record; the saga
//! probes the ring (`take` on `home+1, …, home`). Each take is decided once per
//! (request, pass, bucket) and remembered, so a saga re-driven by a retry after
//! a crash walks to the same bucket and never takes twice; the home bucket's
//! `finish` arbitrates between concurrent drivers, and a loser gives its units
//! back (`untake`).
//!
//! "Sold out" is answered only from a consistent snapshot: every bucket short,
//! and a second collect of the buckets' addition counters unchanged (no
//! cancel, transfer or untake added units to a bucket after it was read — a
//! double collect). The snapshot comes from the probe, or, for the first
//! driver of a saga on a layout of many buckets, from reading every bucket at
//! once before probing (`short_everywhere`): the last units of a sale spread
//! over 256 buckets cost one round trip to refuse, not a walk of the ring.
//! The verdict is kept as marks — the event's and each bucket's copy — that
//! say "at most `left` units": orders of more are refused by the home step in
//! its one call until units come back (the seq and the epochs move on). Only
//! the first driver trusts them: a re-driver may find an earlier driver's
//! take on its walk, which a mark made after that take knows nothing of.
//! When the ring holds enough units in fragments (or in a transfer a mover
//! left open), the saga takes the event's mover lease, completes open
//! transfers, consolidates the units into the home bucket and probes again,
//! keeping the lease until it ends.
//! `settle.rs` ends a saga cut off mid-way from its markers alone (a close,
//! a reshard, the sweeper).
//!
//! Probe markers are keys of their own with a lifetime (`marker_ttl`). A
//! driver that ended the saga deletes the markers it wrote, but not a take
//! that stands (`clear_markers`): a request refused after probing the whole
//! ring leaves nothing behind, and a retry after an abort probes afresh. A
//! late driver of an ended saga then decides again where the markers are
//! gone; whatever it takes, `finish` tells it the saga ended and it gives the
//! units back. Every driver of a saga carries the pending record's order id,
//! so `finish` only ends that saga, and `take` only replays that saga's takes.
//! A take is identified by (bucket, probes), and probes is
//! `(pass − 1) × N + position`, so a driver knows its own take from another.

use futures::future::try_join_all;
use tracing::Instrument;

#[cfg(feature = "fault-injection")]
use super::CrashPoint;
use super::purchase::{Answer, order};
use super::{Engine, EngineError, Lease, Refusal};
use crate::domain::ids::{OrderId, UserId};
use crate::domain::model::{EventMeta, EventStatus, RequestRecord};
use crate::domain::routing::ring;
use crate::store::{Finish, FinishArgs, FinishReply, Store, StoreError, TakeArgs, TakeReply};

/// One purchase saga: everything a driver (the first, or a retry) needs.
#[derive(Debug, Clone)]
pub(super) struct Saga {
    pub(super) home: u32,
    pub(super) rid: String,
    pub(super) keep: bool,
    /// The event has a per-user limit (the quota is reserved and released).
    pub(super) limited: bool,
    pub(super) user: UserId,
    pub(super) qty: u32,
    pub(super) order_id: OrderId,
    /// When the home step left the pending record (engine clock, ms).
    pub(super) started_ms: i64,
    /// Lifetime of the probe markers (ms).
    pub(super) marker_ttl_ms: u64,
    /// Events with holds: the order's pay-by deadline (`started_ms` + the
    /// event's `hold_seconds`; set by [`Saga::held`]).
    pub(super) pay_by: Option<i64>,
    /// A `token` event: the home step reserved the token's allowance, which
    /// the finish consumes or gives back ([`FinishArgs::tokens`]).
    pub(super) tokens: bool,
}

impl Saga {
    /// The saga with its pay-by deadline, on an event with holds.
    pub(super) fn held(mut self, meta: &EventMeta) -> Self {
        self.pay_by = meta.spec.pay_by(self.started_ms);
        self
    }
}

impl Saga {
    pub(super) fn take_args(&self, pass: u32) -> TakeArgs {
        TakeArgs {
            rid: self.rid.clone(),
            pass,
            user: self.user.clone(),
            qty: self.qty,
            order_id: self.order_id.clone(),
            home: self.home,
            marker_ttl_ms: self.marker_ttl_ms,
            pay_by: None,
            keep_taken: false,
        }
    }

    fn finish_args(&self, outcome: Finish) -> FinishArgs {
        FinishArgs {
            rid: self.rid.clone(),
            order_id: self.order_id.clone(),
            user: self.user.clone(),
            qty: self.qty,
            keep: self.keep,
            limited: self.limited,
            outcome,
            pay_by: self.pay_by,
            tokens: self.tokens,
        }
    }
}

/// Who drives a saga: the call whose home step left the pending record (it
/// knows the saga has taken nothing yet), or a retry, the sweeper's peer, a
/// call that found the record after a failed home step (takes may stand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Driver {
    First,
    Again,
}

/// Where the probe passes of a saga ended.
#[derive(Debug)]
enum Step {
    Taken {
        pass: u32,
        order_id: OrderId,
        bucket: u32,
        probes: u32,
    },
    SoldOut {
        available: u64,
    },
    /// A concurrent driver ended the saga with this record.
    Ended(RequestRecord),
    GaveUp,
}

impl Step {
    /// The ring positions (1-based) in which this driver may have left a
    /// marker that is not a take: all of them, except when it took in the
    /// first pass (then only those before the take).
    fn marked(&self, buckets: u32) -> u32 {
        match self {
            Step::Taken {
                pass: 1, probes, ..
            } => probes - 1,
            _ => buckets,
        }
    }
}

impl<S: Store> Engine<S> {
    /// The probe saga, from the pending record to its end.
    pub(super) async fn drive(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        driver: Driver,
    ) -> Result<Answer, EngineError> {
        let start = self.fresh_meta(meta).await?;
        // Only the first driver knows that the saga has taken nothing yet: a
        // re-driver walks the ring, where the takes of an earlier driver are.
        if driver == Driver::First {
            let ttl = self.opts.sold_out_mark_ttl.as_millis() as i64;
            if let Some(left) = start.sold_out_for(saga.qty, self.clock.now_ms(), ttl) {
                return self.finish_sold_out(meta, saga, left).await;
            }
            if let Some(available) = self.short_everywhere(meta, saga, start.seq).await? {
                return self.finish_sold_out(meta, saga, available).await;
            }
        }
        // A saga that had to gather keeps the mover lease until it ends, so
        // another saga cannot pull the gathered units away before it takes them.
        let mut lease: Option<Lease> = None;
        let step = self.probe_passes(meta, saga, start.seq, &mut lease).await;
        if let Some(lease) = lease {
            lease.release(&self.store).await;
        }
        let step = step?;
        let marked = step.marked(meta.spec.buckets);
        let answer = self
            .end(meta, saga, step)
            .instrument(tracing::debug_span!("finish"))
            .await;
        // Only once the saga has ended (an answer, or a contention answered
        // after the abort): a pending saga's markers are what make its
        // re-driver walk to the same take.
        if matches!(answer, Ok(_) | Err(EngineError::Contention { .. })) {
            self.clear_markers(meta, saga, marked).await;
        }
        answer
    }

    /// Records a consistent snapshot's verdict: at `seq` the event held at
    /// most `left` units. The event's mark first, then every bucket's copy
    /// (at the epoch the snapshot read): from then on the home step refuses
    /// an order of more than `left` units in its one call, until units come
    /// back (the seq and the epochs move on).
    pub(super) async fn mark_short(
        &self,
        meta: &EventMeta,
        seq: u64,
        left: u64,
        epochs: &[(u32, u64)],
    ) -> Result<(), EngineError> {
        if !self
            .store
            .mark_sold_out(&meta.spec.id, seq, self.clock.now_ms(), left)
            .await?
        {
            return Ok(());
        }
        let ttl = self.opts.sold_out_mark_ttl.as_millis() as u64;
        try_join_all(epochs.iter().map(|&(j, epoch)| {
            let bucket = Self::bucket(meta, j);
            async move { self.store.set_empty(&bucket, epoch, ttl, left).await }
        }))
        .await?;
        Ok(())
    }

    /// Ends the saga where its probe passes ended.
    async fn end(&self, meta: &EventMeta, saga: &Saga, step: Step) -> Result<Answer, EngineError> {
        match step {
            Step::Taken {
                pass,
                order_id,
                bucket,
                probes,
            } => {
                self.finish_bought(meta, saga, pass, order_id, bucket, probes)
                    .await
            }
            Step::SoldOut { available } => self.finish_sold_out(meta, saga, available).await,
            Step::Ended(record) => self.answer(meta, saga, record),
            Step::GaveUp => {
                self.finish_with(meta, saga, Finish::Abort).await?;
                Err(EngineError::Contention {
                    passes: self.opts.max_passes,
                })
            }
        }
    }

    /// Probes the ring pass after pass until a take, a consistent sold-out, or
    /// the pass budget is spent.
    async fn probe_passes(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        seq: u64,
        lease: &mut Option<Lease>,
    ) -> Result<Step, EngineError> {
        let qty = u64::from(saga.qty);
        let mut probes = 0;
        for pass in 1..=self.opts.max_passes {
            // Past half the markers' lifetime a take could be missed by a
            // re-driver; the sweeper has long been due: leave it the saga.
            if self.clock.now_ms() - saga.started_ms > (saga.marker_ttl_ms / 2) as i64 {
                return Err(EngineError::OutcomeUnknown(format!(
                    "saga {} outlived half its markers' lifetime",
                    saga.rid
                )));
            }
            // One span per pass: it lasts the pass, its store steps run in it.
            let pass_span = tracing::debug_span!("probe_pass", pass);
            let args = saga.take_args(pass);
            let mut fresh_all = true;
            // What this pass saw of each bucket: (index, available, adds).
            let mut seen = Vec::with_capacity(meta.spec.buckets as usize);
            for j in ring(saga.home, meta.spec.buckets) {
                probes += 1;
                let bucket = Self::bucket(meta, j);
                let taken = self
                    .store
                    .take(&bucket, self.clock.now_ms(), &args)
                    .instrument(pass_span.clone())
                    .await;
                self.activity.wrote(&bucket);
                match taken? {
                    TakeReply::Taken { order_id } => {
                        #[cfg(feature = "fault-injection")]
                        self.crash_at(CrashPoint::AfterTake)?;
                        return Ok(Step::Taken {
                            pass,
                            order_id,
                            bucket: j,
                            probes,
                        });
                    }
                    TakeReply::Short {
                        available,
                        fresh,
                        adds,
                    } => {
                        fresh_all &= fresh;
                        seen.push((j, available, adds));
                    }
                }
            }
            let total = |seen: &[(u32, u64, u64)]| seen.iter().map(|o| o.1).sum::<u64>();
            if total(&seen) < qty
                && let Some(epochs) = self
                    .settle_short(meta, &mut seen, qty)
                    .instrument(pass_span.clone())
                    .await?
            {
                let available = total(&seen);
                self.mark_short(meta, seq, available, &epochs).await?;
                return Ok(Step::SoldOut { available });
            }
            if !fresh_all {
                // Another driver of this saga probed here first: it may have ended it.
                let home = Self::bucket(meta, saga.home);
                if let Some(record) = self.store.request_record(&home, &saga.rid).await?
                    && !matches!(record, RequestRecord::Pending { .. })
                {
                    return Ok(Step::Ended(record));
                }
            }
            // Enough units, but no bucket could give `qty` alone (in fragments,
            // or some in a transfer a mover left open): consolidate them.
            let fragmented = total(&seen) >= qty;
            if fragmented {
                self.consolidate(meta, saga.home, qty, lease, &pass_span)
                    .await?;
            }
        }
        Ok(Step::GaveUp)
    }

    /// Gathers `qty` units into bucket `home` under the event's mover lease
    /// (taken here unless `lease` holds it already, and kept there): open
    /// transfers completed first. A failed gathering is logged, not an
    /// error: the next pass probes on without it.
    pub(super) async fn consolidate(
        &self,
        meta: &EventMeta,
        home: u32,
        qty: u64,
        lease: &mut Option<Lease>,
        pass_span: &tracing::Span,
    ) -> Result<(), EngineError> {
        if lease.is_none() {
            *lease = self.mover_lease(meta).await?;
        }
        let Some(token) = lease.as_ref().map(Lease::token) else {
            return Ok(());
        };
        let gathered = async {
            crate::engine::mover::complete_open(&self.store, meta, token).await?;
            crate::engine::mover::gather(&self.store, meta, token, home, qty).await
        };
        let span = tracing::debug_span!(parent: pass_span, "consolidate", units = qty);
        match gathered.instrument(span).await {
            Ok(moved) => {
                metrics::counter!(crate::metrics::CONSOLIDATIONS, "event" => meta.spec.id.to_string()).increment(1);
                tracing::debug!(event = %meta.spec.id, units = moved.units, "consolidated fragments on demand");
            }
            // Fenced (the lease expired and a newer mover took over) or a
            // store hiccup: probe on without gathering.
            Err(e) => {
                tracing::warn!(event = %meta.spec.id, error = %e, "on-demand consolidation failed")
            }
        }
        Ok(())
    }

    /// Makes a short pass into a consistent snapshot (a double collect): collect
    /// every bucket's addition count; buckets that received units since they were
    /// seen are read again (stock and count in one atomic read) and the collect
    /// repeats. `Some(epochs)` when a collect found nothing changed and the
    /// snapshot holds fewer than `qty` units: then, at the first read of that
    /// collect, fewer than `qty` units were left in the whole event; the
    /// buckets' epochs of that collect come with it. `None` when the snapshot
    /// shows enough units (the next pass takes them) or churn outlasted the rounds.
    pub(super) async fn settle_short(
        &self,
        meta: &EventMeta,
        seen: &mut [(u32, u64, u64)],
        qty: u64,
    ) -> Result<Option<Vec<(u32, u64)>>, EngineError> {
        const ROUNDS: usize = 8;
        for _ in 0..ROUNDS {
            let now = try_join_all(seen.iter().map(|&(j, _, _)| {
                let bucket = Self::bucket(meta, j);
                async move { self.store.counters(&bucket).await }
            }))
            .await?;
            let changed: Vec<usize> = (0..seen.len()).filter(|&i| seen[i].2 != now[i].0).collect();
            if changed.is_empty() {
                return Ok(Some(
                    seen.iter().zip(&now).map(|(s, c)| (s.0, c.1)).collect(),
                ));
            }
            let fresh = try_join_all(changed.iter().map(|&i| {
                let bucket = Self::bucket(meta, seen[i].0);
                async move { self.store.bucket_state(&bucket).await }
            }))
            .await?;
            for (&i, state) in changed.iter().zip(fresh) {
                seen[i].1 = state.stock + state.in_transfer;
                seen[i].2 = state.adds;
            }
            if seen.iter().map(|o| o.1).sum::<u64>() >= qty {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// The meta as stored now; `Stale` if the layout changed under the saga.
    pub(super) async fn fresh_meta(&self, meta: &EventMeta) -> Result<EventMeta, EngineError> {
        let now = self
            .store
            .load_meta(&meta.spec.id)
            .await?
            .ok_or_else(|| EngineError::UnknownEvent(meta.spec.id.clone()))?;
        if now.generation != meta.generation || now.status == EventStatus::Resharding {
            return Err(StoreError::Stale(format!("layout of {}", meta.spec.id)).into());
        }
        Ok(now)
    }

    pub(super) async fn finish_with(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        outcome: Finish,
    ) -> Result<FinishReply, EngineError> {
        let bucket = Self::bucket(meta, saga.home);
        let reply = self
            .store
            .finish(&bucket, self.clock.now_ms(), &saga.finish_args(outcome))
            .await;
        // A hold's record goes into the home bucket's stream here: the
        // flusher must look there (else the order's take reached the ledger
        // alone, `confirmed`, until the slow scan came by).
        self.activity.wrote(&bucket);
        Ok(reply?)
    }

    async fn finish_bought(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        pass: u32,
        order_id: OrderId,
        bucket: u32,
        probes: u32,
    ) -> Result<Answer, EngineError> {
        let outcome = Finish::Bought {
            order_id: order_id.clone(),
            bucket,
            probes,
        };
        let ended = match self.finish_with(meta, saga, outcome).await? {
            FinishReply::Done => {
                return Ok(Ok(order(
                    meta, &saga.user, saga.qty, order_id, bucket, probes,
                )
                .held_until(saga.pay_by)));
            }
            FinishReply::Already(record)
                if matches!(&record, RequestRecord::Bought { order_id: o, bucket: b, probes: p, .. }
                    if *o == order_id && *b == bucket && *p == probes) =>
            {
                // A concurrent driver finished with this same take (same
                // bucket, same pass and position): answer as it did.
                return self.answer(meta, saga, record);
            }
            FinishReply::Already(record) => Some(record),
            FinishReply::NoRecord => None,
        };
        // The saga ended without this take: give the units back.
        let mut args = saga.take_args(pass);
        args.order_id = order_id;
        let source = Self::bucket(meta, bucket);
        let untaken = self.store.untake(&source, self.clock.now_ms(), &args).await;
        self.activity.wrote(&source);
        // Also when another driver undid the take first: it may have failed
        // or died before voiding the sold-out marks (an extra seq bump costs
        // one call and at most one more probe).
        untaken?;
        crate::engine::mover::units_came_back(&self.store, &meta.spec.id, meta).await?;
        match ended {
            Some(record) => self.answer(meta, saga, record),
            None => Err(EngineError::Contention { passes: pass }),
        }
    }

    pub(super) async fn finish_sold_out(
        &self,
        meta: &EventMeta,
        saga: &Saga,
        remaining: u64,
    ) -> Result<Answer, EngineError> {
        match self
            .finish_with(meta, saga, Finish::SoldOut { remaining })
            .await?
        {
            FinishReply::Done => Ok(Err(Refusal::SoldOut { remaining })),
            // A concurrent driver of this saga gave up and aborted it (or the
            // sweeper did): the request holds no answer, and a retry with its
            // id starts afresh. Answered as that driver was (try again), not
            // "sold out", which no retry would replay.
            FinishReply::NoRecord if saga.keep => Err(EngineError::Contention {
                passes: self.opts.max_passes,
            }),
            FinishReply::NoRecord => Ok(Err(Refusal::SoldOut { remaining })),
            FinishReply::Already(record) => self.answer(meta, saga, record),
        }
    }
}
