//! `/v1/events`: create (admin), view, list; every rejection changes nothing.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Backend, TOKEN, TestApp, eid, on_every_backend, problem, settings};

on_every_backend!(
    app:
    creating_an_event_splits_its_stock_and_shows_it,
    creating_needs_the_admin_token,
    creating_is_refused_without_a_configured_token,
    the_token_is_checked_before_the_body_is_read,
    invalid_events_are_refused_and_nothing_is_created,
    unknown_members_are_refused_naming_them,
    a_bucket_range_out_of_order_is_told_in_json,
    a_small_stock_per_bucket_is_created_with_a_warning,
    an_existing_event_is_never_overwritten,
    body_rejections_are_problems,
    viewing_an_unknown_or_malformed_event_is_a_problem,
);

/// A 401's challenge: the bearer scheme (RFC 9110 §11.6.1).
fn challenges_bearer(r: &reqwest::Response) -> bool {
    r.headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("bearer"))
}

async fn creating_an_event_splits_its_stock_and_shows_it(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-create");
    let mut view = app
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
    // The answer to create is the view, and (2.5 units a bucket for orders
    // of up to 2) a warning the view does not repeat.
    let warnings = view.as_object_mut().unwrap().remove("warnings");
    assert!(warnings.is_some_and(|w| w.as_array().unwrap().len() == 1));
    assert_eq!(app.view(&id).await, view);
    let list: Vec<String> = app.get("/v1/events").await.json().await.unwrap();
    assert!(list.contains(&id));
}

