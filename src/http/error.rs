//! `ApiError`: every failure as `application/problem+json` (RFC 9457).
//!
//! Handlers return `Result<_, ApiError>`; engine errors convert with `?`. The
//! JSON extractor wrapper [`ApiJson`] turns axum's body rejections into the same
//! format (serde's message, which names the field, without axum's sentence
//! around it; the bodies refuse unknown members, so a typo is named too),
//! the router's fallbacks answer unknown routes and methods, and
//! [`problemize`] converts anything else a layer produced (a timeout, a body
//! over the limit) so no client ever sees a non-problem error body. 5xx details
//! say little; the cause is logged.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::token::TokenRefusal;
use crate::engine::mover::MoverError;
use crate::engine::{EngineError, Refusal};
use crate::store::StoreError;

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// The API's errors; each variant's doc says its status and `type`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 (413 for a body too large, 415 for a wrong content type) `invalid-request`.
    #[error("{detail}")]
    Invalid { status: StatusCode, detail: String },
    /// 401 `unauthorized` with `WWW-Authenticate: Bearer`: no token, or the wrong one.
    #[error("a valid `Authorization: Bearer <token>` is required")]
    Unauthorized,
    /// 401 `unauthorized` with `WWW-Authenticate: Bearer`: no admin token is
    /// configured, so no token can be right (told apart from a wrong token,
    /// which an operator would otherwise chase).
    #[error(
        "no admin token is configured: the admin endpoints are disabled until \
         `[server] admin_token` (or SHARDSTOCK_ADMIN_TOKEN) is set"
    )]
    AdminDisabled,
    /// 404 `unknown-event`.
    #[error("no event {0:?}")]
    UnknownEvent(String),
    /// 404 `unknown-order`.
    #[error("no order {0:?}")]
    UnknownOrder(String),
    /// 404 `unknown-request`: no answer is kept for this request id (never
    /// sent, sent without an id, or, after a close, refused).
    #[error("{0}")]
    UnknownRequest(String),
    /// 409 `event-exists`.
    #[error("event {0:?} exists")]
    EventExists(String),
    /// 404 `unknown-release`.
    #[error("no release {0:?}")]
    UnknownRelease(String),
    /// 409 `release-exists`: the release id is taken by another spec.
    #[error("release {0:?} exists with other settings")]
    ReleaseExists(String),
    /// 409 `sold-out` of a release order, member `short_lines`: each line
    /// its pool cannot serve, with that pool's remaining. Nothing was kept.
    #[error("fewer units remain than asked for in {}", ShortLine::names(.0))]
    LinesSoldOut(Vec<ShortLine>),
    /// 409 `release-pool`: an event that is a release's pool is bought
    /// through its release's orders only.
    #[error(
        "event {event} is a pool of release {release}: buy it through          POST /v1/releases/{release}/orders, which holds the release-wide per-user limit"
    )]
    ReleasePool { event: String, release: String },
    /// 409 `release-pool`: a reshard of a pool of a release with holds,
    /// whose bucket count is fixed.
    #[error(
        "event {event} is a pool of release {release}, which has holds: its bucket count is fixed while orders may be held (a reshard would not carry their markers)"
    )]
    HeldPool { event: String, release: String },
    /// 409 `sold-out`, member `remaining`.
    #[error("fewer units remain than asked for")]
    SoldOut { remaining: u64 },
    /// 409 `limit-exceeded`, members `limit`, `held`.
    #[error("the purchase would exceed the per-user limit")]
    LimitExceeded { limit: u32, held: u64 },
    /// 403 `token-missing`, `token-invalid`, `token-not-yours`,
    /// `token-expired`; 409 `token-used`: a `token` event refused the
    /// purchase's access token. Nothing was bought, and nothing is kept
    /// under the request id (a retry with a good token may buy).
    #[error("{}", token_detail(*.0))]
    Token(TokenRefusal),
    /// A draw's refusals ([`DrawProblem`]): 409 `not-a-draw`,
    /// `entries-closed`, `draw-not-due`, `not-drawn`; 404 `not-entered`.
    #[error("{1}")]
    Draw(DrawProblem, String),
    /// 409 `not-on-sale`.
    #[error("{0}")]
    NotOnSale(String),
    /// 409 `not-on-sale` before the sale opens, member `starts_at`, with
    /// `Retry-After` (the seconds until it opens).
    #[error("event {event} is not on sale until its starts_at, {}", rfc3339(*.starts_at))]
    NotStarted { event: String, starts_at: i64 },
    /// 409 `idempotency-conflict`.
    #[error("this request id was used before for a different purchase")]
    IdempotencyConflict,
    /// 409 `hold-expired`: a confirm after the order's `pay_by`.
    #[error("order {0} was not confirmed by its pay-by deadline; its units are back on sale")]
    HoldExpired(String),
    /// 409 `order-cancelled`: a confirm of a cancelled order.
    #[error("order {0} was cancelled")]
    OrderCancelled(String),
    /// 409 `order-confirmed`: a cancel of a confirmed (paid) release order.
    #[error("order {0} was confirmed; a paid order is not cancelled")]
    OrderConfirmed(String),
    /// 429 `rate-limited` with `Retry-After`.
    #[error("too many requests")]
    RateLimited { retry_after_s: u64 },
    /// 503 `try-again` with `Retry-After`: contention, nothing was bought.
    #[error("{0}")]
    TryAgain(String),
    /// 503 `backend-unavailable`; `outcome_unknown` when a purchase may have applied.
    #[error("{detail}")]
    Unavailable {
        detail: String,
        outcome_unknown: bool,
    },
    /// 404 `order-events-off`: the changes endpoint while `[outbox] enabled`
    /// is false (the ledger writes no order changes).
    #[error(
        "order events are off: this deployment writes no order changes; \
         set `[outbox] enabled = true` (or SHARDSTOCK_OUTBOX=true) to record and serve them"
    )]
    OrderEventsOff,
    /// 404 `unknown-webhook`: no webhook subscription with this id.
    #[error("no webhook subscription {0:?}")]
    UnknownWebhook(String),
    /// 409 `webhook-conflict`: the id is taken, the subscription is the
    /// configuration's, or the most subscriptions exist already.
    #[error("{0}")]
    WebhookConflict(String),
    /// 404 `not-found`: no such route.
    #[error("no such route")]
    NotFound,
    /// 405 `method-not-allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 500 `internal`.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(detail: impl ToString) -> Self {
        Self::Invalid {
            status: StatusCode::BAD_REQUEST,
            detail: detail.to_string(),
        }
    }

    pub(crate) fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            Invalid { status, .. } => (*status, "invalid-request", "Invalid request"),
            Unauthorized | AdminDisabled => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized")
            }
            UnknownEvent(_) => (StatusCode::NOT_FOUND, "unknown-event", "Unknown event"),
            OrderEventsOff => (
                StatusCode::NOT_FOUND,
                "order-events-off",
                "Order events off",
            ),
            UnknownWebhook(_) => (
                StatusCode::NOT_FOUND,
                "unknown-webhook",
                "Unknown webhook subscription",
            ),
            WebhookConflict(_) => (
                StatusCode::CONFLICT,
                "webhook-conflict",
                "Webhook subscription conflict",
            ),
            UnknownOrder(_) => (StatusCode::NOT_FOUND, "unknown-order", "Unknown order"),
            UnknownRequest(_) => (StatusCode::NOT_FOUND, "unknown-request", "Unknown request"),
            EventExists(_) => (StatusCode::CONFLICT, "event-exists", "Event exists"),
            SoldOut { .. } | LinesSoldOut(_) => (StatusCode::CONFLICT, "sold-out", "Sold out"),
            UnknownRelease(_) => (StatusCode::NOT_FOUND, "unknown-release", "Unknown release"),
            ReleaseExists(_) => (StatusCode::CONFLICT, "release-exists", "Release exists"),
            ReleasePool { .. } | HeldPool { .. } => {
                (StatusCode::CONFLICT, "release-pool", "Pool of a release")
            }
            LimitExceeded { .. } => (
                StatusCode::CONFLICT,
                "limit-exceeded",
                "Per-user limit exceeded",
            ),
            Token(why) => match why {
                TokenRefusal::Missing => (
                    StatusCode::FORBIDDEN,
                    "token-missing",
                    "Access token required",
                ),
                TokenRefusal::Invalid => (
                    StatusCode::FORBIDDEN,
                    "token-invalid",
                    "Access token invalid",
                ),
                TokenRefusal::OtherUser => (
                    StatusCode::FORBIDDEN,
                    "token-not-yours",
                    "Access token of another user",
                ),
                TokenRefusal::Expired => (
                    StatusCode::FORBIDDEN,
                    "token-expired",
                    "Access token expired",
                ),
                TokenRefusal::Used => (StatusCode::CONFLICT, "token-used", "Access token used"),
            },
            NotOnSale(_) | NotStarted { .. } => {
                (StatusCode::CONFLICT, "not-on-sale", "Not on sale")
            }
            Draw(p, _) => p.parts(),
            IdempotencyConflict => (
                StatusCode::CONFLICT,
                "idempotency-conflict",
                "Idempotency key reused",
            ),
            HoldExpired(_) => (StatusCode::CONFLICT, "hold-expired", "Hold expired"),
            OrderCancelled(_) => (StatusCode::CONFLICT, "order-cancelled", "Order cancelled"),
            OrderConfirmed(_) => (StatusCode::CONFLICT, "order-confirmed", "Order confirmed"),
            RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "Rate limited",
            ),
            TryAgain(_) => (StatusCode::SERVICE_UNAVAILABLE, "try-again", "Try again"),
            Unavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "backend-unavailable",
                "Backend unavailable",
            ),
            NotFound => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// The outcome label of `shardstock_purchases_total` this error stands for.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::SoldOut { .. } | Self::LinesSoldOut(_) => "sold_out",
            Self::LimitExceeded { .. } => "limit_exceeded",
            Self::Invalid { .. }
            | Self::NotOnSale(_)
            | Self::NotStarted { .. }
            | Self::UnknownEvent(_)
            | Self::UnknownRelease(_)
            | Self::ReleasePool { .. }
            | Self::IdempotencyConflict
            // Counted with the other refusals of a request; which one is
            // `shardstock_token_checks_total`'s outcome.
            | Self::Token(_) => "invalid",
            Self::RateLimited { .. } => "rate_limited",
            _ => "error",
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::SoldOut { remaining } => Self::SoldOut { remaining },
            Refusal::LimitExceeded { limit, held } => Self::LimitExceeded { limit, held },
            Refusal::Token(why) => Self::Token(why),
        }
    }
}

