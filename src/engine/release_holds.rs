//! Holds on a release order: confirm, cancel and expiry of the whole order.
//!
//! On a release with `hold_seconds` an order whose lines are all taken is
//! committed as a hold (`HomeRecord::Held`, open, one `pay_by` for every
//! line, each line's take record carrying it). The home record is the one
//! decision point (docs/DESIGN.md, "Holds on a release order"): an open hold
//! becomes confirming (a confirm before `pay_by`), cancelling (a cancel) or
//! expiring (the sweeper at or after `pay_by`, a confirm or cancel that finds
//! the deadline passed, or a close of one of its pools) by one
//! compare-and-set at the home, so the order is decided once. Then each line
//! is confirmed (`confirm_line`, `T` → `K` with its confirm record) or given
//! back (`give_back_line`, `T` → `U` with the units and its cancel or expiry
//! record) in its pool, each exactly once by its marker, and the record
//! moves to its end (`move_hold`; a give-back with `release_order`, the
//! user's count down). Until then the order stays in the home's `pend`, so
//! the release sweeper finishes what a dead instance left. A line is never
//! in its pool's hold index: the pool's own expiry and close never see it.

use super::release::{OrderRun, ReleaseOrder, answer};
use super::{Engine, EngineError};
use crate::domain::ids::{EventId, OrderId};
use crate::domain::keys::HomeRef;
use crate::domain::release::{HoldState, HomeRecord};
use crate::domain::stream::RecordKind;
use crate::store::{Decided, Store, StoreError};

/// Why a confirm or cancel of a release order did not do what it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldRefusal {
    /// The deadline passed: every line's units went back on sale.
    Expired(ReleaseOrder),
    /// Cancelled before: a confirm is refused.
    Cancelled(ReleaseOrder),
    /// Confirmed (paid) before: a cancel is refused.
    Confirmed(ReleaseOrder),
}

/// The answer to a confirm or cancel of a release order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldOutcome {
    pub result: Result<ReleaseOrder, HoldRefusal>,
    /// Nothing was decided by this call (it found the order decided).
    pub already: bool,
}

/// What a round of `Engine::sweep_release_holds` did, and when the release
/// next needs one for its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSweep {
    /// Orders this round ended.
    pub ended: u32,
    /// No hold of the release falls due before this (unix ms, the engine's
    /// clock): the earliest `pay_by` of an open hold the round left, or of a
    /// pending order were it committed now, capped at the round's start plus
    /// `hold_seconds` (an order reserved after the listing is due no
    /// sooner). The round's start when a home listed `per_home` entries
    /// (more to read). `i64::MAX` on a release without holds.
    pub next_due: i64,
}

/// What a buyer asks of a held order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Confirm,
    Cancel,
}

impl<S: Store> Engine<S> {
    /// A release order by its id, with its record: `UnknownOrder` when the
    /// id is not one of the release's bought orders.
    async fn release_order_run(
        &self,
        release: &EventId,
        raw: &str,
    ) -> Result<(OrderRun, HomeRecord), EngineError> {
        let unknown = || EngineError::UnknownOrder(raw.to_owned());
        let (order_id, event, hash) = OrderId::parse(raw).map_err(|_| unknown())?;
        if &event != release {
            return Err(unknown());
        }
        let spec = self.release_spec(release).await?;
        let home = HomeRef::new(&spec.id, spec.home(hash));
        let rid = self
            .store
            .order_request(&home, &order_id)
            .await?
            .ok_or_else(unknown)?;
        let record = self
            .store
            .home_record(&home, &rid)
            .await?
            .ok_or_else(unknown)?;
        let head = record.head().cloned().ok_or_else(unknown)?;
        let run = OrderRun {
            spec,
            home,
            rid,
            head,
        };
        Ok((run, record))
    }

    /// A release order as it stands (a decided hold's lines are finished
    /// first, so what it shows is what the ledger will say).
    pub async fn release_order(
        &self,
        release: &EventId,
        order_id: &str,
    ) -> Result<ReleaseOrder, EngineError> {
        let (run, record) = self.release_order_run(release, order_id).await?;
        let record = match record {
            HomeRecord::Held(_, pay_by, state) if state.finishing() => {
                self.finish_hold(&run, pay_by, state).await?
            }
            other => other,
        };
        answer(&run.spec, &record).map_err(|_| EngineError::UnknownOrder(order_id.to_owned()))
    }

