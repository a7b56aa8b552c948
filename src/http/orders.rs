//! `/v1/orders/{id}`: lookup and cancel.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{ApiError, AppState};
use crate::engine::OrderView;
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/orders/{id}", get(order::<S>))
        .route("/v1/orders/{id}/cancel", post(cancel::<S>))
}

async fn order<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    Ok(Json(state.engine.order(&id).await?))
}

/// Cancels; cancelling twice answers 200 with the cancelled order again.
async fn cancel<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<OrderView>, ApiError> {
    let outcome = state.engine.cancel(&id).await?;
    if !outcome.already {
        metrics::counter!(crate::metrics::CANCELS, "event" => outcome.order.event_id.to_string())
            .increment(1);
    }
    Ok(Json(outcome.order))
}
