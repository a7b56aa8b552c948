//! `/v1/events`: create (admin), list, view, close (admin), audit (admin).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::DrawProblem;
use super::guard::Admin;
use super::{ApiError, ApiJson, AppState};
use crate::control::ControlError;
use crate::control::audit::Audit;
use crate::control::flusher::Flusher;
use crate::control::lifecycle;
use crate::domain::ids::EventId;
use crate::domain::model::{BucketCount, BucketRange, DEFAULT_MAX_PER_ORDER, EventSpec};
use crate::domain::token::{Access, TokenAccess};
use crate::engine::{EngineError, EventView};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/events", get(list::<S>).post(create::<S>))
        .route(
            "/v1/events/{id}",
            get(view::<S>).delete(super::archive::archive::<S>),
        )
        .route("/v1/events/{id}/close", post(close::<S>))
        .route("/v1/events/{id}/buckets", put(reshard::<S>))
        .route("/v1/events/{id}/rebalance", post(rebalance::<S>))
        .route("/v1/events/{id}/audit", get(audit::<S>))
}

/// `POST /v1/events`. An unknown member is refused, naming it (a typo such
/// as `per_user_limt` must not create an event without its limit).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "sneaker-42", "stock": 10000, "buckets": 16, "per_user_limit": 2, "max_per_order": 2}))]
pub(super) struct CreateEvent {
    #[schema(value_type = EventId)]
    id: String,
    #[serde(deserialize_with = "super::whole::u64")]
    #[schema(maximum = 9007199254740992_u64)]
    stock: u64,
    /// A count (1..=1024), or an adaptive count: `"auto"` (1 to 256) or
    /// `{"min": .., "max": ..}`; the event starts at the minimum and the
    /// rebalancer's leader reshards it within the bounds as demand and
    /// stock change.
    #[serde(deserialize_with = "super::whole::buckets")]
    #[schema(value_type = BucketsDoc)]
    buckets: BucketCount,
    /// Units one user may hold at most; absent: no limit.
    // The whole u32 range is accepted: `int32`'s implied maximum (2^31 - 1)
    // was narrower than the service (schemathesis sent 2^31 and saw 201).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 4294967295_u64, format = Int64)]
    per_user_limit: Option<u32>,
    /// Units one purchase may take at most (default 10).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 1000)]
    max_per_order: Option<u32>,
    /// The sale opens (RFC 3339); absent: on sale at once.
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    starts_at: Option<i64>,
    /// The sale ends (RFC 3339); absent: no end.
    #[serde(default, with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    ends_at: Option<i64>,
    /// Purchases are holds: the buyer confirms within this many seconds
    /// (`POST /v1/orders/{id}/confirm`) or the units go back on sale.
    /// Absent: purchases are confirmed at once.
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 86400)]
    hold_seconds: Option<u32>,
    /// Who may buy: `open` (default: anyone), `token` (a purchase
    /// carries an `access_token` signed with one of `token_keys`:
    /// docs/API.md, "Access tokens"), or `draw` (users enter a draw; its
    /// winners buy with the tokens it gives them: docs/API.md, "Draws").
    #[serde(default)]
    access: Access,
    /// `token` and `draw` events only: one HMAC-SHA256 key, or two while
    /// rotating (16 to 128 printable ASCII characters, no spaces). A token
    /// signed by either verifies; a draw signs with the first.
    #[schema(min_items = 1, max_items = 2)]
    token_keys: Option<Vec<String>>,
    /// `draw` events only (and required there): the entry window and the
    /// draw's settings.
    draw: Option<super::draws::CreateDraw>,
}

/// The spec's tokens from the body's `access` and `token_keys`.
fn tokens(access: Access, keys: Option<Vec<String>>) -> Result<Option<TokenAccess>, ApiError> {
    match (access, keys) {
        (Access::Open, None) => Ok(None),
        (Access::Open, Some(_)) => Err(ApiError::invalid(
            "token_keys: only with \"access\": \"token\"",
        )),
        (Access::Token | Access::Draw, None) => Err(ApiError::invalid(
            "token_keys: required when \"access\" is \"token\" or \"draw\"",
        )),
        (Access::Token | Access::Draw, Some(keys)) => {
            let t = TokenAccess { keys };
            t.validate()
                .map_err(|e| ApiError::invalid(format!("token_keys: {e}")))?;
            Ok(Some(t))
        }
    }
}

/// How the published document describes `buckets` (parsed by
/// `whole::buckets`, whose errors name the field): one of a count, `"auto"`,
/// or a [`BucketRange`].
pub(super) struct BucketsDoc;

impl utoipa::PartialSchema for BucketsDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use crate::domain::model::MAX_BUCKETS;
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Ref, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .maximum(Some(MAX_BUCKETS)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["auto"])),
            )
            .item(Ref::from_schema_name("BucketRange"))
            .into()
    }
}

impl utoipa::ToSchema for BucketsDoc {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("BucketRange".into(), BucketRange::schema()));
    }
}

/// Parses an event id from the path (a bad charset can never name an event).
pub(super) fn event_id(raw: String) -> Result<EventId, ApiError> {
    let id = EventId::parse(raw).map_err(ApiError::invalid)?;
    super::trace::record_event(id.as_str());
    Ok(id)
}

