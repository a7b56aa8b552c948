//! Fair drops' first slice: the `token` access mode (docs/DESIGN.md, "Fair
//! drops"). A purchase carries a token a waiting room signed; the engine
//! checks its signature, user and expiry, and the home step checks and
//! consumes its allowance with the take (the saga: reserves it at the home
//! step, the finish consumes it or gives it back).
//!
//! On every backend: many buyers at once with tokens of allowance 1 and 2,
//! reusing their token under new request ids, using another user's, forged
//! and expired ones, and replaying request ids; checked against the
//! store's sales and the ledger's orders. Then the saga's reservation, a
//! token's consumption moved by reshards, and the model's fixed trace.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::{lifecycle, reshard};
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::model::EventSpec;
use shardstock::domain::token::{TokenAccess, TokenRefusal, mint};
use shardstock::engine::{PurchaseOutcome, PurchaseRequest, Refusal};
use shardstock::{Engine, EngineError, Store};
use tokio_util::sync::CancellationToken;

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::faulty::Faulty;
use crate::harness::{
    Backend, TOKEN, TestApp, eid, event_id, ledger_for, on_every_backend, problem, spec, user,
    user_homed_at,
};

on_every_backend!(
    token_holders_buy_their_allowance_and_nobody_buys_without_a_valid_token,
    a_saga_reserves_the_allowance_and_gives_it_back_when_sold_out,
    a_reshard_moves_each_tokens_consumption_with_its_user,
    the_models_checked_before_take_trace_buys_once,
    a_release_does_not_adopt_a_token_event_as_a_pool,
    a_batch_of_token_purchases_answers_each_entry_as_alone,
    keys_rotated_on_a_live_event_verify_on_every_engine_within_a_refresh,
    a_refresh_reads_the_keys_alone_and_still_picks_up_a_rotation,
);

on_every_backend!(
    app:
    the_api_takes_access_and_token_keys_and_answers_each_refusal_by_its_type,
    an_admin_mints_tokens_every_user_buys_with_and_the_bounds_name_their_field,
    token_checks_are_counted_by_outcome,
    the_api_rotates_an_events_keys_and_names_each_refusal,
);

const KEYS: [&str; 2] = ["old-key-0123456789abcdef", "new-key-0123456789abcdef"];
/// Far in the future (unix seconds): 2100-01-01.
const LATER: i64 = 4_102_444_800;

fn token_spec(id: &EventId, stock: u64, buckets: u32) -> EventSpec {
    let mut s = spec(id, stock, buckets);
    s.tokens = Some(TokenAccess {
        keys: KEYS.iter().map(|k| k.to_string()).collect(),
    });
    s
}

fn buy(event: &EventId, who: &str, qty: u32, rid: &str, token: Option<String>) -> PurchaseRequest {
    PurchaseRequest {
        event: event.clone(),
        user: user(who),
        quantity: qty,
        request_id: Some(RequestId::parse(rid.to_owned()).unwrap()),
        access_token: token,
    }
}

