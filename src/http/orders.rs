//! `/v1/orders/{id}`: lookup, confirm and cancel. A live event's orders are
//! read from their home bucket; once flushed and the event closed, from the
//! ledger.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{ApiError, AppState};
use crate::domain::ids::OrderId;
use crate::domain::model::OrderView;
use crate::engine::{ConfirmRefusal, EngineError};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/orders/{id}", get(order::<S>))
        .route("/v1/orders/{id}/cancel", post(cancel::<S>))
        .route("/v1/orders/{id}/confirm", post(confirm::<S>))
}

/// The order's event (the id names it) on the request's span, for its log lines.
fn record_event(order: &str) {
    if let Ok((_, event, _)) = OrderId::parse(order) {
        super::trace::record_event(event.as_str());
    }
}

impl<S: Store> AppState<S> {
    /// A confirm or cancel of an order its event's store no longer knows: if
    /// the ledger has the event closed and the order, the sale is over; if
    /// it has the order but not the event closed, the answer is not known
    /// yet (a close under way): try again; else no such order.
    async fn closed_or_unknown(&self, id: String) -> ApiError {
        let order = match self.flushed_order(&id).await {
            Ok(order) => order,
            Err(e) => return e,
        };
        let Some(order) = order else {
            return ApiError::UnknownOrder(id);
        };
        match self.ledger.event(&order.event_id).await {
            Ok(Some(db)) if db.closed => {
                ApiError::NotOnSale(format!("event {} is closed", order.event_id))
            }
            Ok(_) => ApiError::TryAgain(format!(
                "event {} is closing; retry once it is closed",
                order.event_id
            )),
            Err(e) => {
                tracing::warn!(error = %e, "ledger failed");
                ApiError::Unavailable {
                    detail: "the database is unreachable".into(),
                    outcome_unknown: false,
                }
            }
        }
    }

    /// The order from the ledger, when the store no longer has it.
    async fn flushed_order(&self, raw: &str) -> Result<Option<OrderView>, ApiError> {
        let Ok((oid, event, _)) = OrderId::parse(raw) else {
            return Ok(None);
        };
        self.ledger.order(&oid, &event).await.map_err(|e| {
            tracing::warn!(error = %e, "ledger failed");
            ApiError::Unavailable {
                detail: "the database is unreachable".into(),
                outcome_unknown: false,
            }
        })
    }
}

/// The order, from its home bucket while the event is live, from the database after.
#[utoipa::path(
    get, path = "/v1/orders/{id}", tag = "orders", operation_id = "get_order",
    params(("id" = String, Path, description = "The order id (`<event>.<16 hex>.<16 hex>`)")),
    responses(
        (status = 200, description = "The order", body = OrderView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn order<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    record_event(&id);
    match state.engine.order(&id).await {
        Ok(order) => Ok(Json(order)),
        Err(EngineError::UnknownOrder(_)) => match state.flushed_order(&id).await? {
            Some(order) => Ok(Json(order)),
            None => Err(ApiError::UnknownOrder(id)),
        },
        Err(e) => Err(e.into()),
    }
}

/// Cancels; cancelling twice answers 200 with the cancelled order again.
#[utoipa::path(
    post, path = "/v1/orders/{id}/cancel", tag = "orders", operation_id = "cancel_order",
    params(("id" = String, Path, description = "The order id")),
    responses(
        (status = 200, description = "The cancelled order; its units are back on sale", body = OrderView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 409, response = super::openapi::NotOnSale),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn cancel<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    record_event(&id);
    match state.engine.cancel(&id).await {
        Ok(outcome) => {
            if !outcome.already {
                metrics::counter!(crate::metrics::CANCELS, "event" => outcome.order.event_id.to_string()).increment(1);
            }
            Ok(Json(outcome.order))
        }
        // Only a closed sale's orders live in the ledger alone.
        Err(EngineError::UnknownOrder(_)) => Err(state.closed_or_unknown(id).await),
        Err(e) => Err(e.into()),
    }
}

/// Confirms a held order (events with `hold_seconds`) before its `pay_by`;
/// confirming a confirmed order answers 200 again.
#[utoipa::path(
    post, path = "/v1/orders/{id}/confirm", tag = "orders", operation_id = "confirm_order",
    params(("id" = String, Path, description = "The order id")),
    responses(
        (status = 200, description = "The confirmed order", body = OrderView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownOrder),
        (status = 409, response = super::openapi::ConfirmRefused),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn confirm<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    record_event(&id);
    match state.engine.confirm(&id).await {
        Ok(outcome) => {
            if !outcome.already {
                let event = match &outcome.result {
                    Ok(o) | Err(ConfirmRefusal::Expired(o) | ConfirmRefusal::Cancelled(o)) => {
                        o.event_id.to_string()
                    }
                };
                match &outcome.result {
                    Ok(_) => metrics::counter!(crate::metrics::HOLDS_CONFIRMED, "event" => event)
                        .increment(1),
                    Err(ConfirmRefusal::Expired(_)) => {
                        metrics::counter!(crate::metrics::HOLDS_EXPIRED, "event" => event)
                            .increment(1)
                    }
                    Err(ConfirmRefusal::Cancelled(_)) => {}
                }
            }
            match outcome.result {
                Ok(order) => Ok(Json(order)),
                Err(ConfirmRefusal::Expired(o)) => {
                    Err(ApiError::HoldExpired(o.order_id.to_string()))
                }
                Err(ConfirmRefusal::Cancelled(o)) => {
                    Err(ApiError::OrderCancelled(o.order_id.to_string()))
                }
            }
        }
        // Only a closed sale's orders live in the ledger alone.
        Err(EngineError::UnknownOrder(_)) => Err(state.closed_or_unknown(id).await),
        Err(e) => Err(e.into()),
    }
}
