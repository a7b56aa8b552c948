//! A Redis Cluster that grows and shrinks mid-sale, as an operator does it.
//!
//! On a private 3-master Cluster (the shared one serves other suites), the
//! whole application (HTTP, flusher, gauges, rebalancer, sweeper, audits;
//! PostgreSQL ledger) sells one event of 32 buckets to clients that keep
//! buying. Meanwhile a fourth master joins (`redis-cli --cluster add-node`),
//! a third of the slots move to it (`--cluster reshard`), then every slot
//! moves off it again (`--cluster rebalance` with its weight at 0) and it is
//! removed (`--cluster del-node`; it keeps running, reset, as a node an
//! operator has not stopped yet). The service was started with the three
//! original nodes' addresses only.
//!
//! Checked: no answer is ever a 500; fewer than 1% of the purchases sent
//! while slots move fail (a 503 with `Retry-After`), none after; every
//! request retried with its id gets a final answer; then, with the sale
//! still open, the background loops are seen alive after the moves (the
//! flusher brings every 201 into the ledger, once, with its quantity; the
//! gauges show the final remaining; the audit balances; the rebalancer's
//! leader keeps its lease), and sold + remaining = stock, per-user limits
//! hold.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shardstock::domain::ids::EventId;
use shardstock::domain::keys::{BucketRef, EventKeys, slot};
use shardstock_bench::cluster::{redis_cli, scratch_dir, spawn_redis};

use crate::harness::{
    Backend, RedisCluster, TestApp, eventually, free_port, ledger_for, namespace, sample,
    settings_in, suite_of, wait_until,
};

const STOCK: u64 = 1_000_000;
const BUCKETS: u32 = 32;
const LIMIT: u64 = 60;
const USERS: usize = 4_000;
const CLIENTS: usize = 12;
/// A third of the 16,384 slots.
const MOVED_SLOTS: &str = "5461";

/// When a request was sent, relative to the slot moves.
const BEFORE: u8 = 0;
const MOVING: u8 = 1;
const AFTER: u8 = 2;

/// A master added to the Cluster (stopped when dropped).
struct ExtraNode {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl ExtraNode {
    fn start() -> Self {
        let port = free_port();
        let dir = scratch_dir("cluster-extra");
        let child = spawn_redis(
            &dir,
            &format!(
                "--port {port} --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
                 --cluster-node-timeout 2000 --save '' --appendonly no"
            ),
        )
        .expect("spawn a fourth redis-server");
        wait_until("the fourth node to answer", Duration::from_secs(10), || {
            redis_cli(port, &["ping"]).trim() == "PONG"
        });
        Self { port, dir, child }
    }

