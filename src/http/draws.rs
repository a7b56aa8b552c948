//! The `draw` access mode's endpoints: entries (`POST`, anyone), an
//! entrant's standing and a winner's token (a waiting user's offer and its
//! token once the line reached it; the offer's purchase), the draw (`POST`, admin; the
//! leader also draws at `draw_at`), the draw's record and, once drawn, the
//! entrants page by page so anyone can recompute it (docs/API.md, "Draws").
//!
//! The checks, the store steps and the draw are the engine's
//! (`engine::draw`); the create body's `draw` object is checked here and in
//! `domain::draw::DrawSpec`, each bad field a 400 naming it.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::guard::Admin;
use super::{ApiError, ApiJson, AppState, events::event_id};
use crate::domain::draw::{
    DEFAULT_BUY_SECONDS, DrawSpec, MAX_ENTRIES_PAGE, OfferStanding, Standing,
};
use crate::domain::ids::{EventId, UserId};
use crate::domain::model::OrderView;
use crate::domain::offer::DEFAULT_OFFER_SECONDS;
use crate::domain::token::Access;
use crate::domain::token::MAX_TOKEN_LEN;
use crate::engine::DrawView;
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route(
            "/v1/events/{id}/entries",
            post(enter::<S>).get(entrants::<S>),
        )
        .route("/v1/events/{id}/entries/{user}", get(entry::<S>))
        .route(
            "/v1/events/{id}/entries/{user}/offer",
            post(claim_offer::<S>),
        )
        .route("/v1/events/{id}/draw", post(draw::<S>).get(view::<S>))
}

/// The create body's `draw` object (`draw` events only). An unknown member
/// is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"entries_until": "2030-05-01T10:00:00Z", "draw_at": "2030-05-01T10:05:00Z", "oversubscription": 1.2, "allowance": 1, "buy_seconds": 3600}))]
pub(super) struct CreateDraw {
    /// Entries are refused from then on (RFC 3339); the draw may run. Required.
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = String, format = DateTime)]
    entries_until: Option<i64>,
    /// The leader draws then (RFC 3339, not before `entries_until`);
    /// absent: only `POST /v1/events/{id}/draw` draws.
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    draw_at: Option<i64>,
    /// Winners per unit of stock, 1.0 to 10.0 (default 1.0), read to the
    /// thousandth: `ceil(stock × oversubscription)` win.
    #[schema(minimum = 1.0, maximum = 10.0)]
    oversubscription: Option<f64>,
    /// Units a winner's token buys (default 1).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 1000)]
    allowance: Option<u32>,
    /// A winner's token is valid this long after the draw, 60 s to 7 days
    /// (default 3600).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 60, maximum = 604800)]
    buy_seconds: Option<u32>,
    /// A waiting user's offer (a unit that came back, offered in line
    /// order) is open this long, 10 s to 1 day (default 600).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 10, maximum = 86400)]
    offer_seconds: Option<u32>,
}

/// The spec's draw from the create body's `access` and `draw`.
pub(super) fn draw_spec(
    access: Access,
    draw: Option<CreateDraw>,
) -> Result<Option<DrawSpec>, ApiError> {
    match (access, draw) {
        (Access::Draw, None) => Err(ApiError::invalid(
            "draw: required when \"access\" is \"draw\"",
        )),
        (Access::Open | Access::Token, Some(_)) => {
            Err(ApiError::invalid("draw: only with \"access\": \"draw\""))
        }
        (Access::Open | Access::Token, None) => Ok(None),
        (Access::Draw, Some(d)) => {
            let until = d
                .entries_until
                .ok_or_else(|| ApiError::invalid("draw.entries_until: required"))?;
            DrawSpec::new(
                until,
                d.draw_at,
                d.oversubscription.unwrap_or(1.0),
                d.allowance.unwrap_or(1),
                d.buy_seconds.unwrap_or(DEFAULT_BUY_SECONDS),
                d.offer_seconds.unwrap_or(DEFAULT_OFFER_SECONDS),
            )
            .map(Some)
            .map_err(ApiError::invalid)
        }
    }
}

/// `POST /v1/events/{id}/entries`. An unknown member is refused.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user_id": "u-1001"}))]
pub(super) struct Enter {
    user_id: UserId,
}

