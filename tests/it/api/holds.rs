//! Holds over HTTP (issue 14): `hold_seconds` on create, `held` answers with
//! `pay_by`, `POST /v1/orders/{id}/confirm`, the event view's `held`, and an
//! event without holds unchanged. Deadlines passing are the engine suite's
//! (`holds`, on a clock moved by hand); here a hold is cancelled instead.

use reqwest::StatusCode;
use serde_json::{Value, json};

use shardstock::client::{NewEvent, NewPurchase};

use crate::harness::{Backend, TestApp, eid, on_every_backend, problem};

on_every_backend!(
    app:
    a_held_purchase_is_confirmed_once_and_a_cancelled_one_refused,
    hold_seconds_out_of_bounds_is_refused,
    an_event_without_holds_answers_as_before,
    the_typed_client_reads_and_confirms_holds,
);

async fn a_held_purchase_is_confirmed_once_and_a_cancelled_one_refused(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-hold");
    let event = app
        .create(
            &id,
            10,
            2,
            json!({"hold_seconds": 600, "per_user_limit": 2}),
        )
        .await;
    assert_eq!(
        (event["hold_seconds"].clone(), event["held"].clone()),
        (json!(600), json!(0))
    );
    let r = app.buy(&id, "u-1", 2, Some("h-1")).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let order: Value = r.json().await.unwrap();
    assert_eq!(order["status"], "held");
    let pay_by = order["pay_by"].as_str().unwrap().to_owned();
    shardstock::domain::model::rfc3339_ms::parse(&pay_by).unwrap();
    let oid = order["order_id"].as_str().unwrap().to_owned();
    let view = app.view(&id).await;
    assert_eq!(
        (view["held"].clone(), view["remaining"].clone()),
        (json!(2), json!(8))
    );
    let seen: Value = app
        .get(&format!("/v1/orders/{oid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (seen["status"].as_str(), seen["pay_by"].as_str()),
        (Some("held"), Some(pay_by.as_str()))
    );
    // A replay answers the order as it stands.
    let again: Value = app
        .buy(&id, "u-1", 2, Some("h-1"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (again["order_id"].clone(), again["status"].clone()),
        (json!(oid), json!("held"))
    );

    for _ in 0..2 {
        let r = app
            .post(&format!("/v1/orders/{oid}/confirm"), json!({}))
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        let confirmed: Value = r.json().await.unwrap();
        assert_eq!(confirmed["status"], "confirmed");
        assert_eq!(confirmed["pay_by"].as_str(), Some(pay_by.as_str()));
    }
    let view = app.view(&id).await;
    assert_eq!(
        (view["held"].clone(), view["sold"].clone()),
        (json!(0), json!(2))
    );

    let other: Value = app.buy(&id, "u-2", 1, None).await.json().await.unwrap();
    let other = other["order_id"].as_str().unwrap().to_owned();
    let r = app
        .post(&format!("/v1/orders/{other}/cancel"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(app.view(&id).await["remaining"], 8, "released at once");
    let r = app
        .post(&format!("/v1/orders/{other}/confirm"), json!({}))
        .await;
    problem(r, 409, "order-cancelled").await;
    let r = app
        .post(
            &format!("/v1/orders/{id}.00a1b2c3d4e5f607.1122334455667788/confirm"),
            json!({}),
        )
        .await;
    problem(r, 404, "unknown-order").await;
    let metrics = app.metrics().await;
    for name in [
        "shardstock_holds_created_total",
        "shardstock_holds_confirmed_total",
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(name) && l.contains(&id) && !l.ends_with(" 0")),
            "{name} counted:\n{metrics}"
        );
    }
}

async fn hold_seconds_out_of_bounds_is_refused(b: Backend) {
    let app = TestApp::spawn(b).await;
    for bad in [json!(0), json!(86_401), json!(-1), json!(1.5)] {
        let body =
            json!({"id": eid("api-hold-bad"), "stock": 1, "buckets": 1, "hold_seconds": bad});
        let r = app.admin_post("/v1/events", body).await;
        assert!(
            matches!(r.status().as_u16(), 400 | 422),
            "hold_seconds {bad}: {}",
            r.status()
        );
    }
}

async fn an_event_without_holds_answers_as_before(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-nohold");
    let event = app.create(&id, 3, 1, json!({})).await;
    assert!(event.get("hold_seconds").is_none());
    assert_eq!(event["held"], 0);
    let order: Value = app.buy(&id, "u-1", 1, None).await.json().await.unwrap();
    assert!(
        order.get("status").is_none() && order.get("pay_by").is_none(),
        "{order}"
    );
    let oid = order["order_id"].as_str().unwrap();
    let seen: Value = app
        .get(&format!("/v1/orders/{oid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(seen["status"], "confirmed");
    assert!(seen.get("pay_by").is_none());
    // Confirming an order that was never held is a no-op.
    let r = app
        .post(&format!("/v1/orders/{oid}/confirm"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// `shardstock::client` speaks holds: `hold_seconds` on create, `held` and
/// `pay_by` on the purchase and the order, `confirm`, and the problems of a
/// cancelled order.
async fn the_typed_client_reads_and_confirms_holds(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-hold-client");
    let event = app
        .api
        .create_event(&NewEvent {
            id: id.clone(),
            stock: 5,
            buckets: 1,
            hold_seconds: Some(300),
            ..NewEvent::default()
        })
        .await
        .unwrap();
    assert_eq!((event.hold_seconds, event.held), (Some(300), 0));
    let buy = |user: &str| NewPurchase {
        user_id: user.into(),
        quantity: 2,
        request_id: None,
    };
    let bought = app.api.purchase(&id, &buy("u-1")).await.unwrap().order;
    assert_eq!(bought.status.as_deref(), Some("held"));
    let pay_by = bought.pay_by.clone().expect("a held order has a deadline");
    let event = app.api.event(&id).await.unwrap();
    assert_eq!((event.held, event.remaining), (2, 3));
    let seen = app.api.order(&bought.order_id).await.unwrap();
    assert_eq!(
        (seen.status.as_str(), seen.pay_by.as_deref()),
        ("held", Some(pay_by.as_str()))
    );
    for _ in 0..2 {
        let confirmed = app.api.confirm(&bought.order_id).await.unwrap();
        assert_eq!(
            (confirmed.status.as_str(), confirmed.pay_by.as_deref()),
            ("confirmed", Some(pay_by.as_str()))
        );
    }
    let other = app.api.purchase(&id, &buy("u-2")).await.unwrap().order;
    assert_eq!(
        app.api.cancel(&other.order_id).await.unwrap().status,
        "cancelled"
    );
    let refused = app.api.confirm(&other.order_id).await.unwrap_err();
    assert_eq!(refused.slug(), Some("order-cancelled"), "{refused}");
    let event = app.api.event(&id).await.unwrap();
    assert_eq!((event.held, event.sold, event.remaining), (0, 2, 3));
}
