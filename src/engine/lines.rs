//! A release order's lines in their pools: the walk that takes a line, and
//! the undo that gives it back or closes it.
//!
//! A line's walk is the one-event saga's probe (`saga.rs`) in the line's
//! pool, with the line's own order id and the order's marker id: the ring
//! from the user's home bucket in that pool, one `take_line` a bucket,
//! passes with a consolidation between them, and "short" only from a
//! consistent snapshot of the whole pool (the first driver may refuse from
//! the pool's sold-out mark or its one-read snapshot, as a purchase does).
//! The walk stops at its own take, and at an undone marker: the order was
//! refused and its undo came first there. A walk that meets a sealed layout
//! waits for its pool's reshard to switch, reads the order's record again
//! and walks the new layout while the order is pending
//! (`walk_line_across`).
//!
//! The undo walks the same ring, pass after pass: it passes the short
//! buckets, and at the first other one gives the take back (`T` → `U`),
//! closes the bucket (nothing → `U`) or finds it undone already. A walk and
//! the undo pass only short buckets before that bucket, so no walk gets past
//! it: a late driver's walk stops there, taking nothing.

use std::sync::Arc;

use tracing::Instrument;

use super::release::OrderRun;
use super::saga::{Driver, Saga};
use super::{Engine, EngineError, Lease};
use crate::domain::model::{EventMeta, EventStatus};
use crate::domain::release::{HomeRecord, Line, line_order_id};
use crate::domain::routing::{home, ring, user_hash};
use crate::domain::stream::RecordKind;
use crate::store::{LineConfirm, LineTake, LineUndo, Store, StoreError};

/// Layouts an undo follows before it gives up (each one a reshard that
/// switched while it undid).
const UNDO_LAYOUTS: u32 = 4;

/// Layouts a line's walk follows before the order answers outcome-unknown
/// (each one a reshard that sealed the layout under the walk), as a
/// purchase routes again at most three times.
const WALK_LAYOUTS: u32 = 3;

/// Where a line's walk ended.
#[derive(Debug)]
pub(super) enum LineEnd {
    Taken,
    /// The order was decided by someone else (an undone marker, or a record
    /// no longer pending): follow its record.
    Decided,
    /// The pool as a whole cannot serve the line (at most `remaining` left).
    Short {
        remaining: u64,
    },
    /// No decision within the probe budget.
    GaveUp,
}

impl<S: Store> Engine<S> {
    /// The line as a one-event saga of its pool (markers, take records).
    /// A held order's short decisions outlive its hold (its walk's bound is
    /// half their lifetime), and its take has no lifetime until its confirm
    /// or give-back (`line_args`): those walk the ring again after the
    /// deadline, however long every sweeper was away.
    fn line_saga(&self, run: &OrderRun, line: &Line, meta: &EventMeta) -> Saga {
        let pool = run.pool(line);
        let hold_ms = run
            .pay_by()
            .map_or(0, |p| (p - run.head.at_ms).max(0) as u64);
        Saga {
            home: home(user_hash(&run.head.user), meta.spec.buckets),
            rid: run.line_rid(),
            keep: true,
            limited: false,
            user: run.head.user.clone(),
            qty: line.qty,
            order_id: line_order_id(&run.head.order_id, &run.spec.id, &pool),
            started_ms: run.head.at_ms,
            marker_ttl_ms: self.opts.marker_ttl.as_millis() as u64 + hold_ms,
            pay_by: None,
            tokens: false,
        }
    }

    /// A pass's take arguments: a held order's take records its deadline,
    /// and its take marker is kept without a lifetime until the line's
    /// confirm or give-back replaces it (`TakeArgs::keep_taken`).
    fn line_args(run: &OrderRun, saga: &Saga, pass: u32) -> crate::store::TakeArgs {
        let mut args = saga.take_args(pass);
        args.pay_by = run.pay_by();
        args.keep_taken = args.pay_by.is_some();
        args
    }

    /// The pool's meta, its layout current (a reshard under way is waited
    /// for, as a purchase waits).
    pub(super) async fn pool_meta(
        &self,
        run: &OrderRun,
        line: &Line,
    ) -> Result<std::sync::Arc<EventMeta>, EngineError> {
        let pool = run.pool(line);
        let mut meta = self.meta(&pool).await?;
        if meta.status == EventStatus::Resharding {
            meta = Box::pin(self.after_reshard(&pool)).await?;
        }
        Ok(meta)
    }

