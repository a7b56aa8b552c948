//! The PostgreSQL baselines: the stock is one row of `bench_inventory`, every
//! purchase also inserts a row into `bench_orders` in the same transaction
//! (a sale without its order would not be a sale).
//!
//! All three serialise on the one row — that is the point of measuring them.
//! What differs is how long the row lock is held and who waits or retries:
//!
//! - [`PgForUpdate`] holds it across four client round trips (SELECT FOR
//!   UPDATE, UPDATE, INSERT, COMMIT), and every buyer queues for it.
//! - [`PgConditionalUpdate`] sends one statement (a data-modifying CTE: the
//!   conditional UPDATE and the order INSERT), so the lock is held only
//!   inside the server, up to the commit's WAL flush.
//! - [`PgVersionCas`] takes no lock while reading; a writer whose version is
//!   stale updates nothing and tries again, at most [`CAS_RETRIES`] times.
//!
//! Queries are runtime `sqlx::query` on `&'static str` (no `query!` macros: no
//! database is needed to build). The schema is created on connect, under an
//! advisory lock so parallel connects do not race on `CREATE … IF NOT EXISTS`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use super::{START_POSTGRES, run_id};
use crate::{BenchError, Outcome, Strategy, Workload};

/// The benchmark database on the machine's PostgreSQL (created if absent).
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/shardstock_bench";

/// How often [`PgVersionCas`] re-reads and re-tries before giving up.
pub const CAS_RETRIES: u32 = 50;

/// The pool never exceeds this, whatever the concurrency (PostgreSQL's
/// default `max_connections` is 100, and tests run strategies side by side).
const MAX_POOL: usize = 64;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bench_inventory (
    id      text PRIMARY KEY,
    stock   bigint NOT NULL,
    version bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS bench_orders (
    id         bigserial PRIMARY KEY,
    item       text NOT NULL,
    user_id    text NOT NULL,
    qty        bigint NOT NULL,
    request_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bench_orders_item ON bench_orders (item);
";

const LOCK_SCHEMA: &str = "SELECT pg_advisory_xact_lock(hashtext('shardstock bench schema'))";
const RESET_ITEM: &str = "INSERT INTO bench_inventory (id, stock, version) VALUES ($1, $2, 0)
    ON CONFLICT (id) DO UPDATE SET stock = EXCLUDED.stock, version = 0";
const DELETE_ORDERS: &str = "DELETE FROM bench_orders WHERE item = $1";
const DELETE_ITEM: &str = "DELETE FROM bench_inventory WHERE id = $1";
const SELECT_STOCK: &str = "SELECT stock FROM bench_inventory WHERE id = $1";
const SELECT_FOR_UPDATE: &str = "SELECT stock FROM bench_inventory WHERE id = $1 FOR UPDATE";
const SUBTRACT: &str = "UPDATE bench_inventory SET stock = stock - $2 WHERE id = $1";
const INSERT_ORDER: &str =
    "INSERT INTO bench_orders (item, user_id, qty, request_id) VALUES ($1, $2, $3, $4)";
const CONDITIONAL_TAKE: &str = "WITH taken AS (
        UPDATE bench_inventory SET stock = stock - $2
        WHERE id = $1 AND stock >= $2 RETURNING id)
    INSERT INTO bench_orders (item, user_id, qty, request_id)
    SELECT id, $3, $2, $4 FROM taken";
const SELECT_VERSION: &str = "SELECT stock, version FROM bench_inventory WHERE id = $1";
const CAS_TAKE: &str = "WITH taken AS (
        UPDATE bench_inventory SET stock = stock - $2, version = version + 1
        WHERE id = $1 AND version = $3 RETURNING id)
    INSERT INTO bench_orders (item, user_id, qty, request_id)
    SELECT id, $4, $2, $5 FROM taken";

/// One instance's row and the pool that reaches it.
struct PgItem {
    pool: PgPool,
    item: String,
    pool_size: usize,
}

