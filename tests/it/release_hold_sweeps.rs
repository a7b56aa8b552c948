//! The release holds' sweep when a home cannot be listed (its master down,
//! say), on every backend: the round goes on to the other homes, expires
//! their due holds, and reports the failure; the failed home's holds end
//! in the next round that can list it.

use std::collections::HashMap;
use std::time::Duration;

use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::domain::routing::user_hash;
use shardstock::engine::{LinesRequest, ManualClock, ReleaseOrderStatus};
use shardstock::{Engine, EngineOptions, Store};

use crate::harness::faulty::{Faulty, When};
use crate::harness::{event_id, on_every_backend, user};

async fn a_home_that_cannot_be_listed_does_not_hold_up_the_others<S: Store>(engine: Engine<S>) {
    let clock = ManualClock::starting_now();
    let faulty = Faulty::new(engine.store().clone(), 1);
    let engine =
        Engine::new(faulty.clone(), EngineOptions::default()).with_clock(clock.clone().into());
    let spec = ReleaseSpec {
        id: event_id("hsweep"),
        pools: vec![PoolSpec {
            name: EventId::parse("p0").unwrap(),
            stock: 100,
            buckets: 2,
            auto_buckets: None,
        }],
        per_user_limit: None,
        max_per_order: 3,
        starts_at: None,
        ends_at: None,
        hold_seconds: Some(60),
        homes: 4,
    };
    engine.create_release(spec.clone()).await.unwrap();
    // One held order a user, users until every home holds some.
    let mut by_home: HashMap<u32, Vec<String>> = HashMap::new();
    let mut u = 0;
    while by_home.len() < spec.homes as usize {
        let name = format!("u{u}");
        u += 1;
        let order = engine
            .buy_lines(&LinesRequest {
                release: spec.id.clone(),
                user: user(&name),
                lines: vec![(EventId::parse("p0").unwrap(), 1)],
                request_id: Some(RequestId::parse(format!("r{u}")).unwrap()),
            })
            .await
            .unwrap()
            .result
            .unwrap();
        by_home
            .entry(spec.home(user_hash(&user(&name))))
            .or_default()
            .push(order.order_id.to_string());
    }
    clock.advance(Duration::from_secs(61));
    // The round's first listing (home 0) fails.
    faulty.arm(
        "stale_orders",
        faulty.calls("stale_orders") + 1,
        When::Before,
    );
    let round = engine.sweep_release_holds(&spec.id, 64, None).await;
    assert!(round.is_err(), "the failed listing is reported: {round:?}");
    let status = |id: String| {
        let engine = &engine;
        let release = spec.id.clone();
        async move { engine.release_order(&release, &id).await.unwrap().status }
    };
    for (home, orders) in &by_home {
        for id in orders {
            let want = if *home == 0 {
                ReleaseOrderStatus::Held
            } else {
                ReleaseOrderStatus::Expired
            };
            assert_eq!(status(id.clone()).await, want, "order {id} at home {home}");
        }
    }
    // The next round lists home 0 too.
    let again = engine
        .sweep_release_holds(&spec.id, 64, None)
        .await
        .unwrap();
    assert_eq!(again.ended as usize, by_home[&0].len());
    for id in by_home.values().flatten() {
        assert_eq!(status(id.clone()).await, ReleaseOrderStatus::Expired);
    }
    let view = engine.view(&spec.pool_event(0).unwrap()).await.unwrap();
    assert_eq!(view.remaining, 100, "every unit back on sale");
}

on_every_backend!(namespace_per_test: a_home_that_cannot_be_listed_does_not_hold_up_the_others);
