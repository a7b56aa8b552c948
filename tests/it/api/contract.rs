//! The published contract, `GET /openapi.json`, and what schemathesis found
//! when it tested the service against it (`.ci/contract`): each finding stays
//! here as a regression test.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Backend, TOKEN, TestApp, eid, on_every_backend, problem};

on_every_backend!(
    app:
    the_document_is_served_and_every_operation_in_it_is_routed,
    every_request_body_refuses_unknown_members_in_the_document,
    the_document_tells_the_two_request_ids_and_the_new_members_apart,
    whole_number_floats_are_counts,
    the_largest_limit_accepted_is_documented_where_it_is_answered,
    concurrent_reshards_answer_a_layout_or_try_again,
    a_reshard_slower_than_the_request_answers_try_again_and_finishes,
);

async fn the_document_is_served_and_every_operation_in_it_is_routed(b: Backend) {
    let app = TestApp::spawn(b).await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    let doc: Value = r.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            operations += 1;
            let url = app.url(&path.replace("{id}", "x"));
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let r = app
                .client
                .request(method.clone(), url)
                .bearer_auth(TOKEN)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let kind = match r.headers().get("content-type") {
                Some(ct) if ct == "application/problem+json" => {
                    r.json::<Value>().await.unwrap()["type"].clone()
                }
                _ => Value::Null,
            };
            assert!(
                kind != "urn:shardstock:not-found" && kind != "urn:shardstock:method-not-allowed",
                "{method} {path} is in the document but not routed: {status} {kind}"
            );
        }
    }
    assert_eq!(operations, 42, "every endpoint of API.md and /openapi.json");
    // The admin operations carry the bearer scheme, the others none.
    let create = &doc["paths"]["/v1/events"]["post"];
    assert_eq!(create["security"], json!([{"bearer": []}]));
    assert!(doc["paths"]["/v1/events/{id}/purchases"]["post"]["security"].is_null());
}

/// Resolves a `$ref` to `#/components/…` in the document.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} resolves to nothing")),
        None => schema,
    }
}

/// Every request body, and the objects inside them, says
/// `additionalProperties: false`, so schemathesis sends unknown members and
/// expects them refused (which the service does: `api::events` and
/// `api::purchases`).
async fn every_request_body_refuses_unknown_members_in_the_document(b: Backend) {
    let app = TestApp::spawn(b).await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let mut bodies = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(content) = op["requestBody"]["content"].as_object() else {
                continue;
            };
            for media in content.values() {
                let schema = resolve(&doc, &media["schema"]);
                assert_eq!(
                    schema["additionalProperties"],
                    json!(false),
                    "{method} {path}: {schema}"
                );
                bodies.push(format!("{method} {path}"));
            }
        }
    }
    bodies.sort();
    assert_eq!(
        bodies,
        [
            "post /v1/events",
            "post /v1/events/{id}/entries",
            "post /v1/events/{id}/entries/{user}/offer",
            "post /v1/events/{id}/purchases",
            "post /v1/events/{id}/tokens",
            "post /v1/releases",
            "post /v1/releases/{id}/orders",
            "post /v1/webhooks",
            "put /v1/events/{id}/buckets",
            "put /v1/events/{id}/token-keys",
            "put /v1/webhooks/{id}/secrets",
        ],
        "every body the API reads"
    );
    let range = &doc["components"]["schemas"]["BucketRange"];
    assert_eq!(range["additionalProperties"], json!(false), "{range}");
}

/// What the document says of the additions: `X-Request-Id` on every answer
/// (logs only, no idempotency), the 401's challenge, and `starts_at` with
/// `Retry-After` before a sale opens.
async fn the_document_tells_the_two_request_ids_and_the_new_members_apart(b: Backend) {
    let app = TestApp::spawn(b).await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let header = &doc["components"]["headers"]["X-Request-Id"];
    let said = header["description"].as_str().unwrap();
    assert!(
        said.contains("does not deduplicate") && said.contains("Idempotency-Key"),
        "{said}"
    );
    assert!(
        doc["info"]["description"]
            .as_str()
            .unwrap()
            .contains("`X-Request-Id` only correlates log lines")
    );
    let mut responses = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, response) in op["responses"].as_object().unwrap() {
                let response = resolve(&doc, response);
                assert_eq!(
                    response["headers"]["X-Request-Id"]["$ref"],
                    "#/components/headers/X-Request-Id",
                    "{method} {path} {status}"
                );
                responses += 1;
            }
        }
    }
    assert!(responses > 50, "{responses}");
    let key = doc["paths"]["/v1/events/{id}/purchases"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .unwrap();
    assert!(
        key["description"]
            .as_str()
            .unwrap()
            .contains("X-Request-Id"),
        "{key}"
    );
    let responses = &doc["components"]["responses"];
    assert!(
        responses["Unauthorized"]["headers"]["WWW-Authenticate"].is_object(),
        "{}",
        responses["Unauthorized"]
    );
    assert!(responses["PurchaseRefused"]["headers"]["Retry-After"].is_object());
    let starts_at = &doc["components"]["schemas"]["Problem"]["properties"]["starts_at"];
    assert_eq!(starts_at["format"], "date-time", "{starts_at}");
    let created = doc["paths"]["/v1/events"]["post"]["responses"]["201"].to_string();
    assert!(created.contains("Created"), "{created}");
    assert!(
        doc["components"]["schemas"]["Created"]
            .to_string()
            .contains("warnings"),
        "{}",
        doc["components"]["schemas"]["Created"]
    );
}

