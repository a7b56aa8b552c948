//! The benchmark harness against real backends: a tiny workload through each
//! of the five baselines on the machine's PostgreSQL and Redis, and through
//! the shardstock strategies (the engine, the service over HTTP on Redis and
//! PostgreSQL, on the embedded store and SQLite, and at a `--target` URL); the
//! verdict on deliberately broken in-memory strategies, the seeded picker, and
//! the `redis-benchmark` ceiling.
//!
//! When Redis or PostgreSQL is down these tests fail with the command that
//! starts it; they never skip.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use shardstock_bench::baselines::{DEFAULT_PG_URL, DEFAULT_REDIS_URL, START_REDIS};
use shardstock_bench::http::Setup;
use shardstock_bench::{
    Outcome, PgConditionalUpdate, PgForUpdate, PgVersionCas, Picker, RedisDecrRollback,
    RedisLuaSingleKey, Report, Strategy, Workload, redis_ceiling, run,
};

fn tiny() -> Workload {
    Workload {
        stock: 200,
        users: 100,
        zipf: Some(1.0),
        attempts: 1_000,
        concurrency: 16,
        quantities: vec![(1, 0.8), (2, 0.15), (3, 0.05)],
        retry_rate: 0.0,
        per_user_limit: None,
        seed: 1,
    }
}

fn ready<T, E: std::fmt::Display>(connected: Result<T, E>) -> T {
    connected.unwrap_or_else(|e| panic!("{e}"))
}

/// The accounting every run must show, whatever the strategy.
fn assert_books(r: &Report, w: &Workload) {
    println!("{r}");
    assert_eq!(r.attempts, w.attempts, "{r}");
    assert!(r.purchases_ok <= r.attempts, "{r}");
    assert_eq!(
        r.purchases_ok + r.sold_out_answers + r.limit_exceeded + r.replayed + r.errors,
        r.attempts,
        "every attempt has exactly one answer: {r}"
    );
    assert!(r.p50_us <= r.p99_us && r.p99_us <= r.p999_us && r.p999_us <= r.max_us);
    assert!(r.p50_us > 0, "{r}");
    assert!(r.elapsed_s > 0.0 && r.attempts_per_s > 0.0, "{r}");
    let json: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(json["strategy"], r.strategy.as_str());
    assert_eq!(json["units_sold"], r.units_sold);
}

/// A strategy that claims no oversell: the units add up to the stock.
fn assert_no_oversell(r: &Report, w: &Workload) {
    assert_books(r, w);
    assert!(r.claims_no_oversell);
    assert_eq!(r.oversold_units, 0, "{r}");
    assert!(r.remaining >= 0, "{r}");
    assert_eq!(r.units_sold as i64 + r.remaining, w.stock as i64, "{r}");
    assert!(
        r.sold_out_answers > 0,
        "1,000 attempts sell out 200 units: {r}"
    );
}

