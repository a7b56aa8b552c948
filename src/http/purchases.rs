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

use super::{ApiError, ApiJson, AppState, events::event_id};
use crate::domain::ids::{RequestId, UserId};
use crate::engine::{PurchaseOutcome, PurchaseRequest};
use crate::metrics as m;
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new().route("/v1/events/{id}/purchases", post(purchase::<S>))
}

#[derive(Deserialize)]
struct PurchaseBody {
    user_id: String,
    quantity: u32,
    request_id: Option<String>,
}

/// The request id from the body or the `Idempotency-Key` header (they must agree).
fn request_id(headers: &HeaderMap, body: Option<String>) -> Result<Option<RequestId>, ApiError> {
    let header = headers
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_owned))
        .transpose()
        .map_err(|_| ApiError::invalid("Idempotency-Key must be ASCII"))?;
    let raw = match (header, body) {
        (Some(h), Some(b)) if h != b => {
            return Err(ApiError::invalid("Idempotency-Key and request_id differ"));
        }
        (h, b) => h.or(b),
    };
    raw.map(|r| RequestId::parse(r).map_err(ApiError::invalid))
        .transpose()
}

async fn purchase<S: Store>(
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
        let req = PurchaseRequest {
            user: UserId::parse(body.user_id).map_err(ApiError::invalid)?,
            quantity: body.quantity,
            request_id: request_id(&headers, body.request_id)?,
            event,
        };
        state.limits.check(&req.user)?;
        let event = req.event.clone();
        // A task of its own: if this handler is dropped (the client went
        // away, the request timeout fired), the purchase still ends.
        state
            .engine
            .purchase_detached(req)
            .await
            .map_err(|e| state.engine_error(&event, e))
    }
    .await;
    // Metric series are labelled only with events that exist, so requests for
    // made-up ids cannot grow /metrics without bound.
    let label = match &event_seen {
        Some(e) if outcome.is_ok() || state.engine.is_known(e) => e.as_str(),
        _ => UNKNOWN_EVENT,
    };
    respond(outcome, label, start)
}

/// The `event` label of purchases whose event does not exist (or was never named).
const UNKNOWN_EVENT: &str = "unknown";

fn respond(outcome: Result<PurchaseOutcome, ApiError>, event: &str, start: Instant) -> Response {
    let elapsed = start.elapsed().as_secs_f64();
    let (mut response, result, replayed) = match outcome {
        Ok(PurchaseOutcome {
            result: Ok(order),
            replayed,
        }) => {
            if !replayed {
                let path = if order.probes == 0 { "fast" } else { "probe" };
                metrics::histogram!(m::PURCHASE_DURATION, "path" => path).record(elapsed);
                metrics::histogram!(m::PROBE_DEPTH, "event" => event.to_owned())
                    .record(f64::from(order.probes));
                metrics::counter!(m::PURCHASED_UNITS, "event" => event.to_owned())
                    .increment(u64::from(order.quantity));
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
                metrics::histogram!(m::PURCHASE_DURATION, "path" => "probe").record(elapsed);
            }
            let e = ApiError::from(refusal);
            let outcome = e.outcome();
            (e.into_response(), outcome, replayed)
        }
        Err(e) => {
            let outcome = e.outcome();
            metrics::counter!(m::PURCHASES, "event" => event.to_owned(), "outcome" => outcome)
                .increment(1);
            return e.into_response();
        }
    };
    let outcome = if replayed { "replayed" } else { result };
    metrics::counter!(m::PURCHASES, "event" => event.to_owned(), "outcome" => outcome).increment(1);
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}
