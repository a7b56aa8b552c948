//! The draw timer: draw events whose `draw_at` came are drawn.
//!
//! Every instance runs it, as every instance sweeps expired holds: no lease
//! is needed, because a draw is a function of its seed and its (closed)
//! entries, and its record is written by compare-and-set; two instances
//! drawing at once write the same ranks and agree on the first record
//! (`engine::draw`). A round reads the event list and each event's cached
//! meta; only a draw event past its `draw_at` reads its record, and once
//! drawn it is remembered here and never read again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::engine::{Engine, EngineError};
use crate::metrics as m;
use crate::store::Store;

/// How often the timer looks: a draw runs at most this late.
pub const DRAW_TICK: Duration = Duration::from_secs(1);

/// Draws every draw event whose `draw_at` is past; those drawn now or
/// before are added to `drawn`, which later rounds skip. One event that
/// fails does not hold up the others: the round goes on and answers the
/// first failure.
pub async fn draw_due<S: Store>(
    engine: &Engine<S>,
    drawn: &mut HashSet<EventId>,
) -> Result<(), EngineError> {
    let mut first = None;
    for event in engine.store().list_events().await? {
        if drawn.contains(&event) {
            continue;
        }
        if let Err(e) = draw_if_due(engine, &event, drawn).await {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Draws one event if it is a draw event past its `draw_at`.
async fn draw_if_due<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    drawn: &mut HashSet<EventId>,
) -> Result<(), EngineError> {
    let meta = match engine.meta(event).await {
        Ok(meta) => meta,
        Err(EngineError::UnknownEvent(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let Some(at) = meta.spec.draw.as_ref().and_then(|d| d.draw_at) else {
        return Ok(());
    };
    if engine.clock().now_ms() < at {
        return Ok(());
    }
    let view = engine.draw(event).await?;
    if view.drawn_at.is_some() {
        drawn.insert(event.clone());
    }
    Ok(())
}

/// Draws due draws every [`DRAW_TICK`] until `stop`. Never fails: a round
/// cut short is logged, and the next one (of any instance) resumes it.
pub async fn run<S: Store>(engine: Arc<Engine<S>>, stop: CancellationToken) {
    let mut ticker = Ticker::new(DRAW_TICK, &stop);
    let mut drawn = HashSet::new();
    while ticker.tick().await {
        if let Err(e) = draw_due(&engine, &mut drawn).await {
            m::store_error("draw");
            tracing::warn!(error = %e, "draw timer: round cut short");
        }
    }
}
