//! `/v1/releases`: create (admin; and from `[[releases]]`), view with every
//! pool's figures, and orders of lines bought all or nothing under one
//! per-user limit; a pool's own purchases refused.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    Backend, TestApp, eid, eventually, on_every_backend, problem, sample, settings,
};

on_every_backend!(
    app:
    a_release_is_created_once_and_viewed_with_its_pools,
    a_two_line_order_is_bought_and_its_lines_reach_the_ledger,
    a_short_line_refuses_the_whole_order_naming_it,
    the_limit_covers_every_pool_and_a_replay_answers_the_original,
    invalid_orders_and_releases_are_refused_naming_the_field,
    a_pools_own_purchases_are_refused,
    a_configured_release_is_created_at_start_up,
    a_held_order_is_confirmed_cancelled_or_expired_whole,
    a_releases_orders_and_pools_are_in_the_metrics,
    an_unpaid_release_order_ends_soon_after_its_deadline,
);

fn release_body(id: &str, extra: Value) -> Value {
    let mut body = json!({
        "id": id,
        "pools": [
            {"id": "42", "stock": 5, "buckets": 2},
            {"id": "43", "stock": 1, "buckets": 1},
        ],
        "max_per_order": 4,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

async fn create(app: &TestApp, id: &str, extra: Value) -> Value {
    let r = app
        .admin_post("/v1/releases", release_body(id, extra))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json().await.unwrap()
}

async fn order(app: &TestApp, release: &str, body: Value) -> reqwest::Response {
    app.post(&format!("/v1/releases/{release}/orders"), body)
        .await
}

async fn view(app: &TestApp, release: &str) -> Value {
    let r = app.get(&format!("/v1/releases/{release}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// Remaining and sold of each pool, in the release's order.
fn figures(v: &Value) -> Vec<(u64, u64)> {
    v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["event"]["remaining"].as_u64().unwrap(),
                p["event"]["sold"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn a_release_is_created_once_and_viewed_with_its_pools(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel");
    let created = create(&app, &id, json!({"per_user_limit": 3})).await;
    assert_eq!(created["id"], id);
    assert_eq!(created["per_user_limit"], 3);
    assert_eq!(created["max_per_order"], 4);
    let pools = created["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[0]["pool"], "42");
    assert_eq!(pools[0]["event"]["id"], format!("{id}.42"));
    assert_eq!(pools[0]["event"]["bucket_count"], 2);
    assert_eq!(pools[0]["event"]["buckets"].as_array().unwrap().len(), 2);
    assert_eq!(figures(&created), vec![(5, 0), (1, 0)]);
    assert_eq!(created["totals"]["stock"], 6);
    assert_eq!(created["totals"]["remaining"], 6);
    assert_eq!(created["totals"]["sold"], 0);
    assert_eq!(view(&app, &id).await, created);
    // The same body again: the release as it is, 200; another body: 409.
    let again = app
        .admin_post(
            "/v1/releases",
            release_body(&id, json!({"per_user_limit": 3})),
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    let other = app
        .admin_post(
            "/v1/releases",
            release_body(&id, json!({"per_user_limit": 4})),
        )
        .await;
    problem(other, 409, "release-exists").await;
    // Admin only.
    let r = app
        .post("/v1/releases", release_body(&eid("api-rel"), json!({})))
        .await;
    problem(r, 401, "unauthorized").await;
    let list: Vec<String> = app.get("/v1/releases").await.json().await.unwrap();
    assert!(list.contains(&id), "{list:?}");
    // Each pool is an event whose views keep working.
    assert_eq!(app.view(&format!("{id}.43")).await["stock"], 1);
    problem(
        app.get(&format!("/v1/releases/{}", eid("ghost"))).await,
        404,
        "unknown-release",
    )
    .await;
    app.stop().await;
}

async fn a_two_line_order_is_bought_and_its_lines_reach_the_ledger(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-buy");
    create(&app, &id, json!({})).await;
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "43", "quantity": 1}, {"pool": "42", "quantity": 2}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let o: Value = r.json().await.unwrap();
    let oid = o["order_id"].as_str().unwrap().to_owned();
    assert_eq!(o["release"], id);
    assert_eq!(o["user_id"], "u-1");
    let lines = o["lines"].as_array().unwrap();
    // In the release's pool order, each an order of its pool's event that
    // shares the release order's id as its suffix.
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["pool"], "42");
    assert_eq!(lines[0]["quantity"], 2);
    assert_eq!(lines[1]["pool"], "43");
    let tail = oid.strip_prefix(id.as_str()).unwrap();
    for line in lines {
        let event = format!("{id}.{}", line["pool"].as_str().unwrap());
        assert_eq!(line["event"], event);
        assert_eq!(line["order_id"], format!("{event}{tail}"));
    }
    assert_eq!(figures(&view(&app, &id).await), vec![(3, 2), (0, 1)]);
    // The ledger's orders view has each line, once flushed.
    for line in lines {
        let event = line["event"].as_str().unwrap();
        let listed = eventually(
            "the line in the ledger",
            Duration::from_secs(20),
            async || {
                let r = app
                    .get(&format!("/v1/events/{event}/orders?user_id=u-1"))
                    .await;
                assert_eq!(r.status(), StatusCode::OK);
                let v: Value = r.json().await.unwrap();
                (v["orders"].as_array().unwrap().len() == 1).then_some(v)
            },
        )
        .await;
        let row = &listed["orders"][0];
        assert_eq!(row["order_id"], line["order_id"], "{listed}");
        assert_eq!(row["quantity"], line["quantity"], "{listed}");
        assert_eq!(row["status"], "confirmed", "{listed}");
        // And a line is an order like any other of its pool's.
        let r = app
            .get(&format!(
                "/v1/orders/{}",
                line["order_id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        let got: Value = r.json().await.unwrap();
        assert_eq!(got["event_id"], line["event"], "{got}");
        assert_eq!(got["quantity"], line["quantity"], "{got}");
        assert_eq!(got["status"], "confirmed", "{got}");
    }
    app.stop().await;
}

async fn a_short_line_refuses_the_whole_order_naming_it(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-short");
    create(&app, &id, json!({})).await;
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 2}, {"pool": "43", "quantity": 2}]}),
    )
    .await;
    let p = problem(r, 409, "sold-out").await;
    assert_eq!(
        p["short_lines"],
        json!([{"pool": "43", "quantity": 2, "remaining": 1}]),
        "{p}"
    );
    // Nothing kept: the first line's units are back.
    assert_eq!(figures(&view(&app, &id).await), vec![(5, 0), (1, 0)]);
    app.stop().await;
}

async fn the_limit_covers_every_pool_and_a_replay_answers_the_original(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-limit");
    create(&app, &id, json!({"per_user_limit": 2})).await;
    let first =
        json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 1}], "request_id": "r-1"});
    let r = order(&app, &id, first.clone()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().get("idempotent-replayed").is_none());
    let bought: Value = r.json().await.unwrap();
    // The same request id again answers the original, buying nothing.
    let r = order(&app, &id, first).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.json::<Value>().await.unwrap(), bought);
    // So does the Idempotency-Key header.
    let r = app
        .client
        .post(app.url(&format!("/v1/releases/{id}/orders")))
        .header("Idempotency-Key", "r-1")
        .json(&json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    // The same request id for other lines is a conflict.
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 2}], "request_id": "r-1"}),
    )
    .await;
    problem(r, 409, "idempotency-conflict").await;
    // One more unit in another pool passes the limit across the release.
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "43", "quantity": 1}, {"pool": "42", "quantity": 1}]}),
    )
    .await;
    let p = problem(r, 409, "limit-exceeded").await;
    assert_eq!(p["limit"], 2, "{p}");
    assert_eq!(p["held"], 1, "{p}");
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "43", "quantity": 1}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(figures(&view(&app, &id).await), vec![(4, 1), (0, 1)]);
    app.stop().await;
}

