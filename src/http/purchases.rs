//! `POST /v1/events/{id}/purchases`: the hot path. Extract → validate → rate
//! limit → one engine call (its own task, so a dropped handler never abandons
//! a saga) → respond; metrics recorded on the way out.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

use super::{ApiError, ApiJson, AppState, Meters, events::event_id};
use crate::domain::ids::{EventId, RequestId, UserId};
use crate::domain::model::Order;
use crate::domain::token::MAX_TOKEN_LEN;
use crate::engine::{EngineError, PurchaseOutcome, PurchaseRequest};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new().route("/v1/events/{id}/purchases", post(purchase::<S>))
}

/// `POST /v1/events/{id}/purchases`. An unknown member is refused, naming
/// it (`"qty": 5` must not buy the default quantity).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user_id": "u-1001", "quantity": 2, "request_id": "9f1c-0001"}))]
pub(super) struct PurchaseBody {
    #[schema(value_type = UserId)]
    user_id: String,
    /// 1 to the event's `max_per_order`.
    #[serde(deserialize_with = "super::whole::quantity")]
    #[schema(minimum = 1)]
    quantity: u32,
    /// The idempotency key (or the `Idempotency-Key` header; both given:
    /// equal). Not `X-Request-Id`, which only correlates log lines.
    #[schema(value_type = Option<RequestId>)]
    request_id: Option<String>,
    /// The access token a waiting room signed for this user (docs/API.md,
    /// "Access tokens"): required by an event whose `access` is `token`,
    /// ignored by an `open` one.
    #[schema(max_length = 256)]
    access_token: Option<String>,
}

/// The request id from the body or the `Idempotency-Key` header (they must
/// agree). Both are held to `RequestId`'s one rule: a header value that is
/// not ASCII is refused as the same characters in the body are, and an error
/// names the header when the header was wrong.
pub(super) fn request_id(
    headers: &HeaderMap,
    body: Option<String>,
) -> Result<Option<RequestId>, ApiError> {
    let header = headers
        .get("idempotency-key")
        .map(|v| {
            RequestId::parse(String::from_utf8_lossy(v.as_bytes()))
                .map_err(|e| ApiError::invalid(format!("the Idempotency-Key header: {e}")))
        })
        .transpose()?;
    let body = body
        .map(|b| RequestId::parse(b).map_err(ApiError::invalid))
        .transpose()?;
    match (header, body) {
        (Some(h), Some(b)) if h != b => {
            Err(ApiError::invalid("Idempotency-Key and request_id differ"))
        }
        (h, b) => Ok(h.or(b)),
    }
}

/// The body's `access_token`, bounded (its signature is the engine's to check).
fn access_token(token: Option<String>) -> Result<Option<String>, ApiError> {
    match token {
        Some(t) if t.len() > MAX_TOKEN_LEN => Err(ApiError::invalid(format!(
            "access_token: at most {MAX_TOKEN_LEN} characters"
        ))),
        t => Ok(t),
    }
}

/// Buys `quantity` units: from the user's home bucket, else from the ring.
///
/// A retry with the same request id answers the stored status and body with
/// `Idempotent-Replayed: true` (refusals too).
#[utoipa::path(
    post, path = "/v1/events/{id}/purchases", tag = "purchases", operation_id = "purchase",
    params(
        ("id" = EventId, Path, description = "The event"),
        ("Idempotency-Key" = Option<RequestId>, Header, description = "The idempotency key (same as the body's `request_id`, same characters): a retry with it never buys twice. `X-Request-Id` is not one: it only correlates log lines, and the same `X-Request-Id` sent twice buys twice."),
    ),
    request_body = PurchaseBody,
    responses(
        (status = 201, description = "The order", body = Order, headers(
            ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer to an earlier request with the same request id"),
        )),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 403, response = super::openapi::TokenRefused),
        (status = 409, response = super::openapi::PurchaseRefused),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 429, response = super::openapi::RateLimited),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn purchase<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PurchaseBody>,
) -> Response {
    let start = Instant::now();
    let mut event_seen = None;
    let outcome = async {
        let event = event_id(id)?;
        event_seen = Some(event.clone());
        // A release's pool is bought through its release's orders only:
        // they hold the release-wide per-user limit.
        if let Some(release) = state.engine.pool_release(&event).await? {
            return Err(ApiError::ReleasePool {
                event: event.to_string(),
                release: release.to_string(),
            });
        }
        let user = UserId::parse(body.user_id).map_err(ApiError::invalid)?;
        super::trace::record_user(user.as_str());
        let req = PurchaseRequest {
            user,
            quantity: body.quantity,
            request_id: request_id(&headers, body.request_id)?,
            event,
            access_token: access_token(body.access_token)?,
        };
        state.limits.check(state.engine.store(), &req.user).await?;
        let event = req.event.clone();
        if let Some(refused) = state.quarantine.refusal(&event) {
            return Box::pin(from_ledger(&state, req, refused)).await;
        }
        // A task of its own: if this handler is dropped (the client went
        // away, the request timeout fired), the purchase still ends.
        match state.engine.purchase_detached(req).await {
            (Ok(outcome), _) => Ok(outcome),
            // Boxed: its database read would otherwise make every
            // purchase's handler future (moved on every request) larger.
            (Err(e), req) => {
                // Closed, or gone from the store since (its keys expire an
                // hour after the close): the ledger has its orders.
                let closed = matches!(
                    e,
                    EngineError::NotOnSale { why: "closed", .. } | EngineError::UnknownEvent(_)
                );
                let refused = Box::pin(state.engine_error_checked(&event, e)).await;
                match req {
                    Some(req)
                        if closed
                            && req.request_id.is_some()
                            && matches!(
                                refused,
                                ApiError::NotOnSale(_) | ApiError::UnknownEvent(_)
                            ) =>
                    {
                        Box::pin(from_ledger(&state, req, refused)).await
                    }
                    _ => Err(refused),
                }
            }
        }
    }
    .await;
    // Metric series are labelled only with events that exist, so requests for
    // made-up ids cannot grow /metrics without bound.
    let label = match &event_seen {
        Some(e) if outcome.is_ok() || state.engine.is_known(e) => e.as_str(),
        _ => UNKNOWN_EVENT,
    };
    respond(outcome, &state.meters, label, start)
}

