//! The admin endpoints over HTTP: reshard, rebalance, close, audit; and the
//! live page. Each needs the token, and each refusal changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Backend, TOKEN, TestApp, eid, on_every_backend, problem};

on_every_backend!(
    app:
    admin_endpoints_need_the_token_and_refusals_change_nothing,
    a_live_event_is_resharded_and_rebalanced_over_http,
    close_ends_the_sale_and_the_audit_balances_throughout,
    the_live_page_is_served,
    a_close_sets_the_final_gauges_at_once,
    a_closed_event_is_archived_out_of_the_listing_and_keeps_its_orders,
);

async fn admin(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut r = app.client.request(method, app.url(path)).bearer_auth(TOKEN);
    if let Some(body) = body {
        r = r.json(&body);
    }
    r.send().await.unwrap()
}

/// The event's audit, which must answer 200.
async fn audit_of(app: &TestApp, id: &str) -> Value {
    let r = admin(
        app,
        reqwest::Method::GET,
        &format!("/v1/events/{id}/audit"),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn admin_endpoints_need_the_token_and_refusals_change_nothing(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-admin");
    app.create(&id, 100, 4, json!({})).await;
    let before = app.view(&id).await;
    let put = app
        .client
        .put(app.url(&format!("/v1/events/{id}/buckets")))
        .json(&json!({"buckets": 8}));
    problem(put.send().await.unwrap(), 401, "unauthorized").await;
    for path in ["rebalance", "close"] {
        let r = app
            .post(&format!("/v1/events/{id}/{path}"), json!({}))
            .await;
        problem(r, 401, "unauthorized").await;
    }
    problem(
        app.get(&format!("/v1/events/{id}/audit")).await,
        401,
        "unauthorized",
    )
    .await;
    for bad in [
        json!({"buckets": 0}),
        json!({"buckets": 1025}),
        json!({"buckets": "many"}),
    ] {
        let r = admin(
            &app,
            reqwest::Method::PUT,
            &format!("/v1/events/{id}/buckets"),
            Some(bad),
        )
        .await;
        problem(r, 400, "invalid-request").await;
    }
    let ghost = eid("ghost");
    let r = admin(
        &app,
        reqwest::Method::GET,
        &format!("/v1/events/{ghost}/audit"),
        None,
    )
    .await;
    problem(r, 404, "unknown-event").await;
    problem(app.close_request(&ghost).await, 404, "unknown-event").await;
    assert_eq!(app.view(&id).await, before);
}

async fn a_live_event_is_resharded_and_rebalanced_over_http(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-reshard");
    app.create(&id, 400, 4, json!({"per_user_limit": 3})).await;
    let first: Value = app
        .buy(&id, "u-1", 2, Some("r-1"))
        .await
        .json()
        .await
        .unwrap();
    let r = admin(
        &app,
        reqwest::Method::PUT,
        &format!("/v1/events/{id}/buckets"),
        Some(json!({"buckets": 16})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let view: Value = r.json().await.unwrap();
    assert_eq!(
        (view["bucket_count"].as_u64(), view["remaining"].as_u64()),
        (Some(16), Some(398))
    );
    assert_eq!(view["generation"], 1);
    // The user's count and request record moved with the reshard.
    let replay = app.buy(&id, "u-1", 2, Some("r-1")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.json::<Value>().await.unwrap()["order_id"],
        first["order_id"]
    );
    problem(
        app.buy(&id, "u-1", 2, Some("r-2")).await,
        409,
        "limit-exceeded",
    )
    .await;
    let oid = first["order_id"].as_str().unwrap();
    assert_eq!(
        app.post(&format!("/v1/orders/{oid}/cancel"), json!({}))
            .await
            .status(),
        200
    );
    let r = admin(
        &app,
        reqwest::Method::POST,
        &format!("/v1/events/{id}/rebalance"),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let rebalanced: Value = r.json().await.unwrap();
    assert!(rebalanced["moves"].is_array());
    assert_eq!(rebalanced["event"]["remaining"], 400);
}

async fn close_ends_the_sale_and_the_audit_balances_throughout(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-close");
    app.create(&id, 50, 4, json!({})).await;
    let mut orders = Vec::new();
    for i in 0..20 {
        let order: Value = app
            .buy(&id, &format!("u-{i}"), 1, None)
            .await
            .json()
            .await
            .unwrap();
        orders.push(order["order_id"].as_str().unwrap().to_owned());
    }
    app.post(&format!("/v1/orders/{}/cancel", orders[0]), json!({}))
        .await;
    let audit = audit_of(&app, &id).await;
    assert_eq!(audit["balanced"], true, "{audit}");
    assert_eq!(audit["stock"], 50);
    let closed = app.close(&id).await;
    assert_eq!(
        (
            closed["status"].as_str(),
            closed["sold"].as_u64(),
            closed["leftover"].as_u64()
        ),
        (Some("closed"), Some(19), Some(31))
    );
    let audit = audit_of(&app, &id).await;
    assert_eq!(
        (
            audit["balanced"].as_bool(),
            audit["sold_unflushed"].as_u64()
        ),
        (Some(true), Some(0)),
        "{audit}"
    );
    problem(app.buy(&id, "late", 1, None).await, 409, "not-on-sale").await;
    problem(
        app.post(&format!("/v1/orders/{}/cancel", orders[1]), json!({}))
            .await,
        409,
        "not-on-sale",
    )
    .await;
    let order: Value = app
        .get(&format!("/v1/orders/{}", orders[1]))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order["status"], "confirmed");
    assert_eq!(
        app.close(&id).await["leftover"],
        31,
        "closing twice changes nothing"
    );
    assert_eq!(app.view(&id).await["status"], "closed");
}

async fn the_live_page_is_served(b: Backend) {
    let app = TestApp::spawn(b).await;
    let r = app.get("/ui").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        r.text().await.unwrap().contains("fetch(\"/v1/live\")"),
        "the page reads every event in one request"
    );
    let root = app.client.get(app.url("/")).send().await.unwrap();
    assert_eq!(root.url().path(), "/ui", "/ redirects to the live page");
}

/// The gauges of a closed event say so at once: nothing remaining, nothing
/// held, the leftover. They showed the last refresh's numbers for minutes
/// after the close (remaining 63, held 37, while the API said 0 and 0).
async fn a_close_sets_the_final_gauges_at_once(b: Backend) {
    use crate::harness::sample;
    let app = TestApp::spawn(b).await;
    let id = eid("api-final-gauges");
    app.create(&id, 100, 4, json!({"hold_seconds": 600})).await;
    for u in 0..5 {
        let r = app
            .buy(&id, &format!("u-{u}"), 2, Some(&format!("g-{u}")))
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    crate::harness::eventually(
        "the gauges to show the holds",
        std::time::Duration::from_secs(10),
        async || {
            let text = app.metrics().await;
            (sample(
                &text,
                "shardstock_event_held_units",
                &[("event", id.as_str())],
            ) == Some(10.0))
            .then_some(())
        },
    )
    .await;
    app.close(&id).await;
    let text = app.metrics().await;
    let event = [("event", id.as_str())];
    assert_eq!(
        sample(&text, "shardstock_event_remaining", &event),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "shardstock_event_held_units", &event),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "shardstock_event_leftover_units", &event),
        Some(100.0)
    );
    for bucket in 0..4 {
        let b = bucket.to_string();
        assert_eq!(
            sample(
                &text,
                "shardstock_bucket_remaining",
                &[("event", id.as_str()), ("bucket", &b)]
            ),
            Some(0.0),
            "bucket {b}"
        );
    }
}

/// An operator archives a closed event: it leaves the listing, its orders
/// stay readable from the database; an open event cannot be archived, and
/// archiving needs the token.
async fn a_closed_event_is_archived_out_of_the_listing_and_keeps_its_orders(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-archive");
    app.create(&id, 10, 2, json!({})).await;
    let order: Value = app
        .buy(&id, "u-1", 1, Some("a-1"))
        .await
        .json()
        .await
        .unwrap();
    let oid = order["order_id"].as_str().unwrap();
    let r = admin(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/events/{id}"),
        None,
    )
    .await;
    let p = problem(r, 409, "not-on-sale").await;
    assert!(
        p["detail"].as_str().unwrap().contains("close it first"),
        "{p}"
    );
    let r = app
        .client
        .delete(app.url(&format!("/v1/events/{id}")))
        .send()
        .await
        .unwrap();
    problem(r, 401, "unauthorized").await;
    app.close(&id).await;
    let listed: Vec<String> = app.get("/v1/events").await.json().await.unwrap();
    assert!(listed.contains(&id), "a closed event is still listed");
    for _ in 0..2 {
        let r = admin(
            &app,
            reqwest::Method::DELETE,
            &format!("/v1/events/{id}"),
            None,
        )
        .await;
        assert_eq!(
            r.status(),
            StatusCode::NO_CONTENT,
            "archived (twice is the same)"
        );
    }
    let listed: Vec<String> = app.get("/v1/events").await.json().await.unwrap();
    assert!(!listed.contains(&id), "{listed:?}");
    let got: Value = app
        .get(&format!("/v1/orders/{oid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "confirmed", "{got}");
    // An archive is not an erasure: the event's final view still answers.
    let r = app.get(&format!("/v1/events/{id}")).await;
    assert_eq!(r.status(), StatusCode::OK, "the archived event's view");
    let view: Value = r.json().await.unwrap();
    assert_eq!(view["status"], "closed", "{view}");
    let r = admin(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/events/{}", eid("ghost")),
        None,
    )
    .await;
    problem(r, 404, "unknown-event").await;
}
