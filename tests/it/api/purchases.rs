//! `POST /v1/events/{id}/purchases`: success, replays, every refusal, and that
//! a refused purchase changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use shardstock::client::{NewEvent, NewPurchase};

use crate::harness::{Backend, TestApp, eid, on_memory_and_redis, problem, settings};

on_memory_and_redis!(
    a_purchase_returns_the_order,
    a_retry_replays_the_original_answer_with_the_header,
    refusals_are_problems_and_change_nothing,
    the_rate_limit_answers_429_with_retry_after,
    purchases_outside_the_window_are_not_on_sale,
);

/// Through the typed client (`shardstock::client`): its types are the
/// document's, so a field renamed or dropped fails here.
async fn a_purchase_returns_the_order(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-buy");
    let event = app
        .api
        .create_event(&NewEvent {
            id: id.clone(),
            stock: 10,
            buckets: 2,
            ..NewEvent::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (event.remaining, event.bucket_count, event.status.as_str()),
        (10, 2, "on_sale")
    );
    let buy = NewPurchase {
        user_id: "u-1001".into(),
        quantity: 2,
        request_id: Some("buy-1".into()),
    };
    let bought = app.api.purchase(&id, &buy).await.unwrap();
    assert!(!bought.replayed);
    let order = &bought.order;
    assert_eq!(
        (order.event_id.as_str(), order.user_id.as_str()),
        (id.as_str(), "u-1001")
    );
    assert_eq!((order.quantity, order.probes), (2, 0));
    assert!(order.bucket < 2);
    assert!(order.order_id.starts_with(&format!("{id}.")));
    assert_eq!(app.api.event(&id).await.unwrap().sold, 2);
    // The same request again: the same order, marked replayed.
    let again = app.api.purchase(&id, &buy).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.order, bought.order);
    // Looked up and cancelled through the client too.
    let info = app.api.order(&order.order_id).await.unwrap();
    assert_eq!(
        (info.status.as_str(), info.request_id.as_deref()),
        ("confirmed", Some("buy-1"))
    );
    assert_eq!(
        app.api.cancel(&order.order_id).await.unwrap().status,
        "cancelled"
    );
    assert_eq!(app.api.event(&id).await.unwrap().sold, 0);
    // A refusal is a typed problem.
    let too_many = NewPurchase {
        user_id: "u-1002".into(),
        quantity: 11,
        request_id: None,
    };
    let e = app.api.purchase(&id, &too_many).await.unwrap_err();
    assert_eq!(e.slug(), Some("invalid-request"), "{e}");
}

async fn a_retry_replays_the_original_answer_with_the_header(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-replay");
    app.create(&id, 3, 2, json!({"per_user_limit": 2})).await;
    let first = app.buy(&id, "u-1", 2, Some("req-1")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    // Same key in the header: same status, same body, marked replayed.
    let again = app
        .client
        .post(app.url(&format!("/v1/events/{id}/purchases")))
        .header("Idempotency-Key", "req-1")
        .json(&json!({"user_id": "u-1", "quantity": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    // A refusal replays too.
    let limited = app.buy(&id, "u-1", 1, Some("req-2")).await;
    let body = problem(limited, 409, "limit-exceeded").await;
    let replay = app.buy(&id, "u-1", 1, Some("req-2")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(problem(replay, 409, "limit-exceeded").await, body);
    assert_eq!(app.view(&id).await["sold"], 2);
}

async fn refusals_are_problems_and_change_nothing(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-refuse");
    app.create(&id, 3, 2, json!({"per_user_limit": 2, "max_per_order": 2}))
        .await;
    assert_eq!(
        app.buy(&id, "u-1", 2, Some("k")).await.status(),
        StatusCode::CREATED
    );
    let before = app.view(&id).await;
    let path = format!("/v1/events/{id}/purchases");
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"user_id": "u-2", "quantity": 0}),
            400,
            "invalid-request",
        ),
        (
            json!({"user_id": "u-2", "quantity": 3}),
            400,
            "invalid-request",
        ),
        (
            json!({"user_id": "u-2", "quantity": -1}),
            400,
            "invalid-request",
        ),
        (json!({"user_id": "u-2"}), 400, "invalid-request"),
        (
            json!({"user_id": "bad|user", "quantity": 1}),
            400,
            "invalid-request",
        ),
        (
            json!({"user_id": "u-2", "quantity": 1, "request_id": "has space"}),
            400,
            "invalid-request",
        ),
        (
            json!({"user_id": "u-1", "quantity": 1}),
            409,
            "limit-exceeded",
        ),
        (json!({"user_id": "u-3", "quantity": 2}), 409, "sold-out"),
        (
            json!({"user_id": "u-1", "quantity": 1, "request_id": "k"}),
            409,
            "idempotency-conflict",
        ),
    ];
    for (body, status, kind) in cases {
        let p = problem(app.post(&path, body.clone()).await, status, kind).await;
        if kind == "sold-out" {
            assert_eq!(p["remaining"], 1);
        }
        if kind == "limit-exceeded" {
            assert_eq!(
                (p["limit"].as_u64(), p["held"].as_u64()),
                (Some(2), Some(2))
            );
        }
        assert_eq!(app.view(&id).await, before, "{body} changed the event");
    }
    let mismatch = app
        .client
        .post(app.url(&path))
        .header("Idempotency-Key", "a")
        .json(&json!({"user_id": "u-2", "quantity": 1, "request_id": "b"}))
        .send()
        .await
        .unwrap();
    problem(mismatch, 400, "invalid-request").await;
    problem(
        app.buy(&eid("nope"), "u-1", 1, None).await,
        404,
        "unknown-event",
    )
    .await;
    assert_eq!(app.view(&id).await, before);
}

async fn the_rate_limit_answers_429_with_retry_after(b: Backend) {
    let mut s = settings(b);
    s.rate_limit.per_user_per_sec = 1;
    let app = TestApp::spawn_with(s).await;
    let id = eid("api-rate");
    app.create(&id, 10, 1, json!({})).await;
    assert_eq!(
        app.buy(&id, "u-1", 1, None).await.status(),
        StatusCode::CREATED
    );
    let r = app.buy(&id, "u-1", 1, None).await;
    assert_eq!(r.headers()["retry-after"], "1");
    problem(r, 429, "rate-limited").await;
    assert_eq!(
        app.buy(&id, "u-2", 1, None).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(app.view(&id).await["sold"], 2);
}

async fn purchases_outside_the_window_are_not_on_sale(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-window");
    app.create(&id, 5, 1, json!({"starts_at": "2099-01-01T00:00:00Z"}))
        .await;
    assert_eq!(app.view(&id).await["status"], "scheduled");
    problem(app.buy(&id, "u-1", 1, None).await, 409, "not-on-sale").await;
    assert_eq!(app.view(&id).await["remaining"], 5);
}
