//! `POST /v1/events/{id}/tokens` (admin): access tokens minted for a list
//! of users (presale codes), signed with the event's first key; and `PUT
//! /v1/events/{id}/token-keys` (admin): the event's keys rotated while it
//! sells (`engine::keys`).
//!
//! The checks and the signing are `domain::token::Grant`'s; this handler
//! reads the event's keys and answers. Nothing is written: a token is
//! stateless until a purchase consumes it at its user's home, so minting the
//! same users again answers the same tokens (the same allowance, not a new
//! one). Its body may name 10,000 users, past the default body limit, so
//! the route has a limit of its own ([`MINT_BODY_LIMIT`]); the admin token
//! is checked before any of it is read.

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::{post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::guard::Admin;
use super::{ApiError, ApiJson, AppState, events::event_id};
use crate::domain::ids::{EventId, UserId};
use crate::domain::token::{Grant, MAX_MINT_USERS, TokenAccess};
use crate::store::Store;

/// The largest mint body: the most users, each id of the longest, quoted
/// and pretty-printed on a line of its own (32 bytes spare an id), and the
/// rest: 1.6 MB.
pub(super) const MINT_BODY_LIMIT: usize = MAX_MINT_USERS * (UserId::MAX_LEN + 32) + 4096;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route(
            "/v1/events/{id}/tokens",
            post(mint::<S>).layer(DefaultBodyLimit::max(MINT_BODY_LIMIT)),
        )
        .route("/v1/events/{id}/token-keys", put(rotate_keys::<S>))
}

/// `PUT /v1/events/{id}/token-keys`. An unknown member is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"token_keys": ["new-key-0123456789abcdef", "old-key-0123456789abcdef"]}))]
pub(super) struct RotateKeys {
    /// The event's keys from now on: 1 or 2, each 16 to 128 printable ASCII
    /// characters without spaces. The first signs (a draw's winners'
    /// tokens, minted tokens); either verifies.
    #[schema(min_items = 1, max_items = 2)]
    token_keys: Vec<String>,
}

/// Rotates a `token` or `draw` event's keys while it sells.
#[utoipa::path(
    put, path = "/v1/events/{id}/token-keys", tag = "events", operation_id = "rotate_token_keys",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event (its `access` is `token` or `draw`)")),
    request_body = RotateKeys,
    responses(
        (status = 204, description = "The keys are replaced: this instance verifies with them now, every other within a second"),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::NotOnSale),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn rotate_keys<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RotateKeys>,
) -> Result<StatusCode, ApiError> {
    let event = event_id(id)?;
    let keys = TokenAccess {
        keys: body.token_keys,
    };
    state
        .engine
        .rotate_token_keys(&event, keys)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/events/{id}/tokens`. An unknown member is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"users": ["u-1001", "u-1002"], "allowance": 2, "expires_at_ms": 1900000000000_u64}))]
pub(super) struct MintTokens {
    /// The users to mint a token for, 1 to 10,000 (a user listed twice
    /// gets the same token twice).
    #[schema(min_items = 1, max_items = 10000)]
    users: Vec<UserId>,
    /// Units each token may buy in all.
    #[serde(deserialize_with = "super::whole::u32")]
    #[schema(minimum = 1, maximum = 1000)]
    allowance: u32,
    /// When the tokens expire, unix milliseconds, rounded down to the
    /// second (a token carries unix seconds); that second must be after now.
    #[serde(deserialize_with = "super::whole::u64")]
    #[schema(minimum = 0, maximum = 999999999999999_u64, format = Int64)]
    expires_at_ms: u64,
}

/// `200` of `POST /v1/events/{id}/tokens`: one token per user, in the
/// request's order.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Minted {
    tokens: Vec<MintedToken>,
}

/// One user's token.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct MintedToken {
    user_id: UserId,
    /// `v1.<user_id>.<allowance>.<expiry>.<mac>` (docs/API.md, "Access
    /// tokens"): the purchase's `access_token`.
    #[schema(max_length = 256)]
    token: String,
}

/// Mints access tokens for a `token` event's users (presale codes).
#[utoipa::path(
    post, path = "/v1/events/{id}/tokens", tag = "events", operation_id = "mint_tokens",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event (its `access` is `token`)")),
    request_body = MintTokens,
    responses(
        (status = 200, description = "One token per user, in the request's order, signed with the event's first key; nothing is stored", body = Minted),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn mint<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MintTokens>,
) -> Result<Json<Minted>, ApiError> {
    let event = event_id(id)?;
    let now_ms = state.engine.clock().now_ms();
    let grant = Grant::new(body.users, body.allowance, body.expires_at_ms, now_ms)
        .map_err(ApiError::invalid)?;
    let meta = state
        .engine
        .meta(&event)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    // 10,000 signatures take milliseconds (more in a debug build): off the
    // request threads.
    let minted = tokio::task::spawn_blocking(move || grant.mint(meta.spec.tokens.as_ref(), &event))
        .await
        .map_err(|e| ApiError::Internal(format!("minting failed: {e}")))?
        .map_err(ApiError::invalid)?;
    Ok(Json(Minted {
        tokens: minted
            .into_iter()
            .map(|(user_id, token)| MintedToken { user_id, token })
            .collect(),
    }))
}