    fn id(&self) -> String {
        redis_cli(self.port, &["cluster", "myid"]).trim().to_owned()
    }
}

impl Drop for ExtraNode {
    fn drop(&mut self) {
        let _ = redis_cli(self.port, &["shutdown", "nosave"]);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-cli --cluster …` against `port`; fails the test with its output.
fn cluster_tool(port: u16, args: &[&str]) {
    let entry = format!("127.0.0.1:{port}");
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg(args[0])
        .args(
            args[1..]
                .iter()
                .map(|a| if *a == "ENTRY" { &entry } else { *a }),
        )
        .output()
        .expect("redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    // The plan lists every slot: keep the end, where the error is.
    let tail: String = text
        .lines()
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success() && !text.contains("[ERR]"),
        "redis-cli --cluster {}: …{tail}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until each of `ports` knows exactly `masters` healthy masters and
/// `redis-cli --cluster check` is clean: what `reshard` insists on.
fn settled(ports: &[u16], masters: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut seen = String::new();
        for &p in ports {
            let info = redis_cli(p, &["cluster", "info"]);
            let nodes = redis_cli(p, &["cluster", "nodes"]);
            let known: Vec<&str> = nodes.lines().filter(|l| l.contains("master")).collect();
            let healthy = known.len() == masters
                && known.iter().all(|l| {
                    l.contains("connected") && !l.contains("fail") && !l.contains("handshake")
                });
            if !info.contains("cluster_state:ok") || !healthy {
                seen.push_str(&format!(
                    "node {p}: {}\n{nodes}\n",
                    info.lines().next().unwrap_or("")
                ));
            }
        }
        let out = Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{}", ports[0])])
            .output()
            .expect("redis-cli");
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.contains("[ERR]") {
            seen.push_str(&text);
        }
        if seen.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Cluster's nodes did not agree within 60 s:\n{seen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One purchase sent: its body, when it was sent, the first answer.
struct Sent {
    body: Value,
    phase: u8,
    status: u16,
    answer: Value,
}

fn is_final(status: u16) -> bool {
    status == 201 || status == 409
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_moving_to_a_new_master_and_back_mid_sale_fail_under_one_percent_and_no_loop_dies() {
    let cluster = RedisCluster::start().expect("start a private 3-master Cluster");
    let suite = suite_of(module_path!());
    let mut settings = settings_in(suite, Backend::Redis);
    settings.store.redis_url = Some(cluster.url());
    settings.rebalancer.interval_ms = 200;
    settings.rebalancer.lease_ttl_ms = 1_000;
    settings.database.audit_interval_ms = 500;
    let app = TestApp::spawn_with(settings).await;
    let id = crate::harness::eid("grow");
    app.create(
        &id,
        STOCK,
        BUCKETS,
        json!({"per_user_limit": LIMIT, "max_per_order": 3}),
    )
    .await;

    let phase = Arc::new(AtomicU8::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, url) = (
                app.client.clone(),
                app.url(&format!("/v1/events/{id}/purchases")),
            );
            let (phase, stop, sent) = (phase.clone(), stop.clone(), sent.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = {
                        let mut rng = rand::rng();
                        json!({
                            "user_id": format!("u{}", rng.random_range(0..USERS)),
                            "quantity": rng.random_range(1..=3),
                            "request_id": format!("c{c}-{i}"),
                        })
                    };
                    let at = phase.load(Ordering::Relaxed);
                    let r = client.post(&url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    if status == 503 {
                        assert!(
                            r.headers().contains_key("retry-after"),
                            "a 503 without Retry-After"
                        );
                    }
                    let answer: Value = r.json().await.unwrap_or(Value::Null);
                    sent.lock().unwrap().push(Sent {
                        body,
                        phase: at,
                        status,
                        answer,
                    });
                    i += 1;
                }
            })
        })
        .collect();
    let count = |p: u8| sent.lock().unwrap().iter().filter(|s| s.phase == p).count();
    eventually(
        "the sale to get going",
        Duration::from_secs(60),
        async || (count(BEFORE) >= 500).then_some(()),
    )
    .await;

    // Grow to 4 masters, move a third of the slots, move them all back, remove the node.
    let retries = async || {
        let m = app.metrics().await;
        let of = |reason| {
            sample(&m, "shardstock_store_retries_total", &[("reason", reason)]).unwrap_or(0.0)
        };
        (of("tryagain"), of("redirect"))
    };
    let retried_before = retries().await;
    phase.store(MOVING, Ordering::Relaxed);
    let moves_began = std::time::Instant::now();
    let entry = cluster.ports[0];
    let node = ExtraNode::start();
    let (moved, node_id) = tokio::task::spawn_blocking({
        let (port, node_id) = (node.port, node.id());
        let new_node = format!("127.0.0.1:{port}");
        let three = cluster.ports.clone();
        let mut four = three.clone();
        four.push(port);
        move || {
            cluster_tool(entry, &["add-node", &new_node, "ENTRY"]);
            settled(&four, 4);
            cluster_tool(
                entry,
                &[
                    "reshard",
                    "ENTRY",
                    "--cluster-from",
                    "all",
                    "--cluster-to",
                    &node_id,
                    "--cluster-slots",
                    MOVED_SLOTS,
                    "--cluster-yes",
                ],
            );
            settled(&four, 4);
            let moved = slots_served(port);
            let weight = format!("{node_id}=0");
            cluster_tool(entry, &["rebalance", "ENTRY", "--cluster-weight", &weight]);
            // Emptied, the new master turns replica of the one that took its
            // last slot (Redis 7's replica migration).
            settled(&four, 3);
            cluster_tool(entry, &["del-node", "ENTRY", &node_id]);
            settled(&three, 3);
            (moved, node_id)
        }
    })
    .await
    .unwrap();
    phase.store(AFTER, Ordering::Relaxed);
    let served: u32 = moved.iter().map(|(s, e)| u32::from(e - s) + 1).sum();
    assert_eq!(served, 5461, "{node_id} served {moved:?}");
    let ns = namespace(suite);
    let event = EventId::parse(id.clone()).unwrap();
    let buckets_moved = (0..BUCKETS)
        .filter(|&b| {
            let s = slot(&BucketRef::new(&event, 0, b).keys_in(&ns).stock);
            moved.iter().any(|&(lo, hi)| (lo..=hi).contains(&s))
        })
        .count();
    assert!(
        buckets_moved > 0,
        "no bucket of the event was in a moved slot"
    );

    let moves_took = moves_began.elapsed();
    // The moves were seen: calls refused on a moving slot, sent again
    // (the counters are the process's: the other test may add to them).
    let retried_after = retries().await;
    let (tryagain, redirect) = (
        retried_after.0 - retried_before.0,
        retried_after.1 - retried_before.1,
    );
    println!("topology: retried {tryagain} TRYAGAIN, {redirect} redirections during the moves");
    assert!(
        tryagain + redirect > 0.0,
        "no call was refused by a moving slot: the test shows nothing"
    );
    // A while of sale after the moves (bounded: a dead client answers slowly,
    // and the checks below say what it answered).
    let after_until = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(AFTER) < 1_000 && tokio::time::Instant::now() < after_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let sent = Arc::try_unwrap(sent).ok().unwrap().into_inner().unwrap();

    // Answers: never 500; under 1% failed while slots moved; none after.
    let mut statuses: HashMap<(u8, u16), usize> = HashMap::new();
    for s in &sent {
        *statuses.entry((s.phase, s.status)).or_default() += 1;
        assert!(
            is_final(s.status) || s.status == 503,
            "{} answered {}: {}",
            s.body,
            s.status,
            s.answer
        );
    }
    println!(
        "topology: the moves took {moves_took:?}; answers by (phase, status): {statuses:?}; \
         {buckets_moved} of {BUCKETS} buckets in moved slots"
    );
    let during = sent.iter().filter(|s| s.phase == MOVING).count();
    let failed = sent
        .iter()
        .filter(|s| s.phase == MOVING && !is_final(s.status))
        .count();
    assert!(
        during >= 1_000,
        "only {during} purchases while slots moved: the test shows little"
    );
    assert!(
        failed * 100 < during,
        "{failed} of {during} purchases failed while slots moved"
    );
    let failed_after: Vec<_> = sent
        .iter()
        .filter(|s| s.phase == AFTER && !is_final(s.status))
        .map(|s| (&s.body, &s.answer))
        .collect();
    assert!(
        failed_after.is_empty(),
        "failed after the moves: {failed_after:?}"
    );

    // Every request again with its id until it has a final answer.
    let mut bought: HashMap<String, (String, u64)> = HashMap::new();
    for s in &sent {
        let rid = s.body["request_id"].as_str().unwrap().to_owned();
        let (status, answer) = if is_final(s.status) {
            (s.status, s.answer.clone())
        } else {
            eventually(
                &format!("a final answer to {rid}"),
                Duration::from_secs(30),
                async || {
                    let r = app
                        .post(&format!("/v1/events/{id}/purchases"), s.body.clone())
                        .await;
                    let status = r.status().as_u16();
                    let answer: Value = r.json().await.unwrap_or(Value::Null);
                    is_final(status).then_some((status, answer))
                },
            )
            .await
        };
        if status == 201 {
            assert_eq!(answer["quantity"], s.body["quantity"], "{answer}");
            let order = answer["order_id"].as_str().unwrap().to_owned();
            let user = s.body["user_id"].as_str().unwrap().to_owned();
            let qty = answer["quantity"].as_u64().unwrap();
            assert!(
                bought.insert(order, (user, qty)).is_none(),
                "{rid}: an order id twice"
            );
        }
    }
    let units: u64 = bought.values().map(|(_, q)| q).sum();

    // The flusher is alive: every 201 reaches the ledger, once, as answered.
    let ledger = ledger_for("redis-cluster").await;
    let confirmed = eventually(
        "every 201 in the ledger",
        Duration::from_secs(60),
        async || {
            let orders = ledger.confirmed_orders(&event).await.unwrap();
            (orders.len() >= bought.len()).then_some(orders)
        },
    )
    .await;
    assert_eq!(confirmed.len(), bought.len(), "orders no answer knows of");
    let mut held: HashMap<&str, u64> = HashMap::new();
    for o in &confirmed {
        let (user, qty) = bought
            .get(o.order_id.as_str())
            .unwrap_or_else(|| panic!("{o:?} was never answered 201"));
        assert_eq!(o.qty, *qty, "{o:?}");
        *held.entry(user.as_str()).or_default() += qty;
    }
    assert!(held.values().all(|&h| h <= LIMIT), "a user over the limit");

    // The books: sold + remaining = stock, the audit balances.
    let view = app.view(&id).await;
    assert_eq!(view["sold"].as_u64().unwrap(), units, "{view}");
    assert_eq!(
        view["sold"].as_u64().unwrap() + view["remaining"].as_u64().unwrap(),
        STOCK
    );
    let r = app
        .client
        .get(app.url(&format!("/v1/events/{id}/audit")))
        .bearer_auth(crate::harness::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let audit: Value = r.json().await.unwrap();
    assert_eq!(audit["balanced"], true, "{audit}");

    // The gauges and the background audit are alive after the moves.
    let remaining = view["remaining"].as_f64().unwrap();
    eventually(
        "the gauges to show the final remaining",
        Duration::from_secs(30),
        async || {
            let m = app.metrics().await;
            (sample(&m, "shardstock_event_remaining", &[("event", &id)]) == Some(remaining)
                && sample(&m, "shardstock_audit_balanced", &[("event", &id)]) == Some(1.0))
            .then_some(())
        },
    )
    .await;
    // The rebalancer's leader renews its 1 s lease: it is held across 3 s.
    let leader = EventKeys::in_namespace(&ns, &event).leader;
    for _ in 0..6 {
        let holder = redis_cli(entry, &["-c", "get", &leader]);
        assert!(
            !holder.trim().is_empty(),
            "no rebalancer leader after the moves"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(node);
    app.stop().await;
}

/// The slot ranges the node on `port` serves, by its own `CLUSTER SLOTS`.
fn slots_served(port: u16) -> Vec<(u16, u16)> {
    parse_slots(&redis_cli(port, &["cluster", "slots"]), port)
}

/// The slot ranges `port` serves in `redis-cli cluster slots` output (one
/// value per line: start, end, then each node's ip, port, id, …).
fn parse_slots(out: &str, port: u16) -> Vec<(u16, u16)> {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i + 3 < lines.len() {
        match (
            lines[i].parse::<u16>(),
            lines[i + 1].parse::<u16>(),
            lines[i + 2].parse::<std::net::IpAddr>(),
            lines[i + 3].parse::<u16>(),
        ) {
            (Ok(s), Ok(e), Ok(_), Ok(p)) => {
                if p == port {
                    ranges.push((s, e));
                }
                i += 4;
            }
            _ => i += 1,
        }
    }
    ranges
}

/// The moments of one slot's migration, held still: the slot of a bucket
/// with one key (its stock) is set MIGRATING on its owner and IMPORTING on
/// another master. A script naming the bucket's keys is refused `TRYAGAIN`
/// (some of its keys are here, some not), a read of a key not there is sent
/// `ASK`: the store tries them again until its command timeout and then
/// fails them as "slots moving" — and the client lives on (fred 10.1, left
/// to follow the `ASK` itself with one attempt per command, ended its
/// routing task there, and every later call timed out). Once the key is
/// migrated and the slot handed over, the same calls succeed, on the new
/// owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_held_mid_migration_is_retried_then_fails_as_moving_and_the_client_lives_on() {
    use shardstock::store::redis::RedisOptions;
    use shardstock::store::{Buckets, Store, Streams};
    use shardstock::{RedisStore, StoreError};

    let cluster = RedisCluster::start().expect("start a private 3-master Cluster");
    let mut opts = RedisOptions::new(cluster.url());
    opts.namespace = namespace(suite_of(module_path!()));
    opts.command_timeout = Duration::from_millis(500);
    let store = RedisStore::connect(&opts).await.expect("connect");
    let event = EventId::parse(crate::harness::eid("held")).unwrap();
    let bucket = BucketRef::new(&event, 0, 0);
    let keys = bucket.keys_in(&opts.namespace);
    let other = (1..)
        .map(|b| BucketRef::new(&event, 0, b))
        .find(|b| slot(&b.keys_in(&opts.namespace).stock) != slot(&keys.stock))
        .unwrap();
    assert_eq!(
        redis_cli(cluster.ports[0], &["-c", "set", &keys.stock, "7"]).trim(),
        "OK"
    );
    let s = slot(&keys.stock).to_string();
    let holds = |p: u16| redis_cli(p, &["cluster", "countkeysinslot", &s]).trim() == "1";
    let source = *cluster.ports.iter().find(|&&p| holds(p)).unwrap();
    let target = *cluster.ports.iter().find(|&&p| p != source).unwrap();
    let id = |p: u16| redis_cli(p, &["cluster", "myid"]).trim().to_owned();
    let ok = |out: String| assert_eq!(out.trim(), "OK", "{out}");
    ok(redis_cli(
        target,
        &["cluster", "setslot", &s, "importing", &id(source)],
    ));
    ok(redis_cli(
        source,
        &["cluster", "setslot", &s, "migrating", &id(target)],
    ));

    let moving = |r: Result<_, StoreError>| match r {
        Err(e) => assert!(e.is_moving(), "{e}"),
        Ok(v) => panic!("answered {v:?} mid-migration"),
    };
    moving(store.bucket_state(&bucket).await.map(|b| b.stock)); // TRYAGAIN
    moving(store.stream_len(&bucket).await); // ASK
    store
        .ping()
        .await
        .expect("the client still answers after an ASK");
    store
        .bucket_state(&other)
        .await
        .map(drop)
        .or_else(|e| matches!(e, StoreError::Stale(_)).then_some(()).ok_or(e))
        .expect("another slot still served");

    // Hand the slot over while a call is being retried: it lands on the target.
    let call = tokio::spawn({
        let (store, bucket) = (store.clone(), bucket.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store.bucket_state(&bucket).await
        }
    });
    let ports = cluster.ports.clone();
    let (stock, handed) = (keys.stock.clone(), s.clone());
    tokio::task::spawn_blocking(move || {
        let target_port = target.to_string();
        let migrate = [
            "migrate",
            "127.0.0.1",
            &target_port,
            "",
            "0",
            "5000",
            "keys",
            &stock,
        ];
        ok(redis_cli(source, &migrate));
        for p in [target, source]
            .into_iter()
            .chain(ports.into_iter().filter(|&p| p != source && p != target))
        {
            ok(redis_cli(
                p,
                &["cluster", "setslot", &handed, "node", &id(target)],
            ));
        }
    })
    .await
    .unwrap();
    let state = match call.await.unwrap() {
        Ok(state) => state,
        // Started before the handover and refused past the budget: once more.
        Err(e) if e.is_moving() => store
            .bucket_state(&bucket)
            .await
            .expect("served after the handover"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(state.stock, 7);
    assert_eq!(store.stream_len(&bucket).await.unwrap(), 0);
    assert!(
        holds(target) && !holds(source),
        "the key moved to the target"
    );
}
