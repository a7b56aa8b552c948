//! Releases: creating one, and the saga of a multi-line order.
//!
//! A release's pools are ordinary events (`<release>.<pool>`); an order's
//! lines are bought all or nothing by the protocol of docs/DESIGN.md,
//! "Releases": *reserve* at the user's home (the release-wide limit, the
//! pending record), *take* each line in the release's pool order (`lines.rs`:
//! a walk of that pool's ring as the one-event saga probes, per-pool
//! sold-out and consolidation), then *commit*, or *abort*, *undo* every line
//! and *release* the reservation. Commit and abort are compare-and-sets from
//! the pending record, so the order is decided once by whoever comes first —
//! this driver, a retry with the same request id on any instance, or the
//! sweeper (`Engine::end_stale_orders`) — and everyone after follows the
//! record. The record is kept: a refused order answers its refusal again.

use std::collections::HashMap;
use std::sync::Arc;

use super::saga::Driver;
use super::{Engine, EngineError};
use crate::domain::ids::{EventId, OrderId, RequestId, UserId};
use crate::domain::keys::HomeRef;
use crate::domain::model::EventMeta;
use crate::domain::release::{
    HoldState, HomeRecord, Line, OrderHead, ReleaseSpec, Short, line_order_id,
};
use crate::domain::routing::user_hash;
use crate::store::{Decided, ReserveArgs, ReserveReply, Store, StoreError};

/// A multi-line order as the engine receives it (ids validated).
#[derive(Debug, Clone)]
pub struct LinesRequest {
    pub release: EventId,
    pub user: UserId,
    /// `(pool name, quantity)`, in any order; a pool at most once.
    pub lines: Vec<(EventId, u32)>,
    pub request_id: Option<RequestId>,
}

/// One line of a bought order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderLine {
    pub pool: EventId,
    pub quantity: u32,
    /// The line's order in its pool's event (and the ledger).
    pub order_id: OrderId,
}

/// Where a bought order stands, as its buyer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOrderStatus {
    /// Bought (a release without holds), or a hold confirmed.
    Confirmed,
    /// Held until `pay_by`: confirm or cancel it.
    Held,
    Cancelled,
    Expired,
}

impl ReleaseOrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Held => "held",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
        }
    }
}

/// A bought order: one id, every line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseOrder {
    pub order_id: OrderId,
    pub release: EventId,
    pub user: UserId,
    /// In the release's pool order.
    pub lines: Vec<OrderLine>,
    pub status: ReleaseOrderStatus,
    /// A release with holds: the order's deadline (unix ms), one for every
    /// line.
    pub pay_by: Option<i64>,
}

/// A line its pool could not serve, and what the pool had left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortLine {
    pub pool: EventId,
    pub quantity: u32,
    pub remaining: u64,
}

/// Why a multi-line order was refused (nothing of it stays taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinesRefusal {
    /// Each short line with its pool's remaining.
    SoldOut { short: Vec<ShortLine> },
    /// Over the release-wide per-user limit.
    LimitExceeded { limit: u32, held: u64 },
    /// Not decided by its driver (contention past the probe budget, or a
    /// driver gone and the sweeper ended it): nothing bought; a new request
    /// id may try again.
    GaveUp,
}

/// The answer to a multi-line order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinesOutcome {
    pub result: Result<ReleaseOrder, LinesRefusal>,
    /// The request id had been seen before: this answers the original.
    pub replayed: bool,
}

pub(super) type LinesAnswer = Result<ReleaseOrder, LinesRefusal>;

/// One order being driven: where its record lives and what it is.
#[derive(Debug, Clone)]
pub(super) struct OrderRun {
    pub(super) spec: Arc<ReleaseSpec>,
    pub(super) home: HomeRef,
    pub(super) rid: String,
    pub(super) head: OrderHead,
}

impl OrderRun {
    pub(super) fn pending(&self) -> HomeRecord {
        HomeRecord::Pending(self.head.clone())
    }

    /// The pool event of line `line`.
    pub(super) fn pool(&self, line: &Line) -> EventId {
        self.spec
            .pool_event(line.pool as usize)
            .expect("a stored release's pool ids are valid")
    }

    /// The marker id of the order's lines: the request id under the
    /// release's name, apart from the pool's own sagas.
    pub(super) fn line_rid(&self) -> String {
        format!("{}/{}", self.spec.id, self.rid)
    }

