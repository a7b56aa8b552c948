//! `/v1/releases/{id}/orders/{order_id}`: a release order's view, and the
//! confirm and cancel of a held one (a release with `hold_seconds`).
//!
//! The order is read and decided at its user's home (`engine::
//! release_holds`): confirm, cancel and expiry act on every line together,
//! so each answer is the whole order's status. The shapes and problem types
//! are the event orders' (`orders.rs`): a confirm past `pay_by` answers
//! `409 hold-expired`, a confirm of a cancelled order `409 order-cancelled`;
//! a cancel of a confirmed (paid) order answers `409 order-confirmed`, since
//! a paid release order is never given back.

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};

use super::events::event_id;
use super::releases::OrderAnswer;
use super::{ApiError, AppState};
use crate::engine::{EngineError, HoldOutcome, HoldRefusal};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/releases/{id}/orders/{order_id}", get(view::<S>))
        .route(
            "/v1/releases/{id}/orders/{order_id}/confirm",
            post(confirm::<S>),
        )
        .route(
            "/v1/releases/{id}/orders/{order_id}/cancel",
            post(cancel::<S>),
        )
}

fn not_found(e: EngineError, order_id: String) -> ApiError {
    match e {
        EngineError::UnknownOrder(_) => ApiError::UnknownOrder(order_id),
        other => other.into(),
    }
}

/// A release order as it stands: `held`, `confirmed`, `cancelled` or
/// `expired`, every line together.
#[utoipa::path(
    get, path = "/v1/releases/{id}/orders/{order_id}", tag = "releases", operation_id = "release_order",
    params(
        ("id" = crate::domain::ids::EventId, Path, description = "The release"),
        ("order_id" = String, Path, description = "The release order's id"),
    ),
    responses(
        (status = 200, description = "The order and its lines", body = OrderAnswer),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path((id, order_id)): Path<(String, String)>,
) -> Result<Json<OrderAnswer>, ApiError> {
    let release = event_id(id)?;
    match state.engine.release_order(&release, &order_id).await {
        Ok(order) => Ok(Json(OrderAnswer::new(order))),
        Err(e) => Err(not_found(e, order_id)),
    }
}

/// A confirm or a cancel.
#[derive(Clone, Copy)]
enum Decision {
    Confirm,
    Cancel,
}

/// Decides a held order in a task of its own: a dropped handler never stops
/// between the home's decision and the lines (the sweeper would finish
/// them, but later).
async fn decide<S: Store>(
    state: AppState<S>,
    (id, order_id): (String, String),
    decision: Decision,
) -> Result<Json<OrderAnswer>, ApiError> {
    let release = event_id(id)?;
    let engine = state.engine.clone();
    let oid = order_id.clone();
    let outcome = tokio::spawn(async move {
        match decision {
            Decision::Confirm => engine.confirm_release_order(&release, &oid).await,
            Decision::Cancel => engine.cancel_release_order(&release, &oid).await,
        }
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the order's decision task failed: {e}")))?;
    answered(outcome.map_err(|e| not_found(e, order_id))?)
}

/// The answer of a confirm or cancel: `200` with the order, or the refusal.
fn answered(outcome: HoldOutcome) -> Result<Json<OrderAnswer>, ApiError> {
    match outcome.result {
        Ok(order) => Ok(Json(OrderAnswer::new(order))),
        Err(HoldRefusal::Expired(o)) => Err(ApiError::HoldExpired(o.order_id.to_string())),
        Err(HoldRefusal::Cancelled(o)) => Err(ApiError::OrderCancelled(o.order_id.to_string())),
        Err(HoldRefusal::Confirmed(o)) => Err(ApiError::OrderConfirmed(o.order_id.to_string())),
    }
}

/// Confirms a held release order, every line, before its `pay_by`;
/// confirming a confirmed order (or an order of a release without holds)
/// answers 200 again.
#[utoipa::path(
    post, path = "/v1/releases/{id}/orders/{order_id}/confirm", tag = "releases", operation_id = "confirm_release_order",
    params(
        ("id" = crate::domain::ids::EventId, Path, description = "The release"),
        ("order_id" = String, Path, description = "The release order's id"),
    ),
    responses(
        (status = 200, description = "The confirmed order", body = OrderAnswer),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 409, response = super::openapi::ConfirmRefused),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn confirm<S: Store>(
    State(state): State<AppState<S>>,
    Path(path): Path<(String, String)>,
) -> Result<Json<OrderAnswer>, ApiError> {
    decide(state, path, Decision::Confirm).await
}

/// Cancels a held release order: every line's units back on sale, the
/// buyer's count down. Cancelling twice answers 200 again; an expired
/// order answers `409 hold-expired`, a confirmed one `409 order-confirmed`.
#[utoipa::path(
    post, path = "/v1/releases/{id}/orders/{order_id}/cancel", tag = "releases", operation_id = "cancel_release_order",
    params(
        ("id" = crate::domain::ids::EventId, Path, description = "The release"),
        ("order_id" = String, Path, description = "The release order's id"),
    ),
    responses(
        (status = 200, description = "The cancelled order; its units are back on sale", body = OrderAnswer),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 409, response = super::openapi::CancelRefused),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn cancel<S: Store>(
    State(state): State<AppState<S>>,
    Path(path): Path<(String, String)>,
) -> Result<Json<OrderAnswer>, ApiError> {
    decide(state, path, Decision::Cancel).await
}