/// The answer to `req`, retried under its request id while the engine
/// answers an error (contention, a layout changing): a retry never buys
/// twice, and ends with what the first attempt did.
async fn answer<S: Store>(engine: &Engine<S>, req: &PurchaseRequest) -> PurchaseOutcome {
    for _ in 0..50 {
        match engine.purchase(req).await {
            Ok(out) => return out,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("{:?} kept failing", req.request_id)
}

/// What a purchase tries with: the buyer's own token, or one that is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Own,
    Theirs,
    Forged,
    Expired,
    Missing,
}

async fn token_holders_buy_their_allowance_and_nobody_buys_without_a_valid_token<S: Store>(
    engine: Engine<S>,
) {
    let engine = Arc::new(engine);
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("tokens");
    // 24 users over 4 buckets, allowance 1 or 2 (36 units): every unit
    // has a holder, and homes that run dry send their buyers on the saga.
    let users: Vec<String> = (0..24)
        .map(|i| user_homed_at(i % 3, 4, &format!("t{i}")))
        .collect();
    let allowance = |i: usize| 1 + (i % 2) as u32;
    let stock: u64 = (0..users.len()).map(|i| u64::from(allowance(i))).sum();
    lifecycle::create(&engine, &ledger, token_spec(&id, stock, 4))
        .await
        .unwrap();
    let own = |i: usize| mint(KEYS[i % 2], &id, &users[i], allowance(i), LATER);
    let mut attempts = Vec::new();
    for (i, u) in users.iter().enumerate() {
        // One attempt more than the allowance, each its own request id,
        // one unit each: exactly the allowance buys.
        for k in 0..=allowance(i) {
            attempts.push((
                Kind::Own,
                buy(&id, u, 1, &format!("{u}-own-{k}"), Some(own(i))),
            ));
        }
        let theirs = own((i + 1) % users.len());
        attempts.push((
            Kind::Theirs,
            buy(&id, u, 1, &format!("{u}-theirs"), Some(theirs)),
        ));
        let forged = mint("not-this-events-key-0000", &id, u, 5, LATER);
        attempts.push((
            Kind::Forged,
            buy(&id, u, 1, &format!("{u}-forged"), Some(forged)),
        ));
        let expired = mint(KEYS[0], &id, u, 5, 1_000_000);
        attempts.push((
            Kind::Expired,
            buy(&id, u, 1, &format!("{u}-expired"), Some(expired)),
        ));
        attempts.push((Kind::Missing, buy(&id, u, 1, &format!("{u}-missing"), None)));
    }
    let answers: Vec<PurchaseOutcome> = futures::future::join_all(attempts.iter().map(|(_, r)| {
        let engine = engine.clone();
        async move { answer(&engine, r).await }
    }))
    .await;
    let mut bought: HashMap<String, u32> = HashMap::new();
    let mut orders = HashMap::new();
    for ((kind, req), out) in attempts.iter().zip(&answers) {
        match (kind, &out.result) {
            (Kind::Own, Ok(order)) => {
                *bought.entry(req.user.to_string()).or_default() += order.quantity;
                orders.insert(req.request_id.clone(), order.order_id.clone());
            }
            (Kind::Own, Err(Refusal::Token(TokenRefusal::Used))) => {}
            (Kind::Theirs, Err(Refusal::Token(TokenRefusal::OtherUser)))
            | (Kind::Forged, Err(Refusal::Token(TokenRefusal::Invalid)))
            | (Kind::Expired, Err(Refusal::Token(TokenRefusal::Expired)))
            | (Kind::Missing, Err(Refusal::Token(TokenRefusal::Missing))) => {}
            other => panic!("{kind:?} purchase {:?} answered {other:?}", req.request_id),
        }
    }
    // Every holder bought exactly their allowance (the stock covers them
    // all); nobody bought past it, nor without their own valid token.
    for (i, u) in users.iter().enumerate() {
        assert_eq!(bought.get(u).copied().unwrap_or(0), allowance(i), "{u}");
    }
    let view = engine.view(&id).await.unwrap();
    assert_eq!(view.remaining, 0, "the store sold every unit: {view:?}");
    // A token whose allowance is spent refuses a new request id…
    let again = answer(&engine, &buy(&id, &users[0], 1, "late", Some(own(0)))).await;
    assert_eq!(again.result, Err(Refusal::Token(TokenRefusal::Used)));
    // …and a replay answers its original order without checking the token
    // again (here: a forged one, and none at all).
    for ((kind, req), out) in attempts.iter().zip(&answers) {
        if *kind != Kind::Own || out.result.is_err() {
            continue;
        }
        for token in [Some("forged".to_owned()), None] {
            let replay = PurchaseRequest {
                access_token: token,
                ..req.clone()
            };
            let again = answer(&engine, &replay).await;
            assert!(again.replayed, "{:?}", req.request_id);
            assert_eq!(
                again.result.as_ref().map(|o| o.order_id.clone()).ok(),
                orders.get(&req.request_id).cloned()
            );
        }
    }
    // The ledger holds the same: per user, the allowance, no more.
    let meta = engine.reload(&id).await.unwrap();
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        "tokens".into(),
        FlushOptions {
            batch: 500,
            workers: 1,
            idle: Duration::from_millis(10),
            claim_idle_ms: 60_000,
        },
    );
    flusher
        .flush_once(&meta.all_buckets(), &CancellationToken::new())
        .await
        .unwrap();
    let mut in_ledger: HashMap<String, u64> = HashMap::new();
    for o in ledger.confirmed_orders(&id).await.unwrap() {
        *in_ledger.entry(o.user.clone()).or_default() += o.qty;
    }
    for (i, u) in users.iter().enumerate() {
        assert_eq!(
            in_ledger.get(u).copied().unwrap_or(0),
            u64::from(allowance(i)),
            "{u}"
        );
    }
    assert_eq!(in_ledger.len(), users.len());
}

/// One unit in each of two buckets. A holder homed at bucket 0 with an
/// allowance of 2 buys on the fast path, then on the saga (the unit in
/// bucket 1), then is refused as used. A second holder homed there, with
/// an allowance of 1, finds the event sold out after a saga: the
/// reservation comes back, so a retry under a new request id is refused
/// sold out again, not as used.
async fn a_saga_reserves_the_allowance_and_gives_it_back_when_sold_out<S: Store>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("tsaga");
    lifecycle::create(&engine, &ledger, token_spec(&id, 2, 2))
        .await
        .unwrap();
    let a = user_homed_at(0, 2, "sa");
    let b = user_homed_at(0, 2, "sb");
    let ta = mint(KEYS[1], &id, &a, 2, LATER);
    let tb = mint(KEYS[0], &id, &b, 1, LATER);
    let first = answer(&engine, &buy(&id, &a, 1, "a1", Some(ta.clone()))).await;
    assert_eq!(first.result.as_ref().unwrap().probes, 0, "{first:?}");
    let second = answer(&engine, &buy(&id, &a, 1, "a2", Some(ta.clone()))).await;
    let order = second.result.as_ref().unwrap();
    assert_eq!(
        order.bucket, 1,
        "the saga took from the other bucket: {second:?}"
    );
    let third = answer(&engine, &buy(&id, &a, 1, "a3", Some(ta))).await;
    assert_eq!(third.result, Err(Refusal::Token(TokenRefusal::Used)));
    for rid in ["b1", "b2"] {
        let out = answer(&engine, &buy(&id, &b, 1, rid, Some(tb.clone()))).await;
        assert!(
            matches!(out.result, Err(Refusal::SoldOut { .. })),
            "{rid}: {out:?}"
        );
    }
}

