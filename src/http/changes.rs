//! `GET /v1/events/{id}/changes?after=SEQ&limit=N`: an event's order changes
//! from the ledger's outbox, in sequence order, with the cursor of the next
//! page. The way a consumer replays, or catches up after an outage.
//!
//! Only with order events on (`[outbox] enabled`): off, it answers 404
//! `order-events-off`, naming the setting.
//!
//! Admin only, as the audit: the feed carries every buyer's orders (a buyer's
//! own lookup is `GET /v1/events/{id}/orders?user_id=…`).

use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::guard::Admin;
use super::{ApiError, AppState, events::event_id};
use crate::domain::ids::EventId;
use crate::store::Store;

/// The most changes one page holds.
pub const MAX_LIMIT: i64 = 1_000;
/// A page's size when `limit` is not given.
pub const DEFAULT_LIMIT: i64 = 100;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new().route("/v1/events/{id}/changes", get(changes::<S>))
}

/// `?after=SEQ&limit=N`; an unknown parameter is refused, by name.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct Page {
    /// Changes after this sequence number (0, the default: from the start).
    #[param(value_type = Option<i64>, minimum = 0)]
    after: Option<String>,
    /// At most this many changes (1 to 1,000; 100 by default).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

impl Page {
    /// The page a query asks for; an unknown parameter is refused by name
    /// (axum's own rejection would say only "Bad Request").
    fn from_query(query: Vec<(String, String)>) -> Result<Self, ApiError> {
        let mut page = Page {
            after: None,
            limit: None,
        };
        for (name, value) in query {
            match name.as_str() {
                "after" => page.after = Some(value),
                "limit" => page.limit = Some(value),
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter {other:?} (expected after, limit)"
                    )));
                }
            }
        }
        Ok(page)
    }

    /// `(after, limit)`, each checked, the field named when it is wrong.
    fn bounds(&self) -> Result<(i64, i64), ApiError> {
        let after = match &self.after {
            None => 0,
            Some(raw) => raw.parse::<i64>().ok().filter(|a| *a >= 0).ok_or_else(|| {
                ApiError::invalid(format!("after must be a whole number ≥ 0, not {raw:?}"))
            })?,
        };
        let limit = match &self.limit {
            None => DEFAULT_LIMIT,
            Some(raw) => raw
                .parse::<i64>()
                .ok()
                .filter(|l| (1..=MAX_LIMIT).contains(l))
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "limit must be a whole number from 1 to {MAX_LIMIT}, not {raw:?}"
                    ))
                })?,
        };
        Ok((after, limit))
    }
}

/// One change of an order (or of the event), as the outbox has it.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct ChangeView {
    /// Its place in the deployment's sequence: rising, with gaps.
    seq: i64,
    /// `<subject>:<type>`: stable, to deduplicate by (a change may be delivered twice).
    id: String,
    /// `order.created`, `order.confirmed`, `order.cancelled`, `order.expired`,
    /// `order.voided` (the order never existed: its saga gave its takes back),
    /// `order.restored` (an `order.voided` taken back: the order stands) or
    /// `event.closed`.
    #[serde(rename = "type")]
    kind: String,
    #[schema(value_type = EventId)]
    event_id: String,
    /// The order id (the event id for `event.closed`).
    subject: String,
    /// When it happened (unix ms).
    at_ms: i64,
    /// The change's body: `order_id`, `user_id`, `quantity`, and `pay_by_ms`
    /// for a hold's `order.created` (and `release_id`, `release_order`,
    /// `pool` on a release's line); the final counts for `event.closed`.
    #[schema(value_type = Object)]
    payload: serde_json::Value,
}

/// A page of changes.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Changes {
    #[schema(value_type = EventId)]
    event_id: EventId,
    /// Oldest first.
    changes: Vec<ChangeView>,
    /// `after` for the next page: the last change's `seq` (the request's
    /// `after` when the page is empty).
    next: i64,
}

/// An event's order changes after a sequence number.
#[utoipa::path(
    get, path = "/v1/events/{id}/changes", tag = "events", operation_id = "event_changes",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event"), Page),
    responses(
        (status = 200, description = "The changes after `after`, oldest first, with the next page's cursor", body = Changes),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NoChanges),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn changes<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Json<Changes>, ApiError> {
    let event = event_id(id)?;
    let (after, limit) = Page::from_query(query)?.bounds()?;
    if !state.ledger.outbox() {
        return Err(ApiError::OrderEventsOff);
    }
    let unavailable = |e: crate::ledger::LedgerError| {
        tracing::warn!(error = %e, "ledger failed");
        ApiError::Unavailable {
            detail: "the database is unreachable".into(),
            outcome_unknown: false,
        }
    };
    if state
        .ledger
        .event(&event)
        .await
        .map_err(unavailable)?
        .is_none()
    {
        return Err(ApiError::UnknownEvent(event.to_string()));
    }
    let changes: Vec<ChangeView> = state
        .ledger
        .changes(Some(event.as_str()), after, limit)
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|c| ChangeView {
            seq: c.seq,
            id: c.change_id,
            kind: c.kind,
            event_id: c.event_id,
            subject: c.subject,
            at_ms: c.at_ms,
            payload: c.payload,
        })
        .collect();
    let next = changes.last().map_or(after, |c| c.seq);
    Ok(Json(Changes {
        event_id: event,
        changes,
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(after: Option<&str>, limit: Option<&str>) -> Page {
        Page {
            after: after.map(str::to_owned),
            limit: limit.map(str::to_owned),
        }
    }

    #[test]
    fn a_page_names_the_field_it_refuses() {
        assert_eq!(page(None, None).bounds().unwrap(), (0, DEFAULT_LIMIT));
        assert_eq!(page(Some("7"), Some("1000")).bounds().unwrap(), (7, 1000));
        for (p, field) in [
            (page(Some("-1"), None), "after"),
            (page(Some("x"), None), "after"),
            (page(None, Some("0")), "limit"),
            (page(None, Some("1001")), "limit"),
            (page(None, Some("")), "limit"),
        ] {
            let detail = p.bounds().unwrap_err().to_string();
            assert!(detail.starts_with(field), "{detail}");
        }
        let unknown = Page::from_query(vec![("limt".into(), "5".into())]);
        assert!(unknown.err().unwrap().to_string().contains("\"limt\""));
    }
}
