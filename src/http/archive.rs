//! `DELETE /v1/events/{id}` (admin): archives a closed event.
//!
//! A closed event stays listed, viewed and audited; an operator who is done
//! with it archives it: it leaves `GET /v1/events` (and so the live page),
//! its series leave `/metrics` once the recorder's retention has passed
//! without an update (`server.metrics_retention_ms`), and the database keeps
//! its orders (`GET /v1/orders/{id}`, the order lookups and the `orders` view
//! still answer). Only an event the database has closed (its every order
//! flushed) may be archived; archiving twice changes nothing.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::guard::Admin;
use super::{ApiError, AppState, events::event_id};
use crate::domain::ids::EventId;
use crate::engine::EngineError;
use crate::store::Store;

/// Archives a closed event (see the module docs).
#[utoipa::path(
    delete, path = "/v1/events/{id}", tag = "events", operation_id = "archive_event",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event")),
    responses(
        (status = 204, description = "Archived: out of the listing; its orders, and its final view at `GET /v1/events/{id}`, stay"),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::NotOnSale),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn archive<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = event_id(id)?;
    let db = state.ledger.event(&id).await.map_err(|e| {
        tracing::warn!(error = %e, "ledger failed");
        ApiError::Unavailable {
            detail: "the database is unreachable".into(),
            outcome_unknown: false,
        }
    })?;
    match db {
        None => return Err(ApiError::UnknownEvent(id.to_string())),
        Some(db) if !db.closed => {
            return Err(ApiError::NotOnSale(format!(
                "event {id} is not closed: close it first (POST /v1/events/{id}/close)"
            )));
        }
        Some(_) => {}
    }
    state
        .engine
        .store()
        .archive_event(&id)
        .await
        .map_err(EngineError::from)?;
    state.engine.activity().forget(&id);
    state.engine.forget(&id);
    tracing::info!(event = %id, "archived");
    Ok(StatusCode::NO_CONTENT)
}
