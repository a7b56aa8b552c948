//! Two application instances on one Redis sell one event at the same time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Backend, TestApp, eid};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sell_one_event_without_breaking_an_invariant() {
    let a = Arc::new(TestApp::spawn(Backend::Redis).await);
    let b = Arc::new(TestApp::spawn(Backend::Redis).await);
    let id = eid("api-two");
    a.create(
        &id,
        600,
        8,
        json!({"per_user_limit": 3, "max_per_order": 2}),
    )
    .await;
    let bought: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let tasks: Vec<_> = (0..48)
        .map(|t| {
            let app = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (id, bought) = (id.clone(), bought.clone());
            tokio::spawn(async move {
                for i in 0..40 {
                    let user = format!("u-{}", (t * 7 + i * 13) % 400);
                    let qty = 1 + (i % 2) as u32;
                    let r = app.buy_final(&id, &user, qty, &format!("t{t}-{i}")).await;
                    match r.status() {
                        StatusCode::CREATED => {
                            *bought.lock().unwrap().entry(user).or_default() += u64::from(qty)
                        }
                        StatusCode::CONFLICT => {}
                        other => panic!("unexpected {other}: {}", r.text().await.unwrap()),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Sell whatever is left one unit at a time, alternating instances.
    let mut i = 0;
    loop {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app
            .buy_final(&id, &format!("late-{i}"), 1, &format!("late-{i}"))
            .await;
        if r.status() != StatusCode::CREATED {
            let p: Value = r.json().await.unwrap();
            assert_eq!(p["type"], "urn:shardstock:sold-out");
            break;
        }
        *bought
            .lock()
            .unwrap()
            .entry(format!("late-{i}"))
            .or_default() += 1;
        i += 1;
    }
    let bought = bought.lock().unwrap().clone();
    assert_eq!(bought.values().sum::<u64>(), 600, "units sold == stock");
    assert!(bought.values().all(|&n| n <= 3), "a user over the limit");
    for app in [&a, &b] {
        let v = app.view(&id).await;
        assert_eq!(
            (v["remaining"].as_u64(), v["sold"].as_u64()),
            (Some(0), Some(600))
        );
    }
}