/// An entrant's standing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Entry {
    user_id: UserId,
    /// `entered` (not drawn yet), `won`, `waiting`, then, once the line
    /// reached the user, `offered`, `bought` (with the offer) or `passed`
    /// (not bought in time, or the sale closed first).
    status: EntryState,
    /// `waiting`, `offered`, `bought`, `passed`: the place in the waiting
    /// order (1 first).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    position: Option<u64>,
    /// `won`: the access token to buy with (`access_token` of a purchase),
    /// the same each time it is asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 256)]
    access_token: Option<String>,
    /// `won`: the token's expiry (RFC 3339): the draw's time plus `buy_seconds`.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    buy_until: Option<i64>,
    /// `offered`: the offer token to buy the unit with
    /// (`POST /v1/events/{id}/entries/{user}/offer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 256)]
    offer_token: Option<String>,
    /// `offered`: the offer's deadline (RFC 3339); then it passes to the
    /// next user in line.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    offer_until: Option<i64>,
    /// `bought`: the order bought with the offer.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<String>,
}

/// Where an entrant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum EntryState {
    Entered,
    Won,
    Waiting,
    Offered,
    Bought,
    Passed,
}

impl Entry {
    fn entered(user_id: UserId) -> Self {
        Self {
            user_id,
            status: EntryState::Entered,
            position: None,
            access_token: None,
            buy_until: None,
            offer_token: None,
            offer_until: None,
            order_id: None,
        }
    }
}

/// Enters a user in a `draw` event's draw.
#[utoipa::path(
    post, path = "/v1/events/{id}/entries", tag = "draws", operation_id = "enter_draw",
    params(("id" = EventId, Path, description = "The event (its `access` is `draw`)")),
    request_body = Enter,
    responses(
        (status = 201, description = "Entered now", body = Entry),
        (status = 200, description = "Entered before: the same answer", body = Entry),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::EntryRefused),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn enter<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Enter>,
) -> Result<(StatusCode, Json<Entry>), ApiError> {
    let event = event_id(id)?;
    super::trace::record_user(body.user_id.as_str());
    let new = state
        .engine
        .enter(&event, &body.user_id)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(Entry::entered(body.user_id))))
}

/// An entrant's standing; a winner's access token.
#[utoipa::path(
    get, path = "/v1/events/{id}/entries/{user}", tag = "draws", operation_id = "view_entry",
    params(
        ("id" = EventId, Path, description = "The event (its `access` is `draw`)"),
        ("user" = UserId, Path, description = "The entrant"),
    ),
    responses(
        (status = 200, description = "`entered` before the draw; `won` with the access token, or `waiting` with a position, after it", body = Entry),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::NotEntered),
        (status = 409, response = super::openapi::NotADraw),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn entry<S: Store>(
    State(state): State<AppState<S>>,
    Path((id, user)): Path<(String, String)>,
) -> Result<Json<Entry>, ApiError> {
    let event = event_id(id)?;
    let user = UserId::parse(user).map_err(ApiError::invalid)?;
    super::trace::record_user(user.as_str());
    let s = state
        .engine
        .entry_status(&event, &user)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    let mut entry = Entry::entered(s.user);
    match s.standing {
        Standing::Entered => {}
        Standing::Won => {
            entry.status = EntryState::Won;
            if let Some((token, until)) = s.token {
                entry.access_token = Some(token);
                entry.buy_until = Some(until);
            }
        }
        Standing::Waiting(p) => {
            entry.status = EntryState::Waiting;
            entry.position = Some(p);
            match s.offer {
                None | Some(OfferStanding::Waiting) => {}
                Some(OfferStanding::Offered { token, deadline_ms }) => {
                    entry.status = EntryState::Offered;
                    entry.offer_token = Some(token);
                    entry.offer_until = Some(deadline_ms);
                }
                Some(OfferStanding::Bought { order }) => {
                    entry.status = EntryState::Bought;
                    entry.order_id = Some(order);
                }
                Some(OfferStanding::Passed) => entry.status = EntryState::Passed,
            }
        }
    }
    Ok(Json(entry))
}

/// `POST /v1/events/{id}/entries/{user}/offer`. An unknown member is refused.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"offer_token": "o1.17.1777629900000.3q2-7w…"}))]
pub(super) struct ClaimOffer {
    /// The `offer_token` of the user's entry, while `offered`.
    #[schema(max_length = 256)]
    offer_token: String,
}

