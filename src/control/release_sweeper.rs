//! The release sweeper: ends the multi-line orders no driver will end.
//!
//! An order is listed in its home's `pend` set from its reserve until it is
//! bought or released. Its driver is the call that reserved it or a retry
//! with its request id; when the process dies mid-order, nobody may come
//! back, and its reservation would count against the user's limit for
//! ever. Every instance therefore sweeps, every `interval`: each release's
//! homes list the orders listed since `stale_after` or longer
//! (`Releases::stale_orders`), and `Engine::end_stale_orders` aborts a
//! pending one (a compare-and-set: a driver that comes first commits
//! instead, and the sweeper follows it), then undoes every line of a
//! refused one and releases its reservation. Each step is idempotent, so
//! two sweepers, or a sweeper racing a retry, end an order once.
//!
//! On a release with holds the same round expires the held orders whose
//! `pay_by` passed (a compare-and-set at their home: a confirm that came
//! first wins) and finishes every decided hold whose lines a dead driver
//! left (`Engine::sweep_release_holds`): a held order stays listed until
//! every line is confirmed or given back.
//!
//! Deadlines are kept at the plain expirer's pace, not the round's
//! (`run_holds`, every `ExpiryOptions::interval`, 200 ms): an unpaid
//! release order ends within about that of its `pay_by`, as an event's
//! hold does. It does not read every home each tick: each round of a
//! release says when its next hold falls due (`HoldSweep::next_due`: the
//! earliest deadline it left, of an open hold or of a pending order were it
//! committed, and no later than the round plus `hold_seconds`), and this
//! instance reads the release's homes again only then. A tick costs one
//! read (the releases' list) when nothing is due; a release without holds
//! is never read again.
//!
//! The bound is the one-event sweeper's (`SagaSweepOptions`): a driver stops
//! walking at half its markers' lifetime, and the markers outlive the
//! sweeper's bound and round several times over (the settings check it),
//! so a refused order's takes are still marked when its undo comes.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::control::ControlError;
use crate::control::hold_expiry::ExpiryOptions;
use crate::control::saga_sweeper::SagaSweepOptions;
use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::engine::Engine;
use crate::store::Store;

/// Ends the stale orders of one release; returns how many this call ended.
pub async fn sweep_release<S: Store>(
    engine: &Engine<S>,
    release: &EventId,
    opts: &SagaSweepOptions,
) -> Result<u32, ControlError> {
    let before = engine.clock().now_ms() - opts.stale_after.as_millis() as i64;
    let ended = engine
        .end_stale_orders(release, before, opts.per_bucket)
        .await?
        + engine
            .sweep_release_holds(release, opts.per_bucket, None)
            .await?
            .ended;
    if ended > 0 {
        tracing::info!(%release, ended, "swept stale release orders");
    }
    Ok(ended)
}

/// One round: every release, once. Never fails: a release whose round was
/// cut short is logged, and the next round tries again.
pub async fn sweep_round<S: Store>(engine: &Engine<S>, opts: &SagaSweepOptions) {
    let releases = match engine.store().list_releases().await {
        Ok(releases) => releases,
        Err(e) => {
            crate::metrics::store_error("list_releases");
            tracing::warn!(error = %e, "release sweeper: listing releases failed");
            return;
        }
    };
    for release in releases {
        if let Err(e) = sweep_release(engine, &release, opts).await {
            tracing::warn!(%release, error = %e, "release sweeper: round cut short");
        }
    }
}

/// Sweeps every release each `interval` until `stop`.
pub async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    opts: SagaSweepOptions,
    stop: CancellationToken,
) {
    let mut ticker = Ticker::new(opts.interval, &stop);
    while ticker.tick().await {
        tokio::select! {
            _ = stop.cancelled() => return,
            () = sweep_round(&engine, &opts) => {}
        }
    }
}

/// How long a release whose hold round failed waits before the next one
/// (an unreachable pool is not walked every tick; `run`'s round also
/// retries it).
const FAILED_RETRY_MS: i64 = 1_000;

/// When each release's holds next fall due, as this instance last read
/// them (`HoldSweep::next_due`); a release not in it is read at once.
#[derive(Debug, Default)]
pub struct DueReleases(HashMap<EventId, i64>);

impl DueReleases {
    /// When `release`'s holds next fall due, as last read.
    pub fn next(&self, release: &EventId) -> Option<i64> {
        self.0.get(release).copied()
    }
}

/// One round of deadlines: every release whose next hold is due now has
/// its homes read, its due holds expired and its decided ones finished
/// (`Engine::sweep_release_holds`, at most `opts.per_bucket` entries a
/// home). Returns how many orders it ended. Never fails: a release whose
/// round failed is logged and read again after `FAILED_RETRY_MS`.
pub async fn holds_round<S: Store>(
    engine: &Engine<S>,
    opts: &ExpiryOptions,
    due: &mut DueReleases,
) -> u32 {
    let releases = match engine.store().list_releases().await {
        Ok(releases) => releases,
        Err(e) => {
            crate::metrics::store_error("list_releases");
            tracing::warn!(error = %e, "release hold expiry: listing releases failed");
            return 0;
        }
    };
    due.0.retain(|r, _| releases.contains(r));
    let mut ended = 0;
    for release in releases {
        let now = engine.clock().now_ms();
        if due.0.get(&release).is_some_and(|&at| at > now) {
            continue;
        }
        let next = match engine
            .sweep_release_holds(&release, opts.per_bucket, None)
            .await
        {
            Ok(sweep) => {
                ended += sweep.ended;
                if sweep.ended > 0 {
                    tracing::debug!(%release, ended = sweep.ended, "expired release holds");
                }
                sweep.next_due
            }
            Err(e) => {
                tracing::warn!(%release, error = %e, "release hold expiry: round cut short");
                now + FAILED_RETRY_MS
            }
        };
        due.0.insert(release, next);
    }
    ended
}

/// Expires release holds at `opts.interval` (the plain expirer's pace)
/// until `stop`.
pub async fn run_holds<S: Store>(
    engine: Arc<Engine<S>>,
    opts: ExpiryOptions,
    stop: CancellationToken,
) {
    let mut due = DueReleases::default();
    let mut ticker = Ticker::new(opts.interval, &stop);
    while ticker.tick().await {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = holds_round(&engine, &opts, &mut due) => {}
        }
    }
}