async fn creating_needs_the_admin_token(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-auth");
    let body = json!({"id": id, "stock": 5, "buckets": 1});
    let none = app.post("/v1/events", body.clone()).await;
    assert!(challenges_bearer(&none), "{:?}", none.headers());
    problem(none, 401, "unauthorized").await;
    let wrong = app
        .client
        .post(app.url("/v1/events"))
        .bearer_auth("nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(challenges_bearer(&wrong), "{:?}", wrong.headers());
    let wrong = problem(wrong, 401, "unauthorized").await;
    assert!(
        !wrong["detail"].as_str().unwrap().contains("no admin token"),
        "a token is configured: {wrong}"
    );
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
    // The scheme is case-insensitive (RFC 9110 §11.1).
    for (n, scheme) in ["bearer", "BEARER", "bEaReR"].into_iter().enumerate() {
        let id = format!("{id}-{n}");
        let r = app
            .client
            .post(app.url("/v1/events"))
            .header("authorization", format!("{scheme} {TOKEN}"))
            .json(&json!({"id": id, "stock": 5000, "buckets": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{scheme}");
        assert_eq!(app.view(&id).await["stock"], 5000);
    }
}

/// With no token configured every admin call is refused, and says why: not
/// the same 401 as a wrong token, which an operator would chase instead.
async fn creating_is_refused_without_a_configured_token(b: Backend) {
    let mut s = settings(b);
    s.server.admin_token = String::new();
    let app = TestApp::spawn_with(s).await;
    let id = eid("api-notoken");
    let r = app
        .admin_post("/v1/events", json!({"id": id, "stock": 5, "buckets": 1}))
        .await;
    assert!(challenges_bearer(&r), "{:?}", r.headers());
    let body = problem(r, 401, "unauthorized").await;
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("no admin token is configured"), "{body}");
    let audit = app.get(&format!("/v1/events/{id}/audit")).await;
    let audit = problem(audit, 401, "unauthorized").await;
    assert_eq!(audit["detail"], detail, "every admin call says the same");
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
}

/// The body of an admin call is read only once the token is right: an
/// unauthenticated caller gets a 401, never a 400 describing the schema.
async fn the_token_is_checked_before_the_body_is_read(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-auth-first");
    app.create(&id, 1000, 2, json!({})).await;
    let put = format!("/v1/events/{id}/buckets");
    for (method, path) in [
        (reqwest::Method::POST, "/v1/events"),
        (reqwest::Method::PUT, put.as_str()),
    ] {
        for body in [json!({}), json!({"buckets": "many", "stock": -1})] {
            let anonymous = app
                .client
                .request(method.clone(), app.url(path))
                .json(&body)
                .send()
                .await
                .unwrap();
            problem(anonymous, 401, "unauthorized").await;
            let wrong = app
                .client
                .request(method.clone(), app.url(path))
                .bearer_auth("nope")
                .json(&body)
                .send()
                .await
                .unwrap();
            problem(wrong, 401, "unauthorized").await;
            // With the token, the same body is the 400 it deserves.
            let admin = app
                .client
                .request(method.clone(), app.url(path))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            problem(admin, 400, "invalid-request").await;
        }
    }
    assert_eq!(app.view(&id).await["bucket_count"], 2);
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

/// A member the API does not know is refused, naming it: a typo such as
/// `per_user_limt` once created an event with no per-user limit at all.
async fn unknown_members_are_refused_naming_them(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-strict");
    for (body, named) in [
        (
            json!({"id": id, "stock": 100, "buckets": 1, "per_user_limt": 1}),
            "per_user_limt",
        ),
        (
            json!({"id": id, "stock": 100, "buckets": {"min": 1, "max": 4, "step": 2}}),
            "step",
        ),
        (json!({"id": id, "stock": 100, "buckets": 1, "": 0}), "``"),
    ] {
        let p = problem(
            app.admin_post("/v1/events", body.clone()).await,
            400,
            "invalid-request",
        )
        .await;
        let detail = p["detail"].as_str().unwrap();
        assert!(
            detail.contains("unknown field") && detail.contains(named),
            "{body}: {detail}"
        );
        assert!(
            !detail.contains("Failed to deserialize"),
            "axum's prefix leaked: {detail}"
        );
    }
    problem(
        app.get(&format!("/v1/events/{id}")).await,
        404,
        "unknown-event",
    )
    .await;
    // The same body without the typo is created, with its limit.
    let view = app
        .create(
            &id,
            100,
            1,
            json!({"per_user_limit": 1, "max_per_order": 1}),
        )
        .await;
    assert_eq!(view["per_user_limit"], 1);
    let reshard = app
        .client
        .put(app.url(&format!("/v1/events/{id}/buckets")))
        .bearer_auth(TOKEN)
        .json(&json!({"buckets": 2, "bucket": 4}))
        .send()
        .await
        .unwrap();
    let p = problem(reshard, 400, "invalid-request").await;
    assert!(p["detail"].as_str().unwrap().contains("`bucket`"), "{p}");
    assert_eq!(app.view(&id).await["bucket_count"], 1);
}

/// The API speaks JSON: its errors quote the body as JSON, not as TOML.
async fn a_bucket_range_out_of_order_is_told_in_json(b: Backend) {
    let app = TestApp::spawn(b).await;
    let body = json!({"id": eid("api-range"), "stock": 10_000, "buckets": {"min": 5, "max": 2}});
    let p = problem(
        app.admin_post("/v1/events", body).await,
        400,
        "invalid-request",
    )
    .await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains(r#"{"min": 5, "max": 2}"#), "{detail}");
    assert!(
        !detail.contains("min = 5"),
        "TOML in an API error: {detail}"
    );
}

/// An event whose buckets hold fewer than 100 of its largest orders is
/// created as asked, and the answer says why that is unwise (the README's
/// sizing rule); a well-sized one has no `warnings`.
async fn a_small_stock_per_bucket_is_created_with_a_warning(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-small");
    let view = app.create(&id, 3, 16, json!({})).await;
    assert_eq!(
        (view["stock"].as_u64(), view["bucket_count"].as_u64()),
        (Some(3), Some(16))
    );
    let warnings = view["warnings"].as_array().expect("a warnings array");
    assert_eq!(warnings.len(), 1, "{view}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.contains("stock per bucket") && warning.contains("max_per_order"),
        "{warning}"
    );
    assert!(app.view(&id).await.get("warnings").is_none());
    // 100 × max_per_order (2) per bucket: nothing to say.
    let sized = app
        .create(&eid("api-sized"), 3200, 16, json!({"max_per_order": 2}))
        .await;
    assert!(sized.get("warnings").is_none(), "{sized}");
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