/// Strategies whose stock only goes down must sell out exactly and cleanly.
fn assert_clean(r: &Report, w: &Workload) {
    assert_no_oversell(r, w);
    assert_eq!(r.errors, 0, "{r}");
    assert_eq!(r.remaining, 0, "{r}");
    assert_eq!(r.verdict, "clean", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_for_update_sells_exactly_the_stock() {
    let w = tiny();
    let s = ready(PgForUpdate::connect(DEFAULT_PG_URL, w.concurrency).await);
    assert_clean(&run(&s, &w, false).await.unwrap(), &w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_conditional_update_sells_exactly_the_stock() {
    let w = tiny();
    let s = ready(PgConditionalUpdate::connect(DEFAULT_PG_URL, w.concurrency).await);
    assert_clean(&run(&s, &w, false).await.unwrap(), &w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_version_cas_never_oversells() {
    let w = tiny();
    let s = ready(PgVersionCas::connect(DEFAULT_PG_URL, w.concurrency).await);
    let r = run(&s, &w, false).await.unwrap();
    // Losing 50 races in a row is possible under contention: such attempts are
    // errors ("retry budget"), never sales.
    assert_no_oversell(&r, &w);
    if let Some(e) = &r.first_error {
        assert!(e.contains("retry budget"), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_decr_rollback_never_oversells_in_the_end() {
    let w = tiny();
    let s = ready(RedisDecrRollback::connect(DEFAULT_REDIS_URL).await);
    let r = run(&s, &w, false).await.unwrap();
    // It may refuse while units exist (UNDERSOLD): that is what it is measured for.
    assert_no_oversell(&r, &w);
    assert_eq!(r.errors, 0, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lua_single_key_sells_exactly_the_stock() {
    let w = tiny();
    let s = ready(RedisLuaSingleKey::connect(DEFAULT_REDIS_URL).await);
    assert_clean(&run(&s, &w, false).await.unwrap(), &w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_baseline_leaves_nothing_behind() {
    let s = ready(RedisLuaSingleKey::connect(DEFAULT_REDIS_URL).await);
    run(&s, &tiny(), false).await.unwrap();
    // `run` cleans up: the key is gone, so `remaining` finds nothing.
    assert!(s.remaining().await.is_err());
}

/// Check-then-act on an in-memory counter, with a yield in between: the race
/// the articles start from. It must be caught overselling.
struct CheckThenAct(AtomicI64);

impl Strategy for CheckThenAct {
    fn name(&self) -> String {
        "naive-check-then-act".to_string()
    }
    fn claims_no_oversell(&self) -> bool {
        false
    }
    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        self.0.store(w.stock as i64, Ordering::SeqCst);
        Ok(())
    }
    async fn attempt(&self, _user: &str, qty: u32, _request_id: &str) -> Outcome {
        let seen = self.0.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        if seen < i64::from(qty) {
            return Outcome::SoldOut;
        }
        self.0.fetch_sub(i64::from(qty), Ordering::SeqCst);
        Outcome::Bought { units: qty }
    }
    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.0.load(Ordering::SeqCst))
    }
}

/// Correct, except that every third attempt is refused regardless of stock.
struct Moody {
    left: AtomicI64,
    calls: AtomicU64,
}

impl Strategy for Moody {
    fn name(&self) -> String {
        "moody".to_string()
    }
    fn claims_no_oversell(&self) -> bool {
        true
    }
    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        self.left.store(w.stock as i64, Ordering::SeqCst);
        Ok(())
    }
    async fn attempt(&self, _user: &str, qty: u32, _request_id: &str) -> Outcome {
        let q = i64::from(qty);
        if self.calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            return Outcome::SoldOut;
        }
        match self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s >= q).then(|| s - q)
            }) {
            Ok(_) => Outcome::Bought { units: qty },
            Err(_) => Outcome::SoldOut,
        }
    }
    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.left.load(Ordering::SeqCst))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_then_act_strategy_is_caught_overselling() {
    let w = tiny();
    let r = run(&CheckThenAct(AtomicI64::new(0)), &w, false)
        .await
        .unwrap();
    assert_books(&r, &w);
    assert!(r.oversold_units > 0, "{r}");
    assert!(r.remaining < 0, "{r}");
    assert!(r.verdict.starts_with("OVERSOLD"), "{r}");
    assert!(!r.broken_claim(), "it never claimed otherwise");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_while_units_are_left_is_undersold() {
    let w = Workload {
        attempts: 100,
        ..tiny()
    };
    let moody = Moody {
        left: AtomicI64::new(0),
        calls: AtomicU64::new(0),
    };
    let r = run(&moody, &w, false).await.unwrap();
    assert_books(&r, &w);
    assert_eq!(r.oversold_units, 0, "{r}");
    assert!(r.remaining > 0, "100 attempts cannot sell 200 units: {r}");
    assert!(r.unsold_while_refused, "{r}");
    assert!(r.verdict.starts_with("UNDERSOLD"), "{r}");
}

#[test]
fn a_seeded_workload_picks_the_same_users_and_quantities() {
    let uniform = Workload {
        zipf: None,
        users: 10,
        ..tiny()
    };
    let zipf = Workload {
        zipf: Some(1.2),
        ..uniform.clone()
    };
    for w in [&uniform, &zipf] {
        let (a, b) = (Picker::new(w).unwrap(), Picker::new(w).unwrap());
        for i in 0..1_000 {
            assert_eq!(a.attempt(i), b.attempt(i));
        }
    }
    let count = |w: &Workload, user: &str| {
        let p = Picker::new(w).unwrap();
        (0..20_000).filter(|&i| p.attempt(i).user == user).count()
    };
    // Uniform: ~2,000 each. Zipf s=1.2 over 10 users: user 0 gets ~40.5%, user 9 ~2.6%.
    assert!((1_800..2_200).contains(&count(&uniform, "u0")));
    assert!((1_800..2_200).contains(&count(&uniform, "u9")));
    assert!((7_700..8_500).contains(&count(&zipf, "u0")));
    assert!((350..700).contains(&count(&zipf, "u9")));
    let p = Picker::new(&uniform).unwrap();
    let ones = (0..20_000).filter(|&i| p.attempt(i).qty == 1).count();
    let threes = (0..20_000).filter(|&i| p.attempt(i).qty == 3).count();
    assert!((15_600..16_400).contains(&ones), "{ones} of 20,000 at 80%");
    assert!((800..1_200).contains(&threes), "{threes} of 20,000 at 5%");
}

#[test]
fn the_redis_ceiling_is_measured() {
    for pipeline in [1, 16] {
        let rps = redis_ceiling("127.0.0.1", 6379, 4, 2_000, pipeline).unwrap_or_else(|e| {
            panic!("{e:#}\nIs Redis up on 127.0.0.1:6379? Start it with:\n  {START_REDIS}")
        });
        assert!(rps > 0.0, "{rps} requests/s at -P {pipeline}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_down_is_reported_with_its_start_command() {
    let redis = RedisLuaSingleKey::connect("redis://127.0.0.1:1").await;
    let e = redis.err().expect("nothing listens on port 1").to_string();
    assert!(e.contains("redis-server --daemonize"), "{e}");
    let pg = PgForUpdate::connect("postgres://postgres@127.0.0.1:1/shardstock_bench", 4).await;
    let e = pg.err().expect("nothing listens on port 1").to_string();
    assert!(e.contains("pg_ctlcluster"), "{e}");
}

/// The shardstock strategies' tiny sale: 600 attempts on 200 units, a
/// tenth of them retries.
fn smoke() -> Workload {
    Workload {
        stock: 200,
        users: 100,
        attempts: 600,
        concurrency: 16,
        retry_rate: 0.1,
        ..Workload::default()
    }
}

/// A tiny run of the shardstock strategies (smoke: the harness and the
/// strategies work end to end; speed is measured by `shardstock-bench`). The
/// service runs in process here: cargo builds the `shardstock` binary for the
/// tests of its own package only, and the real runs start the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shardstock_strategies_run_clean() {
    use shardstock_bench::{EngineStrategy, HttpStrategy};
    let w = smoke();
    for batch in [None, Some(64)] {
        let s = EngineStrategy::connect("redis://127.0.0.1:6379", 4, batch)
            .await
            .unwrap();
        let r = run(&s, &w, false).await.unwrap();
        assert_eq!(r.verdict, "clean", "{r}");
        assert_eq!(r.units_sold + r.remaining as u64, 200);
    }
    // A database of this run's own: a shared one keeps the migrations of
    // whatever checkout ran last, and the ledger refuses a schema it does not
    // know (CI once failed on exactly that).
    let db = format!("shardstock_bench_smoke_{}", std::process::id());
    let pg = format!("postgres://postgres@127.0.0.1:5432/{db}");
    let setup = Setup::Redis {
        redis: "redis://127.0.0.1:6379".into(),
        database: pg,
    };
    let s = HttpStrategy::in_process(&setup, 4, 16).await.unwrap();
    let r = run(&s, &w, false).await.unwrap();
    drop(s);
    drop_database(&db).await;
    assert_eq!(r.verdict, "clean", "{r}");
    assert_eq!(r.units_sold, 200, "{r}");
}

/// The quickstart setup measured: the service on the embedded store with
/// SQLite, no Redis and no PostgreSQL (`--strategy http-embedded`, in process
/// here as above, with the settings the binary is given), sells exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_setup_sells_exactly_the_stock() {
    use shardstock_bench::HttpStrategy;
    let w = smoke();
    let s = HttpStrategy::in_process(&Setup::Embedded, 4, 16)
        .await
        .unwrap();
    assert_eq!(s.name(), "shardstock-http-embedded-n4");
    let r = run(&s, &w, false).await.unwrap();
    assert_eq!(r.verdict, "clean", "{r}");
    assert_eq!((r.units_sold, r.remaining), (200, 0), "{r}");
    assert_eq!(r.errors, 0, "{r}");
}

/// `--target`: the load against a service the bench did not start (one
/// started here as an adopter runs it, with the operator's own token). The
/// event is created through the admin API and closed at the end; a wrong
/// token or nothing at the URL is said at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_http_load_runs_against_a_service_already_running() {
    use shardstock_bench::HttpStrategy;
    const TOKEN: &str = "the-operators-token";
    let (base, _stop) = running_service(TOKEN).await;
    let w = smoke();
    let wrong = HttpStrategy::target(&base, "not-the-token", 4, 16)
        .await
        .unwrap();
    let e = format!("{:#}", run(&wrong, &w, false).await.unwrap_err());
    assert!(e.contains("unauthorized"), "{e}");
    let s = HttpStrategy::target(&base, TOKEN, 4, 16).await.unwrap();
    assert_eq!(s.name(), "shardstock-http-target-n4");
    let r = run(&s, &w, false).await.unwrap();
    assert_eq!(r.verdict, "clean", "{r}");
    assert_eq!((r.units_sold, r.remaining), (200, 0), "{r}");
    // The service holds the run's event (the only one: the wrong token
    // created none), sold out and closed.
    let http = reqwest::Client::new();
    let ids: Vec<String> = http
        .get(format!("{base}/v1/events"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let view: serde_json::Value = http
        .get(format!("{base}/v1/events/{}", ids[0]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&view["status"], &view["sold"], &view["leftover"]),
        (
            &serde_json::json!("closed"),
            &serde_json::json!(200),
            &serde_json::json!(0)
        ),
        "{view}"
    );
    let port = shardstock_bench::cluster::free_port();
    let e = HttpStrategy::target(&format!("http://127.0.0.1:{port}"), TOKEN, 4, 16)
        .await
        .err()
        .expect("nothing listens there")
        .to_string();
    assert!(e.contains("/readyz"), "{e}");
}

/// A service as an adopter runs it (embedded store, SQLite), apart from the
/// bench: its base URL, and the sender whose drop stops it.
async fn running_service(token: &str) -> (String, tokio::sync::oneshot::Sender<()>) {
    use shardstock::app::Application;
    use shardstock::config::Settings;
    let dir = shardstock_bench::cluster::scratch_dir("bench-target");
    let mut settings = Settings::default();
    settings.server.listen = "127.0.0.1:0".into();
    settings.server.admin_token = token.into();
    settings.database.url = format!("sqlite://{}", dir.join("ledger.db").display());
    let app = Application::build(settings).await.unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until(async move {
        let _ = stopped.await;
    }));
    (base, stop)
}

/// Drops a scratch database, closing whatever sessions still hold it.
async fn drop_database(db: &str) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .unwrap();
    let sql = format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// The `--http-cost` peers answer the service's purchase route, and the
/// single-key Lua + XADD peer takes stock and writes one record per purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_cost_peers_sell_and_record() {
    use fred::prelude::*;
    use shardstock_bench::cost::load::{Request, Until, drive};
    use shardstock_bench::cost::peer::{Peer, serve_peer, stock_key};
    let port = shardstock_bench::cluster::free_port();
    let listen = format!("127.0.0.1:{port}");
    let served = tokio::spawn({
        let listen = listen.clone();
        async move { serve_peer(Peer::LuaXadd, &listen, DEFAULT_REDIS_URL).await }
    });
    let event = format!("peer{:08x}", rand_id());
    let redis = redis_client().await;
    let () = redis
        .set(stock_key(&event), 150, None, None, false)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://{listen}");
    for _ in 0..100 {
        if client.get(format!("{base}/readyz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let load = drive(
        &client,
        &base,
        &event,
        &Request::Purchase,
        8,
        Until::Requests(200),
        "t",
    )
    .await
    .unwrap();
    served.abort();
    assert_eq!(
        (load.created, load.refused, load.errors),
        (150, 50, 0),
        "{load:?}"
    );
    let left: i64 = redis.get(stock_key(&event)).await.unwrap();
    let records: u64 = redis
        .xlen(format!("bench:{{{event}}}:orders"))
        .await
        .unwrap();
    assert_eq!((left, records), (0, 150));
    let _: i64 = redis
        .del(vec![stock_key(&event), format!("bench:{{{event}}}:orders")])
        .await
        .unwrap();
}

fn rand_id() -> u32 {
    std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
}

async fn redis_client() -> fred::prelude::Client {
    use fred::prelude::*;
    let c = Client::new(
        Config::from_url(DEFAULT_REDIS_URL).unwrap(),
        None,
        None,
        None,
    );
    c.init().await.unwrap();
    c
}