async fn invalid_orders_and_releases_are_refused_naming_the_field(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-bad");
    create(&app, &id, json!({})).await;
    let cases = [
        (json!({"user_id": "u-1", "lines": []}), "lines"),
        (
            json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 1}, {"pool": "42", "quantity": 1}]}),
            "listed twice",
        ),
        (
            json!({"user_id": "u-1", "lines": [{"pool": "44", "quantity": 1}]}),
            "no pool 44",
        ),
        (
            json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 0}]}),
            "quantity",
        ),
        (
            json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 3}, {"pool": "43", "quantity": 2}]}),
            "1 to 4 units",
        ),
        (
            json!({"user_id": "u-1", "lines": [{"pool": "42", "qty": 1}]}),
            "qty",
        ),
        (json!({"lines": [{"pool": "42", "quantity": 1}]}), "user_id"),
    ];
    for (body, names) in cases {
        let p = problem(order(&app, &id, body.clone()).await, 400, "invalid-request").await;
        assert!(p["detail"].as_str().unwrap().contains(names), "{body}: {p}");
    }
    assert_eq!(figures(&view(&app, &id).await), vec![(5, 0), (1, 0)]);
    problem(
        order(
            &app,
            &eid("ghost"),
            json!({"user_id": "u-1", "lines": [{"pool": "42", "quantity": 1}]}),
        )
        .await,
        404,
        "unknown-release",
    )
    .await;
    let bad = [
        (json!({"id": eid("r"), "pools": []}), "pools"),
        (
            json!({"id": eid("r"), "pools": [{"id": "a", "stock": 1, "buckets": 1}, {"id": "a", "stock": 1, "buckets": 1}]}),
            "listed twice",
        ),
        (
            json!({"id": eid("r"), "pools": [{"id": "a", "stock": 1, "buckets": 0}]}),
            "buckets",
        ),
        (
            json!({"id": eid("r"), "pools": [{"id": "a b", "stock": 1, "buckets": 1}]}),
            "pools[0].id",
        ),
        (
            json!({"id": eid("r"), "pools": [{"id": "a", "stock": 1, "buckets": 1}], "hold_seconds": 0}),
            "hold_seconds",
        ),
        (
            json!({"id": eid("r"), "pools": [{"id": "a", "stock": 1, "buckets": "auto"}], "hold_seconds": 60}),
            "fixed bucket count",
        ),
    ];
    for (body, names) in bad {
        let r = app.admin_post("/v1/releases", body.clone()).await;
        let p = problem(r, 400, "invalid-request").await;
        assert!(p["detail"].as_str().unwrap().contains(names), "{body}: {p}");
    }
    app.stop().await;
}