/// A draw's refusals, each a problem type of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawProblem {
    /// 409 `not-a-draw`: the event's access is not `draw`.
    NotADraw,
    /// 409 `entries-closed`: the entry window is over.
    EntriesClosed,
    /// 409 `draw-not-due`: the draw asked for before the entries close.
    NotDue,
    /// 409 `not-drawn`: the entrants listed before the draw.
    NotDrawn,
    /// 404 `not-entered`: the user never entered.
    NotEntered,
    /// 403 `offer-invalid`: the offer token is malformed, another user's or
    /// not signed by the event's keys.
    OfferInvalid,
    /// 409 `offer-expired`: the offer's deadline passed.
    OfferExpired,
    /// 409 `offer-passed`: the offer went to the next user in line.
    OfferPassed,
    /// 409 `not-offered`: no such open offer.
    NotOffered,
    /// 409 `waiting-list`: a reshard of a drawn draw event (its waiting
    /// list's units stay in the buckets they came back to).
    WaitingList,
}

impl DrawProblem {
    /// Every one, for the document's examples and its tests.
    pub const ALL: [Self; 10] = [
        Self::NotADraw,
        Self::EntriesClosed,
        Self::NotDue,
        Self::NotDrawn,
        Self::NotEntered,
        Self::OfferInvalid,
        Self::OfferExpired,
        Self::OfferPassed,
        Self::NotOffered,
        Self::WaitingList,
    ];

