//! Nothing lost between Redis and the database, whatever crashes:
//! - the service killed with SIGKILL mid-sale, then restarted (on PostgreSQL
//!   and on a SQLite ledger);
//! - the service killed with SIGKILL while it expires unpaid holds (issue 14):
//!   the restarted one expires each exactly once;
//! - the database unreachable for a while (a TCP proxy the test cuts and restores);
//! - Redis itself killed with SIGKILL and restarted from its append-only file.
//!
//! Each test ends with: every order a client got a 201 for is in the database,
//! exactly once, and the audit balances. Each step waits for the sale to move
//! on (orders answered), not for a fixed time. The suite has its own Redis
//! namespace, so the service it kills and the apps whose database it cuts
//! never hold another suite's events; Redis itself is crashed on a private
//! server.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{
    Backend, RedisServer, Sale, Service, TOKEN, TestApp, answered, eid, eventually, free_port,
    namespace, pg_pool, pg_url, problem, sample, settings_in, sqlite_url,
};
use sqlx::AssertSqlSafe;

/// How long a step may take: a sale to move on, the ledger to catch up.
const WAIT: Duration = Duration::from_secs(60);

/// A config for a service the test kills: listening on `port`, the suite's
/// Redis namespace and the database at `db`, the background audit off, and
/// one event `event` whose other keys are `spec`. Returns its directory and
/// path.
fn kill_config(name: &str, port: u16, event: &str, spec: &str, db: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("shardstock-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("shardstock.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_token = \"{TOKEN}\"\n\
             [store]\nredis_url = \"redis://127.0.0.1:6379\"\nnamespace = \"{ns}\"\n\
             [database]\nurl = \"{db}\"\nclaim_idle_ms = 500\nflush_block_ms = 20\naudit_interval_ms = 0\n\
             [[events]]\nid = \"{event}\"\n{spec}",
            // Instances of one namespace share one database (their flushers
            // claim each other's records): a SQLite ledger gets its own.
            ns = namespace(if db.starts_with("sqlite:") { "durability-sqlite" } else { "durability" }),
        ),
    )
    .unwrap();
    (dir, config)
}

/// `GET …/audit` of a service at `base`, with the admin token.
async fn audit_at(base: &str, event: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/v1/events/{event}/audit"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Asserts every answered order is in the database at `db` once, and the
/// audit balances.
async fn assert_in_ledger_once(base: &str, event: &str, answered: &HashSet<String>, db: &str) {
    sqlx::any::install_default_drivers();
    let sqlite = db.starts_with("sqlite:");
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        .connect(&if sqlite {
            db.to_owned()
        } else {
            format!("{db}?options=-c%20jit%3Doff")
        })
        .await
        .expect("connect to the service's database");
    // SQLite finds an order by its id's last 8 characters (API.md, the `orders` view).
    let by_id = if sqlite {
        "substr(order_id, -8) = substr($1, -8) AND +order_id = $1"
    } else {
        "order_id = $1"
    };
    let audit = eventually("the ledger to catch up", WAIT, async || {
        let audit = audit_at(base, event).await;
        (audit["sold_unflushed"] == 0 && audit["balanced"] == true).then_some(audit)
    })
    .await;
    for oid in answered {
        let takes: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM order_records WHERE {by_id} AND kind = 'o'"
        )))
        .bind(oid)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(takes, 1, "order {oid} is in the ledger {takes} times");
        let status: String = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT status FROM orders WHERE {by_id}"
        )))
        .bind(oid)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(status, "confirmed", "{oid}");
    }
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM orders WHERE event_id = $1 AND status = 'confirmed'")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit["sold_flushed"].as_i64().unwrap(),
        rows,
        "one unit per order here"
    );
    assert!(rows as usize >= answered.len());
    println!(
        "{} orders answered 201, {rows} in the ledger, audit {audit}",
        answered.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_killed_mid_sale_loses_no_acknowledged_order() {
    killed_mid_sale("kill", &pg_url()).await;
}

/// The same on a SQLite ledger: its flush writes commit (`synchronous =
/// FULL`, statement journals in memory) before the records are acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_on_sqlite_killed_mid_sale_loses_no_acknowledged_order() {
    killed_mid_sale("kill-sqlite", &sqlite_url()).await;
}

