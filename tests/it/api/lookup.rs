//! Finding orders without their ids: `GET /v1/events/{id}/orders?user_id=…`
//! and `GET /v1/events/{id}/requests/{request_id}?user_id=…`, while the
//! event sells and after its close.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, eid, eventually, on_every_backend, problem};

on_every_backend!(
    app:
    a_users_orders_are_listed_live_and_after_the_close,
    a_request_ids_answer_is_read_without_buying,
);

async fn orders_of(app: &TestApp, event: &str, user: &str) -> Value {
    let r = app
        .get(&format!("/v1/events/{event}/orders?user_id={user}"))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// A user's two orders (one cancelled) are listed with their statuses, and
/// no one else's; the same after the close, from the database.
async fn a_users_orders_are_listed_live_and_after_the_close(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-lookup");
    app.create(&id, 20, 2, json!({"per_user_limit": 6})).await;
    let mut mine = Vec::new();
    for rid in ["l-1", "l-2"] {
        let r = app.buy(&id, "u-1", 2, Some(rid)).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        mine.push(r.json::<Value>().await.unwrap()["order_id"].clone());
    }
    assert_eq!(
        app.buy(&id, "u-2", 1, Some("l-1")).await.status(),
        StatusCode::CREATED
    );
    let cancelled = mine[1].as_str().unwrap();
    let r = app
        .post(&format!("/v1/orders/{cancelled}/cancel"), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    // Live: the orders appear once flushed, with their statuses now.
    let listed = eventually("the user's orders", Duration::from_secs(20), async || {
        let v = orders_of(&app, &id, "u-1").await;
        (v["orders"].as_array().unwrap().len() == 2).then_some(v)
    })
    .await;
    // Oldest first; two orders of one millisecond may come either way (the
    // API orders by creation time, to the millisecond), so each is found by
    // its id.
    let check = |v: &Value| {
        let orders = v["orders"].as_array().unwrap();
        assert_eq!(orders.len(), 2, "{v}");
        let times: Vec<time::OffsetDateTime> = orders
            .iter()
            .map(|o| {
                let at = o["created_at"].as_str().unwrap();
                time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                    .unwrap_or_else(|e| panic!("created_at {at}: {e}"))
            })
            .collect();
        assert!(times[0] <= times[1], "oldest first: {v}");
        let by_id = |id: &Value| {
            orders
                .iter()
                .find(|o| o["order_id"] == *id)
                .unwrap_or_else(|| panic!("{id} listed: {v}"))
        };
        assert_eq!(by_id(&mine[0])["status"], "confirmed", "{v}");
        assert_eq!(by_id(&mine[0])["request_id"], "l-1", "{v}");
        assert_eq!(by_id(&mine[1])["status"], "cancelled", "{v}");
        assert!(orders.iter().all(|o| o["user_id"] == "u-1"), "{v}");
    };
    check(&listed);
    app.close(&id).await;
    check(&orders_of(&app, &id, "u-1").await);
    assert_eq!(
        orders_of(&app, &id, "nobody").await["orders"],
        json!([]),
        "a user without orders has none"
    );
    let r = app.get(&format!("/v1/events/{id}/orders")).await;
    let p = problem(r, 400, "invalid-request").await;
    assert!(p["detail"].as_str().unwrap().contains("user_id"), "{p}");
    let r = app
        .get(&format!("/v1/events/{}/orders?user_id=u-1", eid("ghost")))
        .await;
    problem(r, 404, "unknown-event").await;
}

/// The answer kept for a request id comes back as it was (the order, or the
/// refusal) and the lookup never buys: an id never sent is `404` and leaves
/// the stock as it was, and another user's id finds nothing. After the
/// close the order comes from the database; a refusal is not kept there.
async fn a_request_ids_answer_is_read_without_buying(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-request");
    app.create(&id, 10, 2, json!({"per_user_limit": 2})).await;
    let bought: Value = app
        .buy(&id, "u-1", 2, Some("q-1"))
        .await
        .json()
        .await
        .unwrap();
    let r = app.buy(&id, "u-1", 1, Some("q-2")).await;
    assert_eq!(r.status(), StatusCode::CONFLICT, "over the limit");
    let ask = async |user: &str, rid: &str| {
        app.get(&format!("/v1/events/{id}/requests/{rid}?user_id={user}"))
            .await
    };
    let r = ask("u-1", "q-1").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let order: Value = r.json().await.unwrap();
    assert_eq!(
        (&order["order_id"], &order["quantity"]),
        (&bought["order_id"], &json!(2))
    );
    let refusal = problem(ask("u-1", "q-2").await, 409, "limit-exceeded").await;
    assert_eq!(refusal["limit"], 2);
    problem(ask("u-1", "q-3").await, 404, "unknown-request").await;
    problem(ask("u-2", "q-1").await, 404, "unknown-request").await;
    let view = app.view(&id).await;
    assert_eq!(view["sold"], 2, "a lookup never buys: {view}");

    app.close(&id).await;
    let r = ask("u-1", "q-1").await;
    assert_eq!(r.status(), StatusCode::OK);
    let order: Value = r.json().await.unwrap();
    assert_eq!(order["order_id"], bought["order_id"], "from the database");
    problem(ask("u-1", "q-2").await, 404, "unknown-request").await;
}
