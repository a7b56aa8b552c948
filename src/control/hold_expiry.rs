//! The expiry sweeper: held orders that reach their pay-by deadline
//! unconfirmed go back on sale.
//!
//! It follows only buckets with holds: the deployment-wide deadline index
//! (`Holds::due_holds`, one sorted set: bucket -> when to look next) lists
//! the buckets due now, one read per tick whatever the number of events, and
//! an idle deployment pays that one read. Each due bucket is swept with
//! `Engine::expire_due` (one atomic step per bucket: the units back, the
//! buyer's count down, the expire record, exactly once however many
//! sweepers run or die), then its index entry is moved to the bucket's next
//! deadline or dropped, with a compare-and-set (`reschedule_holds`): an entry
//! a purchase lowered meanwhile (a new first hold) stands. A sweeper that
//! dropped an entry reads the bucket once more and announces a hold it finds
//! (one bought between the sweep and the drop).
//!
//! Every instance sweeps; no lease is needed for correctness because every
//! step is decided in the bucket's own script, and two sweepers of one
//! bucket expire each hold once (the second finds nothing due). A sweeper
//! killed between its steps leaves the bucket in the index (the entry moves
//! only after the sweep), so the next tick of any instance finishes.
//! Buckets a reshard sealed or a close retired answer stale: their entry is
//! dropped (a reshard's restore announces the new layout's holds; a close
//! voids its holds itself). Only the event's current layout is swept: a
//! layout a reshard is still filling holds copies of holds that count in the
//! old one (sealed, they wait for the switch), so its entry waits
//! [`FILLING_RETRY_MS`] and is looked at again; a layout the event left is
//! dropped.
//!
//! A process killed between a purchase's step and its announcement leaves a
//! first hold unannounced: the saga sweeper's round (`saga_sweeper::sweep_event`)
//! reads the earliest deadline of each bucket of events with holds and
//! announces what it finds, so such a hold expires at most one saga-sweep
//! interval late.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::control::ControlError;
use crate::control::ticker::Ticker;
use crate::engine::{Engine, EngineError};
use crate::metrics as m;
use crate::store::{Store, StoreError};

/// The expiry sweeper's pace and bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryOptions {
    /// How often the deadline index is read (an expiry is seen at most this
    /// late, plus the sweep itself).
    pub interval: Duration,
    /// Buckets per read of the index.
    pub buckets: u32,
    /// Holds expired per bucket and step.
    pub per_bucket: u32,
}

impl Default for ExpiryOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(200),
            buckets: 64,
            per_bucket: 256,
        }
    }
}

/// How long the sweeper waits before it looks again at a bucket whose layout
/// a reshard is still filling (its holds count from the switch on).
const FILLING_RETRY_MS: i64 = 500;

/// Sweeps the buckets due now until none is left due (or `rounds` index
/// reads); returns the holds this call expired.
pub async fn sweep_due<S: Store>(
    engine: &Engine<S>,
    opts: &ExpiryOptions,
    rounds: u32,
) -> Result<u64, ControlError> {
    let store = engine.store();
    let mut expired = 0;
    for _ in 0..rounds.max(1) {
        let due = store
            .due_holds(engine.clock().now_ms(), opts.buckets)
            .await?;
        if due.is_empty() {
            break;
        }
        for (bucket, seen) in due {
            let next = match engine.expire_due(&bucket, opts.per_bucket).await {
                // A reshard fills this layout: look again after its switch.
                Ok(None) => Some(seen.max(engine.clock().now_ms()) + FILLING_RETRY_MS),
                Ok(Some(reply)) => {
                    if !reply.expired.is_empty() {
                        expired += reply.expired.len() as u64;
                        metrics::counter!(m::HOLDS_EXPIRED, "event" => bucket.event.to_string())
                            .increment(reply.expired.len() as u64);
                        tracing::debug!(bucket = %bucket.name(), n = reply.expired.len(), "expired holds");
                    }
                    // A full step may have left due holds: look again at once.
                    if reply.expired.len() as u32 >= opts.per_bucket {
                        Some(seen)
                    } else {
                        reply.next
                    }
                }
                // Sealed by a reshard (its restore announces the new layout),
                // a layout the event left, retired by a close (which voids
                // its holds), or gone.
                Err(EngineError::Store(StoreError::Stale(_)))
                | Err(EngineError::UnknownEvent(_)) => None,
                Err(e) => return Err(e.into()),
            };
            let moved = store.reschedule_holds(&bucket, seen, next).await?;
            if moved && next.is_none() {
                // A first hold announced before the drop: announce it again.
                match store.next_hold(&bucket).await {
                    Ok(Some(at)) => store.announce_holds(&bucket, at).await?,
                    Ok(None) | Err(StoreError::Stale(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(expired)
}

/// Sweeps due holds every `interval` until `stop`. Never fails: a round that
/// could not finish is logged, and the next one (of any instance) resumes.
pub async fn run<S: Store>(engine: Arc<Engine<S>>, opts: ExpiryOptions, stop: CancellationToken) {
    let mut ticker = Ticker::new(opts.interval, &stop);
    while ticker.tick().await {
        // Sweeps again at once while a call expired something: a sale whose
        // buyers do not pay makes holds due as fast as it sells, faster than
        // 16 index reads a tick would keep up with (`expiry_lag` in
        // BENCHMARKS.md); when nothing more is due, the next call is one read.
        loop {
            let swept = tokio::select! {
                _ = stop.cancelled() => return,
                swept = sweep_due(&engine, &opts, 16) => swept,
            };
            match swept {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    m::store_error("expire_holds");
                    tracing::warn!(error = %e, "expiry sweeper: round cut short");
                    break;
                }
            }
        }
    }
}