async fn a_pools_own_purchases_are_refused(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-pool");
    create(&app, &id, json!({"per_user_limit": 1})).await;
    let pool = format!("{id}.42");
    let p = problem(app.buy(&pool, "u-1", 1, None).await, 409, "release-pool").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("/v1/releases/{id}/orders")), "{p}");
    assert_eq!(app.view(&pool).await["sold"], 0);
    // A plain event with a dot in its id is bought as ever.
    let plain = format!("{}.x", eid("api-rel-plain"));
    app.create(&plain, 5, 1, json!({})).await;
    assert_eq!(
        app.buy(&plain, "u-1", 1, None).await.status(),
        StatusCode::CREATED
    );
    app.stop().await;
}

async fn a_configured_release_is_created_at_start_up(b: Backend) {
    let id = eid("cfg-rel");
    let mut s = settings(b);
    s.releases = vec![shardstock::config::ReleaseSettings {
        id: id.clone(),
        pools: vec![shardstock::config::PoolSettings {
            id: "floor".into(),
            stock: 3,
            buckets: shardstock::config::BucketsSetting::Count(1),
        }],
        per_user_limit: Some(2),
        max_per_order: Some(2),
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
    }];
    let app = TestApp::spawn_with(s.clone()).await;
    let v = view(&app, &id).await;
    assert_eq!(v["per_user_limit"], 2);
    assert_eq!(figures(&v), vec![(3, 0)]);
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": [{"pool": "floor", "quantity": 2}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    app.stop().await;
    // A restart with the same configuration finds it as it was.
    let app = TestApp::spawn_with(s).await;
    assert_eq!(figures(&view(&app, &id).await), vec![(1, 2)]);
    app.stop().await;
}