    /// A release with holds: the order's deadline, from its start (the same
    /// for every driver, since the start is in its record).
    pub(super) fn pay_by(&self) -> Option<i64> {
        self.spec.pay_by(self.head.at_ms)
    }
}

/// Home of a user's orders, and the request id it is kept under.
fn request_key(
    spec: &ReleaseSpec,
    user: &UserId,
    request_id: Option<&RequestId>,
) -> (HomeRef, String) {
    let home = HomeRef::new(&spec.id, spec.home(user_hash(user)));
    let rid = match request_id {
        Some(r) => [user.as_str(), "/", r.as_str()].concat(),
        None => {
            let mut rid = String::with_capacity(17);
            rid.push('~');
            crate::domain::ids::push_hex16(&mut rid, rand::random::<u64>());
            rid
        }
    };
    (home, rid)
}

/// After the reserve applied, a store failure leaves the outcome to the
/// record (a retry or the sweeper ends the order).
fn after_reserve(e: EngineError) -> EngineError {
    match e {
        EngineError::Store(
            StoreError::Unavailable(why)
            | StoreError::Moving(why)
            | StoreError::Protocol(why)
            | StoreError::Stale(why),
        ) => EngineError::OutcomeUnknown(why),
        EngineError::Mover(m) => EngineError::OutcomeUnknown(m.to_string()),
        other => other,
    }
}

impl<S: Store> Engine<S> {
    /// Creates a release: its spec (kept as first stored: a second creation
    /// of the same spec resumes an interrupted one), then every pool as an
    /// event of its own.
    pub async fn create_release(&self, spec: ReleaseSpec) -> Result<Arc<ReleaseSpec>, EngineError> {
        spec.validate()?;
        // A token event is not adopted as a pool: release orders take
        // without a token, so the event would sell to anyone. Checked before
        // the spec is stored: a stored release sells from its pools.
        for k in 0..spec.pools.len() {
            let pool = spec.pool_event(k)?;
            if let Some(meta) = self.store.load_meta(&pool).await?
                && meta.spec.tokens.is_some()
            {
                return Err(EngineError::EventExists(pool));
            }
        }
        if let Some(had) = self.store.create_release(&spec).await?
            && had != spec
        {
            return Err(EngineError::EventExists(spec.id));
        }
        for k in 0..spec.pools.len() {
            self.ensure_event(spec.pool_spec(k)?).await?;
        }
        let spec = Arc::new(spec);
        self.cache_release(spec.clone());
        Ok(spec)
    }