    /// Confirms a held release order, every line (idempotent). At or after
    /// its `pay_by` it is expired here instead, as `confirm.lua` does for an
    /// event's hold. A release without holds: a no-op answering the order.
    pub async fn confirm_release_order(
        &self,
        release: &EventId,
        order_id: &str,
    ) -> Result<HoldOutcome, EngineError> {
        self.ask_hold(release, order_id, Ask::Confirm).await
    }

    /// Cancels a held release order, every line given back (idempotent). A
    /// confirmed order is refused (paid orders stay paid); an expired one
    /// answers expired.
    pub async fn cancel_release_order(
        &self,
        release: &EventId,
        order_id: &str,
    ) -> Result<HoldOutcome, EngineError> {
        self.ask_hold(release, order_id, Ask::Cancel).await
    }

    async fn ask_hold(
        &self,
        release: &EventId,
        order_id: &str,
        ask: Ask,
    ) -> Result<HoldOutcome, EngineError> {
        let (run, mut record) = self.release_order_run(release, order_id).await?;
        let mut already = true;
        // Each round either decides (the compare-and-set) or finds another
        // decision, which is final: two rounds at most.
        for _ in 0..4 {
            let (pay_by, state) = match &record {
                HomeRecord::Held(_, pay_by, state) => (*pay_by, *state),
                HomeRecord::Bought(_) => {
                    let order = answer(&run.spec, &record).map_err(|_| self.no_order(order_id))?;
                    let result = match ask {
                        Ask::Confirm => Ok(order),
                        Ask::Cancel => Err(HoldRefusal::Confirmed(order)),
                    };
                    return Ok(HoldOutcome { result, already });
                }
                _ => return Err(self.no_order(order_id)),
            };
            if state != HoldState::Open {
                let ended = self.finish_hold(&run, pay_by, state).await?;
                let order = answer(&run.spec, &ended).map_err(|_| self.no_order(order_id))?;
                let result = match (ask, state.ended()) {
                    (Ask::Confirm, HoldState::Confirmed) | (Ask::Cancel, HoldState::Cancelled) => {
                        Ok(order)
                    }
                    (_, HoldState::Expired) => Err(HoldRefusal::Expired(order)),
                    (Ask::Confirm, _) => Err(HoldRefusal::Cancelled(order)),
                    (Ask::Cancel, _) => Err(HoldRefusal::Confirmed(order)),
                };
                return Ok(HoldOutcome { result, already });
            }
            let next = match ask {
                _ if self.clock.now_ms() >= pay_by => HoldState::Expiring,
                Ask::Confirm => HoldState::Confirming,
                Ask::Cancel => HoldState::Cancelling,
            };
            match self.decide_hold(&run, pay_by, next).await? {
                Decided::Done => {
                    already = false;
                    record = HomeRecord::Held(run.head.clone(), pay_by, next);
                }
                Decided::Found(found) => record = found,
                Decided::NoRecord => return Err(self.no_order(order_id)),
            }
        }
        Err(StoreError::Protocol(format!(
            "release order {order_id}: its record keeps changing"
        ))
        .into())
    }

    fn no_order(&self, order_id: &str) -> EngineError {
        EngineError::UnknownOrder(order_id.to_owned())
    }

    /// Open → `next` by compare-and-set at the home: the one decision, and
    /// the one place it is counted (`shardstock_release_holds_total`): a
    /// confirm, cancel, sweeper or close that finds the order decided, or
    /// finishes a decision another made, counts nothing.
    async fn decide_hold(
        &self,
        run: &OrderRun,
        pay_by: i64,
        next: HoldState,
    ) -> Result<Decided, EngineError> {
        let open = HomeRecord::Held(run.head.clone(), pay_by, HoldState::Open);
        let decided = HomeRecord::Held(run.head.clone(), pay_by, next);
        let result = self
            .store
            .move_hold(&run.home, &run.rid, &open, &decided, false)
            .await?;
        if result == Decided::Done {
            count_decision(&run.spec.id, next);
        }
        Ok(result)
    }