/// JSON Schema's `integer` is any number with no fraction: `16.0` is valid
/// against the document, and serde used to refuse it (400) for every count.
async fn whole_number_floats_are_counts(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("contract-floats");
    let r = app
        .admin_post(
            "/v1/events",
            json!({"id": id, "stock": 10.0, "buckets": 2.0, "per_user_limit": 3.0, "max_per_order": 2.0}),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "{}",
        r.text().await.unwrap()
    );
    let view: Value = r.json().await.unwrap();
    assert_eq!(
        (view["stock"].as_u64(), view["bucket_count"].as_u64()),
        (Some(10), Some(2))
    );
    assert_eq!(view["per_user_limit"], 3);
    let r = app
        .post(
            &format!("/v1/events/{id}/purchases"),
            json!({"user_id": "u-1", "quantity": 2.0}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app
        .client
        .put(app.url(&format!("/v1/events/{id}/buckets")))
        .bearer_auth(TOKEN)
        .json(&json!({"buckets": 4.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["bucket_count"], 4);
    // A fraction, a negative or an overflow is still refused, and buys nothing.
    for quantity in [json!(1.5), json!(-1.0), json!(4294967297.0)] {
        let r = app
            .post(
                &format!("/v1/events/{id}/purchases"),
                json!({"user_id": "u-2", "quantity": quantity}),
            )
            .await;
        problem(r, 400, "invalid-request").await;
    }
    assert_eq!(app.view(&id).await["sold"], 2);
}

/// `per_user_limit` takes any u32 (schemathesis sent 2^31 and saw 201: the
/// request's schema was widened to it), and the view and the over-the-limit
/// problem answer it back: their schemas must say so too, or a client
/// generated from the document reads an `int32` that overflows.
async fn the_largest_limit_accepted_is_documented_where_it_is_answered(b: Backend) {
    let app = TestApp::spawn(b).await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let schemas = &doc["components"]["schemas"];
    let max = u64::from(u32::MAX);
    for (schema, field) in [
        ("CreateEvent", "per_user_limit"),
        ("EventView", "per_user_limit"),
        ("Problem", "limit"),
    ] {
        let f = &schemas[schema]["properties"][field];
        assert_eq!(f["format"], "int64", "{schema}.{field}: {f}");
        assert_eq!(f["maximum"].as_u64(), Some(max), "{schema}.{field}: {f}");
    }
    let id = eid("contract-limit");
    let view = app
        .create(
            &id,
            10,
            2,
            json!({"per_user_limit": max, "max_per_order": 5}),
        )
        .await;
    assert_eq!(view["per_user_limit"].as_u64(), Some(max), "{view}");
    assert_eq!(app.view(&id).await["per_user_limit"].as_u64(), Some(max));
    let r = app
        .admin_post(
            "/v1/events",
            json!({"id": eid("contract-limit-over"), "stock": 10, "per_user_limit": max + 1}),
        )
        .await;
    problem(r, 400, "invalid-request").await;
}

/// Reshards and consolidations of one event at once. A reshard whose mover
/// was fenced by a newer lease answered 500 `internal` (schemathesis, two
/// workers, on Redis, `PUT …/buckets {"buckets": 1023}`); it is `503
/// try-again`, as a reshard that finds its lease lost already was, and the
/// event stays whole. (The fenced step is a race this test may or may not
/// hit; `http::error::tests::a_fenced_mover_answers_try_again_not_internal`
/// pins the mapping.)
async fn concurrent_reshards_answer_a_layout_or_try_again(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("contract-reshards");
    app.create(&id, 1000, 8, json!({})).await;
    for round in 0..3 {
        // Reshards to several counts, and consolidations, all at once.
        let answers = join_all([16u32, 200, 1021, 0, 3, 64, 0, 512].map(|n| {
            let app = &app;
            let id = &id;
            async move {
                let r = if n == 0 {
                    app.client
                        .post(app.url(&format!("/v1/events/{id}/rebalance")))
                } else {
                    app.client
                        .put(app.url(&format!("/v1/events/{id}/buckets")))
                        .json(&json!({"buckets": n + round}))
                };
                let r = r.bearer_auth(TOKEN).send().await.unwrap();
                let status = r.status();
                (n, status, r.text().await.unwrap())
            }
        }))
        .await;
        for (n, status, body) in &answers {
            let ok = match status.as_u16() {
                200 => true,
                // A consolidation while the event is resharding.
                409 => *n == 0 && body.contains("urn:shardstock:not-on-sale"),
                503 => body.contains("urn:shardstock:try-again"),
                _ => false,
            };
            assert!(
                ok,
                "{} answered {status} {body}",
                if *n == 0 { "a rebalance" } else { "a reshard" }
            );
        }
        // A reshard won, or one still runs on its own (past the admin wait,
        // on a loaded machine: a flake of CI when the request timeout cut it
        // to "backend-unavailable"): it ends in one of the counts asked for.
        let asked: Vec<u64> = answers
            .iter()
            .filter(|(n, _, _)| *n > 0)
            .map(|(n, _, _)| u64::from(n + round))
            .collect();
        let won = answers
            .iter()
            .any(|(n, s, _)| *n > 0 && *s == StatusCode::OK);
        let runs_on = answers.iter().any(|(_, _, b)| b.contains("still running"));
        assert!(
            won || runs_on,
            "no reshard won and none runs on: {answers:?}"
        );
        if runs_on {
            // One that runs on, even beside a winner, may still be moving
            // units when the next round (or the counts below) look: wait
            // for the event to be on sale again.
            let view = on_sale_again(&app, &id).await;
            let count = view["bucket_count"].as_u64().unwrap();
            assert!(asked.contains(&count), "{count} not in {asked:?}");
        }
    }
    let view = on_sale_again(&app, &id).await;
    assert_eq!(view["remaining"], 1000, "{view}");
    let audit = app.audit(&id).await;
    assert_eq!(audit["balanced"], true, "{audit}");
}

/// The event's view once it is on sale again (a reshard still running on
/// its own finished); fails after 60 s.
async fn on_sale_again(app: &TestApp, id: &str) -> Value {
    for _ in 0..600 {
        let view = app.view(id).await;
        if view["status"] == "on_sale" {
            return view;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!(
        "{id} is not on sale again after 60 s: {}",
        app.view(id).await
    );
}

/// A reshard that takes longer than the admin wait (three quarters of the
/// request timeout) answers `503 try-again` "still running" and goes on as
/// its own task: the event ends on sale in the new layout, whole, without
/// anyone asking again and with the rebalancer (which resumes stalled
/// reshards) off. Asking again then answers `200`. (The request timeout used
/// to cut the request and the reshard with it: `503 backend-unavailable`,
/// `outcome` `unknown`, and the event left resharding — a CI flake of
/// `concurrent_reshards_answer_a_layout_or_try_again` on a loaded machine.)
async fn a_reshard_slower_than_the_request_answers_try_again_and_finishes(b: Backend) {
    use shardstock::control::checkpoint::{self, Checkpoint, Flow};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let mut settings = crate::harness::settings(b);
    settings.server.request_timeout_ms = 1_000;
    settings.rebalancer.enabled = false;
    let app = TestApp::spawn_with(settings).await;
    let id = eid("contract-slow-reshard");
    app.create(&id, 500, 4, json!({})).await;
    let event = shardstock::domain::ids::EventId::parse(&id).unwrap();
    // The first run stalls 2 s once its old layout is sealed.
    let stalled = Arc::new(AtomicBool::new(false));
    checkpoint::inject(
        &event,
        Arc::new(move |at| {
            let first = at == Checkpoint::ReshardSealed && !stalled.swap(true, Ordering::SeqCst);
            Box::pin(async move {
                if first {
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
                Flow::Go
            })
        }),
    );
    let reshard = || {
        app.client
            .put(app.url(&format!("/v1/events/{id}/buckets")))
            .bearer_auth(TOKEN)
            .json(&json!({"buckets": 7}))
            .send()
    };
    let body = problem(reshard().await.unwrap(), 503, "try-again").await;
    assert!(
        body["detail"].as_str().unwrap().contains("still running"),
        "{body}"
    );
    let view = on_sale_again(&app, &id).await;
    assert_eq!(view["bucket_count"], 7, "{view}");
    assert_eq!(view["remaining"], 500, "{view}");
    let r = reshard().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["bucket_count"], 7);
    checkpoint::clear(&event);
    let audit = app.audit(&id).await;
    assert_eq!(audit["balanced"], true, "{audit}");
}
