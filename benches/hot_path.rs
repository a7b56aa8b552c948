//! criterion benches of the pure hot-path pieces: the routing hash, building a
//! bucket's keys, and a whole purchase on the embedded (memory) store.
//!
//! `cargo bench --bench hot_path`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::EventSpec;
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::PurchaseRequest;
use shardstock::{Engine, EngineOptions, MemoryStore};

fn routing(c: &mut Criterion) {
    let user = UserId::parse("u-1001-a-typical-user-id").unwrap();
    c.bench_function("routing: user hash + home bucket", |b| {
        b.iter(|| home(user_hash(black_box(&user)), black_box(16)))
    });
}

fn keys(c: &mut Criterion) {
    let event = EventId::parse("sneaker-42").unwrap();
    c.bench_function("keys: all keys of a bucket", |b| {
        b.iter(|| BucketRef::new(black_box(&event), 3, black_box(7)).keys())
    });
}

fn memory_purchase(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, batch) in [
        ("memory purchase (fast path, unbatched)", None),
        ("memory purchase (fast path, batched)", Some(64)),
    ] {
        let engine = Engine::new(
            MemoryStore::new(),
            EngineOptions {
                max_batch: batch,
                ..EngineOptions::default()
            },
        );
        let event = EventId::parse("bench").unwrap();
        let spec = EventSpec {
            id: event.clone(),
            stock: 1 << 40,
            buckets: 16,
            per_user_limit: None,
            max_per_order: 10,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
            tokens: None,
            draw: None,
        };
        rt.block_on(engine.create_event(spec)).unwrap();
        let users: Vec<UserId> = (0..1024)
            .map(|i| UserId::parse(format!("u-{i}")).unwrap())
            .collect();
        let mut i = 0;
        c.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let req = PurchaseRequest {
                    event: event.clone(),
                    user: users[i % users.len()].clone(),
                    quantity: 1,
                    request_id: None,
                    access_token: None,
                };
                rt.block_on(engine.purchase(&req)).unwrap()
            })
        });
    }
}

criterion_group!(benches, routing, keys, memory_purchase);
criterion_main!(benches);