/// A release with holds (from `[[releases]]`): an order answers `held` with
/// its `pay_by`, and a replay the same; confirm and cancel act on every line
/// (`order-confirmed`, `order-cancelled`, `hold-expired` as an event's
/// holds answer); an order never paid expires, all its units back; the
/// ledger shows each line as its order, naming its release order; each
/// decision is counted once in `shardstock_release_holds_total`.
async fn a_held_order_is_confirmed_cancelled_or_expired_whole(b: Backend) {
    let id = eid("held-rel");
    let mut s = settings(b);
    s.engine.sweep_interval_ms = 100;
    s.releases = vec![shardstock::config::ReleaseSettings {
        id: id.clone(),
        pools: vec![
            shardstock::config::PoolSettings {
                id: "a".into(),
                stock: 5,
                buckets: shardstock::config::BucketsSetting::Count(2),
            },
            shardstock::config::PoolSettings {
                id: "b".into(),
                stock: 5,
                buckets: shardstock::config::BucketsSetting::Count(1),
            },
        ],
        per_user_limit: None,
        max_per_order: Some(4),
        starts_at: None,
        ends_at: None,
        hold_seconds: Some(2),
    }];
    let app = TestApp::spawn_with(s).await;
    assert_eq!(view(&app, &id).await["hold_seconds"], 2);
    let both = json!([{"pool": "a", "quantity": 1}, {"pool": "b", "quantity": 1}]);
    let buy = async |u: &str, rid: &str| {
        let r = order(
            &app,
            &id,
            json!({"user_id": u, "lines": both, "request_id": rid}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        r.json::<Value>().await.unwrap()
    };
    let paid = buy("u-1", "p").await;
    assert_eq!(paid["status"], "held", "{paid}");
    assert!(paid["pay_by"].is_string(), "{paid}");
    // A replay answers the same.
    let r = order(
        &app,
        &id,
        json!({"user_id": "u-1", "lines": both, "request_id": "p"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.json::<Value>().await.unwrap(), paid);
    let at = |o: &Value, what: &str| {
        format!(
            "/v1/releases/{id}/orders/{}{what}",
            o["order_id"].as_str().unwrap()
        )
    };
    let got: Value = app.get(&at(&paid, "")).await.json().await.unwrap();
    assert_eq!(got, paid);
    let cancelled = buy("u-2", "c").await;
    let lapsed = buy("u-3", "l").await;
    assert_eq!(figures(&view(&app, &id).await), vec![(2, 3), (2, 3)]);
    // Confirm, twice; a paid order is not cancelled.
    for _ in 0..2 {
        let r = app.post(&at(&paid, "/confirm"), json!({})).await;
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["status"], "confirmed", "{v}");
        assert_eq!(v["pay_by"], paid["pay_by"]);
    }
    problem(
        app.post(&at(&paid, "/cancel"), json!({})).await,
        409,
        "order-confirmed",
    )
    .await;
    // Cancel, twice; a cancelled order is not confirmed.
    for _ in 0..2 {
        let r = app.post(&at(&cancelled, "/cancel"), json!({})).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.json::<Value>().await.unwrap()["status"], "cancelled");
    }
    problem(
        app.post(&at(&cancelled, "/confirm"), json!({})).await,
        409,
        "order-cancelled",
    )
    .await;
    assert_eq!(figures(&view(&app, &id).await), vec![(3, 2), (3, 2)]);
    // Never paid: expired by the sweeper, every line's units back.
    eventually("the hold expired", Duration::from_secs(20), async || {
        let v: Value = app.get(&at(&lapsed, "")).await.json().await.unwrap();
        (v["status"] == "expired").then_some(())
    })
    .await;
    assert_eq!(figures(&view(&app, &id).await), vec![(4, 1), (4, 1)]);
    problem(
        app.post(&at(&lapsed, "/confirm"), json!({})).await,
        409,
        "hold-expired",
    )
    .await;
    problem(
        app.post(&at(&lapsed, "/cancel"), json!({})).await,
        409,
        "hold-expired",
    )
    .await;
    let ghost = format!("{id}.00a1b2c3d4e5f607.1122334455667788");
    problem(
        app.get(&format!("/v1/releases/{id}/orders/{ghost}")).await,
        404,
        "unknown-order",
    )
    .await;
    // The ledger: each line as its order.
    for (o, u, want) in [
        (&paid, "u-1", "confirmed"),
        (&cancelled, "u-2", "cancelled"),
        (&lapsed, "u-3", "expired"),
    ] {
        for line in o["lines"].as_array().unwrap() {
            let event = line["event"].as_str().unwrap();
            eventually(
                "the line in the ledger",
                Duration::from_secs(20),
                async || {
                    let r = app
                        .get(&format!("/v1/events/{event}/orders?user_id={u}"))
                        .await;
                    let v: Value = r.json().await.unwrap();
                    let row = v["orders"].as_array()?.first()?.clone();
                    assert_eq!(row["order_id"], line["order_id"], "{v}");
                    assert_eq!(row["release_order"], o["order_id"], "{v}");
                    (row["status"] == want).then_some(())
                },
            )
            .await;
        }
    }
    // Each decision counted once, by the call that made it: the second
    // confirm and cancel, the reads and the 409s found it decided.
    let text = app.metrics().await;
    for outcome in ["confirmed", "cancelled", "expired"] {
        assert_eq!(
            sample(
                &text,
                "shardstock_release_holds_total",
                &[("release", id.as_str()), ("outcome", outcome)],
            ),
            Some(1.0),
            "{outcome}: {text}"
        );
    }
    // Its pools keep their bucket count: 409 release-pool, naming why.
    let r = app
        .client
        .put(format!("{}/v1/events/{id}.a/buckets", app.base))
        .bearer_auth(crate::harness::TOKEN)
        .json(&json!({"buckets": 4}))
        .send()
        .await
        .unwrap();
    let p = problem(r, 409, "release-pool").await;
    assert!(p["detail"].as_str().unwrap().contains("has holds"), "{p}");
    app.stop().await;
}

async fn a_releases_orders_and_pools_are_in_the_metrics(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("api-rel-m");
    create(&app, &id, json!({})).await;
    let one =
        json!({"user_id": "u-1", "request_id": "m-1", "lines": [{"pool": "42", "quantity": 1}]});
    assert_eq!(
        order(&app, &id, one.clone()).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        order(&app, &id, one).await.status(),
        StatusCode::CREATED,
        "replayed"
    );
    let short = json!({"user_id": "u-2", "lines": [{"pool": "43", "quantity": 2}]});
    assert_eq!(order(&app, &id, short).await.status(), StatusCode::CONFLICT);
    // An unknown release is not counted: the labels stay those of releases
    // that exist.
    let ghost = eid("api-rel-ghost");
    let r = order(
        &app,
        &ghost,
        json!({"user_id": "u-3", "lines": [{"pool": "42", "quantity": 1}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let text = app.metrics().await;
    let orders = |outcome: &str| {
        sample(
            &text,
            "shardstock_release_orders_total",
            &[("release", id.as_str()), ("outcome", outcome)],
        )
    };
    assert_eq!(orders("ok"), Some(1.0), "{text}");
    assert_eq!(orders("replayed"), Some(1.0));
    assert_eq!(orders("sold_out"), Some(1.0));
    assert!(!text.contains(&ghost), "an unknown release has no series");
    // Each pool joins its release once the gauge task has seen it, and the
    // release's other outcomes are there at 0. A rendering collects the
    // counters before the gauges, so it may show a pool's info and not yet
    // the counters its publication set: wait for both.
    let text = eventually(
        "the pools' info series",
        Duration::from_secs(10),
        async || {
            let text = app.metrics().await;
            let holds = sample(
                &text,
                "shardstock_release_holds_total",
                &[("release", id.as_str()), ("outcome", "expired")],
            );
            (sample(
                &text,
                "shardstock_release_pool_info",
                &[
                    ("release", id.as_str()),
                    ("pool", "43"),
                    ("event", &format!("{id}.43")),
                ],
            )
            .is_some()
                && holds.is_some())
            .then_some(text)
        },
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "shardstock_release_pool_info",
            &[
                ("release", id.as_str()),
                ("pool", "42"),
                ("event", &format!("{id}.42"))
            ],
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "shardstock_release_orders_total",
            &[("release", id.as_str()), ("outcome", "gave_up")],
        ),
        Some(0.0)
    );
    for outcome in ["confirmed", "cancelled", "expired"] {
        assert_eq!(
            sample(
                &text,
                "shardstock_release_holds_total",
                &[("release", id.as_str()), ("outcome", outcome)],
            ),
            Some(0.0),
            "{outcome}"
        );
    }
    app.stop().await;
}

/// An unpaid release order ends within a second and a half of its `pay_by` with
/// the default options, as an event's hold does: the release sweeper's
/// round is every 5 s, the deadlines are kept at the plain expirer's
/// 200 ms. Three orders about a second and a half apart: the 5 s round
/// alone would leave at least one of them held for seconds.
async fn an_unpaid_release_order_ends_soon_after_its_deadline(b: Backend) {
    let app = TestApp::spawn(b).await;
    let id = eid("rel-lapse");
    create(&app, &id, json!({"hold_seconds": 1})).await;
    for i in 0..3 {
        let bought = std::time::Instant::now();
        let r = order(
            &app,
            &id,
            json!({"user_id": format!("u-{i}"), "lines": [{"pool": "42", "quantity": 1}]}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let o: Value = r.json().await.unwrap();
        assert_eq!(o["status"], "held", "{o}");
        let at = format!(
            "/v1/releases/{id}/orders/{}",
            o["order_id"].as_str().unwrap()
        );
        // Its pay_by is at most 1 s after `bought`: ended 1.5 s after that
        // (the expirer's tick is 200 ms; the rest is slack for a loaded CI).
        loop {
            let v: Value = app.get(&at).await.json().await.unwrap();
            if v["status"] == "expired" {
                break;
            }
            assert_eq!(v["status"], "held", "{v}");
            assert!(
                bought.elapsed() < Duration::from_millis(2_500),
                "order {i} still held {:?} after its purchase, a hold of 1 s: {v}",
                bought.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    app.stop().await;
}
