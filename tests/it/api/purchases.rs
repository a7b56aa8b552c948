//! `POST /v1/events/{id}/purchases`: success, replays, every refusal, and that
//! a refused purchase changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use shardstock::client::{NewEvent, NewPurchase};

use crate::harness::{Backend, TestApp, eid, on_every_backend, problem, settings};

on_every_backend!(
    app:
    a_purchase_returns_the_order,
    a_retry_replays_the_original_answer_with_the_header,
    refusals_are_problems_and_change_nothing,
    unknown_members_are_refused_and_buy_nothing,
    a_quantity_out_of_range_is_told_the_event_s_range,
    the_idempotency_key_has_one_rule_in_the_header_and_the_body,
    x_request_id_is_echoed_and_deduplicates_nothing,
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

/// `"qty": 5` once bought the default quantity of nothing it named: a member
/// the body does not have is refused, naming it.
async fn unknown_members_are_refused_and_buy_nothing(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-strict-buy");
    app.create(&id, 1000, 1, json!({})).await;
    let path = format!("/v1/events/{id}/purchases");
    for body in [
        json!({"user_id": "u-1", "qty": 5}),
        json!({"user_id": "u-1", "quantity": 1, "qty": 5}),
        json!({"user_id": "u-1", "quantity": 1, "requestId": "r-1"}),
    ] {
        let p = problem(app.post(&path, body.clone()).await, 400, "invalid-request").await;
        let detail = p["detail"].as_str().unwrap();
        let named = body
            .as_object()
            .unwrap()
            .keys()
            .find(|k| !["user_id", "quantity"].contains(&k.as_str()))
            .unwrap();
        assert!(
            detail.contains("unknown field") && detail.contains(named.as_str()),
            "{body}: {detail}"
        );
        assert!(!detail.contains("Failed to deserialize"), "{detail}");
    }
    assert_eq!(app.view(&id).await["sold"], 0);
    // Documented members only: bought as before.
    let r = app.buy(&id, "u-1", 1, Some("r-1")).await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

/// Every quantity outside 1..=max_per_order is told the same range, the
/// event's own: a negative one was told "≥ 0", a range 0 is not in either.
async fn a_quantity_out_of_range_is_told_the_event_s_range(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-qty");
    app.create(&id, 1000, 1, json!({"max_per_order": 3})).await;
    let path = format!("/v1/events/{id}/purchases");
    for quantity in [
        json!(-1),
        json!(0),
        json!(4),
        json!(-1.0),
        json!(4294967297u64),
    ] {
        let body = json!({"user_id": "u-1", "quantity": quantity});
        let p = problem(app.post(&path, body).await, 400, "invalid-request").await;
        let detail = p["detail"].as_str().unwrap();
        assert!(
            detail.contains("quantity") && detail.contains("between 1 and 3"),
            "{quantity}: {detail}"
        );
        assert!(!detail.contains('≥'), "{quantity}: {detail}");
    }
    for quantity in [json!(1.5), json!("2")] {
        let body = json!({"user_id": "u-1", "quantity": quantity});
        let p = problem(app.post(&path, body).await, 400, "invalid-request").await;
        let detail = p["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("quantity") && !detail.contains("Failed to deserialize"),
            "{quantity}: {detail}"
        );
    }
    assert_eq!(app.view(&id).await["sold"], 0);
}

/// The `Idempotency-Key` header and the body's `request_id` are one key
/// under one rule: each value is accepted by both or refused by both, and
/// the same key in either is the same request.
async fn the_idempotency_key_has_one_rule_in_the_header_and_the_body(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-keys");
    app.create(&id, 1000, 1, json!({})).await;
    let path = format!("/v1/events/{id}/purchases");
    let long = "k".repeat(129);
    let longest = "k".repeat(128);
    let cases: [(&[u8], &str, bool); 7] = [
        (b"9f1c2b7e-0d4a-4c55-9e57-3f0b1c2d3e4f", "uuid", true),
        (b"a_b.c-1", "plain", true),
        (longest.as_bytes(), "longest", true),
        (long.as_bytes(), "too-long", false),
        (b"a:b", "colon", false),
        (b"a b", "space", false),
        ("k\u{e9}".as_bytes(), "non-ascii", false),
    ];
    for (key, name, ok) in cases {
        let user = format!("u-{name}");
        let by_header = app
            .client
            .post(app.url(&path))
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(key).unwrap(),
            )
            .json(&json!({"user_id": user, "quantity": 1}))
            .send()
            .await
            .unwrap();
        let text = String::from_utf8(key.to_vec()).unwrap();
        let by_body = app.buy(&id, &user, 1, Some(&text)).await;
        if ok {
            assert_eq!(by_header.status(), StatusCode::CREATED, "{name}");
            let first: Value = by_header.json().await.unwrap();
            assert_eq!(by_body.status(), StatusCode::CREATED, "{name}");
            assert_eq!(by_body.headers()["idempotent-replayed"], "true", "{name}");
            let again: Value = by_body.json().await.unwrap();
            assert_eq!(again["order_id"], first["order_id"], "{name}: one key");
        } else {
            let h = problem(by_header, 400, "invalid-request").await;
            let h = h["detail"].as_str().unwrap().to_owned();
            assert!(h.contains("Idempotency-Key"), "{name}: {h}");
            let body = problem(by_body, 400, "invalid-request").await;
            let body = body["detail"].as_str().unwrap();
            assert!(h.ends_with(body), "{name}: the same rule: {h} / {body}");
        }
    }
    assert_eq!(app.view(&id).await["sold"], 3);
}

/// `X-Request-Id` correlates logs: every answer echoes it (or the one made
/// up for the request), errors included, and it is no idempotency key.
async fn x_request_id_is_echoed_and_deduplicates_nothing(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-xrid");
    app.create(&id, 1000, 1, json!({})).await;
    let path = format!("/v1/events/{id}/purchases");
    let send = |rid: &'static str, body: Value| {
        app.client
            .post(app.url(&path))
            .header("x-request-id", rid)
            .json(&body)
            .send()
    };
    let mut orders = Vec::new();
    for _ in 0..2 {
        let r = send("corr-1:a", json!({"user_id": "u-1", "quantity": 1}))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()["x-request-id"], "corr-1:a");
        assert!(r.headers().get("idempotent-replayed").is_none());
        orders.push(r.json::<Value>().await.unwrap()["order_id"].clone());
    }
    assert_ne!(orders[0], orders[1], "the same X-Request-Id bought twice");
    assert_eq!(app.view(&id).await["sold"], 2);
    let refused = send("corr-2", json!({"user_id": "u-1", "quantity": 0}))
        .await
        .unwrap();
    assert_eq!(refused.headers()["x-request-id"], "corr-2");
    problem(refused, 400, "invalid-request").await;
    let unknown = app
        .client
        .get(app.url("/v2/nothing"))
        .header("x-request-id", "corr-3")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.headers()["x-request-id"], "corr-3");
    problem(unknown, 404, "not-found").await;
    // None, or one that is no plain token: one is made up, and echoed.
    for given in [None, Some("has space"), Some("")] {
        let mut r = app.client.get(app.url(&format!("/v1/events/{id}")));
        if let Some(given) = given {
            r = r.header("x-request-id", given);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let made = r.headers()["x-request-id"].to_str().unwrap();
        assert!(
            made.len() == 16 && made.bytes().all(|c| c.is_ascii_hexdigit()),
            "{given:?} → {made}"
        );
    }
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

/// Before `starts_at` a purchase is told when to come back: the problem's
/// `starts_at`, and `Retry-After` in seconds until then.
async fn purchases_outside_the_window_are_not_on_sale(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-window");
    app.create(&id, 5, 1, json!({"starts_at": "2099-01-01T00:00:00Z"}))
        .await;
    assert_eq!(app.view(&id).await["status"], "scheduled");
    let r = app.buy(&id, "u-1", 1, None).await;
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let p = problem(r, 409, "not-on-sale").await;
    assert_eq!(p["starts_at"], "2099-01-01T00:00:00Z", "{p}");
    let until_2099 = 4_070_908_800
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
    assert!(until_2099.abs_diff(wait) <= 5, "{wait} s, not {until_2099}");
    assert_eq!(app.view(&id).await["remaining"], 5);
    // Soon: at least a second, never 0.
    let soon = eid("api-soon");
    let at = time::OffsetDateTime::now_utc() + time::Duration::milliseconds(1500);
    let at = at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    app.create(&soon, 5, 1, json!({"starts_at": at})).await;
    let r = app.buy(&soon, "u-1", 1, None).await;
    if r.status() == StatusCode::CONFLICT {
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&wait), "{wait}");
    }
    // After the end: no `starts_at`, no `Retry-After`.
    let past = eid("api-past");
    app.create(&past, 5, 1, json!({"ends_at": "2001-01-01T00:00:00Z"}))
        .await;
    let r = app.buy(&past, "u-1", 1, None).await;
    assert!(r.headers().get("retry-after").is_none());
    let p = problem(r, 409, "not-on-sale").await;
    assert!(p.get("starts_at").is_none(), "{p}");
}