    /// Walks line `line` of the order as [`Self::walk_line`] does, and
    /// follows its pool into a new layout when the walk meets a sealed one
    /// (a reshard under way, or one this engine had not seen): it waits for
    /// the switch as a purchase does (`after_reshard`, bounded by
    /// `reshard_wait`), then reads the order's record again. Still pending,
    /// it walks the line again in the new layout, read before that record
    /// (the rule of `walk_line`); the earlier lines stay taken in their
    /// pools. Decided (the reshard's settle refused an order with a take in
    /// the sealed layout, or another driver ended it), the driver follows the
    /// record. Pending in a pool closed meanwhile, the line can never be
    /// taken: the driver gives up (aborts). Outcome-unknown only when the
    /// reshard outlasts the wait, the layout was sealed in place (nothing
    /// switched), or the pool kept switching layouts.
    pub(super) async fn walk_line_across(
        &self,
        run: &OrderRun,
        line: &Line,
        driver: Driver,
        meta: &Arc<EventMeta>,
    ) -> Result<LineEnd, EngineError> {
        let pool = run.pool(line);
        let (mut meta, mut driver) = (meta.clone(), driver);
        for _ in 0..WALK_LAYOUTS {
            let why = match Box::pin(self.walk_line(run, line, driver, &meta)).await {
                Err(EngineError::Store(StoreError::Stale(why))) => why,
                other => return other,
            };
            let mut now = Box::pin(self.after_reshard(&pool)).await?;
            if now.status == EventStatus::OnSale && now.generation <= meta.generation {
                // A meta cached before the one walked: the store's.
                now = self.reload(&pool).await?;
            }
            match now.status {
                EventStatus::Resharding => {
                    return Err(EngineError::OutcomeUnknown(format!(
                        "{why}: pool {pool} still resharding after {} ms",
                        self.opts.reshard_wait.as_millis()
                    )));
                }
                EventStatus::OnSale if now.generation <= meta.generation => {
                    return Err(EngineError::OutcomeUnknown(why));
                }
                _ => {}
            }
            // The record, read after the new layout: pending, a walk there
            // keeps the rule (no abort came before the layout was current).
            match self.store.home_record(&run.home, &run.rid).await? {
                Some(HomeRecord::Pending(_)) if now.status == EventStatus::Closed => {
                    return Ok(LineEnd::GaveUp);
                }
                Some(HomeRecord::Pending(_)) => {}
                _ => return Ok(LineEnd::Decided),
            }
            // Another driver may have taken in the new layout already: no
            // mark trusted, the walk finds its take.
            (meta, driver) = (now, Driver::Again);
        }
        Err(EngineError::OutcomeUnknown(format!(
            "pool {pool} kept switching layouts under the walk of {}",
            run.rid
        )))
    }

    /// Walks line `line` of the order in the layout of `meta` until it is
    /// taken, the pool is found short, the order is found decided, or the
    /// pass budget is spent. `meta` must have been read before the driver
    /// last read the order's record as pending (or reserved it): an undo
    /// closes a line only in the layouts that were current from the abort on
    /// (`undo_walk`), so a driver that walked a layout switched in after the
    /// abort could take there for an order already released
    /// (docs/DESIGN.md, "Releases", As built: a pool's reshard and close).
    pub(super) async fn walk_line(
        &self,
        run: &OrderRun,
        line: &Line,
        driver: Driver,
        meta: &EventMeta,
    ) -> Result<LineEnd, EngineError> {
        let saga = self.line_saga(run, line, meta);
        let start = self.fresh_meta(meta).await?;
        if driver == Driver::First {
            let ttl = self.opts.sold_out_mark_ttl.as_millis() as i64;
            if let Some(left) = start.sold_out_for(saga.qty, self.clock.now_ms(), ttl) {
                return Ok(LineEnd::Short { remaining: left });
            }
            if let Some(available) = self.short_everywhere(meta, &saga, start.seq).await? {
                // Read again after the snapshot: one that raced a reshard
                // may have read a sealed layout whose stock was moving out
                // (then stale: the walk follows the switch).
                self.fresh_meta(meta).await?;
                return Ok(LineEnd::Short {
                    remaining: available,
                });
            }
        }
        let mut lease: Option<Lease> = None;
        let end = self
            .line_passes(run, meta, &saga, start.seq, &mut lease)
            .await;
        if let Some(lease) = lease {
            lease.release(&self.store).await;
        }
        end
    }

