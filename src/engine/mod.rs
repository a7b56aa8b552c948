//! The engine: routing, the purchase saga, consolidation, cancels and views,
//! written once above [`Store`] and therefore the same on every backend.
//!
//! The engine keeps each event's meta in a process-local cache, so the fast path
//! is one store call: route (pure) → the home step → answer. The cache never
//! needs invalidating by other instances: a bucket that no longer exists answers
//! `Stale`, and the engine reloads the meta and routes again.
//!
//! Sub-modules: `purchase` (fast path), `saga` (the probe saga), `precheck`
//! (the event-wide check before a saga probes: the last units refused in one
//! round trip), `settle` (ending a saga from its markers: close, reshard, the
//! sweeper), `release` (a release's multi-line orders: reserve, commit or
//! abort, release), `lines` (a line's walk and undo in its pool),
//! `release_holds` (a held release order's confirm, cancel and expiry, whole),
//! `pool_cut` (a pool's reshard or close settling the release orders under
//! way), `orders` (cancel, lookup), `holds` (confirm, expiry and voiding of
//! held orders), `view` (per-bucket remaining, skew), `draw` (the `draw` access mode:
//! entries, the draw, an entrant's standing; `entry_batch` groups entries
//! per shard as `batch` groups purchases per bucket), `offers` (the draw's waiting
//! list: its sweeper round, an offer's purchase), `clock` (the time every
//! sale window and sold-out mark is judged by).

mod activity;
mod batch;
mod clock;
mod draw;
mod entry_batch;
mod handoff;
mod holds;
mod keys;
mod lease;
mod lines;
pub mod mover;
mod offers;
mod orders;
mod pool_cut;
mod precheck;
mod purchase;
mod release;
mod release_holds;
mod saga;
mod settle;
mod view;

use std::collections::HashMap;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::AtomicU8;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::try_join_all;

use crate::domain::ids::{EventId, IdError, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EventMeta, EventSpec, EventStatus, SpecError};
use crate::engine::mover::MoverError;
use crate::store::{CreateEventReply, Store, StoreError};

pub use activity::Activity;
pub use clock::{Clock, ManualClock};
pub use draw::{DrawView, EntryStatus};
pub use holds::{ConfirmOutcome, ConfirmRefusal};
pub use lease::{KeepAlive, Lease};
pub use offers::{OfferRefusal, OfferRound};
pub use orders::CancelOutcome;
pub use purchase::{PurchaseOutcome, PurchaseRequest, Refusal};
pub use release::{
    LinesOutcome, LinesRefusal, LinesRequest, OrderLine, ReleaseOrder, ReleaseOrderStatus,
    ShortLine,
};
pub use release_holds::{HoldOutcome, HoldRefusal, HoldSweep};
pub use view::{BucketView, EventView, LayoutView, skew};

