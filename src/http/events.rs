//! `/v1/events`: create (admin), list, view.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::{ApiError, ApiJson, AppState};
use crate::engine::EventView;
use crate::ids::EventId;
use crate::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/events", get(list::<S>).post(create::<S>))
        .route("/v1/events/{id}", get(view::<S>))
}

#[derive(Deserialize)]
struct CreateEvent {
    id: String,
    stock: u64,
    buckets: u32,
    per_user_limit: Option<u32>,
    max_per_order: Option<u32>,
    #[serde(default, with = "crate::model::rfc3339_ms")]
    starts_at: Option<i64>,
    #[serde(default, with = "crate::model::rfc3339_ms")]
    ends_at: Option<i64>,
}

/// Parses an event id from the path (a bad charset can never name an event).
pub(super) fn event_id(raw: String) -> Result<EventId, ApiError> {
    EventId::parse(raw).map_err(ApiError::invalid)
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
    let view = state.engine.create_event(spec).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    Ok(Json(state.engine.view(&event_id(id)?).await?))
}

/// The ids of every event the store knows.
async fn list<S: Store>(State(state): State<AppState<S>>) -> Result<Json<Vec<EventId>>, ApiError> {
    let mut ids = state
        .engine
        .store()
        .list_events()
        .await
        .map_err(crate::engine::EngineError::from)?;
    ids.sort();
    Ok(Json(ids))
}
