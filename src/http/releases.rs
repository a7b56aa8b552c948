//! `/v1/releases`: create (admin), list, view, and a release's orders (lines
//! bought all or nothing, one per-user limit across the release).
//!
//! A release's pools are ordinary events (`<release>.<pool>`): the view
//! shows each pool's event view and the totals (sums of the pools). A pool
//! event's own purchases are refused (`release-pool`): they would pass the
//! release-wide limit.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::error::ShortLine;
use super::events::{BucketsDoc, event_id};
use super::{ApiError, ApiJson, AppState, guard::Admin};
use crate::control::lifecycle;
use crate::domain::event::MAX_HOLD_SECONDS;
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::model::{BucketCount, DEFAULT_MAX_PER_ORDER};
use crate::domain::release::{DEFAULT_HOMES, PoolSpec, ReleaseSpec, pool_id, release_id};
use crate::engine::{
    EngineError, EventView, LinesOutcome, LinesRefusal, LinesRequest, ReleaseOrder,
};
use crate::store::Store;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new()
        .route("/v1/releases", get(list::<S>).post(create::<S>))
        .route("/v1/releases/{id}", get(view::<S>))
        .route("/v1/releases/{id}/orders", post(order::<S>))
}

/// One pool of `POST /v1/releases`; an unknown member is refused.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreatePool {
    /// The pool's name in the release (an event id of at most 32
    /// characters); its event is `<release>.<pool>`.
    #[schema(
        pattern = "^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$",
        min_length = 1,
        max_length = 32
    )]
    id: String,
    #[serde(deserialize_with = "super::whole::u64")]
    #[schema(maximum = 9007199254740992_u64)]
    stock: u64,
    /// As an event's `buckets`: a count, `"auto"` or `{"min", "max"}`.
    #[serde(deserialize_with = "super::whole::buckets")]
    #[schema(value_type = BucketsDoc)]
    buckets: BucketCount,
}

/// `POST /v1/releases`. An unknown member is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"id": "air-max", "pools": [{"id": "42", "stock": 100, "buckets": 4}, {"id": "43", "stock": 100, "buckets": 4}], "per_user_limit": 2, "max_per_order": 2}))]
pub(super) struct CreateRelease {
    /// An event id of at most 31 characters and without a `.` (a pool's
    /// event, `<release>.<pool>`, is an event id).
    #[schema(pattern = "^[A-Za-z0-9_-]+$", min_length = 1, max_length = 31)]
    id: String,
    /// 1 to 64 pools, in the order an order's lines are taken.
    #[schema(min_items = 1, max_items = 64)]
    pools: Vec<CreatePool>,
    /// Units one user may hold across the whole release; absent: no limit.
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 4294967295_u64, format = Int64)]
    per_user_limit: Option<u32>,
    /// Units of one order, all lines together (default 10).
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
    /// Every order is held this long for its buyer to confirm
    /// (`POST /v1/releases/{id}/orders/{order_id}/confirm`), all its lines
    /// together, or all its units go back on sale. Absent: orders are
    /// bought at once.
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 86400)]
    hold_seconds: Option<u32>,
}