    /// Status, `type` and title.
    pub fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::NotADraw => (StatusCode::CONFLICT, "not-a-draw", "Not a draw"),
            Self::EntriesClosed => (StatusCode::CONFLICT, "entries-closed", "Entries closed"),
            Self::NotDue => (StatusCode::CONFLICT, "draw-not-due", "Draw not due"),
            Self::NotDrawn => (StatusCode::CONFLICT, "not-drawn", "Not drawn yet"),
            Self::NotEntered => (StatusCode::NOT_FOUND, "not-entered", "Not entered"),
            Self::OfferInvalid => (
                StatusCode::FORBIDDEN,
                "offer-invalid",
                "Offer token invalid",
            ),
            Self::OfferExpired => (StatusCode::CONFLICT, "offer-expired", "Offer expired"),
            Self::OfferPassed => (StatusCode::CONFLICT, "offer-passed", "Offer passed"),
            Self::NotOffered => (StatusCode::CONFLICT, "not-offered", "Not offered"),
            Self::WaitingList => (StatusCode::CONFLICT, "waiting-list", "Waiting list"),
        }
    }
}

/// What a token refusal's `detail` says.
fn token_detail(why: TokenRefusal) -> &'static str {
    match why {
        TokenRefusal::Missing => "this event sells to access token holders: send `access_token`",
        TokenRefusal::Invalid => "the access token is malformed or not signed by this event's keys",
        TokenRefusal::OtherUser => "the access token was issued to another user",
        TokenRefusal::Expired => "the access token has expired",
        TokenRefusal::Used => {
            "the access token's allowance is spent (bought, or held by a purchase in flight)"
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        use EngineError as E;
        match e {
            E::UnknownEvent(id) => Self::UnknownEvent(id.to_string()),
            E::UnknownRelease(id) => Self::UnknownRelease(id.to_string()),
            E::Release(e) => Self::invalid(e),
            E::UnknownOrder(id) => Self::UnknownOrder(id),
            E::EventExists(id) => Self::EventExists(id.to_string()),
            E::NotOnSale {
                event,
                starts_at: Some(starts_at),
                ..
            } => Self::NotStarted {
                event: event.to_string(),
                starts_at,
            },
            E::NotOnSale { event, why, .. } => Self::NotOnSale(format!("event {event} is {why}")),
            E::Invalid { field, reason } => Self::invalid(format!("{field} {reason}")),
            E::NotADraw(_) => Self::Draw(DrawProblem::NotADraw, e.to_string()),
            E::EntriesClosed(_) => Self::Draw(DrawProblem::EntriesClosed, e.to_string()),
            E::DrawNotDue { entries_until, .. } => Self::Draw(
                DrawProblem::NotDue,
                format!("{e}, at {}", rfc3339(entries_until)),
            ),
            E::NotDrawn(_) => Self::Draw(DrawProblem::NotDrawn, e.to_string()),
            E::NotEntered { .. } => Self::Draw(DrawProblem::NotEntered, e.to_string()),
            E::OfferRefused { why, .. } => {
                use crate::engine::OfferRefusal as R;
                let p = match why {
                    R::InvalidToken => DrawProblem::OfferInvalid,
                    R::Expired => DrawProblem::OfferExpired,
                    R::Passed => DrawProblem::OfferPassed,
                    R::NotOffered => DrawProblem::NotOffered,
                };
                Self::Draw(p, e.to_string())
            }
            E::Id(e) => Self::invalid(e),
            E::Spec(e) => Self::invalid(e),
            E::IdempotencyConflict(_) => Self::IdempotencyConflict,
            E::Contention { .. } => Self::TryAgain(e.to_string()),
            E::Store(StoreError::Stale(_)) => {
                Self::TryAgain("the event's layout is changing; retry".into())
            }
            // Another mover (a concurrent reshard, close or rebalancer round)
            // holds a newer lease on the buckets: this one stopped before
            // writing anything more. Nothing is wrong; a retry sees the winner's
            // layout. (Was a 500; found by schemathesis: two reshards at once.)
            E::Mover(MoverError::Fenced { .. }) => {
                Self::TryAgain("another operation is moving this event's units; retry".into())
            }
            // A mover's store step failed: as the same failure of any step
            // (a bucket a concurrent reshard sealed is a layout changing, not
            // an internal error; was a 500 in a clean-clone CI run of
            // `concurrent_reshards_answer_a_layout_or_try_again`).
            E::Mover(MoverError::Store(e)) => Self::from(E::Store(e)),
            E::OutcomeUnknown(why) => {
                crate::metrics::store_error("request");
                tracing::warn!(%why, "purchase outcome unknown");
                Self::Unavailable {
                    detail: "the store failed mid-purchase; retry with the same request id".into(),
                    outcome_unknown: true,
                }
            }
            // Refused while a Cluster's slots moved, for longer than a store
            // call may take: nothing ran, and the move ends by itself.
            E::Store(e) if e.is_moving() => {
                crate::metrics::store_error("request");
                tracing::warn!(error = %e, "slots moving");
                Self::TryAgain("the store's slots are moving; retry".into())
            }
            E::Store(StoreError::Unavailable(why)) => {
                crate::metrics::store_error("request");
                tracing::warn!(%why, "store unavailable");
                Self::Unavailable {
                    detail: "the store is unreachable; nothing was deducted".into(),
                    outcome_unknown: false,
                }
            }
            other => {
                tracing::error!(error = %other, "internal error");
                Self::Internal(other.to_string())
            }
        }
    }
}