    /// A decided hold's lines, each confirmed or given back in its pool
    /// exactly once, then its record at its end (out of `pend`; a give-back
    /// with the user's count down). Idempotent: any number of drivers (the
    /// buyer's call, a retry, the sweeper, a close) may finish the same
    /// order. Returns the record as it ends.
    pub(super) async fn finish_hold(
        &self,
        run: &OrderRun,
        pay_by: i64,
        state: HoldState,
    ) -> Result<HomeRecord, EngineError> {
        let current = HomeRecord::Held(run.head.clone(), pay_by, state);
        let ended = HomeRecord::Held(run.head.clone(), pay_by, state.ended());
        let decided = match state {
            HoldState::Confirming => {
                for line in &run.head.lines {
                    self.confirm_walk(run, line).await?;
                }
                self.store
                    .move_hold(&run.home, &run.rid, &current, &ended, true)
                    .await?
            }
            HoldState::Cancelling | HoldState::Expiring => {
                let kind = if state == HoldState::Cancelling {
                    RecordKind::Cancel
                } else {
                    RecordKind::Expire
                };
                for line in &run.head.lines {
                    self.give_back_walk(run, line, kind).await?;
                }
                self.store
                    .release_order(
                        &run.home,
                        &run.rid,
                        &run.head.user,
                        run.head.units(),
                        &current,
                        &ended,
                    )
                    .await?
            }
            _ => return Ok(current),
        };
        match decided {
            Decided::Done => Ok(ended),
            Decided::Found(found) => Ok(found),
            Decided::NoRecord => {
                Err(StoreError::Protocol(format!("no record for release order {}", run.rid)).into())
            }
        }
    }

