//! The draw timer: draw events whose `draw_at` came are drawn, and drawn
//! events' waiting lists are swept (`Engine::offer_round`: offers past
//! their deadline passed, returned units offered to the next in line).
//!
//! Each tick also reads again the keys of the token and draw events this
//! instance has cached, so a rotation by another instance verifies here
//! within a tick (`engine::keys`).
//!
//! The offers' sweep needs no lease either: each of its steps is one
//! store step, idempotent, and a round cut off anywhere is finished by the
//! next one of any instance (`engine::offers`).
//!
//! Every instance runs it, as every instance sweeps expired holds: no lease
//! is needed, because a draw is a function of its seed and its (closed)
//! entries, and its record is written by compare-and-set; two instances
//! drawing at once write the same ranks and agree on the first record
//! (`engine::draw`). A round reads the event list and each event's cached
//! meta; a draw event past its `draw_at` (or, without one, until the admin
//! call drew it) reads its record; once drawn it is remembered here, not
//! drawn again, and its waiting list is swept each round (a closed event's
//! round reads nothing: its cached meta says closed).

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
    let Some(draw) = meta.spec.draw.as_ref() else {
        return Ok(());
    };
    let due = draw.draw_at.is_some_and(|at| engine.clock().now_ms() >= at);
    if !due {
        // Drawn by the admin call (here or elsewhere): its offers are
        // swept from now on.
        if engine
            .store()
            .draw_record(event)
            .await?
            .is_some_and(|r| r.done.is_some())
        {
            drawn.insert(event.clone());
        }
        return Ok(());
    }
    let view = engine.draw(event).await?;
    if view.drawn_at.is_some() {
        drawn.insert(event.clone());
    }
    Ok(())
}

/// One offers round at each drawn event; an event gone or closed is
/// forgotten. A round cut short is logged: the next finishes it.
pub async fn sweep_offers<S: Store>(engine: &Engine<S>, drawn: &mut HashSet<EventId>) {
    let mut gone = Vec::new();
    for event in drawn.iter() {
        match engine.offer_round(event).await {
            Ok(_) => {}
            Err(EngineError::UnknownEvent(_)) => gone.push(event.clone()),
            Err(e) => {
                m::store_error("offers");
                tracing::warn!(%event, error = %e, "offers: round cut short");
            }
        }
    }
    for event in gone {
        drawn.remove(&event);
    }
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
        sweep_offers(&engine, &mut drawn).await;
        if let Err(e) = engine.refresh_token_keys().await {
            m::store_error("token_keys");
            tracing::warn!(error = %e, "draw timer: token keys not refreshed");
        }
    }
}