impl<S: Store> AppState<S> {
    pub(super) fn control_error(&self, event: &EventId, e: ControlError) -> ApiError {
        match e {
            ControlError::Engine(e) => self.engine_error(event, e),
            ControlError::Exists(id) => ApiError::EventExists(id.to_string()),
            ControlError::Busy(why) => ApiError::TryAgain(why),
            ControlError::HeldPool { event, release } => ApiError::HeldPool {
                event: event.to_string(),
                release: release.to_string(),
            },
            ControlError::WaitingList(_) => ApiError::Draw(DrawProblem::WaitingList, e.to_string()),
            ControlError::Ledger(e) => {
                tracing::warn!(error = %e, "ledger failed");
                ApiError::Unavailable {
                    detail: "the database is unreachable".into(),
                    outcome_unknown: false,
                }
            }
            ControlError::TokenEvent(_) => ApiError::Unavailable {
                detail: e.to_string(),
                outcome_unknown: false,
            },
            ControlError::TokenRecord { .. } => {
                tracing::error!(error = %e, "reshard stopped");
                ApiError::Internal(e.to_string())
            }
            ControlError::Flush(e) => {
                tracing::warn!(error = %e, "flushing failed");
                ApiError::Unavailable {
                    detail: format!("flushing to the database failed: {e}"),
                    outcome_unknown: false,
                }
            }
        }
    }

    /// Runs a long admin operation (a close, a reshard) as its own task: a
    /// client that goes away or the request timeout must not leave it half
    /// done. Past [`AppState::admin_wait`] the answer is `503 try-again` while
    /// the operation goes on; every step is idempotent, so asking again finds
    /// it done (or joins and finishes it).
    pub(super) async fn on_its_own<T: Send + 'static>(
        &self,
        event: &EventId,
        what: &str,
        op: impl Future<Output = Result<T, ControlError>> + Send + 'static,
    ) -> Result<T, ApiError> {
        let task = tokio::spawn(op);
        match tokio::time::timeout(self.admin_wait, task).await {
            Ok(Ok(done)) => done.map_err(|e| self.control_error(event, e)),
            Ok(Err(e)) => Err(ApiError::Internal(format!("the {what} task failed: {e}"))),
            Err(_) => Err(ApiError::TryAgain(format!(
                "the {what} of {event} is still running; ask again to see it finish"
            ))),
        }
    }

    /// The event, or its final view once closed.
    pub(super) async fn event_view(&self, event: &EventId) -> Result<EventView, ApiError> {
        match self.engine.view(event).await {
            Ok(view) if view.status != "closed" => Ok(view),
            Ok(_) | Err(EngineError::UnknownEvent(_)) if !self.quarantine.contains(event) => {
                lifecycle::final_view(&self.engine, &self.ledger, event)
                    .await
                    .map_err(|e| self.control_error(event, e))
            }
            Ok(view) => Ok(view),
            Err(e) => Err(self.engine_error(event, e)),
        }
    }
}

/// Creates an event and splits its stock into buckets.
#[utoipa::path(
    post, path = "/v1/events", tag = "events", operation_id = "create_event",
    security(("bearer" = [])),
    request_body = CreateEvent,
    responses(
        (status = 201, description = "The event, and `warnings` when the event was created but is unwisely sized", body = Created),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 409, response = super::openapi::EventExists),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn create<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    ApiJson(body): ApiJson<CreateEvent>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let spec = EventSpec {
        id: event_id(body.id)?,
        stock: body.stock,
        buckets: body.buckets.initial(),
        auto_buckets: body.buckets.range(),
        per_user_limit: body.per_user_limit,
        max_per_order: body.max_per_order.unwrap_or(DEFAULT_MAX_PER_ORDER),
        starts_at: body.starts_at,
        ends_at: body.ends_at,
        hold_seconds: body.hold_seconds,
        tokens: tokens(body.access, body.token_keys)?,
        draw: super::draws::draw_spec(body.access, body.draw)?,
    };
    let mut spec = spec;
    state
        .engine
        .commit_draw(&mut spec)
        .await
        .map_err(|e| state.engine_error(&spec.id, e))?;
    let spec = lifecycle::starting_layout(&state.engine, spec, &state.rebalance.resizing);
    let id = spec.id.clone();
    let warnings = spec.warnings();
    let event = lifecycle::create(&state.engine, &state.ledger, spec)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    crate::control::gauges::initialise(&id);
    for warning in &warnings {
        // The request's span carries the event id.
        tracing::warn!("event created as asked, with a warning: {warning}");
    }
    Ok((StatusCode::CREATED, Json(Created { event, warnings })))
}

/// `201` of `POST /v1/events`: the event view, and what was accepted but
/// unwise about the request.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(super) struct Created {
    #[serde(flatten)]
    event: EventView,
    /// Present only when there is something to say: e.g. a stock per bucket
    /// below 100 × `max_per_order`. The event was created as asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// One event: stock, remaining, sold, per-bucket remaining, skew, status.