    /// The release sweeper's part for holds: every home's open holds due
    /// (`pay_by` passed) expired by compare-and-set, and every decided hold
    /// whose lines are not all finished (a driver gone) finished. With
    /// `close_pool`, a close of that pool: every open hold with a line in
    /// it is expired whatever its deadline (a paid order was confirmed
    /// first and is finished confirmed), and every pending order with a
    /// line in it aborted, so none becomes a hold after the pool's buckets
    /// were sealed. At most `per_home` entries a home a round; returns how
    /// many orders this call ended, and when the release's next hold falls
    /// due (`HoldSweep`).
    pub async fn sweep_release_holds(
        &self,
        release: &EventId,
        per_home: u32,
        close_pool: Option<u32>,
    ) -> Result<HoldSweep, EngineError> {
        let spec = self.release_spec(release).await?;
        let Some(start_due) = spec.pay_by(self.clock.now_ms()) else {
            return Ok(HoldSweep {
                ended: 0,
                next_due: i64::MAX,
            });
        };
        let mut ended = 0;
        let mut next_due = start_due;
        // One order that cannot be finished (a pool unreachable, say) must
        // not keep the others from their deadline: it is tried again next
        // round, and the first such error is returned once this one is done.
        let mut failed: Option<EngineError> = None;
        for h in 0..spec.homes {
            let home = HomeRef::new(&spec.id, h);
            let now = self.clock.now_ms();
            // A home that cannot be listed (its master down, say) must not
            // keep the later homes from their deadlines either.
            let listed = match self.store.stale_orders(&home, i64::MAX, per_home).await {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(home = h, error = %e, "a release home was not listed; next round");
                    failed.get_or_insert(e.into());
                    continue;
                }
            };
            if listed.len() as u32 >= per_home {
                // More than a round lists: `pend` is ordered by score (a
                // hold's `pay_by`, another order's start), so nothing left
                // unlisted falls due before the last one listed. (Not `now`:
                // a busy sale's full homes would be read again every tick.)
                let last = listed
                    .iter()
                    .filter_map(|(_, record)| match record {
                        HomeRecord::Held(_, pay_by, _) => Some(*pay_by),
                        other => other.head().map(|h| h.at_ms),
                    })
                    .max()
                    .unwrap_or(now);
                next_due = next_due.min(last.max(now));
            }
            for (rid, record) in listed {
                let Some(head) = record.head().cloned() else {
                    continue;
                };
                match &record {
                    // A due one is expired below; one that fails is the
                    // next round's (this one or `sweep_release`'s).
                    HomeRecord::Held(_, pay_by, HoldState::Open) if *pay_by > now => {
                        next_due = next_due.min(*pay_by);
                    }
                    HomeRecord::Pending(head) => {
                        next_due = next_due.min(spec.pay_by(head.at_ms).unwrap_or(i64::MAX));
                    }
                    _ => {}
                }
                let in_pool = close_pool.is_some_and(|k| head.lines.iter().any(|l| l.pool == k));
                let run = OrderRun {
                    spec: spec.clone(),
                    home: home.clone(),
                    rid,
                    head,
                };
                let done = match record {
                    HomeRecord::Held(_, pay_by, HoldState::Open) if now >= pay_by || in_pool => {
                        self.expire_hold(&run, pay_by).await
                    }
                    HomeRecord::Held(_, pay_by, state) if state.finishing() => {
                        self.finish_hold(&run, pay_by, state).await.map(drop)
                    }
                    HomeRecord::Pending(_) if in_pool => {
                        self.abort(&run, Vec::new()).await.map(drop)
                    }
                    HomeRecord::Refused(head, shorts) if in_pool => {
                        self.finish_refused(&run, &head, &shorts).await.map(drop)
                    }
                    _ => continue,
                };
                match done {
                    Ok(()) => ended += 1,
                    Err(e) => {
                        tracing::warn!(
                            order = %run.head.order_id, error = %e,
                            "a held release order was not finished; next round"
                        );
                        // A pool's close fails only on its own orders: one
                        // with no line in the pool (another pool down, say)
                        // is the sweeper's to finish, and must not keep this
                        // pool from closing.
                        if close_pool.is_none() || in_pool {
                            failed.get_or_insert(e);
                        }
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(HoldSweep { ended, next_due }),
        }
    }

    /// Open → expiring by compare-and-set (a confirm that came first wins:
    /// then its decision is finished instead), and the lines finished.
    async fn expire_hold(&self, run: &OrderRun, pay_by: i64) -> Result<(), EngineError> {
        let state = match self.decide_hold(run, pay_by, HoldState::Expiring).await? {
            Decided::Done => HoldState::Expiring,
            Decided::Found(HomeRecord::Held(_, _, state)) => state,
            _ => return Ok(()),
        };
        self.finish_hold(run, pay_by, state).await.map(drop)
    }

    /// Before a pool's buckets turn into leftover (its close, after they
    /// are sealed): the release's held orders with a line in it are decided
    /// at their home (expired unless confirmed first) and finished, so no
    /// line of the pool is left held in the ledger. Nothing for an event
    /// that is not a pool of a release with holds.
    pub async fn close_pool_holds(&self, pool: &EventId) -> Result<(), EngineError> {
        let Some(release) = self.pool_release(pool).await? else {
            return Ok(());
        };
        let spec = self.release_spec(&release).await?;
        let Some(k) = spec.pool_index(pool.as_str().split_once('.').map_or("", |p| p.1)) else {
            return Ok(());
        };
        // Every entry of every home in one round: a round of a bounded
        // number of entries, repeated while it ended that many, stopped
        // early when most of them were open holds of other pools, leaving
        // this pool's later ones held past its close (found in review).
        self.sweep_release_holds(&release, u32::MAX, Some(k as u32))
            .await?;
        Ok(())
    }
}

/// Counts a hold decided `next` (confirming, cancelling or expiring) by
/// the outcome it ends in.
fn count_decision(release: &EventId, next: HoldState) {
    let outcome = match next.ended() {
        HoldState::Confirmed => "confirmed",
        HoldState::Cancelled => "cancelled",
        HoldState::Expired => "expired",
        _ => return,
    };
    metrics::counter!(crate::metrics::RELEASE_HOLDS, "release" => release.to_string(), "outcome" => outcome)
        .increment(1);
}