async fn killed_mid_sale(name: &str, db: &str) {
    let port = free_port();
    let event = eid("kill");
    let (dir, config) = kill_config(name, port, &event, "stock = 100000\nbuckets = 8\n", db);
    let base = format!("http://127.0.0.1:{port}");
    let mut service = Service::start(&config, port);
    let sale = Sale::start(&base, &event, 32);
    sale.sells(200, "orders before the kill").await;
    service.child.kill().unwrap(); // SIGKILL: no shutdown, no final flush
    service.child.wait().unwrap();
    let _restarted = Service::start(&config, port);
    sale.sells(100, "orders from the restarted service").await;
    let answered = answered(&sale.stop().await);
    assert!(
        answered.len() > 100,
        "only {} purchases before and after the kill",
        answered.len()
    );
    assert_in_ledger_once(&base, &event, &answered, db).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Holds nobody pays, bought while earlier ones come due: the service is
/// killed with SIGKILL once its expiry sweeper has started returning units
/// (while it keeps sweeping and selling), and a new one started on the same
/// config. Every hold a client got a 201 for expires exactly once: all the
/// units are back on sale, each order is in the database once with one
/// expiry record and status `expired`, and the audit balances. (The steps of
/// one sweep cut one by one are `holds::sweeps_cut_at_every_step`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_killed_mid_expiry_expires_each_hold_once() {
    const STOCK: u64 = 100_000;
    let port = free_port();
    let event = eid("killexp");
    let (dir, config) = kill_config(
        "killexp",
        port,
        &event,
        &format!("stock = {STOCK}\nbuckets = 8\nhold_seconds = 1\n"),
        &pg_url(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let view = async || -> Value {
        client
            .get(format!("{base}/v1/events/{event}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    };
    let mut service = Service::start(&config, port);
    let sale = Sale::start(&base, &event, 32);
    sale.sells(100, "holds before the deadlines").await;
    // Killed once the sweeper has returned some units and holds are still live.
    let at_kill = eventually("the first expiries", WAIT, async || {
        let v = view().await;
        let held = v["held"].as_u64().unwrap();
        let answered = sale.bought() as u64;
        (held > 0 && held < answered).then_some((held, answered))
    })
    .await;
    service.child.kill().unwrap(); // SIGKILL: mid-sweep, mid-sale
    service.child.wait().unwrap();
    let _restarted = Service::start(&config, port);
    sale.sells(100, "holds from the restarted service").await;
    let answered = answered(&sale.stop().await);
    let after = eventually("every hold to expire", WAIT, async || {
        let v = view().await;
        (v["held"] == 0).then_some(v)
    })
    .await;
    assert_eq!(
        after["remaining"], STOCK,
        "every unit back on sale: {after}"
    );
    let pool = pg_pool().await;
    eventually("the ledger to catch up", WAIT, async || {
        let audit = audit_at(&base, &event).await;
        (audit["sold_unflushed"] == 0
            && audit["released_unflushed"] == 0
            && audit["balanced"] == true)
            .then_some(())
    })
    .await;
    for oid in &answered {
        let (takes, expiries): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE kind = 'o'), count(*) FILTER (WHERE kind = 'e') \
             FROM order_records WHERE order_id = $1",
        )
        .bind(oid)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!((takes, expiries), (1, 1), "order {oid}: takes, expiries");
        let (status,): (String,) = sqlx::query_as("SELECT status FROM orders WHERE order_id = $1")
            .bind(oid)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(status, "expired", "{oid}");
    }
    println!(
        "{} holds answered, killed with {} of the first {} still held, all expired once",
        answered.len(),
        at_kill.0,
        at_kill.1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_only_delays_the_ledger() {
    let proxy = crate::harness::DbProxy::start("127.0.0.1:5432").await;
    let mut s = settings_in("durability", Backend::Redis);
    s.database.url = pg_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port));
    s.database.claim_idle_ms = 500;
    s.database.flush_block_ms = 20;
    let app = TestApp::spawn_with(s).await;
    let event = eid("dbdown");
    app.create(&event, 100_000, 8, json!({})).await;
    let sale = Sale::start(&app.base, &event, 16);
    sale.sells(100, "orders before the outage").await;
    proxy.cut();
    // Purchases go on; the records wait in Redis.
    sale.sells(100, "orders while the database is down").await;
    let lag = eventually(
        "the lag to grow while the database is down",
        WAIT,
        async || {
            let lag =
                sample(&app.metrics().await, "shardstock_flush_lag_orders", &[]).unwrap_or(0.0);
            (lag > 0.0).then_some(lag)
        },
    )
    .await;
    eventually("not ready without the database", WAIT, async || {
        (app.get("/readyz").await.status() == 503).then_some(())
    })
    .await;
    proxy.restore();
    sale.sells(100, "orders after the outage").await;
    let answered = answered(&sale.stop().await);
    assert_in_ledger_once(&app.base, &event, &answered, &pg_url()).await;
    println!("lag while the database was down: {lag}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_crash_with_aof_loses_no_acknowledged_order() {
    let mut redis = RedisServer::start_with("--appendonly yes --appendfsync always --save ''");
    let mut s = settings_in("durability", Backend::Redis);
    s.store.redis_url = Some(redis.url());
    s.store.command_timeout_ms = 500;
    s.database.claim_idle_ms = 500;
    s.database.flush_block_ms = 20;
    let app = TestApp::spawn_with(s).await;
    let event = eid("aof");
    app.create(&event, 100_000, 8, json!({})).await;
    let sale = Sale::start(&app.base, &event, 16);
    sale.sells(100, "orders before the crash").await;
    let before = app.view(&event).await["sold"].as_u64().unwrap();
    tokio::task::spawn_blocking(move || {
        redis.crash_and_restart();
        redis
    })
    .await
    .map(|r| {
        // Keep the server alive until the end of the test.
        std::mem::forget(r);
    })
    .unwrap();
    sale.sells(100, "orders after Redis came back").await;
    let answered = answered(&sale.stop().await);
    let after = app.view(&event).await["sold"].as_u64().unwrap();
    assert!(
        after >= before,
        "units sold went back from {before} to {after}: writes were lost"
    );
    assert_in_ledger_once(&app.base, &event, &answered, &pg_url()).await;
}

/// Issue 15: a Redis emptied mid-sale (FLUSHALL, or a restart without its
/// data) while the database has the event on sale. Purchases are refused
/// with 503 `backend-unavailable` (nothing deducted), not answered 404
/// `unknown-event` for an event on sale, and
/// `shardstock_store_events_lost_total` counts them for an alert; a made-up
/// event id is still 404 and reaches neither the counter nor the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_emptied_mid_sale_refuses_purchases_and_raises_the_alarm() {
    let redis = RedisServer::start_with("--save ''");
    let mut s = settings_in("durability", Backend::Redis);
    s.store.redis_url = Some(redis.url());
    let app = TestApp::spawn_with(s).await;
    let event = eid("emptied");
    app.create(&event, 100, 4, json!({})).await;
    for i in 0..5 {
        let r = app.buy(&event, &format!("early{i}"), 1, None).await;
        assert_eq!(r.status().as_u16(), 201, "a sale before the loss");
    }
    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    for i in 0..3 {
        let r = app
            .buy(&event, &format!("late{i}"), 1, Some(&format!("late-{i}")))
            .await;
        let body = problem(r, 503, "backend-unavailable").await;
        assert!(
            body["detail"].as_str().unwrap().contains("recover"),
            "{body}"
        );
        assert!(
            body.get("outcome").is_none(),
            "nothing was deducted: {body}"
        );
    }
    let made_up = eid("never");
    problem(app.buy(&made_up, "u", 1, None).await, 404, "unknown-event").await;
    let metrics = app.metrics().await;
    let lost = sample(
        &metrics,
        "shardstock_store_events_lost_total",
        &[("event", event.as_str())],
    );
    assert_eq!(lost, Some(3.0), "every refusal is counted");
    assert!(
        !metrics.contains(&made_up),
        "a made-up id is never a metric label"
    );
    app.stop().await;
}