/// A purchase the store cannot answer (the event closed, or is quarantined after
/// the store lost state): a request with the client's request id learns from
/// the ledger what it bought. A close drains every order and every later
/// change (confirm, cancel, expiry) into the ledger before the ledger marks
/// the event closed, so once it is, its answer is final: the order as it is,
/// or no order (the request bought nothing). Before that (a close under way,
/// a quarantined event) the answer is `outcome: unknown`, which a later retry
/// resolves.
async fn from_ledger<S: Store>(
    state: &AppState<S>,
    req: PurchaseRequest,
    refused: ApiError,
) -> Result<PurchaseOutcome, ApiError> {
    let Some(rid) = &req.request_id else {
        return Err(refused);
    };
    let ledger = &state.ledger;
    let unknown = |why: String| ApiError::Unavailable {
        detail: format!("{why}; retry with the same request id later"),
        outcome_unknown: true,
    };
    let db = match ledger.event(&req.event).await {
        Ok(Some(db)) => db,
        Ok(None) => return Err(refused),
        Err(e) => return Err(unknown(format!("the database did not answer ({e})"))),
    };
    let order = ledger
        .order_by_request(&req.event, &req.user, rid.as_str())
        .await
        .map_err(|e| unknown(format!("the database did not answer ({e})")))?;
    match order {
        Some(o) if o.quantity != req.quantity => Err(ApiError::IdempotencyConflict),
        // Only a closed ledger's word is final: before, a later confirm,
        // cancel or expiry may not have reached it, and a status read then
        // could go back on one the client was told.
        Some(o) if db.closed => Ok(PurchaseOutcome {
            result: Ok(Order::from_view(o)),
            replayed: true,
        }),
        None if db.closed => Err(match refused {
            ApiError::NotOnSale(why) => {
                ApiError::NotOnSale(format!("{why}; no order was made for request id {rid}"))
            }
            other => other,
        }),
        _ if state.quarantine.contains(&req.event) => Err(unknown(format!(
            "event {} is quarantined until an operator recovers it; the order of request id {rid} \
             is not final in the database yet",
            req.event
        ))),
        _ => Err(unknown(format!(
            "event {} is closing; the order of request id {rid} is not final in the database yet",
            req.event
        ))),
    }
}

/// The `event` label of purchases whose event does not exist (or was never named).
const UNKNOWN_EVENT: &str = "unknown";

fn respond(
    outcome: Result<PurchaseOutcome, ApiError>,
    meters: &Meters,
    event: &str,
    start: Instant,
) -> Response {
    let elapsed = start.elapsed().as_secs_f64();
    let event = meters.event(event);
    let (mut response, result, replayed) = match outcome {
        Ok(PurchaseOutcome {
            result: Ok(order),
            replayed,
        }) => {
            if !replayed {
                let path = if order.probes == 0 {
                    meters.fast()
                } else {
                    meters.probe()
                };
                path.record(elapsed);
                event.probe_depth.record(f64::from(order.probes));
                event.units.increment(u64::from(order.quantity));
                if order.pay_by.is_some() {
                    event.holds_created.increment(1);
                }
            }
            (
                (StatusCode::CREATED, Json(order)).into_response(),
                "ok",
                replayed,
            )
        }
        Ok(PurchaseOutcome {
            result: Err(refusal),
            replayed,
        }) => {
            if !replayed {
                meters.probe().record(elapsed);
            }
            let e = ApiError::from(refusal);
            let outcome = e.outcome();
            (e.into_response(), outcome, replayed)
        }
        Err(e) => {
            event.purchase(e.outcome());
            return e.into_response();
        }
    };
    event.purchase(if replayed { "replayed" } else { result });
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}
