//! The durability setting (`store.min_replicas`): a purchase is acknowledged
//! only once its writes are on a replica.
//!
//! A private master with one replica. With `min_replicas = 1`, a purchase
//! answers once the replica has its order; with the replica stopped
//! (SIGSTOP), a purchase answers "outcome unknown" — while a store without
//! the setting still buys from the same master — and, the replica continued,
//! a retry with the same request id answers the purchase, which the replica
//! then holds.

use std::process::Command;
use std::time::Duration;

use shardstock::control::lifecycle;
use shardstock::domain::ids::RequestId;
use shardstock::domain::keys::BucketRef;
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::{PurchaseOutcome, PurchaseRequest};
use shardstock::store::redis::RedisOptions;
use shardstock::{Engine, EngineError, EngineOptions, RedisStore};

use crate::harness::{
    RedisServer, event_id, ledger_for, namespace, spec, suite_of, user, wait_until,
};

/// Continues a stopped process when dropped.
struct Stopped(String);

impl Stopped {
    fn stop(server: &RedisServer) -> Self {
        let pid = server.pid();
        assert!(
            Command::new("kill")
                .args(["-STOP", &pid])
                .status()
                .unwrap()
                .success()
        );
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

async fn store(url: &str, min_replicas: u32) -> RedisStore {
    let mut opts = RedisOptions::new(url);
    opts.namespace = namespace(suite_of(module_path!()));
    opts.min_replicas = min_replicas;
    opts.replica_timeout = Duration::from_millis(200);
    RedisStore::connect(&opts).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_min_replicas_a_purchase_is_acknowledged_only_once_a_replica_has_it() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&format!(
        "--save '' --appendonly no --replicaof 127.0.0.1 {}",
        master.port
    ));
    wait_until("the replica to sync", Duration::from_secs(20), || {
        replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
    });
    let durable = Engine::new(store(&master.url(), 1).await, EngineOptions::default());
    let plain = Engine::new(store(&master.url(), 0).await, EngineOptions::default());
    let ledger = ledger_for("redis").await;
    let id = event_id("replicas");
    lifecycle::create(&durable, &ledger, spec(&id, 100, 4))
        .await
        .unwrap();
    let buy = |name: &str, rid: &str| PurchaseRequest {
        event: id.clone(),
        user: user(name),
        quantity: 1,
        request_id: Some(RequestId::parse(rid).unwrap()),
        access_token: None,
    };
    // Whether the replica holds the order's index entry.
    let on_replica = |req: &PurchaseRequest, order: &str| {
        let b = BucketRef::new(&id, 0, home(user_hash(&req.user), 4));
        let idx = b.keys_in(&namespace(suite_of(module_path!()))).idx;
        replica.cli(&["hexists", &idx, order]).trim() == "1"
    };

    let first = buy("alice", "r1");
    let order = match durable.purchase(&first).await {
        Ok(PurchaseOutcome { result: Ok(o), .. }) => o,
        other => panic!("{other:?}"),
    };
    assert!(
        on_replica(&first, order.order_id.as_str()),
        "acknowledged before the replica had it"
    );

    let second = buy("bob", "r2");
    {
        let _stopped = Stopped::stop(&replica);
        match durable.purchase(&second).await {
            Err(EngineError::OutcomeUnknown(why)) => println!("replicas: {why}"),
            other => panic!("a purchase the replica cannot confirm answered {other:?}"),
        }
        // The master itself sells: the setting, not Redis, said "unknown".
        match plain.purchase(&buy("carol", "r3")).await {
            Ok(PurchaseOutcome { result: Ok(_), .. }) => {}
            other => panic!("without the setting: {other:?}"),
        }
    }
    wait_until("the replica to catch up", Duration::from_secs(20), || {
        replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
    });
    let again = match durable.purchase(&second).await {
        Ok(PurchaseOutcome { result: Ok(o), .. }) => o,
        other => panic!("the retry with the request id answered {other:?}"),
    };
    assert!(on_replica(&second, again.order_id.as_str()));
    assert_eq!(again.quantity, 1);
}
