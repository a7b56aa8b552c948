//! Redis-only faults and costs, each on a private server (or a private Cluster)
//! so flushing scripts or counting commands cannot disturb other tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use shardstock::domain::ids::RequestId;
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::{PurchaseRequest, Refusal};
use shardstock::{Engine, EngineOptions, RedisStore};

use crate::harness::{RedisCluster, RedisServer, event_id, spec, user};

/// A store on a private server or Cluster (its own, so the suite's namespace
/// is only for form's sake).
async fn connect(url: &str) -> RedisStore {
    crate::harness::connect(url, "redis_faults").await
}

/// Runs a 64-task sale while `disturb` runs alongside; checks nothing failed
/// and every unit was sold exactly once.
async fn sale_survives(engine: Engine<RedisStore>, disturb: impl Fn() + Send + Sync + 'static) {
    let engine = Arc::new(engine);
    let id = event_id("flush");
    engine.create_event(spec(&id, 2_000, 8)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !stop.load(Ordering::Relaxed) {
                disturb();
                flushes += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            flushes
        })
    };
    let sold = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (engine, id, sold) = (engine.clone(), id.clone(), sold.clone());
            tokio::spawn(async move {
                for i in 0..40 {
                    let req = PurchaseRequest {
                        event: id.clone(),
                        user: user(format!("u-{t}-{i}")),
                        quantity: 1,
                        request_id: Some(RequestId::parse(format!("r{t}-{i}")).unwrap()),
                        access_token: None,
                    };
                    let out = engine
                        .purchase(&req)
                        .await
                        .expect("a purchase failed during SCRIPT FLUSH");
                    if out.result.is_ok() {
                        sold.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let flushes = flusher.join().unwrap();
    assert!(
        flushes >= 3,
        "only {flushes} flushes happened during the run"
    );
    let view = engine.view(&id).await.unwrap();
    assert_eq!(sold.load(Ordering::Relaxed), 2_000 - view.remaining);
    assert_eq!(view.sold, 2_000 - view.remaining);
    println!(
        "{} flushes during the run; {} units sold",
        flushes, view.sold
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchases_go_on_through_script_flush() {
    let server = RedisServer::start();
    let engine = Engine::new(connect(&server.url()).await, EngineOptions::default());
    let port = server.port;
    sale_survives(engine, move || {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "script", "flush"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchases_go_on_through_script_flush_on_every_cluster_node() {
    let cluster = Arc::new(RedisCluster::start().unwrap());
    let engine = Engine::new(connect(&cluster.url()).await, EngineOptions::default());
    let c = cluster.clone();
    sale_survives(engine, move || {
        for node in 0..3 {
            assert!(c.cli(node, &["script", "flush"]).contains("OK"));
        }
    })
    .await;
}

/// Records every command clients send to a server (MONITOR), leaving out the
/// commands scripts run inside Redis (`[0 lua]`): what crossed the network.
struct Monitor {
    port: u16,
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        assert_eq!(lines.recv().unwrap(), "OK");
        Self { port, child, lines }
    }

    /// Client commands the server ran so far (lower-cased names). MONITOR
    /// shows commands in the order the server ran them, so everything sent
    /// before is in once a marker sent last shows up.
    fn commands(&mut self) -> Vec<String> {
        let marker = format!("monitor-end-{:08x}", rand::random::<u32>());
        let echoed = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "echo", &marker])
            .output()
            .unwrap();
        assert!(echoed.status.success());
        let seen: Vec<String> = std::iter::from_fn(|| {
            let line = self
                .lines
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("MONITOR shows the marker");
            (!line.contains(&marker)).then_some(line)
        })
        .collect();
        let _ = self.child.kill();
        let _ = self.child.wait();
        seen.iter()
            .filter(|l| !l.contains(" lua]"))
            .filter_map(|l| l.split('"').nth(1).map(str::to_lowercase))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_path_purchase_is_one_round_trip() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let engine = Engine::new(store.clone(), EngineOptions::default());
    let id = event_id("rtt");
    engine.create_event(spec(&id, 1_000, 4)).await.unwrap();
    engine.meta(&id).await.unwrap();
    let mut monitor = Monitor::start(server.port);
    const N: u64 = 200;
    for i in 0..N {
        let req = PurchaseRequest {
            event: id.clone(),
            user: user(format!("u-{i}")),
            quantity: 2,
            request_id: (i % 2 == 0).then(|| RequestId::parse(format!("r{i}")).unwrap()),
            access_token: None,
        };
        let order = engine.purchase(&req).await.unwrap().result.unwrap();
        assert_eq!(order.probes, 0);
        assert_eq!(order.bucket, home(user_hash(&req.user), 4));
    }
    let commands = monitor.commands();
    println!("{} commands for {N} purchases", commands.len());
    assert_eq!(commands.len() as u64, N, "one command per purchase");
    assert!(commands.iter().all(|c| c == "evalsha"), "{commands:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_answer_after_the_mark_is_one_call() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let engine = Engine::new(store.clone(), EngineOptions::default());
    let id = event_id("so");
    engine.create_event(spec(&id, 4, 4)).await.unwrap();
    for i in 0..4 {
        engine
            .purchase(&PurchaseRequest {
                event: id.clone(),
                user: user(format!("a-{i}")),
                quantity: 1,
                request_id: None,
                access_token: None,
            })
            .await
            .unwrap();
    }
    // The first sold-out answer probes the ring and marks the event sold out.
    let first = PurchaseRequest {
        event: id.clone(),
        user: user("late-0"),
        quantity: 1,
        request_id: None,
        access_token: None,
    };
    let mut sold_out = Err(Refusal::SoldOut { remaining: 0 });
    while engine.purchase(&first).await.unwrap().result.is_ok() {}
    let mut monitor = Monitor::start(server.port);
    const N: u64 = 50;
    for i in 0..N {
        let req = PurchaseRequest {
            event: id.clone(),
            user: user(format!("late-{i}")),
            quantity: 1,
            request_id: None,
            access_token: None,
        };
        sold_out = engine
            .purchase(&req)
            .await
            .unwrap()
            .result
            .map(|o| o.quantity);
        assert_eq!(sold_out, Err(Refusal::SoldOut { remaining: 0 }));
    }
    let commands = monitor.commands();
    println!(
        "{} commands for {N} sold-out answers ({sold_out:?})",
        commands.len()
    );
    assert_eq!(
        commands.len() as u64,
        N,
        "the home step alone answers sold out: {commands:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purchases_share_script_calls() {
    let server = RedisServer::start();
    let store = connect(&server.url()).await;
    let engine = Arc::new(Engine::new(store, EngineOptions::default()));
    let id = event_id("batch");
    engine.create_event(spec(&id, 100_000, 2)).await.unwrap();
    engine.meta(&id).await.unwrap();
    let mut monitor = Monitor::start(server.port);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (engine, id) = (engine.clone(), id.clone());
            tokio::spawn(async move {
                for i in 0..25 {
                    let req = PurchaseRequest {
                        event: id.clone(),
                        user: user(format!("u-{t}-{i}")),
                        quantity: 1,
                        request_id: Some(RequestId::parse(format!("r{t}-{i}")).unwrap()),
                        access_token: None,
                    };
                    engine.purchase(&req).await.unwrap().result.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = monitor
        .commands()
        .iter()
        .filter(|c| *c == "evalsha")
        .count();
    let ratio = 1_600.0 / calls as f64;
    println!("1600 purchases in {calls} script calls: {ratio:.1} purchases per call");
    assert!(ratio > 2.0, "{calls} calls for 1600 purchases");
    assert_eq!(engine.view(&id).await.unwrap().sold, 1_600);
}