/// An error body (RFC 9457), `application/problem+json`: what every error
/// answers. The members past `detail` appear only with the types named.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:shardstock:<slug>`.
    #[serde(rename = "type")]
    #[schema(pattern = "^urn:shardstock:[a-z-]+$")]
    pub kind: String,
    pub title: &'static str,
    /// The HTTP status, repeated.
    pub status: u16,
    pub detail: String,
    /// `sold-out`: units left in the whole event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// `sold-out` of a release order: each line its pool cannot serve,
    /// with that pool's remaining.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_lines: Option<Vec<ShortLine>>,
    /// `limit-exceeded`: the per-user limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 4294967295_u64, format = Int64)]
    pub limit: Option<u32>,
    /// `limit-exceeded`: units the user holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// `backend-unavailable`: `unknown` when a purchase may have applied
    /// (retry with the same request id to learn the answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^unknown$")]
    pub outcome: Option<&'static str>,
    /// `not-on-sale` before the sale opens: when it opens (RFC 3339, UTC);
    /// `Retry-After` says the same in seconds.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub starts_at: Option<i64>,
}

/// A line of a release order its pool cannot serve.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ShortLine {
    /// The pool's name in the release.
    #[schema(value_type = crate::domain::ids::EventId)]
    pub pool: String,
    /// Units the line asked for.
    pub quantity: u32,
    /// Units left in the whole pool.
    pub remaining: u64,
}

