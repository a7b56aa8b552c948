//! `/v1/webhooks`: the admin API of webhook subscriptions — create, list,
//! get, delete, rotate secrets, and resume one paused after failing
//! deliveries.
//!
//! Admin only (the `Admin` extractor, as every admin endpoint), and only
//! with order events on (`[outbox] enabled`): off, every call answers 404
//! `order-events-off`. Subscriptions are kept in the ledger (with those of
//! `[[outbox.webhooks]]`, which this API lists and resumes but does not
//! delete: the file owns them). Secrets are write-only: a view says how many
//! a subscription has, never what they are. Delivery is
//! `control::webhook`'s, on the relay leader.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::guard::Admin;
use super::{ApiError, ApiJson, AppState};
use crate::domain::model::rfc3339_ms;
use crate::domain::webhook::{self, MAX_SUBSCRIPTIONS};
use crate::ledger::{Created, LedgerError, ORIGIN_API, ORIGIN_CONFIG, Subscription};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/webhooks", get(list::<S>).post(create::<S>))
        .route("/v1/webhooks/{id}", get(view::<S>).delete(delete::<S>))
        .route("/v1/webhooks/{id}/resume", post(resume::<S>))
        .route("/v1/webhooks/{id}/secrets", put(rotate::<S>))
}

/// `POST /v1/webhooks`. An unknown member is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "payments", "url": "http://payments.internal/hooks/shardstock", "types": ["order.created", "order.confirmed"], "secrets": ["whsec-0123456789abcdef"]}))]
pub(super) struct CreateWebhook {
    /// 1 to 64 of `A-Z a-z 0-9 _ -`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    id: String,
    /// `http://…` or `https://…`, where each change is POSTed (the
    /// receiver's certificate checked against the system's roots and
    /// `[outbox] webhook_ca_file`).
    #[schema(
        max_length = 2048,
        pattern = "^https?://[A-Za-z0-9._~%!$&'()*+,;=:@-]+([/?#][^ ]*)?$"
    )]
    url: String,
    /// The change types delivered (absent or empty: every type).
    #[serde(default)]
    #[schema(max_items = 7, value_type = Vec<ChangeType>)]
    types: Vec<String>,
    /// One signing secret, or two while one is rotated.
    #[schema(min_items = 1, max_items = 2, value_type = Vec<Secret>)]
    secrets: Vec<String>,
}

/// A change type (the document's name for the strings `types` takes).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(super) enum ChangeType {
    #[schema(rename = "order.created")]
    OrderCreated,
    #[schema(rename = "order.confirmed")]
    OrderConfirmed,
    #[schema(rename = "order.cancelled")]
    OrderCancelled,
    #[schema(rename = "order.expired")]
    OrderExpired,
    #[schema(rename = "order.voided")]
    OrderVoided,
    #[schema(rename = "order.restored")]
    OrderRestored,
    #[schema(rename = "event.closed")]
    EventClosed,
}

/// A signing secret: 16 to 256 characters.
#[derive(utoipa::ToSchema)]
#[schema(min_length = 16, max_length = 256)]
#[allow(dead_code)]
pub(super) struct Secret(String);

/// `PUT /v1/webhooks/{id}/secrets`: the secrets that sign from now on.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"secrets": ["whsec-0123456789abcdef", "whsec-fedcba9876543210"]}))]
pub(super) struct Rotate {
    /// One signing secret, or two while one is rotated.
    #[schema(min_items = 1, max_items = 2, value_type = Vec<Secret>)]
    secrets: Vec<String>,
}

/// A subscription as the API shows it (its secrets never).
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct WebhookView {
    id: String,
    url: String,
    /// The change types delivered; empty: every type.
    types: Vec<String>,
    /// How many signing secrets it has (each delivery carries a `v1` by each).
    secrets: usize,
    /// `config` (`[[outbox.webhooks]]`) or `api`.
    origin: String,
    /// `active`, or `paused` after failing deliveries (resume it).
    status: String,
    #[schema(format = DateTime)]
    created_at: String,
    /// When it was paused.
    #[schema(format = DateTime)]
    paused_at: Option<String>,
    /// Why it was paused: the failures and the last one.
    paused_reason: Option<String>,
    /// Every change up to this `seq` is delivered (or not of its types).
    cursor: i64,
}

/// Every subscription.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct WebhookList {
    webhooks: Vec<WebhookView>,
}

fn unavailable(e: LedgerError) -> ApiError {
    tracing::warn!(error = %e, "ledger failed");
    ApiError::Unavailable {
        detail: "the database is unreachable".into(),
        outcome_unknown: false,
    }
}

fn enabled<S: Store>(state: &AppState<S>) -> Result<(), ApiError> {
    if state.ledger.outbox() {
        Ok(())
    } else {
        Err(ApiError::OrderEventsOff)
    }
}

async fn show<S: Store>(state: &AppState<S>, sub: Subscription) -> Result<WebhookView, ApiError> {
    let cursor = state
        .ledger
        .outbox_cursor(&crate::ledger::webhook_target(&sub.id))
        .await
        .map_err(unavailable)?;
    Ok(WebhookView {
        status: if sub.paused_ms.is_some() {
            "paused"
        } else {
            "active"
        }
        .into(),
        created_at: rfc3339_ms::format(sub.created_ms),
        paused_at: sub.paused_ms.map(rfc3339_ms::format),
        paused_reason: sub.paused_reason,
        secrets: sub.secrets.len(),
        id: sub.id,
        url: sub.url,
        types: sub.types,
        origin: sub.origin,
        cursor,
    })
}