/// A reshard moves each token's consumption with its user to the user's
/// new home (the restore), as it moves the per-user counts and request
/// records: after 2 → 5 → 3 buckets, a spent token stays spent, a token
/// with allowance left buys what is left and no more, and replays answer
/// their orders.
async fn a_reshard_moves_each_tokens_consumption_with_its_user<S: Store>(engine: Engine<S>) {
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("tmove");
    lifecycle::create(&engine, &ledger, token_spec(&id, 100, 2))
        .await
        .unwrap();
    let users: Vec<String> = (0..12).map(|i| format!("mv-{i}")).collect();
    let token = |i: usize| mint(KEYS[i % 2], &id, &users[i], 2, LATER);
    let mut orders = HashMap::new();
    for (i, u) in users.iter().enumerate() {
        // Even users spend their allowance of 2, odd ones one unit of it.
        let qty = if i % 2 == 0 { 2 } else { 1 };
        let out = answer(
            &engine,
            &buy(&id, u, qty, &format!("{u}-a"), Some(token(i))),
        )
        .await;
        orders.insert(i, out.result.expect("bought before the reshard").order_id);
    }
    for buckets in [5, 3] {
        reshard::reshard(&engine, &id, buckets).await.unwrap();
        assert_eq!(engine.view(&id).await.unwrap().bucket_count, buckets);
        for (i, u) in users.iter().enumerate() {
            let replay = answer(
                &engine,
                &buy(
                    &id,
                    u,
                    if i % 2 == 0 { 2 } else { 1 },
                    &format!("{u}-a"),
                    None,
                ),
            )
            .await;
            assert!(replay.replayed);
            assert_eq!(replay.result.unwrap().order_id, orders[&i]);
            let again = answer(
                &engine,
                &buy(&id, u, 1, &format!("{u}-{buckets}"), Some(token(i))),
            )
            .await;
            if i % 2 == 0 || buckets == 3 {
                // Spent before this reshard (odd users spent their second
                // unit in the layout of 5).
                assert_eq!(
                    again.result,
                    Err(Refusal::Token(TokenRefusal::Used)),
                    "{u} at {buckets}"
                );
            } else {
                assert!(again.result.is_ok(), "{u} at {buckets}: {again:?}");
            }
        }
    }
    // Even users 2 units each, odd ones 1 and 1 more in the layout of 5.
    assert_eq!(engine.view(&id).await.unwrap().remaining, 100 - 24);
}