    /// The release `event` is a pool of, if it is one. An event's own
    /// purchases are refused on a pool (they would pass the release-wide
    /// limit). Only an id with a `.` can be a pool; the answer is kept for
    /// events this engine knows (a bounded set), so a plain event's
    /// purchases pay one map read after the first.
    pub async fn pool_release(&self, event: &EventId) -> Result<Option<EventId>, EngineError> {
        if !event.as_str().contains('.') {
            return Ok(None);
        }
        if let Some(known) = self.pools.read().expect("pool cache poisoned").get(event) {
            return Ok(known.clone());
        }
        // A release id has no dot (`release::release_id`): a pool names its
        // release before its first one, and the answer is one lookup.
        let (head, pool) = event.as_str().split_once('.').expect("the id has a dot");
        let mut found = None;
        if let Ok(release) = EventId::parse(head) {
            match self.release_spec(&release).await {
                Ok(spec) if spec.pool_index(pool).is_some() => found = Some(release),
                Ok(_) | Err(EngineError::UnknownRelease(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if found.is_some() || self.is_known(event) {
            self.pools
                .write()
                .expect("pool cache poisoned")
                .insert(event.clone(), found.clone());
        }
        Ok(found)
    }

    /// A release's spec (cached: a spec never changes once stored).
    pub async fn release_spec(&self, release: &EventId) -> Result<Arc<ReleaseSpec>, EngineError> {
        if let Some(spec) = self
            .releases
            .read()
            .expect("release cache poisoned")
            .get(release)
        {
            return Ok(spec.clone());
        }
        let spec = self
            .store
            .load_release(release)
            .await?
            .ok_or_else(|| EngineError::UnknownRelease(release.clone()))?;
        let spec = Arc::new(spec);
        self.cache_release(spec.clone());
        Ok(spec)
    }

    fn cache_release(&self, spec: Arc<ReleaseSpec>) {
        {
            let mut pools = self.pools.write().expect("pool cache poisoned");
            for k in 0..spec.pools.len() {
                if let Ok(pool) = spec.pool_event(k) {
                    pools.insert(pool, Some(spec.id.clone()));
                }
            }
        }
        self.releases
            .write()
            .expect("release cache poisoned")
            .insert(spec.id.clone(), spec);
    }

    /// Buys an order's lines all or nothing. Idempotent by request id: a
    /// retry answers from the order's record, or drives the order on from
    /// where the store says.
    pub async fn buy_lines(&self, req: &LinesRequest) -> Result<LinesOutcome, EngineError> {
        let spec = self.release_spec(&req.release).await?;
        let lines = order_lines(&spec, &req.lines)?;
        let units: u64 = lines.iter().map(|l| u64::from(l.qty)).sum();
        let (home, rid) = request_key(&spec, &req.user, req.request_id.as_ref());
        let now = self.clock.now_ms();
        let head = OrderHead {
            order_id: OrderId::generate(&spec.id, user_hash(&req.user)),
            user: req.user.clone(),
            at_ms: now,
            lines,
        };
        let mut run = OrderRun {
            spec: spec.clone(),
            home,
            rid,
            head,
        };
        if let Err(refused) = check_window(&spec, now) {
            // A retry after the window still learns what it did.
            return match req.request_id {
                Some(_) => match self.store.home_record(&run.home, &run.rid).await? {
                    Some(HomeRecord::Pending(_)) => {
                        // Driven on: the layouts first, then the record again
                        // (`walk_line`).
                        let metas = self.line_metas(&run).await?;
                        match self.store.home_record(&run.home, &run.rid).await? {
                            Some(record) => self.replay_order(&mut run, record, 0, &metas).await,
                            None => Err(refused),
                        }
                    }
                    Some(record) => self.replay_order(&mut run, record, 0, &[]).await,
                    None => Err(refused),
                },
                None => Err(refused),
            };
        }
        // Each pool's layout, read before the reserve reads the record
        // (`walk_line`).
        let metas = self.line_metas(&run).await?;
        let limit = spec.per_user_limit.unwrap_or(0);
        let args = ReserveArgs {
            rid: run.rid.clone(),
            user: req.user.clone(),
            units,
            limit,
            pending: run.pending(),
            limited: HomeRecord::Limit { units, limit },
        };
        let fresh = |result| LinesOutcome {
            result,
            replayed: false,
        };
        match self.store.reserve(&run.home, now, &args).await {
            Ok(ReserveReply::Reserved) => {
                #[cfg(feature = "fault-injection")]
                self.crash_at(super::CrashPoint::AfterHome)?;
                self.drive_order(&run, Driver::First, &metas)
                    .await
                    .map(fresh)
                    .map_err(after_reserve)
            }
            Ok(ReserveReply::Limit { held }) => {
                Ok(fresh(Err(LinesRefusal::LimitExceeded { limit, held })))
            }
            Ok(ReserveReply::Replay { record, held }) => {
                self.replay_order(&mut run, record, held, &metas).await
            }
            // The reserve may have applied: its record tells a retry, and
            // the sweeper ends the order if nobody comes back.
            Err(e @ (StoreError::Unavailable(_) | StoreError::Moving(_))) => {
                Err(EngineError::OutcomeUnknown(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Answers a request id that has a record, driving a pending or refused
    /// order to its end first.
    async fn replay_order(
        &self,
        run: &mut OrderRun,
        record: HomeRecord,
        held: u64,
        metas: &[Arc<EventMeta>],
    ) -> Result<LinesOutcome, EngineError> {
        match (&record, record.head()) {
            (HomeRecord::Limit { units, .. }, _) if *units != run.head.units() => {
                return Err(EngineError::IdempotencyConflict(run.rid.clone()));
            }
            (_, Some(head)) if head.lines != run.head.lines => {
                return Err(EngineError::IdempotencyConflict(run.rid.clone()));
            }
            _ => {}
        }
        let result = match record {
            HomeRecord::Pending(head) => {
                run.head = head;
                self.drive_order(run, Driver::Again, metas)
                    .await
                    .map_err(after_reserve)?
            }
            HomeRecord::Refused(head, shorts) => {
                run.head = head.clone();
                self.finish_refused(run, &head, &shorts)
                    .await
                    .map_err(after_reserve)?
            }
            HomeRecord::Limit { limit, .. } => Err(LinesRefusal::LimitExceeded { limit, held }),
            held @ HomeRecord::Held(..) => {
                self.follow_record(run, held).await.map_err(after_reserve)?
            }
            done => answer(&run.spec, &done),
        };
        Ok(LinesOutcome {
            result,
            replayed: true,
        })
    }

    /// Each line's pool meta, in line order (a reshard under way waited
    /// for): read before the order's record, so that a walk never takes in a
    /// layout switched in after the record it saw pending (`walk_line`).
    async fn line_metas(&self, run: &OrderRun) -> Result<Vec<Arc<EventMeta>>, EngineError> {
        let mut metas = Vec::with_capacity(run.head.lines.len());
        for line in &run.head.lines {
            metas.push(self.pool_meta(run, line).await?);
        }
        Ok(metas)
    }

    /// Takes every line in the release's pool order, each in the layout of
    /// its meta in `metas` (read before the record was), then commits; or
    /// aborts at the first line its pool cannot serve.
    pub(super) async fn drive_order(
        &self,
        run: &OrderRun,
        driver: Driver,
        metas: &[Arc<EventMeta>],
    ) -> Result<LinesAnswer, EngineError> {
        if metas.len() != run.head.lines.len() {
            return Err(StoreError::Protocol(format!(
                "order {}: {} layouts for {} lines",
                run.rid,
                metas.len(),
                run.head.lines.len()
            ))
            .into());
        }
        for (i, (line, meta)) in run.head.lines.iter().zip(metas).enumerate() {
            // Boxed, as the calls below: each is a deep future, and inline
            // they overflowed a 2 MiB worker stack in a debug build under a
            // faulty store (`releases::cluster::faults_in_every_step…`).
            match Box::pin(self.walk_line_across(run, line, driver, meta)).await? {
                super::lines::LineEnd::Taken => {
                    #[cfg(feature = "fault-injection")]
                    self.crash_at(super::CrashPoint::AfterTake)?;
                }
                super::lines::LineEnd::Decided => return Box::pin(self.follow(run)).await,
                super::lines::LineEnd::Short { remaining } => {
                    let mut shorts = vec![Short {
                        pool: line.pool,
                        remaining,
                    }];
                    // The 409 names every short line: the later pools are
                    // read, never walked (no markers).
                    for later in &run.head.lines[i + 1..] {
                        let left = self.pool_remaining(&run.pool(later)).await?;
                        if left < u64::from(later.qty) {
                            shorts.push(Short {
                                pool: later.pool,
                                remaining: left,
                            });
                        }
                    }
                    return Box::pin(self.abort(run, shorts)).await;
                }
                super::lines::LineEnd::GaveUp => {
                    return Box::pin(self.abort(run, Vec::new())).await;
                }
            }
        }
        // A release with holds: the order is bought as a hold, still listed
        // in `pend` until its confirm, cancel or expiry ends it.
        let (bought, decided) = match run.pay_by() {
            Some(pay_by) => {
                let held = HomeRecord::Held(run.head.clone(), pay_by, HoldState::Open);
                let decided = self
                    .store
                    .hold_order(
                        &run.home,
                        &run.rid,
                        &run.pending(),
                        &held,
                        &run.head.order_id,
                    )
                    .await?;
                (held, decided)
            }
            None => {
                let bought = HomeRecord::Bought(run.head.clone());
                let decided = self
                    .store
                    .commit_order(&run.home, &run.rid, &run.pending(), &bought)
                    .await?;
                (bought, decided)
            }
        };
        match decided {
            Decided::Done => Ok(answer(&run.spec, &bought)),
            Decided::Found(record) => self.follow_record(run, record).await,
            Decided::NoRecord => Err(no_record(run)),
        }
    }

    /// Ends the order at its abort: `P` → `R`, then every line undone and
    /// the reservation released; or follows whoever decided first.
    pub(super) async fn abort(
        &self,
        run: &OrderRun,
        shorts: Vec<Short>,
    ) -> Result<LinesAnswer, EngineError> {
        let refused = HomeRecord::Refused(run.head.clone(), shorts.clone());
        match self
            .store
            .abort_order(&run.home, &run.rid, &run.pending(), &refused)
            .await?
        {
            Decided::Done => self.finish_refused(run, &run.head, &shorts).await,
            Decided::Found(record) => self.follow_record(run, record).await,
            Decided::NoRecord => Err(no_record(run)),
        }
    }

    /// Follows the order's record as it is now.
    async fn follow(&self, run: &OrderRun) -> Result<LinesAnswer, EngineError> {
        match self.store.home_record(&run.home, &run.rid).await? {
            Some(record) => self.follow_record(run, record).await,
            None => Err(no_record(run)),
        }
    }

    async fn follow_record(
        &self,
        run: &OrderRun,
        record: HomeRecord,
    ) -> Result<LinesAnswer, EngineError> {
        match record {
            HomeRecord::Refused(head, shorts) => self.finish_refused(run, &head, &shorts).await,
            HomeRecord::Pending(_) => Err(EngineError::OutcomeUnknown(format!(
                "order {} is still pending",
                run.head.order_id
            ))),
            // A hold decided by someone who may be gone: its lines finished.
            HomeRecord::Held(head, pay_by, state) if state.finishing() => {
                let run = OrderRun {
                    head,
                    ..run.clone()
                };
                let ended = self.finish_hold(&run, pay_by, state).await?;
                Ok(answer(&run.spec, &ended))
            }
            done => Ok(answer(&run.spec, &done)),
        }
    }

    /// A refused order's end: every line undone, then the reservation
    /// released (`R` → `X`). Idempotent: each undo and the release are.
    pub(super) async fn finish_refused(
        &self,
        run: &OrderRun,
        head: &OrderHead,
        shorts: &[Short],
    ) -> Result<LinesAnswer, EngineError> {
        for line in &head.lines {
            Box::pin(self.undo_walk(run, line)).await?;
        }
        let refused = HomeRecord::Refused(head.clone(), shorts.to_vec());
        let released = HomeRecord::Released(head.clone(), shorts.to_vec());
        match self
            .store
            .release_order(
                &run.home,
                &run.rid,
                &head.user,
                head.units(),
                &refused,
                &released,
            )
            .await?
        {
            Decided::Done => Ok(answer(&run.spec, &released)),
            Decided::Found(record @ HomeRecord::Released(..)) => Ok(answer(&run.spec, &record)),
            Decided::Found(other) => Err(StoreError::Protocol(format!(
                "release of {}: record {other:?}",
                run.rid
            ))
            .into()),
            Decided::NoRecord => Err(no_record(run)),
        }
    }

    /// Ends the release's orders left pending or refused since `before_ms`
    /// or earlier, at most `per_home` a home: a pending one is aborted (its
    /// driver is gone, or past the bound), a refused one undone and
    /// released. Returns how many this call ended.
    pub async fn end_stale_orders(
        &self,
        release: &EventId,
        before_ms: i64,
        per_home: u32,
    ) -> Result<u32, EngineError> {
        let spec = self.release_spec(release).await?;
        let mut ended = 0;
        for h in 0..spec.homes {
            let home = HomeRef::new(&spec.id, h);
            for (rid, record) in self.store.stale_orders(&home, before_ms, per_home).await? {
                let Some(head) = record.head().cloned() else {
                    continue;
                };
                let run = OrderRun {
                    spec: spec.clone(),
                    home: home.clone(),
                    rid,
                    head,
                };
                // Ended either way: a refusal, or the decision someone made first.
                let _answer = match record {
                    HomeRecord::Pending(_) => self.abort(&run, Vec::new()).await?,
                    HomeRecord::Refused(head, shorts) => {
                        self.finish_refused(&run, &head, &shorts).await?
                    }
                    // Held orders end by their deadline: `sweep_release_holds`.
                    _ => continue,
                };
                ended += 1;
            }
        }
        Ok(ended)
    }

    /// Units a user holds against a release's limit.
    pub async fn release_units(
        &self,
        release: &EventId,
        user: &UserId,
    ) -> Result<u64, EngineError> {
        let spec = self.release_spec(release).await?;
        let home = HomeRef::new(&spec.id, spec.home(user_hash(user)));
        Ok(self.store.home_units(&home, user).await?)
    }
}

/// The request's lines in the release's pool order, checked.
fn order_lines(spec: &ReleaseSpec, asked: &[(EventId, u32)]) -> Result<Vec<Line>, EngineError> {
    let invalid = |reason: String| EngineError::Invalid {
        field: "lines",
        reason,
    };
    let mut seen: HashMap<usize, u32> = HashMap::new();
    for (pool, qty) in asked {
        let k = spec
            .pool_index(pool.as_str())
            .ok_or_else(|| invalid(format!("release {} has no pool {pool}", spec.id)))?;
        if *qty == 0 {
            return Err(invalid(format!("pool {pool}: quantity must be at least 1")));
        }
        if seen.insert(k, *qty).is_some() {
            return Err(invalid(format!("pool {pool} is listed twice")));
        }
    }
    let units: u64 = seen.values().map(|&q| u64::from(q)).sum();
    if seen.is_empty() || units > u64::from(spec.max_per_order) {
        return Err(invalid(format!(
            "must hold 1 to {} units in all",
            spec.max_per_order
        )));
    }
    let mut lines: Vec<Line> = seen
        .into_iter()
        .map(|(k, qty)| Line {
            pool: k as u32,
            qty,
        })
        .collect();
    lines.sort_by_key(|l| l.pool);
    Ok(lines)
}

fn check_window(spec: &ReleaseSpec, now: i64) -> Result<(), EngineError> {
    let refused = |why, starts_at| EngineError::NotOnSale {
        event: spec.id.clone(),
        why,
        starts_at,
    };
    if let Some(opens) = spec.starts_at.filter(|&s| now < s) {
        return Err(refused("not started", Some(opens)));
    }
    if spec.ends_at.is_some_and(|e| now >= e) {
        return Err(refused("ended", None));
    }
    Ok(())
}

fn no_record(run: &OrderRun) -> EngineError {
    StoreError::Protocol(format!("no record for release order {}", run.rid)).into()
}

/// A bought order as its buyer is told.
fn bought(
    spec: &ReleaseSpec,
    head: &OrderHead,
    status: ReleaseOrderStatus,
    pay_by: Option<i64>,
) -> ReleaseOrder {
    let pool = |k: u32| {
        spec.pool_event(k as usize)
            .expect("a stored release's pool ids are valid")
    };
    ReleaseOrder {
        order_id: head.order_id.clone(),
        release: spec.id.clone(),
        user: head.user.clone(),
        lines: head
            .lines
            .iter()
            .map(|l| OrderLine {
                pool: pool(l.pool),
                quantity: l.qty,
                order_id: line_order_id(&head.order_id, &spec.id, &pool(l.pool)),
            })
            .collect(),
        status,
        pay_by,
    }
}

/// The answer a decided record gives.
pub(super) fn answer(spec: &ReleaseSpec, record: &HomeRecord) -> LinesAnswer {
    let pool = |k: u32| {
        spec.pool_event(k as usize)
            .expect("a stored release's pool ids are valid")
    };
    match record {
        HomeRecord::Pending(_) => {
            debug_assert!(false, "a pending record is driven, never answered");
            Err(LinesRefusal::GaveUp)
        }
        HomeRecord::Bought(head) => Ok(bought(spec, head, ReleaseOrderStatus::Confirmed, None)),
        HomeRecord::Held(head, pay_by, state) => {
            let status = match state {
                HoldState::Open => ReleaseOrderStatus::Held,
                HoldState::Confirming | HoldState::Confirmed => ReleaseOrderStatus::Confirmed,
                HoldState::Cancelling | HoldState::Cancelled => ReleaseOrderStatus::Cancelled,
                HoldState::Expiring | HoldState::Expired => ReleaseOrderStatus::Expired,
            };
            Ok(bought(spec, head, status, Some(*pay_by)))
        }
        HomeRecord::Refused(head, shorts) | HomeRecord::Released(head, shorts) => {
            if shorts.is_empty() {
                return Err(LinesRefusal::GaveUp);
            }
            Err(LinesRefusal::SoldOut {
                short: shorts
                    .iter()
                    .map(|s| ShortLine {
                        pool: pool(s.pool),
                        quantity: head
                            .lines
                            .iter()
                            .find(|l| l.pool == s.pool)
                            .map_or(0, |l| l.qty),
                        remaining: s.remaining,
                    })
                    .collect(),
            })
        }
        HomeRecord::Limit { limit, .. } => Err(LinesRefusal::LimitExceeded {
            limit: *limit,
            held: 0,
        }),
    }
}