impl PgItem {
    async fn connect(url: &str, concurrency: usize, strategy: &str) -> Result<Self, BenchError> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| BenchError::Unavailable(format!("bad PostgreSQL URL {url:?}: {e}")))?
            // A stuck attempt becomes an error instead of stalling the run.
            .options([("statement_timeout", "10s")]);
        ensure_database(&opts, url).await?;
        let pool_size = concurrency.clamp(1, MAX_POOL);
        let pool = PgPoolOptions::new()
            .max_connections(pool_size as u32)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await
            .map_err(|e| unavailable(url, &e))?;
        let mut tx = pool.begin().await?;
        sqlx::query(LOCK_SCHEMA).execute(&mut *tx).await?;
        sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(Self {
            pool,
            item: run_id(strategy),
            pool_size,
        })
    }

    /// A fresh row with `stock` units and no orders; opens the whole pool so
    /// connection setup is not measured as purchase latency.
    async fn prepare(&self, stock: u64) -> Result<(), BenchError> {
        let stock = i64::try_from(stock)
            .map_err(|_| BenchError::Workload(format!("stock {stock} exceeds bigint")))?;
        self.delete_orders().await?;
        sqlx::query(RESET_ITEM)
            .bind(&self.item)
            .bind(stock)
            .execute(&self.pool)
            .await?;
        let mut held = Vec::with_capacity(self.pool_size);
        for _ in 0..self.pool_size {
            let conn = self.pool.acquire().await.map_err(|e| {
                BenchError::Unavailable(format!(
                    "cannot open {} connections to PostgreSQL ({e}): every pool open at once \
                     shares its max_connections (100 by default); close the pools of \
                     strategies already run",
                    self.pool_size
                ))
            })?;
            held.push(conn);
        }
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn remaining(&self) -> Result<i64, BenchError> {
        Ok(sqlx::query_scalar(SELECT_STOCK)
            .bind(&self.item)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn delete_orders(&self) -> Result<(), BenchError> {
        sqlx::query(DELETE_ORDERS)
            .bind(&self.item)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), BenchError> {
        self.delete_orders().await?;
        sqlx::query(DELETE_ITEM)
            .bind(&self.item)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

fn unavailable(url: &str, e: &sqlx::Error) -> BenchError {
    BenchError::Unavailable(format!(
        "PostgreSQL is not answering at {url} ({e}); start it with:\n  {START_POSTGRES}"
    ))
}

/// Creates the URL's database when it does not exist, through the server's
/// `postgres` database. Two creators racing is fine: the loser's "already
/// exists" (42P04, or 23505 on the catalogue index) counts as success.
async fn ensure_database(opts: &PgConnectOptions, url: &str) -> Result<(), BenchError> {
    let Some(name) = opts.get_database().filter(|d| *d != "postgres") else {
        return Ok(());
    };
    let mut admin = PgConnection::connect_with(&opts.clone().database("postgres"))
        .await
        .map_err(|e| unavailable(url, &e))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        // An identifier cannot be a bind parameter; quoting makes it one name.
        let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        if let Err(e) = sqlx::query(AssertSqlSafe(create)).execute(&mut admin).await {
            let code = e.as_database_error().and_then(|d| d.code());
            if !matches!(code.as_deref(), Some("42P04" | "23505")) {
                return Err(e.into());
            }
        }
    }
    admin.close().await?;
    Ok(())
}

fn outcome(qty: u32, taken: Result<bool, BenchError>) -> Outcome {
    match taken {
        Ok(true) => Outcome::Bought { units: qty },
        Ok(false) => Outcome::SoldOut,
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// Implements the harness-facing methods every PostgreSQL baseline shares.
macro_rules! pg_strategy {
    ($ty:ident, $name:literal) => {
        impl $ty {
            #[doc = concat!("Connects to `url` (see [`DEFAULT_PG_URL`]) with a pool of ",
                        "`concurrency` connections (at most 64), creating the database and ",
                        "the tables when absent. The row is `", $name, "-<run id>`.")]
            pub async fn connect(url: &str, concurrency: usize) -> Result<Self, BenchError> {
                Ok(Self {
                    db: PgItem::connect(url, concurrency, $name).await?,
                })
            }

            /// Closes the pool (waiting for its connections to end), so the
            /// next strategy can open its own within PostgreSQL's
            /// `max_connections`. The strategy cannot run again afterwards.
            pub async fn close(&self) {
                self.db.close().await;
            }
        }

        impl Strategy for $ty {
            fn name(&self) -> String {
                $name.to_string()
            }
            fn claims_no_oversell(&self) -> bool {
                true
            }
            async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
                Ok(self.db.prepare(w.stock).await?)
            }
            async fn attempt(&self, user: &str, qty: u32, request_id: &str) -> Outcome {
                outcome(qty, self.take(user, qty, request_id).await)
            }
            async fn remaining(&self) -> anyhow::Result<i64> {
                Ok(self.db.remaining().await?)
            }
            async fn cleanup(&self) -> anyhow::Result<()> {
                Ok(self.db.cleanup().await?)
            }
        }
    };
}

/// Pessimistic: `SELECT … FOR UPDATE`, check in the client, `UPDATE`,
/// `INSERT` the order, `COMMIT` (seed 002 §2; claimed 500–1,000 TPS).
pub struct PgForUpdate {
    db: PgItem,
}

impl PgForUpdate {
    async fn take(&self, user: &str, qty: u32, request_id: &str) -> Result<bool, BenchError> {
        let mut tx = self.db.pool.begin().await?;
        let stock: i64 = sqlx::query_scalar(SELECT_FOR_UPDATE)
            .bind(&self.db.item)
            .fetch_one(&mut *tx)
            .await?;
        if stock < i64::from(qty) {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query(SUBTRACT)
            .bind(&self.db.item)
            .bind(i64::from(qty))
            .execute(&mut *tx)
            .await?;
        sqlx::query(INSERT_ORDER)
            .bind(&self.db.item)
            .bind(user)
            .bind(i64::from(qty))
            .bind(request_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

pg_strategy!(PgForUpdate, "pg-for-update");

/// One conditional statement: `UPDATE … SET stock = stock - q WHERE id = $1
/// AND stock >= q`, with the order inserted by the same statement (a CTE), so
/// one round trip and one implicit transaction (seed 004's recommendation).
pub struct PgConditionalUpdate {
    db: PgItem,
}

impl PgConditionalUpdate {
    async fn take(&self, user: &str, qty: u32, request_id: &str) -> Result<bool, BenchError> {
        let done = sqlx::query(CONDITIONAL_TAKE)
            .bind(&self.db.item)
            .bind(i64::from(qty))
            .bind(user)
            .bind(request_id)
            .execute(&self.db.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

pg_strategy!(PgConditionalUpdate, "pg-conditional-update");

/// Optimistic: read `stock, version`; refuse when short; else `UPDATE … SET
/// stock = stock - q, version = version + 1 WHERE version = v` (with the order
/// in the same statement). Zero rows means another writer won: wait a tiny
/// random while (under 2 ms, growing with the attempt) and start over, at most
/// [`CAS_RETRIES`] times, then answer `Error("retry budget …")` (seed 002 §3:
/// the "retry storm", claimed 2,000–3,000 TPS).
pub struct PgVersionCas {
    db: PgItem,
}

impl PgVersionCas {
    async fn take(&self, user: &str, qty: u32, request_id: &str) -> Result<bool, BenchError> {
        let qty = i64::from(qty);
        for retry in 0..CAS_RETRIES {
            if retry > 0 {
                // Jitter spreads the losers so they do not collide again at
                // once; tokio's timer rounds sub-millisecond sleeps up to 1 ms.
                let ceiling_us = 250u64 << retry.min(3);
                let pause = Duration::from_micros(rand::random_range(0..=ceiling_us));
                tokio::time::sleep(pause).await;
            }
            let (stock, version): (i64, i64) = sqlx::query_as(SELECT_VERSION)
                .bind(&self.db.item)
                .fetch_one(&self.db.pool)
                .await?;
            if stock < qty {
                return Ok(false);
            }
            let done = sqlx::query(CAS_TAKE)
                .bind(&self.db.item)
                .bind(qty)
                .bind(version)
                .bind(user)
                .bind(request_id)
                .execute(&self.db.pool)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(true);
            }
        }
        Err(BenchError::RetryBudget(CAS_RETRIES))
    }
}

pg_strategy!(PgVersionCas, "pg-version-cas");
