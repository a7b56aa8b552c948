//! A binary started on a Redis an older one filled: the records scripts
//! used to assemble (string probe markers, `owner|token` lease holders,
//! `d` stream records with every field in place) are still read, compared
//! and replaced by the new scripts (issue 44: records are encoded in
//! `domain/`, the scripts only store them). The older values are written
//! with `redis-cli`, as the older scripts left them.

use std::process::Command;

use shardstock::domain::ids::OrderId;
use shardstock::domain::keys::{BucketRef, EventKeys};
use shardstock::domain::stream::RecordKind;
use shardstock::store::{Buckets, Leases, Retirement, Streams, TakeArgs, TakeReply};

use crate::harness::{event_id, namespace, spec, standalone, user};

const SUITE: &str = "upgrade";

fn redis(args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(args).output().unwrap();
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn an_older_lease_holder_string_is_renewed_compared_and_released() {
    let engine = standalone(SUITE).await;
    let id = event_id("lease");
    engine.create_event(spec(&id, 8, 2)).await.unwrap();
    let store = engine.store();
    let keys = EventKeys::in_namespace(&namespace(SUITE), &id);
    redis(&["SET", &keys.token, "7"]);
    redis(&["SET", &keys.lease, "old-owner|7", "PX", "60000"]);
    assert_eq!(
        store.lease_holder(&id).await.unwrap(),
        Some(("old-owner".to_owned(), 7))
    );
    assert!(
        !store
            .renew_lease(&id, "old-owner", 6, 60_000)
            .await
            .unwrap()
    );
    assert!(
        store
            .renew_lease(&id, "old-owner", 7, 60_000)
            .await
            .unwrap()
    );
    assert_eq!(
        store.acquire_lease(&id, "new-owner", 60_000).await.unwrap(),
        None
    );
    assert_eq!(
        store.acquire_lease(&id, "old-owner", 60_000).await.unwrap(),
        Some(7),
        "its own lease, same token"
    );
    store.release_lease(&id, "old-owner", 7).await.unwrap();
    assert_eq!(store.lease_holder(&id).await.unwrap(), None);
    let next = store.acquire_lease(&id, "new-owner", 60_000).await.unwrap();
    assert_eq!(next, Some(8));
    assert_eq!(
        redis(&["TYPE", &keys.lease]),
        "hash",
        "stored as its fields now"
    );
}

#[tokio::test]
async fn older_probe_marker_strings_are_replayed_undone_and_cleared() {
    let engine = standalone(SUITE).await;
    let id = event_id("markers");
    engine.create_event(spec(&id, 8, 2)).await.unwrap();
    let store = engine.store();
    let ns = namespace(SUITE);
    let b = BucketRef::new(&id, 0, 1);
    let take = |rid: &str, pass: u32, oid: &OrderId| TakeArgs {
        rid: rid.into(),
        pass,
        user: user("u-old"),
        qty: 1,
        order_id: oid.clone(),
        home: 0,
        marker_ttl_ms: 60_000,
        pay_by: None,
        keep_taken: false,
    };
    // A short decision, as a string: replayed with its numbers.
    let oid = OrderId::generate(&id, 0);
    redis(&["SET", &b.marker_in(&ns, "r1", 1), "S|5|2", "PX", "60000"]);
    assert_eq!(
        store.take(&b, 1, &take("r1", 1, &oid)).await.unwrap(),
        TakeReply::Short {
            available: 5,
            fresh: false,
            adds: 2
        }
    );
    assert_eq!(store.clear_markers(&b, "r1", 1).await.unwrap(), 1);
    // A take, as a string: replayed, then undone once.
    let held = b.marker_in(&ns, "r2", 1);
    redis(&["SET", &held, &format!("T|{oid}"), "PX", "60000"]);
    assert_eq!(
        store.take(&b, 1, &take("r2", 1, &oid)).await.unwrap(),
        TakeReply::Taken {
            order_id: oid.clone()
        }
    );
    assert_eq!(
        store.take_markers(&b, "r2", 1).await.unwrap(),
        vec![(1, oid.clone())]
    );
    let before = store.bucket_state(&b).await.unwrap().stock;
    assert!(store.untake(&b, 2, &take("r2", 1, &oid)).await.unwrap());
    assert!(!store.untake(&b, 3, &take("r2", 1, &oid)).await.unwrap());
    assert_eq!(store.bucket_state(&b).await.unwrap().stock, before + 1);
    assert_eq!(redis(&["GET", &held]), format!("U|{oid}"));
    // A fresh short decision is a hash now, and cleared like the string was.
    let too_many = TakeArgs {
        qty: 100,
        ..take("r3", 1, &oid)
    };
    let short = store.take(&b, 4, &too_many).await.unwrap();
    let TakeReply::Short {
        available,
        fresh: true,
        adds,
    } = short
    else {
        panic!("a fresh short decision: {short:?}");
    };
    assert_eq!(redis(&["TYPE", &b.marker_in(&ns, "r3", 1)]), "hash");
    assert_eq!(
        store.take(&b, 5, &too_many).await.unwrap(),
        TakeReply::Short {
            available,
            fresh: false,
            adds
        },
        "replayed from the hash"
    );
    assert_eq!(store.clear_markers(&b, "r3", 1).await.unwrap(), 1);
}

#[tokio::test]
async fn older_d_records_in_a_stream_reach_the_flusher() {
    let engine = standalone(SUITE).await;
    let id = event_id("stream");
    engine.create_event(spec(&id, 8, 1)).await.unwrap();
    let store = engine.store();
    let b = BucketRef::new(&id, 0, 0);
    let orders = b.keys_in(&namespace(SUITE)).orders;
    let name = b.name();
    for data in [
        "c|e.1.2|u-1|3|0|0||30".to_owned(),
        "e|e.1.3|u-1|2|0|0|u-1/r|31".to_owned(),
        "k|e.1.4|u-1|1|0|0|u-1/s|32".to_owned(),
        format!("l|{name}||4|0|0||33"),
    ] {
        redis(&["XADD", &orders, "*", "d", &data]);
    }
    let read = store.stream_read(&b, "c-1", 10, None).await.unwrap();
    let got: Vec<(RecordKind, u64)> = read.iter().map(|e| (e.kind, e.qty)).collect();
    assert_eq!(
        got,
        [
            (RecordKind::Cancel, 3),
            (RecordKind::Expire, 2),
            (RecordKind::Confirm, 1),
            (RecordKind::Leftover, 4)
        ]
    );
}