impl CreateRelease {
    fn spec(self) -> Result<ReleaseSpec, ApiError> {
        if let Some(s) = self
            .hold_seconds
            .filter(|s| !(1..=MAX_HOLD_SECONDS).contains(s))
        {
            return Err(ApiError::invalid(format!(
                "hold_seconds: must be between 1 and {MAX_HOLD_SECONDS}, got {s}"
            )));
        }
        let id = release_id(self.id).map_err(|e| ApiError::invalid(format!("id: {e}")))?;
        let pools = self
            .pools
            .into_iter()
            .enumerate()
            .map(|(k, p)| {
                Ok(PoolSpec {
                    name: pool_id(p.id)
                        .map_err(|e| ApiError::invalid(format!("pools[{k}].id: {e}")))?,
                    stock: p.stock,
                    buckets: p.buckets.initial(),
                    auto_buckets: p.buckets.range(),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let spec = ReleaseSpec {
            id,
            pools,
            per_user_limit: self.per_user_limit,
            max_per_order: self.max_per_order.unwrap_or(DEFAULT_MAX_PER_ORDER),
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            hold_seconds: self.hold_seconds,
            homes: DEFAULT_HOMES,
        };
        if spec.pools.is_empty() || spec.pools.len() > crate::domain::release::MAX_POOLS {
            return Err(ApiError::invalid(format!(
                "pools: a release has 1 to {} pools, got {}",
                crate::domain::release::MAX_POOLS,
                spec.pools.len()
            )));
        }
        spec.validate()
            .map_err(|e| ApiError::invalid(format!("pools: {e}")))?;
        Ok(spec)
    }
}

/// A release: its settings, every pool's event view, and the totals.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct ReleaseView {
    #[schema(value_type = EventId)]
    id: String,
    per_user_limit: Option<u32>,
    max_per_order: u32,
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    starts_at: Option<i64>,
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    ends_at: Option<i64>,
    /// Orders are held this long for their buyer to confirm; absent: no
    /// holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_seconds: Option<u32>,
    /// In the order an order's lines are taken.
    pools: Vec<PoolView>,
    /// Sums of the pools.
    totals: Totals,
}

/// One pool of a release: its name and its event's view (`event.id` is
/// `<release>.<pool>`).
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct PoolView {
    #[schema(value_type = EventId)]
    pool: String,
    event: EventView,
}

/// A release's figures: sums of its pools'.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Totals {
    stock: u64,
    remaining: u64,
    sold: u64,
    held: u64,
}

impl<S: Store> AppState<S> {
    async fn release_view(&self, spec: &ReleaseSpec) -> Result<ReleaseView, ApiError> {
        let mut pools = Vec::with_capacity(spec.pools.len());
        let mut totals = Totals {
            stock: 0,
            remaining: 0,
            sold: 0,
            held: 0,
        };
        for (k, pool) in spec.pools.iter().enumerate() {
            let event = spec.pool_event(k).map_err(ApiError::invalid)?;
            let view = self.event_view(&event).await?;
            totals.stock += view.stock;
            totals.remaining += view.remaining;
            totals.sold += view.sold;
            totals.held += view.held;
            pools.push(PoolView {
                pool: pool.name.to_string(),
                event: view,
            });
        }
        Ok(ReleaseView {
            id: spec.id.to_string(),
            per_user_limit: spec.per_user_limit,
            max_per_order: spec.max_per_order,
            starts_at: spec.starts_at,
            ends_at: spec.ends_at,
            hold_seconds: spec.hold_seconds,
            pools,
            totals,
        })
    }
}

/// Creates a release: its spec, then every pool as an event.
///
/// The same body again answers `200` with the release (a creation cut off
/// is finished); another spec under a taken id is `409 release-exists`.
#[utoipa::path(
    post, path = "/v1/releases", tag = "releases", operation_id = "create_release",
    security(("bearer" = [])),
    request_body = CreateRelease,
    responses(
        (status = 201, description = "The release", body = ReleaseView),
        (status = 200, description = "The release existed with these settings", body = ReleaseView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 409, response = super::openapi::ReleaseExists),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn create<S: Store>(
    State(state): State<AppState<S>>,
    _admin: Admin,
    ApiJson(body): ApiJson<CreateRelease>,
) -> Result<(StatusCode, Json<ReleaseView>), ApiError> {
    let spec = body.spec()?;
    let id = spec.id.clone();
    let had = state
        .engine
        .store()
        .load_release(&id)
        .await
        .map_err(EngineError::from)?;
    if had.as_ref().is_some_and(|had| *had != spec) {
        return Err(ApiError::ReleaseExists(id.to_string()));
    }
    let spec = lifecycle::create_release(&state.engine, &state.ledger, spec)
        .await
        .map_err(|e| release_error(&state, &id, e))?;
    for k in 0..spec.pools.len() {
        if let Ok(pool) = spec.pool_event(k) {
            crate::control::gauges::initialise(&pool);
        }
    }
    let status = if had.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(state.release_view(&spec).await?)))
}

fn release_error<S: Store>(
    state: &AppState<S>,
    id: &EventId,
    e: crate::control::ControlError,
) -> ApiError {
    match e {
        // The spec stored differs (a creation racing this one).
        crate::control::ControlError::Engine(EngineError::EventExists(ref taken))
            if taken == id =>
        {
            ApiError::ReleaseExists(id.to_string())
        }
        e => state.control_error(id, e),
    }
}

/// The ids of every release.
#[utoipa::path(
    get, path = "/v1/releases", tag = "releases", operation_id = "list_releases",
    responses(
        (status = 200, description = "Every release's id", body = Vec<EventId>),
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
        .list_releases()
        .await
        .map_err(EngineError::from)?;
    ids.sort();
    Ok(Json(ids))
}

/// One release: its settings, every pool's remaining, sold and buckets
/// (each pool's event view), and the totals.
#[utoipa::path(
    get, path = "/v1/releases/{id}", tag = "releases", operation_id = "view_release",
    params(("id" = EventId, Path, description = "The release")),
    responses(
        (status = 200, description = "The release", body = ReleaseView),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownRelease),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn view<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
) -> Result<Json<ReleaseView>, ApiError> {
    let id = event_id(id)?;
    let spec = state.engine.release_spec(&id).await?;
    Ok(Json(state.release_view(&spec).await?))
}