/// Errors of the engine layer (refusals like sold-out are not errors: see [`Refusal`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no such event: {0}")]
    UnknownEvent(EventId),
    #[error("no such order: {0}")]
    UnknownOrder(String),
    #[error("event {0} exists")]
    EventExists(EventId),
    #[error("no such release: {0}")]
    UnknownRelease(EventId),
    #[error(transparent)]
    Release(#[from] crate::domain::release::ReleaseError),
    /// `starts_at` is the sale's opening (Unix ms) when `why` is that it has
    /// not started, so a client can be told when to come back.
    #[error("event {event} is not on sale ({why})")]
    NotOnSale {
        event: EventId,
        why: &'static str,
        starts_at: Option<i64>,
    },
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(transparent)]
    Id(#[from] IdError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("request id {0} was used before for a different quantity")]
    IdempotencyConflict(String),
    /// Stock is fragmented and contended: no decision within the probe budget;
    /// nothing was bought, the request may be retried.
    #[error("no decision after {passes} probe passes under contention; retry")]
    Contention { passes: u32 },
    /// The store failed after the purchase may have been applied (the home
    /// step reserved the quota, a take may have run): the request id's record
    /// will tell, once a retry or the sweeper has ended the saga.
    #[error("outcome unknown ({0}); retry with the same request id")]
    OutcomeUnknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Mover(#[from] MoverError),
    /// The event's access is not `draw`.
    #[error("event {0} is not a draw: its access is not \"draw\"")]
    NotADraw(EventId),
    /// The draw's entry window is over (by time, or the draw closed it).
    #[error("entries to the draw of event {0} are closed")]
    EntriesClosed(EventId),
    /// The draw is asked for before its entry window closes.
    #[error("the draw of event {event} cannot run before its entries close")]
    DrawNotDue { event: EventId, entries_until: i64 },
    /// Asked of a draw that has not run yet.
    #[error("event {0} is not drawn yet")]
    NotDrawn(EventId),
    /// The user never entered the draw.
    #[error("user {user} did not enter the draw of event {event}")]
    NotEntered { event: EventId, user: UserId },
    /// A waiting user's purchase with an offer token was refused.
    #[error("offer refused at event {event}: {}", why.as_str())]
    OfferRefused { event: EventId, why: OfferRefusal },
    /// A fault injected by a test ([`CrashPoint`], `control::checkpoint`):
    /// the engine stopped as if it crashed. Test builds only.
    #[cfg(feature = "fault-injection")]
    #[error("injected crash at {0}")]
    InjectedCrash(&'static str),
}

/// The sizes of the engine's in-process maps ([`Engine::cached_entries`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CachedEntries {
    /// Metas of events that may sell.
    pub metas: usize,
    /// Batcher lanes of buckets of their own (shared lanes are fixed), and
    /// of draw events' entry shards.
    pub lanes: usize,
    /// Events' event-wide check gates.
    pub(crate) prechecks: usize,
    /// Events' reshard waiting gates.
    pub(crate) reshard_waits: usize,
    /// Events with traffic, and buckets marked for the flusher.
    pub activity: usize,
    /// The store's caches (Redis: purchase keys a bucket).
    pub store: usize,
}

/// Tunables of the engine. Its `Default` is what the default settings map to
/// (`[engine]` and `[batching]`; the impl is in `app::options`, which knows
/// both): the defaults are written once, in `config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// How many passes over the ring (with a consolidation between them) before giving up.
    pub max_passes: u32,
    /// How long a sold-out mark is trusted without a fresh probe.
    pub sold_out_mark_ttl: Duration,
    /// How long a purchase waits for a reshard to finish.
    pub reshard_wait: Duration,
    /// Lease TTL for on-demand consolidation.
    pub gather_lease_ttl: Duration,
    /// How long a purchase waits for the mover lease held by someone else.
    pub gather_wait: Duration,
    /// Group commit of the home step: at most this many purchases per script
    /// call; `None` sends each purchase on its own.
    pub max_batch: Option<usize>,
    /// How long a partial batch may wait for more (zero: it never waits).
    pub batch_wait: Duration,
    /// On a store that serves several buckets in one call (one Redis
    /// server), how many lanes the buckets share (`engine::batch`).
    pub shared_lanes: usize,
    /// Lifetime of a saga's probe markers (PX): the saga's end deletes them
    /// sooner, except a take that stands. A driver stops probing past half of
    /// it (the sweeper ends such a saga long before).
    pub marker_ttl: Duration,
}

/// How often the purchase that waits for a reshard's end reads the meta.
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// Where a test can make the engine "crash" (return without finishing).
/// Test builds only (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CrashPoint {
    None = 0,
    /// After the home step answered (bought or pending).
    AfterHome = 1,
    /// After the first successful take of the probe saga, before finish.
    AfterTake = 2,
}

/// The engine over a store `S`.
pub struct Engine<S: Store> {
    store: S,
    opts: EngineOptions,
    /// Identifies this process as a lease owner.
    instance: String,
    /// The meta cache: each event's meta with the number of the read that
    /// brought it ([`Engine::reload`]).
    events: RwLock<HashMap<EventId, (u64, Arc<EventMeta>)>>,
    /// Numbers meta reads in the order they begin.
    meta_reads: AtomicU64,
    /// A read numbered below this may not fill an empty slot of the cache:
    /// it began before the last refresh of the keys, which could not see it
    /// (`keys::refresh_token_keys`).
    meta_floor: AtomicU64,
    batcher: Option<batch::Batcher<S>>,
    /// Draw entries, batched per entry shard when purchases are batched.
    entries: Option<entry_batch::EntryBatcher<S>>,
    /// The [`CrashPoint`] a test armed.
    #[cfg(feature = "fault-injection")]
    crash: AtomicU8,
    clock: Clock,
    /// What this process wrote: the flusher, gauges and rebalancer follow it.
    activity: Arc<Activity>,
    /// The event-wide checks of sagas, one at a time per event.
    prechecks: precheck::Prechecks,
    /// Per event, the one purchase at a time that polls a reshard's end.
    reshard_waits: Mutex<HashMap<EventId, Arc<tokio::sync::Mutex<()>>>>,
    /// Releases' specs (a spec never changes once stored).
    releases: RwLock<HashMap<EventId, Arc<crate::domain::release::ReleaseSpec>>>,
    /// Events known to be a release's pool (its release) or not (`None`):
    /// only events this engine knows, so the map is bounded by them.
    pools: RwLock<HashMap<EventId, Option<EventId>>>,
}