impl ShortLine {
    fn names(lines: &[ShortLine]) -> String {
        let names: Vec<&str> = lines.iter().map(|l| l.pool.as_str()).collect();
        format!("pool {}", names.join(", "))
    }
}

/// Unix milliseconds as RFC 3339, UTC (as every time in a body is written).
fn rfc3339(ms: i64) -> String {
    crate::domain::model::rfc3339_ms::format(ms)
}

impl ApiError {
    /// The status and the body this error answers.
    pub fn problem(&self) -> (StatusCode, Problem) {
        let (status, slug, title) = self.parts();
        let mut body = Problem {
            kind: format!("urn:shardstock:{slug}"),
            title,
            status: status.as_u16(),
            detail: self.to_string(),
            remaining: None,
            short_lines: None,
            limit: None,
            held: None,
            outcome: None,
            starts_at: None,
        };
        match self {
            Self::SoldOut { remaining } => body.remaining = Some(*remaining),
            Self::LinesSoldOut(short) => body.short_lines = Some(short.clone()),
            Self::LimitExceeded { limit, held } => {
                body.limit = Some(*limit);
                body.held = Some(*held);
            }
            Self::Unavailable {
                outcome_unknown: true,
                ..
            } => body.outcome = Some("unknown"),
            Self::NotStarted { starts_at, .. } => body.starts_at = Some(*starts_at),
            Self::Internal(_) => body.detail = "internal error; see the server log".into(),
            _ => {}
        }
        (status, body)
    }

