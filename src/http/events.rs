//! `/v1/events`: create (admin), list, view, close (admin), audit (admin).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::{ApiError, ApiJson, AppState};
use crate::control::ControlError;
use crate::control::audit::Audit;
use crate::control::flusher::Flusher;
use crate::control::lifecycle;
use crate::domain::ids::EventId;
use crate::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use crate::engine::{EngineError, EventView};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/events", get(list::<S>).post(create::<S>))
        .route("/v1/events/{id}", get(view::<S>))
        .route("/v1/events/{id}/close", post(close::<S>))
        .route("/v1/events/{id}/buckets", put(reshard::<S>))
        .route("/v1/events/{id}/rebalance", post(rebalance::<S>))
        .route("/v1/events/{id}/audit", get(audit::<S>))
}

#[derive(Deserialize)]
struct CreateEvent {
    id: String,
    stock: u64,
    buckets: u32,
    per_user_limit: Option<u32>,
    max_per_order: Option<u32>,
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    starts_at: Option<i64>,
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    ends_at: Option<i64>,
}

/// Parses an event id from the path (a bad charset can never name an event).
pub(super) fn event_id(raw: String) -> Result<EventId, ApiError> {
    EventId::parse(raw).map_err(ApiError::invalid)
}

impl<S: Store> AppState<S> {
    pub(super) fn control_error(&self, event: &EventId, e: ControlError) -> ApiError {
        match e {
            ControlError::Engine(e) => self.engine_error(event, e),
            ControlError::Exists(id) => ApiError::EventExists(id.to_string()),
            ControlError::Busy(why) => ApiError::TryAgain(why),
            ControlError::Ledger(e) => {
                tracing::warn!(error = %e, "ledger failed");
                ApiError::Unavailable {
                    detail: "the database is unreachable".into(),
                    outcome_unknown: false,
                }
            }
            ControlError::Flush(e) => {
                tracing::warn!(error = %e, "flushing failed");
                ApiError::Unavailable {
                    detail: format!("flushing to the database failed: {e}"),
                    outcome_unknown: false,
                }
            }
        }
    }

    /// The event, or its final view once closed.
    pub(super) async fn event_view(&self, event: &EventId) -> Result<EventView, ApiError> {
        match self.engine.view(event).await {
            Ok(view) if view.status != "closed" => Ok(view),
            Ok(_) | Err(EngineError::UnknownEvent(_)) if !self.held.contains(event) => {
                lifecycle::final_view(&self.engine, &self.ledger, event)
                    .await
                    .map_err(|e| self.control_error(event, e))
            }
            Ok(view) => Ok(view),
            Err(e) => Err(self.engine_error(event, e)),
        }
    }
}

async fn create<S: Store>(
    State(state): State<AppState<S>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateEvent>,
) -> Result<(StatusCode, Json<EventView>), ApiError> {
    state.require_admin(&headers)?;
    let spec = EventSpec {
        id: event_id(body.id)?,
        stock: body.stock,
        buckets: body.buckets,
        per_user_limit: body.per_user_limit,
        max_per_order: body.max_per_order.unwrap_or(DEFAULT_MAX_PER_ORDER),
        starts_at: body.starts_at,
        ends_at: body.ends_at,
    };
    let id = spec.id.clone();
    let view = lifecycle::create(&state.engine, &state.ledger, spec)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    crate::control::gauges::initialise(&id);
    Ok((StatusCode::CREATED, Json(view)))
}

async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(id)?;
    Ok(Json(state.event_view(&id).await?))
}

/// The ids of every event the store knows.
async fn list<S: Store>(State(state): State<AppState<S>>) -> Result<Json<Vec<EventId>>, ApiError> {
    let mut ids = state
        .engine
        .store()
        .list_events()
        .await
        .map_err(EngineError::from)?;
    ids.sort();
    Ok(Json(ids))
}

/// Ends the sale: seal, settle, retire the leftover, drain every order to the database.
async fn close<S: Store>(
    State(state): State<AppState<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    state.require_admin(&headers)?;
    let id = event_id(id)?;
    let consumer = format!("{}/close", state.engine.instance());
    let mut flusher = Flusher::new(
        state.engine.clone(),
        state.ledger.clone(),
        consumer,
        state.flush.clone(),
    );
    // The close runs as its own task: a client that goes away or the request
    // timeout must not leave a sale half closed. A retry finds it done (or
    // finishes it: every step is idempotent).
    let task = {
        let state = state.clone();
        let id = id.clone();
        tokio::spawn(async move {
            lifecycle::close(&state.engine, &state.ledger, &mut flusher, &id, &state.stop).await
        })
    };
    let view = task
        .await
        .map_err(|e| ApiError::Internal(format!("the close task failed: {e}")))?
        .map_err(|e| state.control_error(&id, e))?;
    Ok(Json(view))
}

/// The conservation check.
async fn audit<S: Store>(
    State(state): State<AppState<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Audit>, ApiError> {
    state.require_admin(&headers)?;
    let id = event_id(id)?;
    let audit = crate::control::audit::audit(&state.engine, &state.ledger, &id)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    Ok(Json(audit))
}

#[derive(Deserialize)]
struct Reshard {
    buckets: u32,
}

/// Moves a live event to another bucket count.
async fn reshard<S: Store>(
    State(state): State<AppState<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Reshard>,
) -> Result<Json<EventView>, ApiError> {
    state.require_admin(&headers)?;
    let id = event_id(id)?;
    let view = crate::control::reshard::reshard(&state.engine, &id, body.buckets)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    if let Err(e) = state.ledger.set_buckets(&id, body.buckets).await {
        tracing::warn!(event = %id, error = %e, "the database keeps the old bucket count until the next reshard");
    }
    Ok(Json(view))
}

#[derive(serde::Serialize)]
struct Rebalanced {
    moves: Vec<crate::control::rebalancer::Move>,
    transfers: u64,
    units: u64,
    event: EventView,
}

/// Consolidates now: gathers fragments (or levels the buckets); returns the moves.
async fn rebalance<S: Store>(
    State(state): State<AppState<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Rebalanced>, ApiError> {
    state.require_admin(&headers)?;
    let id = event_id(id)?;
    let meta = state
        .engine
        .reload(&id)
        .await
        .map_err(|e| state.engine_error(&id, e))?;
    if meta.status != crate::domain::model::EventStatus::OnSale {
        return Err(ApiError::NotOnSale(format!(
            "event {id} is {}",
            meta.status.as_str()
        )));
    }
    let mut rebalancer = crate::control::rebalancer::Rebalancer::new(
        state.engine.clone(),
        state.ledger.clone(),
        state.flush.clone(),
        state.rebalance.clone(),
    );
    let (moves, round) = rebalancer
        .consolidate_now(&meta)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    Ok(Json(Rebalanced {
        moves,
        transfers: round.transfers,
        units: round.units,
        event: state.engine.view(&id).await?,
    }))
}