/// One line of `POST /v1/releases/{id}/orders`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LineBody {
    /// A pool of the release, at most once an order.
    #[schema(value_type = EventId)]
    pool: String,
    /// At least 1; every line together at most the release's `max_per_order`.
    #[serde(deserialize_with = "super::whole::quantity")]
    #[schema(minimum = 1)]
    quantity: u32,
}

/// `POST /v1/releases/{id}/orders`. An unknown member is refused, naming it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user_id": "u-1001", "lines": [{"pool": "42", "quantity": 1}, {"pool": "43", "quantity": 1}], "request_id": "9f1c-0002"}))]
pub(super) struct OrderBody {
    #[schema(value_type = UserId)]
    user_id: String,
    /// 1 to 64 lines, each pool at most once.
    #[schema(min_items = 1, max_items = 64)]
    lines: Vec<LineBody>,
    /// The idempotency key (or the `Idempotency-Key` header; both given: equal).
    #[schema(value_type = Option<crate::domain::ids::RequestId>)]
    request_id: Option<String>,
}

/// `201` of a release order (and its view): one order id, its status, and
/// every line with its own order id (an ordinary order of the pool's
/// event).
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct OrderAnswer {
    #[schema(value_type = String)]
    order_id: OrderId,
    #[schema(value_type = EventId)]
    release: String,
    #[schema(value_type = UserId)]
    user_id: String,
    /// In the release's pool order.
    lines: Vec<LineAnswer>,
    /// `held` (a release with holds, until confirmed), `confirmed`,
    /// `cancelled` or `expired`: the whole order, every line.
    #[schema(value_type = String, example = "held")]
    status: &'static str,
    /// A release with holds: confirm by this deadline (RFC 3339, UTC), one
    /// for every line, whatever became of the hold.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pay_by: Option<i64>,
}

/// A bought line.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct LineAnswer {
    #[schema(value_type = EventId)]
    pool: String,
    /// The pool's event (`<release>.<pool>`).
    #[schema(value_type = EventId)]
    event: String,
    quantity: u32,
    /// The line's order in its pool's event (`GET /v1/orders/{id}`).
    #[schema(value_type = String)]
    order_id: OrderId,
}

/// The pool's name of a pool event `<release>.<pool>`.
fn pool_name<'a>(release: &EventId, event: &'a EventId) -> &'a str {
    event
        .as_str()
        .strip_prefix(release.as_str())
        .and_then(|s| s.strip_prefix('.'))
        .unwrap_or(event.as_str())
}

impl OrderAnswer {
    pub(super) fn new(order: ReleaseOrder) -> Self {
        let release = order.release;
        Self {
            order_id: order.order_id,
            user_id: order.user.to_string(),
            lines: order
                .lines
                .into_iter()
                .map(|l| LineAnswer {
                    pool: pool_name(&release, &l.pool).to_owned(),
                    event: l.pool.to_string(),
                    quantity: l.quantity,
                    order_id: l.order_id,
                })
                .collect(),
            release: release.to_string(),
            status: order.status.as_str(),
            pay_by: order.pay_by,
        }
    }
}