    /// Seconds for `Retry-After`, on the answers that carry it. Before a
    /// sale opens: the whole seconds until it does, at least 1 (read from
    /// the system clock, the engine's in production, when answering).
    pub(crate) fn retry_after(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_s } => Some(*retry_after_s),
            Self::TryAgain(_) | Self::Unavailable { .. } => Some(1),
            Self::NotStarted { starts_at, .. } => Some(seconds_until(
                *starts_at,
                crate::engine::Clock::system().now_ms(),
            )),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = self.problem();
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if matches!(self, Self::Unauthorized | Self::AdminDisabled) {
            // RFC 9110 §11.6.1: a 401 names the scheme that would do.
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(CHALLENGE),
            );
        }
        response
    }
}

/// The challenge of every 401: the admin endpoints take a bearer token.
pub(crate) const CHALLENGE: &str = "Bearer realm=\"shardstock\"";

/// Whole seconds from `now_ms` until `at_ms`, rounded up, at least 1.
fn seconds_until(at_ms: i64, now_ms: i64) -> u64 {
    let ms = at_ms.saturating_sub(now_ms).max(1) as u64;
    ms.div_ceil(1000)
}

/// `Json<T>` whose rejections are problems.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    /// A JSON body is decoded by `serde_json` directly; only a body that does
    /// not decode goes through axum's extractor, whose message names the
    /// failing field (`serde_path_to_error`, which doubles the cost of every
    /// decode, so the happy path does without it). Anything but a JSON
    /// content type is axum's answer as it was.
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !json_content_type(req.headers()) {
            return match axum::Json::<T>::from_request(req, state).await {
                Ok(axum::Json(v)) => Ok(Self(v)),
                Err(rejection) => Err(rejected(rejection)),
            };
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rejection| {
                let status = match rejection.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
                    _ => StatusCode::BAD_REQUEST,
                };
                ApiError::Invalid {
                    status,
                    detail: rejection.body_text(),
                }
            })?;
        if let Ok(v) = serde_json::from_slice::<T>(&bytes) {
            return Ok(Self(v));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(rejection) => Err(rejected(rejection)),
        }
    }
}

/// What axum puts before serde's message when a body is JSON of the wrong
/// shape. serde's part names the field (`quantity: invalid value: …`,
/// `unknown field `qty`, expected one of …`); axum's sentence names a Rust
/// "target type", which means nothing to a client.
const AXUM_DATA_ERROR: &str = "Failed to deserialize the JSON body into the target type: ";

/// A rejection of axum's JSON extractor as a problem.
fn rejected(rejection: JsonRejection) -> ApiError {
    let status = match rejection.status() {
        s @ (StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE) => s,
        _ => StatusCode::BAD_REQUEST,
    };
    let text = rejection.body_text();
    let detail = match text.strip_prefix(AXUM_DATA_ERROR) {
        Some(serde) => serde.to_owned(),
        None => text,
    };
    ApiError::Invalid { status, detail }
}

