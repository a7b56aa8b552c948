//! Operations: `/healthz`, `/readyz`, `/metrics`, and the live page at `/ui`.

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
        .route("/ui", get(ui))
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/ui") }),
        )
}

/// The process is alive.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready only when the store and the database answer.
async fn readyz<S: Store>(State(state): State<AppState<S>>) -> Result<Json<Value>, ApiError> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| ApiError::Unavailable {
        detail: format!("{what}: {e}"),
        outcome_unknown: false,
    };
    state
        .engine
        .store()
        .ping()
        .await
        .map_err(|e| unavailable("store", &e))?;
    state
        .ledger
        .ping()
        .await
        .map_err(|e| unavailable("database", &e))?;
    Ok(Json(
        json!({"status": "ready", "store": state.engine.store().kind()}),
    ))
}

/// The live page: every event, a bar per bucket (plain HTML/JS, no build step).
async fn ui() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("ui/index.html"))
}

/// Prometheus text exposition.
async fn render<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
