//! Finding orders without their ids: a user's orders in an event, and what a
//! request id was answered. For a buyer's client that lost its answer, and
//! for a support agent.
//!
//! - `GET /v1/events/{id}/orders?user_id=…`: the user's orders in the event,
//!   any status, read from the database (a live event's orders appear there
//!   within the flush lag) with each order's status as its home bucket has it
//!   now while the event is live.
//! - `GET /v1/events/{id}/requests/{request_id}?user_id=…`: the answer kept
//!   for that request id, read without acting on it (it never buys): `200`
//!   and the order where the purchase answered `201` (its status now), the
//!   same `409` problem where it was refused, `404 unknown-request` where
//!   nothing is kept. While the event is live the record comes from the
//!   user's home bucket; after its close from the database, which keeps
//!   orders, not refusals.
//!
//! Both read the event's records by user in the database (no index on the
//! user: the flush path pays nothing for them; a lookup scans the event's
//! records, see BENCHMARKS.md).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState, events::event_id};
use crate::domain::ids::{EventId, RequestId, UserId};
use crate::domain::model::{Order, OrderView};
use crate::engine::{EngineError, PurchaseOutcome};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/events/{id}/orders", get(user_orders::<S>))
        .route(
            "/v1/events/{id}/requests/{request_id}",
            get(request_answer::<S>),
        )
}

/// `?user_id=…`
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ByUser {
    /// The buyer.
    #[param(value_type = UserId)]
    user_id: Option<String>,
}

impl ByUser {
    fn user(self) -> Result<UserId, ApiError> {
        let raw = self
            .user_id
            .ok_or_else(|| ApiError::invalid("user_id is required (?user_id=…)"))?;
        UserId::parse(raw).map_err(ApiError::invalid)
    }
}

/// A user's orders in an event.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct UserOrders {
    #[schema(value_type = EventId)]
    event_id: EventId,
    #[schema(value_type = UserId)]
    user_id: UserId,
    /// Oldest first.
    orders: Vec<OrderView>,
}

fn database_error(e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "ledger failed");
    ApiError::Unavailable {
        detail: "the database is unreachable".into(),
        outcome_unknown: false,
    }
}

/// A user's orders in an event, any status, live or after its close.
#[utoipa::path(
    get, path = "/v1/events/{id}/orders", tag = "orders", operation_id = "user_orders",
    params(("id" = EventId, Path, description = "The event"), ByUser),
    responses(
        (status = 200, description = "The user's orders (a live event's appear within the flush lag)", body = UserOrders),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn user_orders<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
    Query(by): Query<ByUser>,
) -> Result<Json<UserOrders>, ApiError> {
    let event = event_id(id)?;
    let user = by.user()?;
    super::trace::record_user(user.as_str());
    if state
        .ledger
        .event(&event)
        .await
        .map_err(database_error)?
        .is_none()
    {
        return Err(ApiError::UnknownEvent(event.to_string()));
    }
    let mut orders: Vec<OrderView> = state
        .ledger
        .order_histories(&event, Some(&user))
        .await
        .map_err(database_error)?
        .into_iter()
        .filter_map(|h| h.order)
        .collect();
    // While the event is live its buckets have each order's status first.
    for order in &mut orders {
        if let Ok(now) = state.engine.order(order.order_id.as_str()).await {
            order.status = now.status;
        }
    }
    orders.sort_by_key(|o| o.created_at);
    Ok(Json(UserOrders {
        event_id: event,
        user_id: user,
        orders,
    }))
}

/// The answer kept for a request id of a user, read without acting on it.
#[utoipa::path(
    get, path = "/v1/events/{id}/requests/{request_id}", tag = "orders",
    operation_id = "request_answer",
    params(
        ("id" = EventId, Path, description = "The event"),
        ("request_id" = RequestId, Path, description = "The purchase's idempotency key"),
        ByUser,
    ),
    responses(
        (status = 200, description = "The order the request made, its status as it is now", body = Order),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownRequest),
        (status = 409, response = super::openapi::PurchaseRefused),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn request_answer<S: Store>(
    State(state): State<AppState<S>>,
    Path((id, request_id)): Path<(String, String)>,
    Query(by): Query<ByUser>,
) -> Response {
    let answer = async {
        let event = event_id(id)?;
        let user = by.user()?;
        super::trace::record_user(user.as_str());
        let rid = RequestId::parse(request_id).map_err(ApiError::invalid)?;
        let kept = match state.engine.request_answer(&event, &user, &rid).await {
            Ok(kept) => kept,
            Err(EngineError::NotOnSale { why: "closed", .. } | EngineError::UnknownEvent(_)) => {
                from_ledger(&state, &event, &user, &rid).await?
            }
            Err(e) => return Err(ApiError::from(e)),
        };
        kept.ok_or_else(|| {
            ApiError::UnknownRequest(format!(
                "no answer is kept for request id {rid} of user {user}"
            ))
        })
    }
    .await;
    match answer {
        Ok(PurchaseOutcome {
            result: Ok(order), ..
        }) => replayed((StatusCode::OK, Json(order)).into_response()),
        Ok(PurchaseOutcome {
            result: Err(refusal),
            ..
        }) => replayed(ApiError::from(refusal).into_response()),
        Err(e) => e.into_response(),
    }
}

fn replayed(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// A closed event's answer: the order the request made, from the database
/// (refusals are not kept past the close).
async fn from_ledger<S: Store>(
    state: &AppState<S>,
    event: &EventId,
    user: &UserId,
    rid: &RequestId,
) -> Result<Option<PurchaseOutcome>, ApiError> {
    let Some(db) = state.ledger.event(event).await.map_err(database_error)? else {
        return Err(ApiError::UnknownEvent(event.to_string()));
    };
    let order = state
        .ledger
        .order_by_request(event, user, rid.as_str())
        .await
        .map_err(database_error)?;
    match order {
        Some(o) if db.closed => Ok(Some(PurchaseOutcome {
            result: Ok(Order::from_view(o)),
            replayed: true,
        })),
        None if db.closed => Ok(None),
        // A close under way: a later change of the order may not be in the
        // ledger yet.
        _ => Err(ApiError::Unavailable {
            detail: format!(
                "event {event} is closing; an order of request id {rid} may still reach the database; retry later"
            ),
            outcome_unknown: true,
        }),
    }
}