#[utoipa::path(
    get, path = "/v1/events/{id}", tag = "events", operation_id = "view_event",
    params(("id" = EventId, Path, description = "The event")),
    responses(
        (status = 200, description = "The event", body = EventView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(id)?;
    Ok(Json(state.event_view(&id).await?))
}

/// The ids of every event the store knows.
#[utoipa::path(
    get, path = "/v1/events", tag = "events", operation_id = "list_events",
    responses(
        (status = 200, description = "Every event's id, closed ones included", body = Vec<EventId>),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn list<S: Store>(
    State(state): State<AppState<S>>,
) -> Result<Json<Vec<EventId>>, ApiError> {
    let mut ids = state
        .engine
        .store()
        .list_events()
        .await
        .map_err(EngineError::from)?;
    ids.sort();
    Ok(Json(ids))
}

/// Ends the sale: seal, settle, retire the leftover, drain every order to the database.
#[utoipa::path(
    post, path = "/v1/events/{id}/close", tag = "events", operation_id = "close_event",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event")),
    responses(
        (status = 200, description = "The final view (`status` `closed`, `leftover`); closing twice answers it again", body = EventView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn close<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(id)?;
    let consumer = format!("{}/close", state.engine.instance());
    let mut flusher = Flusher::new(
        state.engine.clone(),
        state.ledger.clone(),
        consumer,
        state.flush.clone(),
    );
    let view = state
        .on_its_own(&id, "close", {
            let state = state.clone();
            let id = id.clone();
            async move {
                lifecycle::close(&state.engine, &state.ledger, &mut flusher, &id, &state.stop).await
            }
        })
        .await?;
    Ok(Json(view))
}

/// The conservation check.
#[utoipa::path(
    get, path = "/v1/events/{id}/audit", tag = "events", operation_id = "audit_event",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event")),
    responses(
        (status = 200, description = "`stock = remaining + in_transfer + sold_flushed + sold_unflushed − released + leftover`", body = Audit),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn audit<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<Audit>, ApiError> {
    let id = event_id(id)?;
    let audit = crate::control::audit::audit(&state.engine, &state.ledger, &id)
        .await
        .map_err(|e| state.control_error(&id, e))?;
    Ok(Json(audit))
}

/// `PUT /v1/events/{id}/buckets`; an unknown member is refused.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"buckets": 32}))]
pub(super) struct Reshard {
    #[serde(deserialize_with = "super::whole::u32")]
    #[schema(minimum = 1, maximum = 1024)]
    buckets: u32,
}

/// Moves a live event to another bucket count.
#[utoipa::path(
    put, path = "/v1/events/{id}/buckets", tag = "events", operation_id = "reshard_event",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event")),
    request_body = Reshard,
    responses(
        (status = 200, description = "The event in its new layout", body = EventView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::ReshardRefused),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn reshard<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Reshard>,
) -> Result<Json<EventView>, ApiError> {
    let id = event_id(id)?;
    let view = state
        .on_its_own(&id, "reshard", {
            let engine = state.engine.clone();
            let id = id.clone();
            async move { crate::control::reshard::reshard(&engine, &id, body.buckets).await }
        })
        .await?;
    if let Err(e) = state.ledger.set_buckets(&id, body.buckets).await {
        tracing::warn!(event = %id, error = %e, "the database keeps the old bucket count until the next reshard");
    }
    Ok(Json(view))
}

/// `POST /v1/events/{id}/rebalance`: the moves made and the event after them.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(super) struct Rebalanced {
    moves: Vec<crate::control::rebalancer::Move>,
    transfers: u64,
    units: u64,
    event: EventView,
}

/// Consolidates now: gathers fragments (or levels the buckets); returns the moves.
#[utoipa::path(
    post, path = "/v1/events/{id}/rebalance", tag = "events", operation_id = "rebalance_event",
    security(("bearer" = [])),
    params(("id" = EventId, Path, description = "The event")),
    responses(
        (status = 200, description = "The moves and the event after them", body = Rebalanced),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::UnknownEvent),
        (status = 409, response = super::openapi::NotOnSale),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn rebalance<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<Rebalanced>, ApiError> {
    let id = event_id(id)?;
    let meta = state
        .engine
        .reload(&id)
        .await
        .map_err(|e| state.engine_error(&id, e))?;
    if meta.status != crate::domain::model::EventStatus::OnSale {
        return Err(ApiError::NotOnSale(format!(
            "event {id} is {}",
            meta.status.as_str()
        )));
    }
    // Its own task, as a reshard is: a consolidation of a thousand buckets
    // moving unit after unit outlasts the request on a loaded machine.
    let mut rebalancer = crate::control::rebalancer::Rebalancer::new(
        state.engine.clone(),
        state.ledger.clone(),
        state.flush.clone(),
        state.rebalance.clone(),
    );
    let (moves, round) = state
        .on_its_own(&id, "consolidation", async move {
            rebalancer.consolidate_now(&meta).await
        })
        .await?;
    Ok(Json(Rebalanced {
        moves,
        transfers: round.transfers,
        units: round.units,
        event: state.engine.view(&id).await?,
    }))
}
