//! A typed client of the HTTP API, written against `/openapi.json`.
//!
//! The project eats its own contract: the bench's HTTP load generator and the
//! API tests call the service through this module, so a change of a field,
//! a status or a header that breaks a client breaks them first. The answer
//! types here are the client's own (they own their strings, where the
//! server's views borrow), decoded with the document's names; every error
//! answer decodes into [`Problem`], whatever the status.
//!
//! Only what the callers use is wrapped; the rest of the API is one
//! [`Client::request`] away.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A failed call: the transport, a problem answer, or a body that is not
/// what the document says.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// Any error answer (`application/problem+json`).
    #[error("{status}: {} ({})", problem.kind, problem.detail)]
    Problem {
        status: StatusCode,
        problem: Box<Problem>,
        /// `Idempotent-Replayed: true`: a stored refusal, answered again.
        replayed: bool,
    },
    #[error("unexpected answer {status}: {body}")]
    Unexpected { status: StatusCode, body: String },
}

impl ClientError {
    /// The problem's slug (`sold-out`, …) when the service answered one.
    pub fn slug(&self) -> Option<&str> {
        match self {
            Self::Problem { problem, .. } => problem.kind.strip_prefix("urn:shardstock:"),
            _ => None,
        }
    }
}

/// An error body (RFC 9457), as the document's `Problem` schema.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub remaining: Option<u64>,
    pub limit: Option<u32>,
    pub held: Option<u64>,
    pub outcome: Option<String>,
    /// `not-on-sale` before the sale opens: when it opens (RFC 3339).
    #[serde(default)]
    pub starts_at: Option<String>,
}

/// `POST /v1/events`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewEvent {
    pub id: String,
    pub stock: u64,
    pub buckets: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_user_limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_order: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<String>,
    /// Seconds a buyer has to confirm (pay) a purchase; `None`: final at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_seconds: Option<u32>,
}

/// `POST /v1/events/{id}/purchases`.
#[derive(Debug, Clone, Serialize)]
pub struct NewPurchase {
    pub user_id: String,
    pub quantity: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// One bucket of an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Bucket {
    pub index: u32,
    pub remaining: u64,
}

/// The document's `EventView`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub id: String,
    pub stock: u64,
    pub remaining: u64,
    pub sold: u64,
    pub buckets: Vec<Bucket>,
    pub bucket_count: u32,
    pub skew: f64,
    pub status: String,
    pub in_transfer: u64,
    pub per_user_limit: Option<u32>,
    pub max_per_order: u32,
    pub starts_at: Option<String>,
    pub ends_at: Option<String>,
    pub generation: u32,
    pub leftover: Option<u64>,
    pub hold_seconds: Option<u32>,
    /// Units in live holds (not in `remaining`).
    #[serde(default)]
    pub held: u64,
    /// The bounds of an adaptive bucket count (absent: fixed).
    #[serde(default)]
    pub auto_buckets: Option<BucketRange>,
    /// The layouts over time, the current one last.
    #[serde(default)]
    pub bucket_history: Vec<Layout>,
    /// Only in the answer to create: what was accepted but unwise (a small
    /// stock per bucket); empty when there is nothing to say.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The document's `BucketRange`: the bounds of an adaptive bucket count
/// ([`Event::auto_buckets`]). The client's own, like every answer type here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BucketRange {
    pub min: u32,
    pub max: u32,
}

/// One entry of [`Event::bucket_history`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Layout {
    pub generation: u32,
    pub buckets: u32,
    pub at: Option<String>,
    pub reason: String,
}

/// The document's `Order`: a purchase's answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub event_id: String,
    pub user_id: String,
    pub quantity: u32,
    pub bucket: u32,
    pub probes: u32,
    /// `held` on an event with holds (confirm before `pay_by`); absent otherwise.
    #[serde(default)]
    pub status: Option<String>,
    /// RFC 3339: the deadline of a held order.
    #[serde(default)]
    pub pay_by: Option<String>,
}

/// The document's `OrderView`: an order looked up or cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OrderInfo {
    pub order_id: String,
    pub event_id: String,
    pub user_id: String,
    pub quantity: u32,
    pub bucket: u32,
    /// `held`, `confirmed`, `expired` or `cancelled`.
    pub status: String,
    pub request_id: Option<String>,
    pub created_at: Option<String>,
    /// RFC 3339: the deadline of an order taken as a hold.
    #[serde(default)]
    pub pay_by: Option<String>,
}

/// A purchase's answer with the replay header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bought {
    pub order: Order,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
}

/// A client of one service.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    /// A client of the service at `base` (`http://host:port`).
    pub fn new(base: impl Into<String>) -> Result<Self, ClientError> {
        Ok(Self::with_http(
            base,
            reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        ))
    }

    /// A client over a configured `reqwest::Client` (pool size, timeouts).
    pub fn with_http(base: impl Into<String>, http: reqwest::Client) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            http,
            token: None,
        }
    }

    /// Sends the admin token on the admin operations.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A request to `path`, with the admin token when one is set.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// `POST /v1/events` (admin).
    pub async fn create_event(&self, event: &NewEvent) -> Result<Event, ClientError> {
        answer(self.request(Method::POST, "/v1/events").json(event)).await
    }

    /// `GET /v1/events/{id}`.
    pub async fn event(&self, id: &str) -> Result<Event, ClientError> {
        answer(self.request(Method::GET, &format!("/v1/events/{id}"))).await
    }

    /// `POST /v1/events/{id}/purchases`.
    pub async fn purchase(&self, event: &str, p: &NewPurchase) -> Result<Bought, ClientError> {
        let r = self
            .request(Method::POST, &format!("/v1/events/{event}/purchases"))
            .json(p)
            .send()
            .await?;
        let replayed = r
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        Ok(Bought {
            order: decode(r, replayed).await?,
            replayed,
        })
    }

    /// `GET /v1/orders/{id}`.
    pub async fn order(&self, id: &str) -> Result<OrderInfo, ClientError> {
        answer(self.request(Method::GET, &format!("/v1/orders/{id}"))).await
    }

    /// `POST /v1/orders/{id}/cancel`.
    pub async fn cancel(&self, id: &str) -> Result<OrderInfo, ClientError> {
        answer(self.request(Method::POST, &format!("/v1/orders/{id}/cancel"))).await
    }

    /// `POST /v1/orders/{id}/confirm`: a held order paid for (a confirmed
    /// one answers as it is). After its `pay_by`: a problem
    /// `urn:shardstock:hold-expired`; cancelled: `urn:shardstock:order-cancelled`.
    pub async fn confirm(&self, id: &str) -> Result<OrderInfo, ClientError> {
        answer(self.request(Method::POST, &format!("/v1/orders/{id}/confirm"))).await
    }

    /// `GET /readyz`: whether the store and the database answer.
    pub async fn ready(&self) -> bool {
        self.request(Method::GET, "/readyz")
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK)
    }
}

async fn answer<T: DeserializeOwned>(request: RequestBuilder) -> Result<T, ClientError> {
    decode(request.send().await?, false).await
}

async fn decode<T: DeserializeOwned>(
    r: reqwest::Response,
    replayed: bool,
) -> Result<T, ClientError> {
    let status = r.status();
    let body = r.bytes().await?;
    if status.is_success() {
        return serde_json::from_slice(&body).map_err(|_| ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    match serde_json::from_slice::<Problem>(&body) {
        Ok(problem) => Err(ClientError::Problem {
            status,
            problem: Box::new(problem),
            replayed,
        }),
        Err(_) => Err(ClientError::Unexpected {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
    }
}