impl<S: Store> Engine<S> {
    pub fn new(store: S, opts: EngineOptions) -> Self {
        let activity = Arc::new(Activity::default());
        Self {
            batcher: opts.max_batch.map(|n| {
                batch::Batcher::new(
                    store.clone(),
                    n,
                    opts.batch_wait,
                    opts.shared_lanes,
                    activity.clone(),
                )
            }),
            entries: opts
                .max_batch
                .map(|n| entry_batch::EntryBatcher::new(store.clone(), n)),
            activity,
            store,
            opts,
            instance: format!("i{:016x}", rand::random::<u64>()),
            events: RwLock::new(HashMap::new()),
            meta_reads: AtomicU64::new(0),
            meta_floor: AtomicU64::new(0),
            #[cfg(feature = "fault-injection")]
            crash: AtomicU8::new(CrashPoint::None as u8),
            clock: Clock::system(),
            prechecks: precheck::Prechecks::default(),
            reshard_waits: Mutex::default(),
            releases: RwLock::default(),
            pools: RwLock::default(),
        }
    }

    /// The same engine on another clock (tests move a [`ManualClock`] to put
    /// an event past its sale window without sleeping).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        if let Some(b) = &mut self.batcher {
            b.set_clock(clock.clone());
        }
        self.clock = clock;
        self
    }

    /// How many script calls the buckets of one server share at a time: the
    /// batcher's shared lanes on a store that groups buckets (one Redis
    /// server), 0 when each bucket has a lane of its own (a Cluster, the
    /// embedded store) or purchases are not batched.
    pub fn shared_lanes(&self) -> u32 {
        self.batcher.as_ref().map_or(0, |b| b.shared_lanes())
    }

    /// The clock the engine judges sale windows and sold-out marks by; the
    /// control plane reads time from it too.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// This process's lease-owner id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn inject_crash(&self, at: CrashPoint) {
        self.crash.store(at as u8, Ordering::SeqCst);
    }

    #[cfg(feature = "fault-injection")]
    fn crash_at(&self, at: CrashPoint) -> Result<(), EngineError> {
        if self.crash.load(Ordering::SeqCst) == at as u8 {
            return Err(EngineError::InjectedCrash(match at {
                CrashPoint::AfterHome => "after home",
                CrashPoint::AfterTake => "after take",
                CrashPoint::None => "none",
            }));
        }
        Ok(())
    }

    /// Creates an event: meta first (status `creating`), then every bucket with
    /// its share of the stock, then `on_sale`. Refuses an existing event, except
    /// that an interrupted creation of the same spec is resumed.
    pub async fn create_event(&self, spec: EventSpec) -> Result<EventView, EngineError> {
        spec.validate()?;
        match self.store.create_event(&spec, self.clock.now_ms()).await? {
            CreateEventReply::Created => {}
            CreateEventReply::Exists(meta)
                if meta.status == EventStatus::Creating && meta.spec == spec =>
            {
                tracing::info!(event = %spec.id, "resuming an interrupted creation");
            }
            CreateEventReply::Exists(_) => return Err(EngineError::EventExists(spec.id)),
        }
        self.store.register_event(&spec.id).await?;
        let shares = spec.split();
        try_join_all(shares.iter().enumerate().map(|(i, &units)| {
            let bucket = BucketRef::new(&spec.id, 0, i as u32);
            async move { self.store.init_bucket(&bucket, units).await }
        }))
        .await?;
        self.store
            .set_status(&spec.id, EventStatus::Creating, EventStatus::OnSale)
            .await?;
        self.forget(&spec.id);
        self.view(&spec.id).await
    }

    /// Creates the event unless it exists; an existing event is left as it is
    /// (its stock, sales and user counts survive every restart). Returns whether
    /// it was created.
    pub async fn ensure_event(&self, spec: EventSpec) -> Result<bool, EngineError> {
        match self.create_event(spec.clone()).await {
            Ok(_) => Ok(true),
            Err(EngineError::EventExists(_)) => {
                self.store.register_event(&spec.id).await?;
                if let Some(meta) = self.store.load_meta(&spec.id).await?
                    && meta.spec != spec
                {
                    tracing::warn!(event = %spec.id, "configured spec differs from the stored event; the stored one stays");
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The cached meta of an event, loading it on first use.
    pub async fn meta(&self, event: &EventId) -> Result<Arc<EventMeta>, EngineError> {
        if let Some((_, meta)) = self.events.read().expect("meta cache poisoned").get(event) {
            return Ok(meta.clone());
        }
        // Boxed: a store read's state would otherwise be part of every
        // caller's future, the purchase's too (see `purchase_detached`).
        Box::pin(self.reload(event)).await
    }

    /// Reloads an event's meta from the store (after a `Stale` answer).
    pub async fn reload(&self, event: &EventId) -> Result<Arc<EventMeta>, EngineError> {
        // Numbered before the read: a read begun after a change in the store
        // (a key rotation, a layout switch) sees it, and a read begun before
        // that ends later must not put the older meta back in the cache (the
        // fault schedules' seed 4800001: a refresh had read a rotation, then
        // a purchase's reload from before it brought the retired key back),
        // nor fill an empty slot once a refresh of the keys began after it.
        let read = self.meta_reads.fetch_add(1, Ordering::SeqCst);
        let meta = self
            .store
            .load_meta(event)
            .await?
            .ok_or_else(|| EngineError::UnknownEvent(event.clone()))?;
        let meta = Arc::new(meta);
        // The cache holds the events that may sell: one being created is not
        // yet, and a closed one never again (a read of its meta answers it;
        // cached, every closed event anyone asked about stayed for the life of
        // the process).
        match meta.status {
            EventStatus::Creating => {}
            EventStatus::Closed => {
                self.events
                    .write()
                    .expect("meta cache poisoned")
                    .remove(event);
            }
            EventStatus::OnSale | EventStatus::Resharding => {
                let mut events = self.events.write().expect("meta cache poisoned");
                match events.get(event) {
                    Some((newer, cached)) if *newer > read => return Ok(cached.clone()),
                    None if read < self.meta_floor.load(Ordering::SeqCst) => {}
                    _ => {
                        events.insert(event.clone(), (read, meta.clone()));
                    }
                }
            }
        }
        Ok(meta)
    }

    /// Whether this engine has loaded the event and it may still sell (on
    /// sale or resharding: closed events leave the cache). Cheap: one read
    /// of the meta cache, no store call.
    pub fn is_known(&self, event: &EventId) -> bool {
        self.events
            .read()
            .expect("meta cache poisoned")
            .contains_key(event)
    }

    /// What this process wrote (buckets to flush, events with traffic).
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Drops an event from the cache.
    pub fn forget(&self, event: &EventId) {
        self.events
            .write()
            .expect("meta cache poisoned")
            .remove(event);
        if let Some(b) = &self.batcher {
            b.forget(event);
        }
        if let Some(b) = &self.entries {
            b.forget(event);
        }
        self.prechecks.forget(event);
        self.reshard_waits
            .lock()
            .expect("reshard_waits gates poisoned")
            .remove(event);
        self.store.forget_event(event);
    }

    /// How many entries the engine's per-event and per-bucket maps hold, and
    /// the store's caches: each is bounded by the open events (a closed
    /// event, and the layouts a reshard left, are forgotten).
    pub fn cached_entries(&self) -> CachedEntries {
        CachedEntries {
            metas: self.events.read().expect("meta cache poisoned").len(),
            lanes: self.batcher.as_ref().map_or(0, |b| b.lanes())
                + self.entries.as_ref().map_or(0, |b| b.lanes()),
            prechecks: self.prechecks.len(),
            reshard_waits: self
                .reshard_waits
                .lock()
                .expect("reshard_waits gates poisoned")
                .len(),
            activity: self.activity.entries(),
            store: self.store.cached_entries(),
        }
    }

    /// Reloads until the event is out of `resharding` (or the wait is over).
    ///
    /// One purchase per event and process polls the store at a time; the
    /// others wait for it and find the new layout in the cache it refreshed.
    /// (Every waiting purchase polling on its own read the meta tens of
    /// thousands of times a second in a reshard under a crowd, slowing the
    /// reshard it waited for.)
    async fn after_reshard(&self, event: &EventId) -> Result<Arc<EventMeta>, EngineError> {
        let deadline = tokio::time::Instant::now() + self.opts.reshard_wait;
        let before = self.meta(event).await?;
        let gate = self
            .reshard_waits
            .lock()
            .expect("reshard_waits gates poisoned")
            .entry(event.clone())
            .or_default()
            .clone();
        let _turn = gate.lock().await;
        // Another purchase polled while this one waited its turn: its read
        // is fresh. (The meta this one had is not: it is why it is here.)
        let cached = self.meta(event).await?;
        if !Arc::ptr_eq(&before, &cached) && cached.status != EventStatus::Resharding {
            return Ok(cached);
        }
        loop {
            let meta = self.reload(event).await?;
            if meta.status != EventStatus::Resharding || tokio::time::Instant::now() >= deadline {
                return Ok(meta);
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// The bucket `index` of the event's current layout.
    fn bucket(meta: &EventMeta, index: u32) -> BucketRef {
        BucketRef::new(&meta.spec.id, meta.generation, index)
    }
}