async fn find<S: Store>(state: &AppState<S>, id: &str) -> Result<Subscription, ApiError> {
    state
        .ledger
        .webhook(id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| ApiError::UnknownWebhook(id.to_owned()))
}

/// Creates a subscription; it gets the changes made from now on (older
/// ones: `GET /v1/events/{id}/changes`).
#[utoipa::path(
    post, path = "/v1/webhooks", tag = "webhooks", operation_id = "create_webhook",
    security(("bearer" = [])),
    request_body = CreateWebhook,
    responses(
        (status = 201, description = "The subscription, active", body = WebhookView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NoWebhooks),
        (status = 409, response = super::openapi::WebhookConflict),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn create<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    ApiJson(body): ApiJson<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookView>), ApiError> {
    webhook::check(&body.id, &body.url, &body.types, &body.secrets)
        .map_err(|(field, reason)| ApiError::invalid(format!("{field} {reason}")))?;
    enabled(&state)?;
    let count = state.ledger.webhooks().await.map_err(unavailable)?.len();
    if count >= MAX_SUBSCRIPTIONS {
        return Err(ApiError::WebhookConflict(format!(
            "there are {count} webhook subscriptions, the most kept ({MAX_SUBSCRIPTIONS}); delete one first"
        )));
    }
    let sub = Subscription {
        id: body.id,
        url: body.url,
        types: body.types,
        secrets: body.secrets,
        origin: ORIGIN_API.into(),
        created_ms: state.engine.clock().now_ms(),
        paused_ms: None,
        paused_reason: None,
    };
    match state
        .ledger
        .create_webhook(&sub)
        .await
        .map_err(unavailable)?
    {
        Created::Created => {}
        Created::Exists => {
            return Err(ApiError::WebhookConflict(format!(
                "webhook subscription {:?} exists",
                sub.id
            )));
        }
    }
    Ok((StatusCode::CREATED, Json(show(&state, sub).await?)))
}

/// Every subscription, with its status and cursor.
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "webhooks", operation_id = "list_webhooks",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every subscription, by id", body = WebhookList),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NoWebhooks),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn list<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
) -> Result<Json<WebhookList>, ApiError> {
    enabled(&state)?;
    let mut webhooks = Vec::new();
    for sub in state.ledger.webhooks().await.map_err(unavailable)? {
        webhooks.push(show(&state, sub).await?);
    }
    Ok(Json(WebhookList { webhooks }))
}

/// One subscription, with its status and cursor.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "view_webhook",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The subscription")),
    responses(
        (status = 200, description = "The subscription", body = WebhookView),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownWebhook),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn view<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    enabled(&state)?;
    let sub = find(&state, &id).await?;
    Ok(Json(show(&state, sub).await?))
}

/// Deletes a subscription made by this API, and its cursor.
#[utoipa::path(
    delete, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "delete_webhook",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The subscription")),
    responses(
        (status = 204, description = "Deleted: no change is delivered to it any more"),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownWebhook),
        (status = 409, response = super::openapi::WebhookConflict),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn delete<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    enabled(&state)?;
    let sub = find(&state, &id).await?;
    if sub.origin == ORIGIN_CONFIG {
        return Err(ApiError::WebhookConflict(format!(
            "webhook subscription {id:?} is declared in the configuration ([[outbox.webhooks]]); remove it there"
        )));
    }
    if !state
        .ledger
        .delete_webhook(&id)
        .await
        .map_err(unavailable)?
    {
        return Err(ApiError::UnknownWebhook(id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Resumes a paused subscription from its cursor (a no-op on an active one).
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/resume", tag = "webhooks", operation_id = "resume_webhook",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The subscription")),
    responses(
        (status = 200, description = "The subscription, active: delivery resumes within a second", body = WebhookView),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownWebhook),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn resume<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    enabled(&state)?;
    if !state
        .ledger
        .resume_webhook(&id)
        .await
        .map_err(unavailable)?
    {
        return Err(ApiError::UnknownWebhook(id));
    }
    tracing::info!(subscription = %id, "webhook subscription resumed");
    let sub = find(&state, &id).await?;
    Ok(Json(show(&state, sub).await?))
}

/// Replaces a subscription's secrets: list the new one beside the old (each
/// delivery then carries a `v1` by both), move the receiver to the new one,
/// then send the new one alone.
#[utoipa::path(
    put, path = "/v1/webhooks/{id}/secrets", tag = "webhooks", operation_id = "rotate_webhook_secrets",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The subscription")),
    request_body = Rotate,
    responses(
        (status = 200, description = "The subscription: the next delivery is signed by these secrets", body = WebhookView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownWebhook),
        (status = 409, response = super::openapi::WebhookConflict),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn rotate<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Rotate>,
) -> Result<Json<WebhookView>, ApiError> {
    webhook::check("x", "http://x", &[], &body.secrets)
        .map_err(|(field, reason)| ApiError::invalid(format!("{field} {reason}")))?;
    enabled(&state)?;
    let sub = find(&state, &id).await?;
    if sub.origin == ORIGIN_CONFIG {
        return Err(ApiError::WebhookConflict(format!(
            "webhook subscription {id:?} is declared in the configuration ([[outbox.webhooks]]); rotate its secrets there"
        )));
    }
    if !state
        .ledger
        .set_webhook_secrets(&id, &body.secrets)
        .await
        .map_err(unavailable)?
    {
        return Err(ApiError::UnknownWebhook(id));
    }
    tracing::info!(subscription = %id, secrets = body.secrets.len(), "webhook secrets rotated");
    let sub = find(&state, &id).await?;
    Ok(Json(show(&state, sub).await?))
}