/// Buys a waiting user's offer: one unit, confirmed at once (no hold).
#[utoipa::path(
    post, path = "/v1/events/{id}/entries/{user}/offer", tag = "draws", operation_id = "buy_offer",
    params(
        ("id" = EventId, Path, description = "The event (its `access` is `draw`)"),
        ("user" = UserId, Path, description = "The waiting user the offer was made to"),
    ),
    request_body = ClaimOffer,
    responses(
        (status = 201, description = "Bought now", body = OrderView),
        (status = 200, description = "Bought before with this offer: the same order", body = OrderView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 403, response = super::openapi::OfferRefused),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::OfferRefused),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn claim_offer<S: Store>(
    State(state): State<AppState<S>>,
    Path((id, user)): Path<(String, String)>,
    ApiJson(body): ApiJson<ClaimOffer>,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    let event = event_id(id)?;
    let user = UserId::parse(user).map_err(ApiError::invalid)?;
    super::trace::record_user(user.as_str());
    if body.offer_token.len() > MAX_TOKEN_LEN {
        return Err(ApiError::invalid(format!(
            "offer_token: at most {MAX_TOKEN_LEN} bytes"
        )));
    }
    let (order, replay) = state
        .engine
        .claim_offer(&event, &user, &body.offer_token)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    let status = if replay {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(order)))
}

/// Draws a `draw` event (once: asked again, the same result).
#[utoipa::path(
    post, path = "/v1/events/{id}/draw", tag = "draws", operation_id = "draw",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event (its `access` is `draw`)")),
    responses(
        (status = 200, description = "The draw: the seed revealed, the entries and winners; drawing again answers the same", body = DrawView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::DrawRefused),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn draw<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<DrawView>, ApiError> {
    let event = event_id(id)?;
    // Its own task: a client that goes away must not leave it half done
    // (a half-done draw is redone to the same result, but later).
    let engine = state.engine.clone();
    let task = {
        let event = event.clone();
        tokio::spawn(async move { engine.draw(&event).await })
    };
    let view = task
        .await
        .map_err(|e| ApiError::Internal(format!("the draw task failed: {e}")))?
        .map_err(|e| state.engine_error(&event, e))?;
    Ok(Json(view))
}

/// The draw: the seed's hash, the entries, and once drawn the seed and result.
#[utoipa::path(
    get, path = "/v1/events/{id}/draw", tag = "draws", operation_id = "view_draw",
    params(("id" = EventId, Path, description = "The event (its `access` is `draw`)")),
    responses(
        (status = 200, description = "The draw; `seed`, `winners` and `drawn_at` once drawn", body = DrawView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::NotADraw),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<DrawView>, ApiError> {
    let event = event_id(id)?;
    let view = state
        .engine
        .draw_view(&event)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    Ok(Json(view))
}

/// `?after=<user>&limit=<1..=10000>`: the document's; the handler reads
/// the pairs itself, so an unknown parameter is refused, naming it.
#[allow(dead_code)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EntrantsPage {
    /// The last user id of the previous page; absent: from the first.
    #[param(value_type = Option<UserId>)]
    after: Option<String>,
    /// Entrants at most (default 1000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
}

/// A page of a drawn event's entrants.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Entrants {
    /// Ascending by user id (byte order).
    entrants: Vec<UserId>,
    /// The `after` of the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<UserId>,
}

/// A drawn event's entrants, by user id, so anyone can recompute the draw.
#[utoipa::path(
    get, path = "/v1/events/{id}/entries", tag = "draws", operation_id = "list_entrants",
    params(("id" = EventId, Path, description = "The event (its `access` is `draw`)"), EntrantsPage),
    responses(
        (status = 200, description = "A page of the entrants", body = Entrants),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::NotDrawn),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn entrants<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Json<Entrants>, ApiError> {
    let event = event_id(id)?;
    let mut after = None;
    let mut limit = 1000;
    for (k, v) in query {
        match k.as_str() {
            "after" => {
                after =
                    Some(UserId::parse(v).map_err(|e| ApiError::invalid(format!("after: {e}")))?)
            }
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=MAX_ENTRIES_PAGE).contains(l))
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "limit: must be a whole number from 1 to {MAX_ENTRIES_PAGE}, not {v:?}"
                        ))
                    })?
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} (after, limit)"
                )));
            }
        }
    }
    let page = state
        .engine
        .entrants(&event, after.as_ref(), limit)
        .await
        .map_err(|e| state.engine_error(&event, e))?;
    let next_after = (page.len() == limit)
        .then(|| page.last().cloned())
        .flatten();
    Ok(Json(Entrants {
        entrants: page,
        next_after,
    }))
}
