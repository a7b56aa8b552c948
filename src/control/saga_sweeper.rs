//! The sweeper: ends the purchase sagas no driver will end.
//!
//! A saga is pending from its home step to its `finish`. Its driver is the
//! purchase's own task (which a client disconnect or the request timeout no
//! longer cancels) or a retry with the same request id; when the process dies
//! mid-saga, or the store failed under it, nobody may come back. Every
//! instance therefore sweeps, every `interval`: for each open event on sale, each
//! bucket of the current layout lists the sagas pending there since
//! `stale_after` or longer (`Buckets::stale_pending`, the bucket's `pend`
//! set, at most `per_bucket` a call), and each is ended with
//! `Engine::settle_pending` — the same deterministic code a close or a
//! reshard uses: the first take its markers show is confirmed (the order
//! indexed, cancellable), or, if it took nothing, it is aborted (the quota
//! released). Each step is idempotent and `finish` arbitrates, so two
//! sweepers, or a sweeper racing a retry or a slow driver, end a saga once; a
//! driver that loses gives back what it took.
//!
//! Events resharding or closed are left alone: those settle their own sagas.
//! On events with holds the round also announces each bucket's earliest
//! deadline to the expiry sweeper's index (`control::hold_expiry`): its backstop.

use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use tokio_util::sync::CancellationToken;

use crate::control::ControlError;
use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::model::EventStatus;
use crate::engine::Engine;
use crate::metrics as m;
use crate::store::{Store, StoreError};

/// The sweeper's pace and bounds. Its `Default` is the default settings'
/// (`[engine]`; the impl is in `app::options`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SagaSweepOptions {
    /// How often every event is swept.
    pub interval: Duration,
    /// A saga pending this long is stale.
    pub stale_after: Duration,
    /// At most this many stale sagas per bucket and round.
    pub per_bucket: u32,
}

impl SagaSweepOptions {
    /// At most this many stale sagas per bucket and round (not a setting).
    pub(crate) const PER_BUCKET: u32 = 64;
}

/// Ends the stale sagas of one event; returns how many this call ended.
pub async fn sweep_event<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    opts: &SagaSweepOptions,
) -> Result<u32, ControlError> {
    let meta = engine.reload(event).await?;
    if meta.status != EventStatus::OnSale {
        return Ok(0);
    }
    let before = engine.clock().now_ms() - opts.stale_after.as_millis() as i64;
    let store = engine.store();
    let stale = try_join_all((0..meta.spec.buckets).map(|b| {
        let bucket = BucketRef::new(event, meta.generation, b);
        async move {
            let found = store.stale_pending(&bucket, before, opts.per_bucket).await;
            found.map(|sagas| (b, sagas))
        }
    }))
    .await;
    let stale = match stale {
        Ok(stale) => stale,
        // The layout changed meanwhile (a reshard began): it settles its own.
        Err(StoreError::Stale(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    if meta.spec.hold_seconds.is_some() {
        announce_holds(engine, &meta).await?;
    }
    let mut ended = 0;
    for (b, sagas) in stale {
        for (rid, record) in sagas {
            if engine.settle_pending(&meta, b, &rid, &record).await? {
                tracing::info!(%event, bucket = b, %rid, "swept a stale saga");
                ended += 1;
            }
        }
    }
    if ended > 0 {
        metrics::counter!(m::SAGAS_SWEPT, "event" => event.to_string()).increment(u64::from(ended));
    }
    Ok(ended)
}

/// The backstop of the deadline index (`control::hold_expiry`): every bucket of
/// an event with holds announces its earliest deadline, so a hold whose
/// purchase died before announcing it is swept at most one round late.
/// Events without holds cost nothing here.
async fn announce_holds<S: Store>(
    engine: &Engine<S>,
    meta: &crate::domain::model::EventMeta,
) -> Result<(), ControlError> {
    let store = engine.store();
    for b in 0..meta.spec.buckets {
        let bucket = BucketRef::new(&meta.spec.id, meta.generation, b);
        match store.next_hold(&bucket).await {
            Ok(Some(at)) => store.announce_holds(&bucket, at).await?,
            Ok(None) | Err(StoreError::Stale(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sweeps every open event each `interval` until `stop`. Never fails: a
/// round that could not finish is logged and the next one tries again.
pub async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    opts: SagaSweepOptions,
    stop: CancellationToken,
) {
    let mut ticker = Ticker::new(opts.interval, &stop);
    while ticker.tick().await {
        // Shutdown never waits for a round: every step of it is idempotent,
        // and the next sweep (of any instance) resumes.
        tokio::select! {
            _ = stop.cancelled() => return,
            () = sweep_round(&engine, &opts) => {}
        }
    }
}

/// One round: every open event, once. Only the open ones: a closed event's
/// sagas were settled by its close, and visiting every event ever created
/// cost each instance a meta read per event every round, for ever (and put
/// each closed event back in the engine's cache).
pub async fn sweep_round<S: Store>(engine: &Engine<S>, opts: &SagaSweepOptions) {
    let events = match engine.store().list_open_events().await {
        Ok(events) => events,
        Err(e) => {
            m::store_error("list_open_events");
            tracing::warn!(error = %e, "sweeper: listing events failed");
            return;
        }
    };
    for event in events {
        if let Err(e) = sweep_event(engine, &event, opts).await {
            tracing::warn!(%event, error = %e, "sweeper: round cut short");
        }
    }
}