/// `application/json` or `application/<anything>+json`, parameters aside
/// (what axum's extractor accepts).
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// Router fallback: no such route.
pub(crate) async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// Router fallback: the route exists, the method does not.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Any error response that is not a problem yet (from a layer such as the
/// timeout or the body limit) becomes one; the outermost step of every answer.
pub(crate) fn problemize(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if status.as_u16() < 400 || is_problem {
        return response;
    }
    let detail = status.canonical_reason().unwrap_or("error").to_owned();
    match status {
        StatusCode::NOT_FOUND => ApiError::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
        StatusCode::UNAUTHORIZED => ApiError::Unauthorized,
        StatusCode::REQUEST_TIMEOUT
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => {
            // A purchase cut short may have applied: say so, the request id decides.
            ApiError::Unavailable {
                detail: format!(
                    "{detail}: the request took too long; retry with the same request id"
                ),
                outcome_unknown: true,
            }
        }
        s if s.is_client_error() => ApiError::Invalid { status: s, detail },
        _ => ApiError::Internal(detail),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_of_the_wrong_shape_is_told_in_serde_s_words_only() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Body {
            quantity: u32,
        }
        for (body, says) in [
            (&br#"{"quantity": 1, "qty": 5}"#[..], "unknown field `qty`"),
            (br#"{"quantity": "1"}"#, "quantity: invalid type"),
        ] {
            let rejection = axum::Json::<Body>::from_bytes(body).unwrap_err();
            assert!(rejection.body_text().starts_with(AXUM_DATA_ERROR));
            let ApiError::Invalid { status, detail } = rejected(rejection) else {
                panic!("not invalid-request")
            };
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(detail.contains(says), "{detail}");
            assert!(!detail.contains("Failed to deserialize"), "{detail}");
        }
    }

    #[test]
    fn before_the_sale_opens_the_answer_says_when() {
        assert_eq!(seconds_until(10_000, 10_000), 1, "at least a second");
        assert_eq!(seconds_until(10_001, 10_000), 1);
        assert_eq!(seconds_until(11_001, 10_000), 2, "rounded up");
        assert_eq!(seconds_until(5_000, 10_000), 1, "opened since: retry now");
        let opens = crate::engine::Clock::system().now_ms() + 90_000;
        let e = ApiError::from(EngineError::NotOnSale {
            event: crate::domain::ids::EventId::parse("e").unwrap(),
            why: "not started",
            starts_at: Some(opens),
        });
        let (status, body) = e.problem();
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body.kind, "urn:shardstock:not-on-sale");
        assert_eq!(body.starts_at, Some(opens));
        assert!((89..=90).contains(&e.retry_after().unwrap()));
        let response = e.into_response();
        assert!(response.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn every_401_challenges_bearer_and_a_disabled_admin_says_so() {
        for e in [ApiError::Unauthorized, ApiError::AdminDisabled] {
            let detail = e.to_string();
            let response = e.into_response();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], CHALLENGE);
            assert_eq!(
                detail.contains("no admin token is configured"),
                detail != ApiError::Unauthorized.to_string()
            );
        }
    }

    #[test]
    fn a_fenced_mover_answers_try_again_not_internal() {
        let e = ApiError::from(EngineError::Mover(MoverError::Fenced {
            bucket: 0,
            token: 2,
            highest: 3,
        }));
        let (status, body) = e.problem();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body.kind, "urn:shardstock:try-again");
        assert_eq!(e.retry_after(), Some(1));
    }

    #[test]
    fn a_mover_meeting_a_sealed_bucket_answers_try_again_not_internal() {
        let e = ApiError::from(EngineError::Mover(MoverError::Store(StoreError::Stale(
            "bucket 3".into(),
        ))));
        let (status, body) = e.problem();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body.kind, "urn:shardstock:try-again");
        let e = ApiError::from(EngineError::Mover(MoverError::Store(
            StoreError::Unavailable("timeout".into()),
        )));
        assert_eq!(e.problem().1.kind, "urn:shardstock:backend-unavailable");
    }
}
