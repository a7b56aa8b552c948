//! `/v1/events`: create (admin), view, list; every rejection changes nothing.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Backend, TOKEN, TestApp, eid, on_memory_and_redis, problem, settings};

on_memory_and_redis!(
    creating_an_event_splits_its_stock_and_shows_it,
    creating_needs_the_admin_token,
    creating_is_refused_without_a_configured_token,
    invalid_events_are_refused_and_nothing_is_created,
    an_existing_event_is_never_overwritten,
    body_rejections_are_problems,
    viewing_an_unknown_or_malformed_event_is_a_problem,
);

async fn creating_an_event_splits_its_stock_and_shows_it(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-create");
    let view = app
        .create(
            &id,
            10,
            4,
            json!({"per_user_limit": 2, "max_per_order": 2, "ends_at": "2099-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(view["stock"], 10);
    assert_eq!(view["remaining"], 10);
    assert_eq!(view["sold"], 0);
    assert_eq!(view["bucket_count"], 4);
    assert_eq!(view["skew"], 1.2);
    assert_eq!(view["status"], "on_sale");
    assert_eq!(view["ends_at"], "2099-01-01T00:00:00Z");
    let remaining: Vec<u64> = view["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(remaining, vec![3, 3, 2, 2]);
    assert_eq!(app.view(&id).await, view);
    let list: Vec<String> = app.get("/v1/events").await.json().await.unwrap();
    assert!(list.contains(&id));
}

async fn creating_needs_the_admin_token(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-auth");
    let body = json!({"id": id, "stock": 5, "buckets": 1});
    problem(
        app.post("/v1/events", body.clone()).await,
        401,
        "unauthorized",
    )
    .await;
    let wrong = app
        .client
        .post(app.url("/v1/events"))
        .bearer_auth("nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(wrong, 401, "unauthorized").await;
    let basic = app
        .client
        .post(app.url("/v1/events"))
        .basic_auth("admin", Some(TOKEN))
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(basic, 401, "unauthorized").await;
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
}

async fn creating_is_refused_without_a_configured_token(b: Backend) {
    let mut s = settings(b);
    s.server.admin_token = String::new();
    let app = TestApp::spawn_with(s).await;
    let id = eid("api-notoken");
    let r = app
        .admin_post("/v1/events", json!({"id": id, "stock": 5, "buckets": 1}))
        .await;
    problem(r, 401, "unauthorized").await;
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
}

async fn invalid_events_are_refused_and_nothing_is_created(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-bad");
    for body in [
        json!({"id": id, "stock": 5, "buckets": 0}),
        json!({"id": id, "stock": 5, "buckets": 1025}),
        json!({"id": id, "stock": 9007199254740993u64, "buckets": 1}),
        json!({"id": id, "stock": -1, "buckets": 1}),
        json!({"id": "bad{id}", "stock": 5, "buckets": 1}),
        json!({"id": "x".repeat(65), "stock": 5, "buckets": 1}),
        json!({"id": id, "stock": 5, "buckets": 1, "max_per_order": 0}),
        json!({"id": id, "stock": 5, "buckets": 1, "per_user_limit": 0}),
        json!({"id": id, "stock": 5, "buckets": 1, "starts_at": "soon"}),
        json!({"id": id, "stock": 5, "buckets": 1, "starts_at": "2030-01-02T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z"}),
        json!({"id": id, "buckets": 1}),
        // Adaptive bounds out of order or range (a min over the max once
        // panicked the handler: the start layout clamped before validating).
        json!({"id": id, "stock": 10_000, "buckets": {"min": 1025, "max": 1}}),
        json!({"id": id, "stock": 10_000, "buckets": {"min": 5, "max": 2}}),
        json!({"id": id, "stock": 10_000, "buckets": {"min": 0, "max": 4}}),
        json!({"id": id, "stock": 10_000, "buckets": {"min": 1, "max": 1025}}),
        json!({"id": id, "stock": 10_000, "buckets": "sometimes"}),
    ] {
        problem(
            app.admin_post("/v1/events", body).await,
            400,
            "invalid-request",
        )
        .await;
    }
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
}

async fn an_existing_event_is_never_overwritten(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-exists");
    app.create(&id, 10, 2, json!({})).await;
    assert_eq!(
        app.buy(&id, "u-1", 1, None).await.status(),
        StatusCode::CREATED
    );
    let before = app.view(&id).await;
    let r = app
        .admin_post("/v1/events", json!({"id": id, "stock": 99, "buckets": 8}))
        .await;
    problem(r, 409, "event-exists").await;
    assert_eq!(app.view(&id).await, before);
}

async fn body_rejections_are_problems(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-body");
    let malformed = app
        .client
        .post(app.url("/v1/events"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{\"id\": ")
        .send()
        .await
        .unwrap();
    problem(malformed, 400, "invalid-request").await;
    let no_type = app
        .client
        .post(app.url("/v1/events"))
        .bearer_auth(TOKEN)
        .body(json!({"id": id, "stock": 5, "buckets": 1}).to_string())
        .send()
        .await
        .unwrap();
    problem(no_type, 415, "invalid-request").await;
    let huge = json!({"id": id, "stock": 5, "buckets": 1, "pad": "x".repeat(64 * 1024)});
    // The server answers 413 without reading the whole body and closes the
    // connection: keep it out of the client's pool.
    let r = app
        .client
        .post(app.url("/v1/events"))
        .bearer_auth(TOKEN)
        .header("connection", "close")
        .json(&huge)
        .send()
        .await
        .unwrap();
    problem(r, 413, "invalid-request").await;
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
}

async fn viewing_an_unknown_or_malformed_event_is_a_problem(b: Backend) {
    let app = TestApp::spawn(b).await;
    problem(
        app.get(&format!("/v1/events/{}", eid("nope"))).await,
        404,
        "unknown-event",
    )
    .await;
    problem(
        app.get("/v1/events/bad%7Bid%7D").await,
        400,
        "invalid-request",
    )
    .await;
}