/// Buys an order's lines all or nothing, under the release-wide per-user
/// limit. A retry with the same request id answers the original with
/// `Idempotent-Replayed: true` (refusals too).
#[utoipa::path(
    post, path = "/v1/releases/{id}/orders", tag = "releases", operation_id = "order_release",
    params(
        ("id" = EventId, Path, description = "The release"),
        ("Idempotency-Key" = Option<crate::domain::ids::RequestId>, Header, description = "The idempotency key (same as the body's `request_id`)"),
    ),
    request_body = OrderBody,
    responses(
        (status = 201, description = "The order and its lines", body = OrderAnswer, headers(
            ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer to an earlier request with the same request id"),
        )),
        (status = 400, response = super::openapi::BadRequest),
        (status = 404, response = super::openapi::UnknownRelease),
        (status = 409, response = super::openapi::OrderRefused),
        (status = 413, response = super::openapi::TooLarge),
        (status = 415, response = super::openapi::NotJson),
        (status = 429, response = super::openapi::RateLimited),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn order<S: Store>(
    State(state): State<AppState<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<OrderBody>,
) -> Response {
    let outcome = async {
        let release = event_id(id)?;
        let named = release.clone();
        let user = UserId::parse(body.user_id).map_err(ApiError::invalid)?;
        super::trace::record_user(user.as_str());
        if body.lines.is_empty() {
            return Err(ApiError::invalid("lines: an order has 1 to 64 lines"));
        }
        let lines = body
            .lines
            .into_iter()
            .enumerate()
            .map(|(k, l)| {
                EventId::parse(l.pool)
                    .map(|p| (p, l.quantity))
                    .map_err(|e| ApiError::invalid(format!("lines[{k}].pool: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let req = LinesRequest {
            release,
            user,
            lines,
            request_id: super::purchases::request_id(&headers, body.request_id)?,
        };
        state.limits.check(state.engine.store(), &req.user).await?;
        let engine = state.engine.clone();
        // A task of its own: a dropped handler never leaves an order half
        // driven (the sweeper would end it, but later).
        let outcome = tokio::spawn(async move { engine.buy_lines(&req).await })
            .await
            .map_err(|e| ApiError::Internal(format!("the order task failed: {e}")))?
            .map_err(|e| {
                // Counted only for a release that exists: the label stays
                // bounded by the releases created.
                if !matches!(e, EngineError::UnknownRelease(_)) {
                    count(&named, "error");
                }
                ApiError::from(e)
            })?;
        Ok((named, outcome))
    }
    .await;
    match outcome {
        Ok((release, LinesOutcome { result, replayed })) => {
            count(
                &release,
                match &result {
                    _ if replayed => "replayed",
                    Ok(_) => "ok",
                    Err(LinesRefusal::SoldOut { .. }) => "sold_out",
                    Err(LinesRefusal::LimitExceeded { .. }) => "limit_exceeded",
                    Err(LinesRefusal::GaveUp) => "gave_up",
                },
            );
            let mut response = match result {
                Ok(order) => (StatusCode::CREATED, Json(OrderAnswer::new(order))).into_response(),
                Err(refusal) => refused(&release, refusal).into_response(),
            };
            if replayed {
                response
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            response
        }
        Err(e) => e.into_response(),
    }
}

/// Counts one order of `release` answered with `outcome`
/// (`shardstock_release_orders_total`). Orders are a handful of store round
/// trips each, so the series is looked up per call rather than kept.
fn count(release: &EventId, outcome: &'static str) {
    metrics::counter!(crate::metrics::RELEASE_ORDERS, "release" => release.to_string(), "outcome" => outcome)
        .increment(1);
}

fn refused(release: &EventId, refusal: LinesRefusal) -> ApiError {
    match refusal {
        LinesRefusal::SoldOut { short } => ApiError::LinesSoldOut(
            short
                .into_iter()
                .map(|s| ShortLine {
                    pool: pool_name(release, &s.pool).to_owned(),
                    quantity: s.quantity,
                    remaining: s.remaining,
                })
                .collect(),
        ),
        LinesRefusal::LimitExceeded { limit, held } => ApiError::LimitExceeded { limit, held },
        LinesRefusal::GaveUp => ApiError::TryAgain(
            "the order was not decided in time; nothing was bought, retry with a new request id"
                .into(),
        ),
    }
}
