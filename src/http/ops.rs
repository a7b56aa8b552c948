//! Operations: `/healthz`, `/readyz`, `/metrics`, and the live page at `/ui`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, AppState};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(render::<S>))
        .route("/ui", get(ui))
        .route("/openapi.json", get(super::openapi::openapi_json))
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/ui") }),
        )
}

/// `/healthz`'s body.
#[derive(Serialize, ToSchema)]
pub(super) struct Health {
    #[schema(pattern = "^ok$")]
    status: &'static str,
}

/// `/readyz`'s body.
#[derive(Serialize, ToSchema)]
pub(super) struct Ready {
    #[schema(pattern = "^ready$")]
    status: &'static str,
    /// `memory`, `redis` or `redis-cluster`.
    store: &'static str,
}

/// The process is alive.
#[utoipa::path(
    get, path = "/healthz", tag = "operations", operation_id = "healthz",
    responses((status = 200, description = "Alive", body = Health)),
)]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Ready only when the store and the database answer.
#[utoipa::path(
    get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "The store and the database answer", body = Ready),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn readyz<S: Store>(
    State(state): State<AppState<S>>,
) -> Result<Json<Ready>, ApiError> {
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
    Ok(Json(Ready {
        status: "ready",
        store: state.engine.store().kind(),
    }))
}

/// The live page: every event, a bar per bucket (plain HTML/JS, no build step).
#[utoipa::path(
    get, path = "/ui", tag = "operations", operation_id = "live_page",
    responses((status = 200, description = "The live page", content_type = "text/html", body = String)),
)]
pub(super) async fn ui() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("ui/index.html"))
}

/// Prometheus text exposition.
#[utoipa::path(
    get, path = "/metrics", tag = "operations", operation_id = "metrics",
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String)),
)]
pub(super) async fn render<S: Store>(State(state): State<AppState<S>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
