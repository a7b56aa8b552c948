//! The peers a purchase over HTTP is judged against: hand-written axum
//! endpoints, each run by `shardstock-bench --serve-peer KIND` in its own
//! process so its CPU time can be read on its own.
//!
//! All three answer the service's purchase route,
//! `POST /v1/events/{id}/purchases` with `{"user_id", "quantity",
//! "request_id"}`, and `GET /readyz`:
//! - [`Peer::Bare`]: parse the JSON body, answer 201 (the HTTP ceiling);
//! - [`Peer::Lua`]: the single-key check-and-decrement script
//!   (`lua/bench_single_key.lua`) on `bench:{<id>}:stock`, 201 or 409;
//! - [`Peer::LuaXadd`]: the same plus an XADD of the order record in the
//!   script (`lua/bench_single_key_xadd.lua`).
//!
//! None of them has idempotency, per-user limits, a ledger or an audit: they
//! are what "writing the seeds' approach by hand" costs, the floor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fred::prelude::*;
use fred::types::scripts::Script;
use serde::Deserialize;
use serde_json::json;

use crate::BenchError;
use crate::baselines::SINGLE_KEY_LUA;

const XADD_LUA: &str = include_str!("../../lua/bench_single_key_xadd.lua");

/// Which peer to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// axum parsing the body and answering 201.
    Bare,
    /// axum + fred + the single-key Lua check-and-decrement.
    Lua,
    /// The same with an XADD of the order record in the script.
    LuaXadd,
}

impl Peer {
    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            Peer::Bare => "axum, parse the body, answer 201 (HTTP ceiling)",
            Peer::Lua => "axum + fred + single-key Lua",
            Peer::LuaXadd => "axum + fred + single-key Lua + XADD",
        }
    }

    /// Whether the peer needs Redis.
    pub fn uses_redis(self) -> bool {
        self != Peer::Bare
    }
}

/// The stock key a peer sells from for `event`.
pub fn stock_key(event: &str) -> String {
    format!("bench:{{{event}}}:stock")
}

#[derive(Deserialize)]
struct Purchase {
    user_id: String,
    quantity: u32,
    #[serde(default)]
    request_id: Option<String>,
}

struct Shared {
    peer: Peer,
    redis: Option<(Client, Script)>,
    next: AtomicU64,
}

/// Serves `peer` on `listen` until the process is killed.
pub async fn serve_peer(peer: Peer, listen: &str, redis: &str) -> Result<(), BenchError> {
    let redis = if peer.uses_redis() {
        let client = crate::baselines::connect_redis(redis).await?;
        let script = Script::from_lua(if peer == Peer::Lua {
            SINGLE_KEY_LUA
        } else {
            XADD_LUA
        });
        script.load(&client).await?;
        Some((client, script))
    } else {
        None
    };
    let shared = Arc::new(Shared {
        peer,
        redis,
        next: AtomicU64::new(1),
    });
    let app = Router::new()
        .route("/readyz", get(|| async { "ready" }))
        .route("/v1/events/{id}/purchases", post(purchase))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| BenchError::Unavailable(format!("cannot listen on {listen}: {e}")))?;
    axum::serve(listener, app)
        .await
        .map_err(|e| BenchError::Unavailable(e.to_string()))
}

async fn purchase(
    State(s): State<Arc<Shared>>,
    Path(event): Path<String>,
    Json(p): Json<Purchase>,
) -> Response {
    let taken = match &s.redis {
        None => Ok(1),
        Some((client, script)) => {
            let stock = stock_key(&event);
            if s.peer == Peer::Lua {
                script
                    .evalsha_with_reload::<i64, _, _>(client, stock, p.quantity)
                    .await
            } else {
                let orders = format!("bench:{{{event}}}:orders");
                let record = format!(
                    "{}|{}|{}",
                    p.user_id,
                    p.quantity,
                    p.request_id.as_deref().unwrap_or("")
                );
                script
                    .evalsha_with_reload::<i64, _, _>(
                        client,
                        vec![stock, orders],
                        vec![p.quantity.to_string(), record],
                    )
                    .await
            }
        }
    };
    match taken {
        Ok(1) => {
            let id = s.next.fetch_add(1, Ordering::Relaxed);
            let body = json!({"order_id": format!("o{id}"), "event_id": event,
                "user_id": p.user_id, "quantity": p.quantity, "status": "confirmed"});
            (StatusCode::CREATED, Json(body)).into_response()
        }
        Ok(_) => (
            StatusCode::CONFLICT,
            Json(json!({"type": "urn:shardstock:sold-out", "status": 409})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"type": "urn:shardstock:backend-unavailable", "detail": e.to_string()})),
        )
            .into_response(),
    }
}