    async fn line_passes(
        &self,
        run: &OrderRun,
        meta: &EventMeta,
        saga: &Saga,
        seq: u64,
        lease: &mut Option<Lease>,
    ) -> Result<LineEnd, EngineError> {
        let qty = u64::from(saga.qty);
        for pass in 1..=self.opts.max_passes {
            if self.clock.now_ms() - saga.started_ms > (saga.marker_ttl_ms / 2) as i64 {
                return Err(EngineError::OutcomeUnknown(format!(
                    "release order {} outlived half its markers' lifetime",
                    run.rid
                )));
            }
            let pass_span = tracing::debug_span!("line_pass", pass);
            let args = Self::line_args(run, saga, pass);
            let mut fresh_all = true;
            let mut seen = Vec::with_capacity(meta.spec.buckets as usize);
            for j in ring(saga.home, meta.spec.buckets) {
                let bucket = Self::bucket(meta, j);
                let taken = self
                    .store
                    .take_line(&bucket, self.clock.now_ms(), &args)
                    .instrument(pass_span.clone())
                    .await;
                self.activity.wrote(&bucket);
                match taken? {
                    LineTake::Taken { .. } => return Ok(LineEnd::Taken),
                    // Given back, or confirmed: the order was decided
                    // while this driver walked; it follows the record.
                    LineTake::Undone | LineTake::Confirmed => return Ok(LineEnd::Decided),
                    LineTake::Short {
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
                return Ok(LineEnd::Short {
                    remaining: available,
                });
            }
            if !fresh_all {
                // Another driver walked here first: it may have decided.
                let record = self.store.home_record(&run.home, &run.rid).await?;
                if !matches!(record, Some(crate::domain::release::HomeRecord::Pending(_))) {
                    return Ok(LineEnd::Decided);
                }
            }
            if total(&seen) >= qty {
                self.consolidate(meta, saga.home, qty, lease, &pass_span)
                    .await?;
            }
        }
        Ok(LineEnd::GaveUp)
    }

    /// Undoes line `line` of a refused order in its pool's current layout,
    /// and again in the next one if the pool switched layouts meanwhile: the
    /// undo counts only in a layout found current after it (a stale meta
    /// would close a sealed layout, and a late walk of the new one would
    /// take for a released order). A layout a reshard or close sealed with
    /// the order's take in it had the take given back by that reshard or
    /// close (`settle_pool_orders`), so only the current one needs closing.
    pub(super) async fn undo_walk(&self, run: &OrderRun, line: &Line) -> Result<(), EngineError> {
        self.give_back_walk(run, line, RecordKind::Void).await
    }

    /// Gives line `line` back with a record of `kind`: a refused order's
    /// undo (`Void`), a held order's cancel or expiry (`Cancel`, `Expire`).
    /// The same walk and the same step (`undo_line.lua`): the line's take
    /// goes `T` → `U` once, whoever walks. In the pool's current layout, and
    /// again in the next one if the pool switched layouts meanwhile (see
    /// [`Self::undo_walk`]).
    pub(super) async fn give_back_walk(
        &self,
        run: &OrderRun,
        line: &Line,
        kind: RecordKind,
    ) -> Result<(), EngineError> {
        let pool = run.pool(line);
        let mut meta = match self.pool_meta(run, line).await {
            Ok(meta) => meta,
            // A closed pool's meta is gone an hour after its close, which
            // gave back every take of an order not bought.
            Err(EngineError::UnknownEvent(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        for _ in 0..UNDO_LAYOUTS {
            self.undo_in(run, line, &meta, kind).await?;
            if meta.status == EventStatus::Closed {
                // No layout follows a closed one.
                return Ok(());
            }
            let now = self.reload(&pool).await?;
            if now.generation == meta.generation {
                return Ok(());
            }
            meta = now;
        }
        Err(EngineError::Store(StoreError::Unavailable(format!(
            "pool {pool} kept switching layouts under the give-back of {}",
            run.rid
        ))))
    }

    /// Gives line `line` back in the layout of `meta` (sealed or not), with
    /// a record of `kind`: the walk's ring, pass after pass, to the first
    /// bucket that is not short. A held order's give-back (`Cancel`,
    /// `Expire`) passes a bucket without a marker (`undo_line.lua` answers
    /// short: its take, kept without a lifetime, is further on), and one
    /// that finds no marker at all has finished: the line was given back
    /// before and its `U` has expired.
    pub(super) async fn undo_in(
        &self,
        run: &OrderRun,
        line: &Line,
        meta: &EventMeta,
        kind: RecordKind,
    ) -> Result<(), EngineError> {
        let saga = self.line_saga(run, line, meta);
        let closed = meta.status == EventStatus::Closed;
        for pass in 1..=self.opts.max_passes {
            let args = Self::line_args(run, &saga, pass);
            for j in ring(saga.home, meta.spec.buckets) {
                let bucket = Self::bucket(meta, j);
                let undone = match kind {
                    RecordKind::Void => {
                        self.store
                            .undo_line(&bucket, self.clock.now_ms(), &args)
                            .await
                    }
                    _ => {
                        self.store
                            .give_back_line(&bucket, self.clock.now_ms(), &args, kind)
                            .await
                    }
                };
                self.activity.wrote(&bucket);
                match undone {
                    Ok(LineUndo::Short) => {}
                    Ok(LineUndo::Closed) => return Ok(()),
                    // A closed pool sells no more: no sold-out mark to void.
                    Ok(LineUndo::GaveBack | LineUndo::Already) if closed => return Ok(()),
                    // Also when undone before: that undo may have stopped
                    // before voiding the sold-out marks its units made wrong.
                    Ok(LineUndo::GaveBack | LineUndo::Already) => {
                        crate::engine::mover::units_came_back(&self.store, &meta.spec.id, meta)
                            .await?;
                        return Ok(());
                    }
                    // A closed pool's bucket expired: its close gave back
                    // every take of an order not bought.
                    Err(crate::store::StoreError::Stale(_)) if closed => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Confirms line `line` of a held order decided confirmed: the walk's
    /// ring, pass after pass, to the bucket of its take, whose marker goes
    /// `T` → `K` with the confirm record once. Done when no bucket holds a
    /// marker of the line's (confirmed before, its `K` expired since).
    pub(super) async fn confirm_walk(
        &self,
        run: &OrderRun,
        line: &Line,
    ) -> Result<(), EngineError> {
        let meta = self.pool_meta(run, line).await?;
        let saga = self.line_saga(run, line, &meta);
        for pass in 1..=self.opts.max_passes {
            let args = Self::line_args(run, &saga, pass);
            for j in ring(saga.home, meta.spec.buckets) {
                let bucket = Self::bucket(&meta, j);
                let confirmed = self
                    .store
                    .confirm_line(&bucket, self.clock.now_ms(), &args)
                    .await;
                self.activity.wrote(&bucket);
                match confirmed? {
                    // No marker: a bucket the walk passed, its short
                    // decision since expired; the take is further on.
                    LineConfirm::Short | LineConfirm::Missing => {}
                    LineConfirm::Confirmed | LineConfirm::Already => return Ok(()),
                }
            }
        }
        // Every line of a held order was taken before its commit, and the
        // take marker stands until its confirm replaces it (a confirming
        // order is never given back): no marker anywhere is a confirm done
        // before whose `K` has expired.
        Ok(())
    }

    /// A pool's remaining units, read (no markers): stock and units in
    /// transfer of every bucket, in the layout as stored (a reshard under
    /// way is waited for, as a walk waits). Not the cached layout: one a
    /// reshard switched away from since is sealed and emptied, and a
    /// refusal would name the pool short with nothing left while it sells
    /// (found in review; `release_reshards::*::a_refusal_names_a_resharded_pool_by_its_new_layout`).
    /// One meta read more on a refusal's path, for each later line.
    pub(super) async fn pool_remaining(
        &self,
        pool: &crate::domain::ids::EventId,
    ) -> Result<u64, EngineError> {
        let mut meta = self.reload(pool).await?;
        if meta.status == EventStatus::Resharding {
            meta = Box::pin(self.after_reshard(pool)).await?;
        }
        let states = self.bucket_states(&meta).await?;
        Ok(states.iter().map(|s| s.stock + s.in_transfer).sum())
    }
}