/// Over HTTP: the create's members and their errors, each refusal's
/// problem type, a replay, the view's `access`, a reshard.
async fn the_api_takes_access_and_token_keys_and_answers_each_refusal_by_its_type(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("tapi");
    for (extra, field) in [
        (json!({"token_keys": [KEYS[0]]}), "token_keys"),
        (json!({"access": "token"}), "token_keys"),
        (
            json!({"access": "token", "token_keys": ["short"]}),
            "token_keys",
        ),
        (
            json!({"access": "token", "token_keys": [KEYS[0], KEYS[1], KEYS[0]]}),
            "token_keys",
        ),
        (json!({"access": "waiting-room"}), "access"),
        (
            json!({"access": "token", "token_keys": [KEYS[0]], "token_key": "x"}),
            "token_key",
        ),
    ] {
        let mut body = json!({"id": id, "stock": 4, "buckets": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap());
        let p = problem(
            app.admin_post("/v1/events", body).await,
            400,
            "invalid-request",
        )
        .await;
        assert!(
            p["detail"].as_str().unwrap().contains(field),
            "{field}: {p}"
        );
    }
    let view = app
        .create(&id, 4, 2, json!({"access": "token", "token_keys": KEYS}))
        .await;
    assert_eq!(view["access"], "token");
    let event = EventId::parse(id.clone()).unwrap();
    let path = format!("/v1/events/{id}/purchases");
    let buy = |user: &str, rid: &str, token: Option<String>| {
        let mut body = json!({"user_id": user, "quantity": 1, "request_id": rid});
        if let Some(t) = token {
            body["access_token"] = json!(t);
        }
        app.post(&path, body)
    };
    let good = mint(KEYS[1], &event, "u-1", 1, LATER);
    problem(buy("u-1", "r0", None).await, 403, "token-missing").await;
    let forged = mint("not-this-events-key-0000", &event, "u-1", 1, LATER);
    problem(buy("u-1", "r0", Some(forged)).await, 403, "token-invalid").await;
    problem(
        buy("u-2", "r0", Some(good.clone())).await,
        403,
        "token-not-yours",
    )
    .await;
    let expired = mint(KEYS[0], &event, "u-1", 1, 1_000_000);
    problem(buy("u-1", "r0", Some(expired)).await, 403, "token-expired").await;
    let too_long = "x".repeat(257);
    let p = problem(
        buy("u-1", "r0", Some(too_long)).await,
        400,
        "invalid-request",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("access_token"),
        "{p}"
    );
    // Nothing was kept under r0: it buys with the good token, and its
    // replay answers the order, token or none.
    let r = buy("u-1", "r0", Some(good.clone())).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let order: serde_json::Value = r.json().await.unwrap();
    let r = buy("u-1", "r0", None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let again: serde_json::Value = r.json().await.unwrap();
    assert_eq!(again["order_id"], order["order_id"]);
    problem(buy("u-1", "r1", Some(good)).await, 409, "token-used").await;
    // An open event ignores a token, and shows its access.
    let open = eid("topen");
    assert_eq!(app.create(&open, 4, 2, json!({})).await["access"], "open");
    let r = app
        .post(
            &format!("/v1/events/{open}/purchases"),
            json!({"user_id": "u-1", "quantity": 1, "access_token": "anything"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app
        .client
        .put(app.url(&format!("/v1/events/{id}/buckets")))
        .bearer_auth(TOKEN)
        .json(&json!({"buckets": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    problem(
        buy("u-1", "r2", Some(mint(KEYS[0], &event, "u-1", 1, LATER))).await,
        409,
        "token-used",
    )
    .await;
    // Closed and archived, its view still says `token` (the store's while
    // it keeps the event, then the database's, which keeps the access mode:
    // `control::lifecycle`'s unit test reads that one).
    assert_eq!(app.close(&id).await["access"], "token");
    let r = app
        .client
        .delete(app.url(&format!("/v1/events/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.view(&id).await["access"], "token");
}

/// `POST /v1/events/{id}/tokens`: an admin mints 100 users' tokens over
/// HTTP, signed with the event's first key (the expiry rounded down to the
/// second), and each user buys its allowance with its own; another user's
/// is refused as not theirs. The bounds each answer `400 invalid-request`
/// naming the field (or `access`, for an open event); 10,000 users of the
/// longest id fit the route's body limit.
async fn an_admin_mints_tokens_every_user_buys_with_and_the_bounds_name_their_field(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("tmint");
    app.create(&id, 250, 4, json!({"access": "token", "token_keys": KEYS}))
        .await;
    let event = EventId::parse(id.clone()).unwrap();
    let path = format!("/v1/events/{id}/tokens");
    let users: Vec<String> = (0..100).map(|i| format!("mint-{i}")).collect();
    let r = app
        .admin_post(
            &path,
            json!({"users": users, "allowance": 2, "expires_at_ms": LATER * 1000 + 999}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: serde_json::Value = r.json().await.unwrap();
    let tokens: Vec<String> = body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&users)
        .map(|(t, u)| {
            assert_eq!(t["user_id"], *u);
            t["token"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(tokens.len(), users.len());
    for (t, u) in tokens.iter().zip(&users) {
        assert_eq!(*t, mint(KEYS[0], &event, u, 2, LATER));
    }
    let purchases = format!("/v1/events/{id}/purchases");
    let buy = |user: &str, qty: u32, rid: &str, token: &str| {
        app.post(
            &purchases,
            json!({"user_id": user, "quantity": qty, "request_id": rid, "access_token": token}),
        )
    };
    problem(
        buy(&users[1], 1, "theirs", &tokens[0]).await,
        403,
        "token-not-yours",
    )
    .await;
    let bought =
        futures::future::join_all(users.iter().zip(&tokens).map(|(u, t)| buy(u, 2, "all", t)))
            .await;
    for (r, u) in bought.into_iter().zip(&users) {
        assert_eq!(r.status(), StatusCode::CREATED, "{u}");
    }
    for (u, t) in users.iter().zip(&tokens).take(5) {
        problem(buy(u, 1, "more", t).await, 409, "token-used").await;
    }
    assert_eq!(app.view(&id).await["remaining"], 50);
    // The bounds, each named.
    let many: Vec<String> = (0..10_001).map(|i| format!("u{i}")).collect();
    for (body, field) in [
        (
            json!({"users": [], "allowance": 1, "expires_at_ms": LATER * 1000}),
            "users",
        ),
        (
            json!({"users": many, "allowance": 1, "expires_at_ms": LATER * 1000}),
            "users",
        ),
        (
            json!({"users": ["a"], "allowance": 0, "expires_at_ms": LATER * 1000}),
            "allowance",
        ),
        (
            json!({"users": ["a"], "allowance": 1001, "expires_at_ms": LATER * 1000}),
            "allowance",
        ),
        (
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": 1_000_000}),
            "expires_at_ms",
        ),
        (
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": 1_000_000_000_000_000_u64}),
            "expires_at_ms",
        ),
        (
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": LATER * 1000, "allowence": 2}),
            "allowence",
        ),
        (
            json!({"users": ["a b"], "allowance": 1, "expires_at_ms": LATER * 1000}),
            "users",
        ),
    ] {
        let p = problem(app.admin_post(&path, body).await, 400, "invalid-request").await;
        assert!(
            p["detail"].as_str().unwrap().contains(field),
            "{field}: {p}"
        );
    }
    let open = eid("tmint-open");
    app.create(&open, 4, 2, json!({})).await;
    let p = problem(
        app.admin_post(
            &format!("/v1/events/{open}/tokens"),
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": LATER * 1000}),
        )
        .await,
        400,
        "invalid-request",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().starts_with("access:"), "{p}");
    problem(
        app.admin_post(
            &format!("/v1/events/{}/tokens", eid("tmint-none")),
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": LATER * 1000}),
        )
        .await,
        404,
        "unknown-event",
    )
    .await;
    problem(
        app.post(
            &path,
            json!({"users": ["a"], "allowance": 1, "expires_at_ms": LATER * 1000}),
        )
        .await,
        401,
        "unauthorized",
    )
    .await;
    // The most users, each of the longest id: within the route's body limit.
    let longest: Vec<String> = (0..10_000).map(|i| format!("{i:0>128}")).collect();
    let r = app
        .admin_post(
            &path,
            json!({"users": longest, "allowance": 1, "expires_at_ms": LATER * 1000}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["tokens"].as_array().unwrap().len(), 10_000);
}

/// `shardstock_token_checks_total{outcome}`: each outcome counted where the
/// engine learns it. The recorder is the process's, shared with the tests
/// running beside this one (their purchases count too): each outcome rose
/// by at least what this test did.
async fn token_checks_are_counted_by_outcome(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("tcount");
    app.create(&id, 20, 2, json!({"access": "token", "token_keys": KEYS}))
        .await;
    let event = EventId::parse(id.clone()).unwrap();
    let count = |text: &str, outcome: &str| {
        crate::harness::sample(
            text,
            "shardstock_token_checks_total",
            &[("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    let outcomes = [
        "consumed",
        "missing",
        "invalid",
        "not_yours",
        "expired",
        "used",
    ];
    let before = app.metrics().await;
    let path = format!("/v1/events/{id}/purchases");
    let buy = |user: &str, rid: &str, token: Option<String>| {
        let mut body = json!({"user_id": user, "quantity": 1, "request_id": rid});
        if let Some(t) = token {
            body["access_token"] = json!(t);
        }
        app.post(&path, body)
    };
    let own = |u: &str| mint(KEYS[0], &event, u, 1, LATER);
    for u in ["c-1", "c-2"] {
        assert_eq!(
            buy(u, "a", Some(own(u))).await.status(),
            StatusCode::CREATED
        );
    }
    problem(buy("c-3", "a", None).await, 403, "token-missing").await;
    let forged = mint("not-this-events-key-0000", &event, "c-3", 1, LATER);
    problem(buy("c-3", "a", Some(forged)).await, 403, "token-invalid").await;
    problem(
        buy("c-3", "a", Some(own("c-1"))).await,
        403,
        "token-not-yours",
    )
    .await;
    let expired = mint(KEYS[0], &event, "c-3", 1, 1_000_000);
    problem(buy("c-3", "a", Some(expired)).await, 403, "token-expired").await;
    problem(buy("c-1", "b", Some(own("c-1"))).await, 409, "token-used").await;
    let after = app.metrics().await;
    for (outcome, did) in outcomes.iter().zip([2.0, 1.0, 1.0, 1.0, 1.0, 1.0]) {
        let rose = count(&after, outcome) - count(&before, outcome);
        assert!(rose >= did, "{outcome} rose by {rose}, not {did}");
    }
    assert!(
        after.contains("# HELP shardstock_token_checks_total "),
        "described"
    );
}

/// The model's fixed trace `CHECKED_BEFORE_TAKE` (model/src/traces.rs), on
/// the model's CI bound: user 0's two requests with its one-unit token,
/// each sent twice. Broken, the check before the take let both buy; as
/// built, the first buys, the second is refused as used, and each answers
/// the same when sent again.
async fn the_models_checked_before_take_trace_buys_once<S: Store>(engine: Engine<S>) {
    use shardstock_model::admission::{Action, Bounds, Carry};
    use shardstock_model::traces::CHECKED_BEFORE_TAKE;
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("tmodel");
    let bound = Bounds::CI;
    let buckets = u32::from(bound.buckets);
    lifecycle::create(
        &engine,
        &ledger,
        token_spec(&id, u64::from(bound.stock), buckets),
    )
    .await
    .unwrap();
    // The model's user u is homed at bucket u % buckets.
    let users: Vec<String> = (0..bound.tokens)
        .map(|u| user_homed_at(u32::from(u % bound.buckets), buckets, "model"))
        .collect();
    let token_of = |u: u8| {
        mint(
            KEYS[0],
            &id,
            &users[usize::from(u)],
            u32::from(bound.allowance),
            LATER,
        )
    };
    let mut first: HashMap<u8, PurchaseOutcome> = HashMap::new();
    for action in CHECKED_BEFORE_TAKE {
        let Action::Purchase(r) = *action else {
            panic!("the trace is of purchases: {action:?}");
        };
        let (u, carry) = bound.requests[usize::from(r)];
        let token = match carry {
            Carry::Own => token_of(u),
            Carry::Of(other) => token_of(other),
            Carry::Forged => mint(
                "not-this-events-key-0000",
                &id,
                &users[usize::from(u)],
                1,
                LATER,
            ),
        };
        let req = buy(
            &id,
            &users[usize::from(u)],
            1,
            &format!("model-{r}"),
            Some(token),
        );
        let out = answer(&engine, &req).await;
        match first.get(&r) {
            Some(was) => assert_eq!(was.result, out.result, "request {r} sent again"),
            None => {
                first.insert(r, out);
            }
        }
    }
    assert!(first[&0].result.is_ok(), "{:?}", first[&0]);
    assert_eq!(first[&1].result, Err(Refusal::Token(TokenRefusal::Used)));
}

/// What a token purchase costs beside an open one, on a private Redis, one
/// purchase a call (unbatched): Redis's microseconds per script call
/// (`INFO commandstats`) and the client's wall time. A measurement, not a
/// check: `cargo test --test it -- --ignored tokens::token_purchase_cost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn token_purchase_cost() {
    use crate::harness::{RedisServer, connect, unbatched};
    let server = RedisServer::start();
    let engine = Engine::new(connect(&server.url(), "tcost").await, unbatched());
    let redis = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &server.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    const N: usize = 2_000;
    for tokens in [false, true] {
        let id = event_id("tcost");
        let s = if tokens {
            token_spec(&id, N as u64, 1)
        } else {
            spec(&id, N as u64, 1)
        };
        engine.create_event(s).await.unwrap();
        engine.meta(&id).await.unwrap();
        redis(&["config", "resetstat"]);
        let start = std::time::Instant::now();
        for i in 0..N {
            let u = format!("c{i}");
            let token = tokens.then(|| mint(KEYS[0], &id, &u, 1, LATER));
            let out = answer(&engine, &buy(&id, &u, 1, &format!("r{i}"), token)).await;
            assert!(out.result.is_ok(), "{out:?}");
        }
        let wall = start.elapsed().as_secs_f64() * 1e6 / N as f64;
        let stats = redis(&["info", "commandstats"]);
        let evalsha = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .unwrap_or("")
            .to_owned();
        println!(
            "{}: {wall:.0} µs a purchase (client wall), {evalsha}",
            if tokens { "token" } else { "open" }
        );
    }
}

/// A release whose pool id is a token event's is refused: release orders
/// take without a token, so adopted as a pool the event would sell to
/// anyone.
async fn a_release_does_not_adopt_a_token_event_as_a_pool<S: Store>(engine: Engine<S>) {
    use shardstock::domain::release::{PoolSpec, ReleaseSpec};
    let release = eid("tokrel");
    let pool = EventId::parse(format!("{release}.p0")).unwrap();
    engine.create_event(token_spec(&pool, 10, 2)).await.unwrap();
    let spec = ReleaseSpec {
        id: EventId::parse(release.clone()).unwrap(),
        pools: vec![PoolSpec {
            name: EventId::parse("p0").unwrap(),
            stock: 10,
            buckets: 2,
            auto_buckets: None,
        }],
        per_user_limit: None,
        max_per_order: 3,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        homes: 2,
    };
    let e = engine.create_release(spec.clone()).await.unwrap_err();
    assert!(
        matches!(&e, shardstock::engine::EngineError::EventExists(id) if *id == pool),
        "{e:?}"
    );
    assert!(engine.meta(&pool).await.unwrap().spec.tokens.is_some());
    // Nothing of the release was stored: no release sells from the pool.
    assert!(
        !engine
            .store()
            .list_releases()
            .await
            .unwrap()
            .contains(&spec.id),
        "the refused release was stored"
    );
}

/// A call of several token purchases on one bucket (the batcher's, sent to
/// the home step whole) answers each entry as it would alone: a call of
/// fresh request ids with distinct tokens buys in one pass (Redis: the
/// uniform path, one stream record), one mixing replays, refused tokens
/// and spent allowances buys the rest, one naming a token twice spends
/// its allowance once, and one where nothing buys changes nothing.
async fn a_batch_of_token_purchases_answers_each_entry_as_alone<S: Store>(engine: Engine<S>) {
    use shardstock::domain::ids::OrderId;
    use shardstock::domain::keys::BucketRef;
    use shardstock::domain::model::RequestRecord;
    use shardstock::domain::token::TokenUse;
    use shardstock::store::{PurchaseEntry, PurchaseReply};
    let id = event_id("tbatch");
    engine.create_event(token_spec(&id, 10, 1)).await.unwrap();
    let store = engine.store();
    let bucket = BucketRef::new(&id, 0, 0);
    let mut seq = 0u64;
    let mut entry = |who: &str, rid: &str, qty: u32, token: TokenUse| {
        seq += 1;
        PurchaseEntry {
            user: user(who),
            qty,
            limit: 0,
            rid: rid.into(),
            keep: true,
            order_id: OrderId::generate(&id, seq),
            pay_by: None,
            token: Some(token),
        }
    };
    let valid = |name: &str, allowance: u32| TokenUse::Valid {
        id: format!("tok-{name}"),
        allowance,
    };
    let bought = |r: &PurchaseReply| matches!(r, PurchaseReply::Bought { .. });
    let used = PurchaseReply::TokenRefused(TokenRefusal::Used);

    // Fresh request ids, distinct tokens: every entry buys.
    let first = [
        entry("a", "a-1", 1, valid("a", 2)),
        entry("b", "b-1", 1, valid("b", 1)),
    ];
    let r = store.purchase(&bucket, 0, &first).await.unwrap();
    assert!(r.iter().all(bought), "{r:?}");

    // A replay, a refused token, a quantity past its allowance, a token
    // with allowance left and a spent one, in one call.
    let second = [
        first[0].clone(),
        entry("c", "c-1", 1, TokenUse::Refused(TokenRefusal::Expired)),
        entry("d", "d-1", 2, valid("d", 1)),
        entry("a", "a-2", 1, valid("a", 2)),
        entry("b", "b-2", 1, valid("b", 1)),
    ];
    let r = store.purchase(&bucket, 0, &second).await.unwrap();
    assert!(
        matches!(&r[0], PurchaseReply::Replay(RequestRecord::Bought { .. })),
        "{r:?}"
    );
    assert_eq!(r[1], PurchaseReply::TokenRefused(TokenRefusal::Expired));
    assert_eq!(r[2], used, "2 units on an allowance of 1");
    assert!(bought(&r[3]), "the second unit of an allowance of 2: {r:?}");
    assert_eq!(r[4], used, "an allowance of 1 spent");

    // One token twice in a call: its one unit buys once.
    let third = [
        entry("e", "e-1", 1, valid("e", 1)),
        entry("e", "e-2", 1, valid("e", 1)),
    ];
    let r = store.purchase(&bucket, 0, &third).await.unwrap();
    assert!(bought(&r[0]), "{r:?}");
    assert_eq!(r[1], used);

    // Nothing in the call buys: a spent token and a replay.
    let fourth = [entry("a", "a-3", 1, valid("a", 2)), first[1].clone()];
    let r = store.purchase(&bucket, 0, &fourth).await.unwrap();
    assert_eq!(r[0], used);
    assert!(matches!(&r[1], PurchaseReply::Replay(_)), "{r:?}");

    // Bought: a twice, b and e once; nothing else was taken.
    assert_eq!(store.bucket_state(&bucket).await.unwrap().stock, 10 - 4);
}

/// A rotation on a live event, in its two steps, seen by two engines over
/// one store: the engine that rotates verifies with the new keys at once,
/// the other once it refreshes (the draw timer's tick), and not before.
/// Then an open event, a closed one and bad keys are refused, each by its
/// field or state, and nothing changes.
/// The draw timer's refresh, each second on every instance, reads each
/// cached event's keys alone (`load_token_keys`), and the whole meta only
/// where they changed.
async fn a_refresh_reads_the_keys_alone_and_still_picks_up_a_rotation<S: Store>(engine: Engine<S>) {
    // The other instance counts its store calls.
    let other = Engine::new(
        Faulty::plain(engine.store().clone()),
        engine.options().clone(),
    );
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("refresh-keys");
    lifecycle::create(&engine, &ledger, token_spec(&id, 10, 2))
        .await
        .unwrap();
    other.reload(&id).await.unwrap();
    let calls = |step| other.store().calls(step);
    let (metas, keys) = (calls("load_meta"), calls("load_token_keys"));
    other.refresh_token_keys().await.unwrap();
    assert_eq!(calls("load_token_keys") - keys, 1, "one read of the keys");
    assert_eq!(
        calls("load_meta") - metas,
        0,
        "no meta read: nothing changed"
    );

    const NEW: &str = "refreshed-key-0123456789ab";
    let rotated = TokenAccess {
        keys: vec![NEW.to_owned(), KEYS[0].to_owned()],
    };
    engine.rotate_token_keys(&id, rotated).await.unwrap();
    let token = Some(mint(NEW, &id, "k1", 1, LATER));
    let before = answer(&other, &buy(&id, "k1", 1, "refresh-k1-a", token.clone())).await;
    assert_eq!(
        before.result.map(|_| ()),
        Err(Refusal::Token(TokenRefusal::Invalid)),
        "the other instance's cached keys, until it refreshes"
    );
    let (metas, keys) = (calls("load_meta"), calls("load_token_keys"));
    other.refresh_token_keys().await.unwrap();
    assert_eq!(calls("load_token_keys") - keys, 1);
    assert_eq!(
        calls("load_meta") - metas,
        1,
        "the meta read again: keys changed"
    );
    let after = answer(&other, &buy(&id, "k1", 1, "refresh-k1-b", token)).await;
    assert!(after.result.is_ok(), "the rotation picked up: {after:?}");
}

async fn keys_rotated_on_a_live_event_verify_on_every_engine_within_a_refresh<S: Store>(
    engine: Engine<S>,
) {
    let other = Engine::new(engine.store().clone(), engine.options().clone());
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("rotate");
    lifecycle::create(&engine, &ledger, token_spec(&id, 100, 2))
        .await
        .unwrap();
    const NEW: &str = "rotated-key-0123456789abcdef";
    let mut n = 0;
    // A new buyer at engine `e` with a token signed by `key`: bought, or
    // why refused.
    macro_rules! try_buy {
        ($e:expr, $key:expr) => {{
            n += 1;
            let who = format!("r{n}");
            let token = Some(mint($key, &id, &who, 5, LATER));
            let req = buy(&id, &who, 1, &format!("rot-{who}"), token);
            answer($e, &req).await.result.map(|_| ())
        }};
    }
    let invalid = Err(Refusal::Token(TokenRefusal::Invalid));
    // Both engines know the event, with its first keys.
    assert_eq!(try_buy!(&engine, KEYS[0]), Ok(()));
    assert_eq!(try_buy!(&other, KEYS[0]), Ok(()));
    assert_eq!(try_buy!(&other, NEW), invalid, "not a key yet");

    // Step one: the new key first, the old one beside it.
    let keys = |k: &[&str]| TokenAccess {
        keys: k.iter().map(|s| s.to_string()).collect(),
    };
    engine
        .rotate_token_keys(&id, keys(&[NEW, KEYS[0]]))
        .await
        .unwrap();
    assert_eq!(try_buy!(&engine, NEW), Ok(()), "at once where rotated");
    assert_eq!(try_buy!(&engine, KEYS[0]), Ok(()), "the old key too");
    assert_eq!(
        try_buy!(&other, NEW),
        invalid,
        "the other engine verifies with its cached keys until it refreshes"
    );
    other.refresh_token_keys().await.unwrap();
    assert_eq!(try_buy!(&other, NEW), Ok(()));
    assert_eq!(try_buy!(&other, KEYS[0]), Ok(()));

    // Step two: the old key dropped.
    engine.rotate_token_keys(&id, keys(&[NEW])).await.unwrap();
    other.refresh_token_keys().await.unwrap();
    for e in [&engine, &other] {
        assert_eq!(try_buy!(e, KEYS[0]), invalid, "a rotated-out key");
        assert_eq!(try_buy!(e, NEW), Ok(()));
        assert_eq!(
            try_buy!(e, KEYS[1]),
            invalid,
            "a key dropped by the first rotation"
        );
    }

    // Refused: bad keys (named), an open event, a closed one.
    let bad = engine
        .rotate_token_keys(&id, keys(&[NEW, KEYS[0], KEYS[1]]))
        .await;
    assert!(
        matches!(
            &bad,
            Err(EngineError::Invalid {
                field: "token_keys",
                ..
            })
        ),
        "{bad:?}"
    );
    let short = engine.rotate_token_keys(&id, keys(&["short"])).await;
    assert!(
        matches!(
            &short,
            Err(EngineError::Invalid {
                field: "token_keys",
                ..
            })
        ),
        "{short:?}"
    );
    let open = event_id("rotate-open");
    lifecycle::create(&engine, &ledger, spec(&open, 10, 1))
        .await
        .unwrap();
    let refused = engine.rotate_token_keys(&open, keys(&[NEW])).await;
    assert!(
        matches!(
            &refused,
            Err(EngineError::Invalid {
                field: "token_keys",
                ..
            })
        ),
        "{refused:?}"
    );
    let walk_in = PurchaseRequest {
        access_token: None,
        ..buy(&open, "walk-in", 1, "rot-open", None)
    };
    assert!(answer(&engine, &walk_in).await.result.is_ok(), "still open");
    assert_eq!(try_buy!(&engine, NEW), Ok(()), "the keys stayed");
    let unknown = engine
        .rotate_token_keys(&event_id("rotate-none"), keys(&[NEW]))
        .await;
    assert!(
        matches!(unknown, Err(EngineError::UnknownEvent(_))),
        "{unknown:?}"
    );
    let engine = Arc::new(engine);
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        "rotate".into(),
        FlushOptions {
            batch: 500,
            workers: 1,
            idle: Duration::from_millis(10),
            claim_idle_ms: 60_000,
        },
    );
    lifecycle::close(
        &engine,
        &ledger,
        &mut flusher,
        &id,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let closed = engine.rotate_token_keys(&id, keys(&[KEYS[1]])).await;
    assert!(
        matches!(&closed, Err(EngineError::NotOnSale { why: "closed", .. })),
        "{closed:?}"
    );
}

/// `PUT /v1/events/{id}/token-keys` over HTTP: admin only, 204, the new
/// key verifies at once and the dropped one is refused; bad keys and an
/// unknown member are refused naming the field, an open event naming
/// `token_keys`, an unknown event 404.
async fn the_api_rotates_an_events_keys_and_names_each_refusal(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rotate");
    app.create(
        &id,
        10,
        2,
        json!({"access": "token", "token_keys": [KEYS[0]]}),
    )
    .await;
    let path = format!("/v1/events/{id}/token-keys");
    const NEW: &str = "rotated-key-0123456789abcdef";
    let put = |path: String, body: serde_json::Value, admin: bool| {
        let mut req = app.client.put(app.url(&path)).json(&body);
        if admin {
            req = req.bearer_auth(TOKEN);
        }
        async move { req.send().await.unwrap() }
    };
    let r = put(path.clone(), json!({"token_keys": [NEW]}), false).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = put(path.clone(), json!({"token_keys": [NEW]}), true).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let event = EventId::parse(id.clone()).unwrap();
    let purchases = format!("/v1/events/{id}/purchases");
    let buy_with = |key: &str, who: &str| {
        let token = mint(key, &event, who, 1, LATER);
        app.post(
            &purchases,
            json!({"user_id": who, "quantity": 1, "access_token": token}),
        )
    };
    assert_eq!(buy_with(NEW, "h1").await.status(), StatusCode::CREATED);
    problem(buy_with(KEYS[0], "h2").await, 403, "token-invalid").await;

    for (body, field) in [
        (json!({"token_keys": [NEW, KEYS[0], KEYS[1]]}), "token_keys"),
        (json!({"token_keys": ["short"]}), "token_keys"),
        (
            json!({"token_keys": [NEW], "tokn_keys": [NEW]}),
            "tokn_keys",
        ),
    ] {
        let p = problem(put(path.clone(), body, true).await, 400, "invalid-request").await;
        assert!(
            p["detail"].as_str().unwrap().contains(field),
            "{field}: {p}"
        );
    }
    let open = eid("api-rotate-open");
    app.create(&open, 10, 1, json!({})).await;
    let open_path = format!("/v1/events/{open}/token-keys");
    let p = problem(
        put(open_path, json!({"token_keys": [NEW]}), true).await,
        400,
        "invalid-request",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("token_keys"), "{p}");
    let none = "/v1/events/no-such-event/token-keys".to_owned();
    problem(
        put(none, json!({"token_keys": [NEW]}), true).await,
        404,
        "unknown-event",
    )
    .await;
    // Unchanged by the refusals: the new key still buys.
    assert_eq!(buy_with(NEW, "h3").await.status(), StatusCode::CREATED);
}
