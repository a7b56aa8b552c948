//! `/v1/orders/{id}`: lookup and cancel.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, eid, on_every_backend, problem};

on_every_backend!(
    app:
    an_order_can_be_read_and_cancelled_once,
    unknown_orders_are_problems
);

async fn an_order_can_be_read_and_cancelled_once(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-order");
    app.create(&id, 4, 2, json!({"per_user_limit": 2})).await;
    let order: Value = app
        .buy(&id, "u-1", 2, Some("r1"))
        .await
        .json()
        .await
        .unwrap();
    let oid = order["order_id"].as_str().unwrap();
    let got: Value = app
        .get(&format!("/v1/orders/{oid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "confirmed");
    assert_eq!(
        (got["quantity"].as_u64(), got["request_id"].as_str()),
        (Some(2), Some("r1"))
    );
    let r = app
        .post(&format!("/v1/orders/{oid}/cancel"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "cancelled");
    assert_eq!(app.view(&id).await["remaining"], 4);
    let twice = app
        .post(&format!("/v1/orders/{oid}/cancel"), json!({}))
        .await;
    assert_eq!(twice.status(), StatusCode::OK);
    assert_eq!(app.view(&id).await["remaining"], 4);
    let got: Value = app
        .get(&format!("/v1/orders/{oid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "cancelled");
    // The user's quota came back with the units.
    assert_eq!(
        app.buy(&id, "u-1", 2, None).await.status(),
        StatusCode::CREATED
    );
}

async fn unknown_orders_are_problems(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-noorder");
    app.create(&id, 4, 2, json!({})).await;
    let before = app.view(&id).await;
    for oid in [
        "nope",
        &format!("{id}.0000000000000000.0000000000000000"),
        &format!("{}.0000000000000000.0000000000000000", eid("x")),
    ] {
        problem(
            app.get(&format!("/v1/orders/{oid}")).await,
            404,
            "unknown-order",
        )
        .await;
        problem(
            app.post(&format!("/v1/orders/{oid}/cancel"), json!({}))
                .await,
            404,
            "unknown-order",
        )
        .await;
    }
    assert_eq!(app.view(&id).await, before);
}
