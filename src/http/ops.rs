//! Operations: `/healthz`, `/readyz`, `/metrics`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(render::<S>))
}

/// The process is alive.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready only when the store answers.
async fn readyz<S: Store>(State(state): State<AppState<S>>) -> Result<Json<Value>, ApiError> {
    state
        .engine
        .store()
        .ping()
        .await
        .map_err(|e| ApiError::Unavailable {
            detail: format!("store: {e}"),
            outcome_unknown: false,
        })?;
    Ok(Json(
        json!({"status": "ready", "store": state.engine.store().kind()}),
    ))
}

/// Prometheus text exposition.
async fn render<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
