//! The ledger: the database that is the truth behind Redis (PostgreSQL in
//! production, SQLite as the embedded default).
//!
//! One code path for both through sqlx's `Any` driver — the SQL is portable
//! (`ON CONFLICT`, `RETURNING`, `$n` parameters, BIGINT everywhere) — except
//! the flusher's writes (`apply`), which run on a pool of the database's own
//! driver ([`Writer`]): on PostgreSQL they bind arrays (`COPY`, `UNNEST`),
//! which `Any` cannot; on SQLite `Any` would encode each of a batch's
//! thousands of arguments twice (into its own value, then into SQLite's).
//! The schema is the same on both; `migrations/postgres` and
//! `migrations/sqlite` hold one folder each (0001 is the same file in both, so
//! a database 0001 migrated migrates on) because keys and index kinds differ.
//! Sub-modules: `apply` writes flushed batches exactly once and applies the
//! final guard, with `records` writing their rows and `outbox` the order
//! changes they make (read back by the relay), and `webhooks` the webhook
//! subscriptions the relay delivers them to; `read` answers orders
//! (derived from their records by `derive`), totals and what the audit and a
//! recovery need.

mod apply;
mod derive;
mod outbox;
mod read;
mod records;
mod webhooks;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::ConnectOptions;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, install_default_drivers};
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Any, AnyPool, AssertSqlSafe};

use crate::domain::ids::EventId;
use crate::domain::model::EventSpec;

pub use apply::{Applied, FlushRecord};
pub use outbox::{
    Backlog, Change, EVENT_CLOSED, ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_CREATED, ORDER_EXPIRED,
    ORDER_RESTORED, ORDER_VOIDED, Outgoing,
};
pub use read::{AuditDb, DbEvent, DbOrder, OrderHistory, StreamCut, Totals};
pub use webhooks::{Created, ORIGIN_API, ORIGIN_CONFIG, Subscription, webhook_target};

/// Failures of the ledger layer.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("bad database URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("unexpected data in the ledger: {0}")]
    Data(String),
}

impl LedgerError {
    /// True when the database could not be reached (the flusher retries).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Db(
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::Tls(_)
            )
        )
    }
}

/// Which database is behind the `Any` pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Postgres,
    Sqlite,
}

/// The ledger, a connection pool.
#[derive(Clone)]
pub struct Ledger {
    pool: AnyPool,
    kind: DbKind,
    /// The flusher's writes. Connects lazily.
    writer: Writer,
    /// The numbers of the streams this process has flushed (`ledger_streams`):
    /// a number, once committed, never changes. Forgotten with their layout
    /// ([`Ledger::forget_streams`]) or their event ([`Ledger::forget_event`]).
    streams: Arc<Mutex<HashMap<String, i64>>>,
    /// Events this process made sure the ledger has (the flusher registers
    /// an event before its first records), until they close.
    registered: Arc<Mutex<HashSet<EventId>>>,
    /// Order events on (`[outbox] enabled`): the flusher and a close write
    /// the outbox. Off (the default), a flush writes what it did without it.
    outbox: bool,
    /// Told after each commit of this process that wrote the outbox: the
    /// relay waits on it besides its poll, so a change this instance wrote
    /// goes out without waiting out the poll interval (one waiter, the
    /// relay; a commit while it is busy leaves it one wake-up, so none is
    /// lost).
    written: Arc<tokio::sync::Notify>,
    /// This process's flusher has a backlog (its last round read a full
    /// batch or left buckets unfinished): the relay then paces itself, so
    /// the durable write keeps the cores (`control::relay`, "Second to the
    /// flush").
    flush_busy: Arc<AtomicBool>,
}

/// The pool of the flusher's writes, on the database's own driver.
#[derive(Clone)]
enum Writer {
    Postgres(PgPool),
    /// One connection: SQLite takes one writer at a time anyway.
    Sqlite(SqlitePool),
}

static POSTGRES: Migrator = sqlx::migrate!("./migrations/postgres");
static SQLITE: Migrator = sqlx::migrate!("./migrations/sqlite");

/// `sqlite:` URLs get `mode=rwc` (create the file) and their directory.
fn prepare_url(url: &str) -> Result<(String, DbKind), LedgerError> {
    let bad = |reason: &str| LedgerError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // No JIT: the `orders` view's subplans make one order's status look
        // expensive to the planner past a few thousand records, and each
        // lookup then spent ~2 s compiling itself (the query runs in under a
        // millisecond). A URL that sets its own `options` keeps them.
        let url = if url.contains("options=") {
            url.to_owned()
        } else if url.contains('?') {
            format!("{url}&options=-c%20jit%3Doff")
        } else {
            format!("{url}?options=-c%20jit%3Doff")
        };
        return Ok((url, DbKind::Postgres));
    }
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| bad("expected postgres://… or sqlite://…"))?;
    let file = path.split('?').next().unwrap_or_default();
    if file.is_empty() {
        return Err(bad("no file name"));
    }
    if file != ":memory:"
        && let Some(dir) = Path::new(file)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| bad(&format!("cannot create {}: {e}", dir.display())))?;
    }
    let url = if path.contains("mode=") {
        format!("sqlite://{path}")
    } else if path.contains('?') {
        format!("sqlite://{path}&mode=rwc")
    } else {
        format!("sqlite://{path}?mode=rwc")
    };
    Ok((url, DbKind::Sqlite))
}

/// Each SQLite connection's settings (they are not kept in the file). The
/// order id index takes random keys, so a flush batch's inserts land all over
/// it: with SQLite's default 2 MiB page cache a sale of 150k orders read most
/// index pages back from the file on every batch (`pread`, 7% of the embedded
/// service's CPU in `perf`), and a checkpoint every 1,000 WAL pages wrote the
/// same index pages back to the database file after nearly every batch
/// (`pwrite`, 19%). A larger cache keeps the index in memory; checkpoints
/// every 10,000 pages (a WAL of up to 40 MiB) write a page once for several
/// batches. `synchronous` is left at SQLite's default (`FULL`): a commit is
/// on disk before the flusher acknowledges its records.
const SQLITE_PRAGMAS: [(&str, &str); 2] =
    [("cache_size", "-65536"), ("wal_autocheckpoint", "10000")];

/// The flusher's connection, besides [`SQLITE_PRAGMAS`]: its statement
/// journals in memory. A multi-row insert into a table with a primary key and
/// another index keeps a statement journal (to undo the statement alone when
/// a key conflicts; with an index on an expression, as 0007's, even `INSERT OR
/// FAIL` keeps one, since evaluating the expression might fail), and by
/// default that journal is a temporary file: each page a statement first
/// touches was written to it, a `pwrite` per page, ~30% of SQLite's thread
/// under a sale (`perf`). In memory it is a copy of the page, dropped with
/// the statement.
/// A statement of [`records`]'s largest chunk touches at most a few hundred
/// pages. The readers keep the default: an audit's sort may be large.
const SQLITE_WRITER_PRAGMAS: [(&str, &str); 1] = [("temp_store", "memory")];

impl Ledger {
    /// Connects (creating the database if it does not exist) and migrates.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        install_default_drivers();
        let (url, kind) = prepare_url(url)?;
        if kind == DbKind::Postgres
            && !Any::database_exists(&url).await?
            && let Err(e) = Any::create_database(&url).await
        {
            // Another instance starting at the same time may have just created it.
            if !Any::database_exists(&url).await? {
                return Err(e.into());
            }
        }
        // PostgreSQL: the connections are shared by the two pools, half of
        // them (at least one) for the flusher's writes.
        let (max, writers) = match kind {
            DbKind::Sqlite => (max_connections.clamp(1, 4), 0),
            DbKind::Postgres => {
                let writers = (max_connections / 2).max(1);
                (max_connections.saturating_sub(writers).max(1), writers)
            }
        };
        // sqlx logs every statement slower than 1 s at `warn`, text and all:
        // a flush of a few hundred records is one statement of thousands of
        // placeholders, and a slow disk made each such line tens of KiB. The
        // flusher says itself when a batch was slow (records, seconds).
        let options: AnyConnectOptions = url.parse()?;
        let mut pool = AnyPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(std::time::Duration::from_secs(5));
        if kind == DbKind::Sqlite {
            pool = pool.after_connect(|conn, _| {
                Box::pin(async move {
                    for (pragma, value) in SQLITE_PRAGMAS {
                        let set = format!("PRAGMA {pragma} = {value}");
                        sqlx::raw_sql(AssertSqlSafe(set))
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            });
        }
        let pool = pool
            .connect_with(options.disable_statement_logging())
            .await?;
        if kind == DbKind::Sqlite {
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        let writer = match kind {
            DbKind::Postgres => {
                POSTGRES.run(&pool).await?;
                Writer::Postgres(
                    PgPoolOptions::new()
                        .max_connections(writers)
                        .acquire_timeout(std::time::Duration::from_secs(5))
                        .connect_lazy_with(
                            url.parse::<PgConnectOptions>()?.disable_statement_logging(),
                        ),
                )
            }
            DbKind::Sqlite => {
                SQLITE.run(&pool).await?;
                let options = SQLITE_PRAGMAS.iter().chain(&SQLITE_WRITER_PRAGMAS).fold(
                    url.parse::<SqliteConnectOptions>()?,
                    |options, (pragma, value)| options.pragma(*pragma, *value),
                );
                Writer::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(1)
                        .acquire_timeout(std::time::Duration::from_secs(5))
                        .connect_lazy_with(options.disable_statement_logging()),
                )
            }
        };
        Ok(Self {
            pool,
            kind,
            writer,
            streams: Arc::default(),
            registered: Arc::default(),
            outbox: false,
            written: Arc::default(),
            flush_busy: Arc::default(),
        })
    }

    /// This ledger with order events on or off (`[outbox] enabled`; off
    /// unless set): whether flushes and closes write the outbox.
    pub fn with_outbox(mut self, on: bool) -> Self {
        self.outbox = on;
        self
    }

    /// Whether flushes and closes write the outbox.
    pub fn outbox(&self) -> bool {
        self.outbox
    }

    /// Resolves once a commit of this process (of any clone of this
    /// ledger) wrote the outbox since the last time it resolved.
    pub async fn outbox_written(&self) {
        self.written.notified().await
    }

    /// Wakes [`Ledger::outbox_written`]: called after a commit that wrote
    /// the outbox.
    fn wrote_outbox(&self) {
        self.written.notify_one();
    }

    /// Records whether this process's flusher has a backlog (set by the
    /// flusher after each of its rounds).
    pub fn set_flush_busy(&self, busy: bool) {
        self.flush_busy.store(busy, Ordering::Relaxed);
    }

    /// Whether this process's flusher had a backlog at its last round.
    pub fn flush_busy(&self) -> bool {
        self.flush_busy.load(Ordering::Relaxed)
    }

    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// Does the database answer?
    pub async fn ping(&self) -> Result<(), LedgerError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Whether this process registered `event` since it last forgot it.
    pub(crate) fn is_registered(&self, event: &EventId) -> bool {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(event)
    }

    /// Forgets a closed event: its streams' numbers and its registration.
    pub fn forget_event(&self, event: &EventId) {
        let prefix = format!("{event}#");
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|name, _| !name.starts_with(&prefix));
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(event);
    }

    /// Forgets the numbers of streams no record will come from again (a
    /// pruned layout's).
    pub(crate) fn forget_streams(&self, names: impl IntoIterator<Item = String>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        for name in names {
            streams.remove(&name);
        }
    }

    /// Entries of the ledger's in-process maps (stream numbers, registered
    /// events): bounded by the open events' streams.
    pub fn cached_entries(&self) -> usize {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).len()
            + self
                .registered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
    }

    /// Records an event (and its totals row) unless it exists.
    pub async fn register_event(&self, spec: &EventSpec, now_ms: i64) -> Result<(), LedgerError> {
        self.register(spec, None, now_ms).await
    }

    /// Records a release's pool as `register_event` does, and names its
    /// release on the event's row (on a row that exists without one too: a
    /// pool registered before migration 0010), so the `orders` view and
    /// the order reads name each line's release order.
    pub async fn register_pool(
        &self,
        spec: &EventSpec,
        release: &EventId,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.register(spec, Some(release), now_ms).await
    }

    async fn register(
        &self,
        spec: &EventSpec,
        release: Option<&EventId>,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO events (event_id, stock, buckets, per_user_limit, max_per_order, starts_ms, ends_ms, status, created_ms, hold_seconds, buckets_min, buckets_max, release_id, access) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'on_sale', $8, $9, $10, $11, $12, $13) \
             ON CONFLICT (event_id) DO UPDATE SET release_id = COALESCE(events.release_id, excluded.release_id)",
        )
        .bind(spec.id.as_str())
        .bind(spec.stock as i64)
        .bind(i64::from(spec.buckets))
        .bind(spec.per_user_limit.map(i64::from))
        .bind(i64::from(spec.max_per_order))
        .bind(spec.starts_at)
        .bind(spec.ends_at)
        .bind(now_ms)
        .bind(spec.hold_seconds.map(i64::from))
        .bind(spec.auto_buckets.map(|r| i64::from(r.min)))
        .bind(spec.auto_buckets.map(|r| i64::from(r.max)))
        .bind(release.map(EventId::as_str))
        .bind(crate::domain::token::Access::of(spec).as_str())
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO event_totals (event_id, stock) VALUES ($1, $2) ON CONFLICT (event_id) DO NOTHING")
            .bind(spec.id.as_str())
            .bind(spec.stock as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(spec.id.clone());
        Ok(())
    }

    /// Records an event's bucket count after a reshard (a rebuild uses it).
    pub(crate) async fn set_buckets(
        &self,
        event: &EventId,
        buckets: u32,
    ) -> Result<(), LedgerError> {
        sqlx::query("UPDATE events SET buckets = $2 WHERE event_id = $1")
            .bind(event.as_str())
            .bind(i64::from(buckets))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks an event closed, once every record of it is flushed, and judges
    /// its guard: an excess the releases did not cover by now is a violation
    /// (see `apply`), counted, alarmed and logged.
    pub async fn close_event(&self, event: &EventId, now_ms: i64) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin().await?;
        let closed = sqlx::query("UPDATE events SET status = 'closed', closed_ms = $2 WHERE event_id = $1 AND status <> 'closed'")
            .bind(event.as_str())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        let mut excess = None;
        if closed {
            excess = sqlx::query_scalar::<_, i64>(
                "UPDATE event_totals SET guard_violations = guard_violations + 1 \
                 WHERE event_id = $1 AND sold - released + leftover > stock RETURNING sold - released + leftover - stock",
            )
            .bind(event.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if self.outbox {
                self.write_closed(&mut tx, event.as_str(), now_ms).await?;
            }
        }
        tx.commit().await?;
        if closed && self.outbox {
            self.wrote_outbox();
        }
        if let Some(excess) = excess {
            metrics::counter!(crate::metrics::DB_GUARD_VIOLATIONS, "event" => event.to_string())
                .increment(1);
            tracing::error!(%event, excess, "DB guard: at the close, sold - released + leftover is over the stock; alarmed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_databases_share_the_first_migration() {
        // A database migrated when there was one folder has 0001's checksum.
        let first = |m: &Migrator| m.iter().next().map(|m| m.checksum.clone());
        assert_eq!(first(&POSTGRES), first(&SQLITE));
        assert_eq!(POSTGRES.iter().count(), SQLITE.iter().count());
    }

    #[tokio::test]
    async fn the_sqlite_writer_keeps_its_statement_journals_in_memory() {
        let dir = std::env::temp_dir().join(format!("shardstock-writer-{}", std::process::id()));
        let url = format!("sqlite://{}/ledger.db", dir.display());
        let ledger = Ledger::connect(&url, 2).await.unwrap();
        let Writer::Sqlite(writer) = &ledger.writer else {
            panic!("a SQLite ledger writes through a SQLite pool");
        };
        let pragma = |pool: &SqlitePool, name: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!("PRAGMA {name}")))
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        // 2 = MEMORY; the readers keep the default (0: the compile-time choice, a file).
        assert_eq!(pragma(writer, "temp_store").await, 2);
        assert_eq!(pragma(writer, "cache_size").await, -65536);
        assert_eq!(pragma(writer, "wal_autocheckpoint").await, 10000);
        let reader: i64 = sqlx::query_scalar("PRAGMA temp_store")
            .fetch_one(&ledger.pool)
            .await
            .unwrap();
        assert_eq!(reader, 0);
        let reader: i64 = sqlx::query_scalar("PRAGMA cache_size")
            .fetch_one(&ledger.pool)
            .await
            .unwrap();
        assert_eq!(reader, -65536);
        ledger.pool.close().await;
        writer.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn sqlite_urls_create_their_file() {
        let (url, kind) = prepare_url("sqlite://data/x.db").unwrap();
        assert_eq!(
            (url.as_str(), kind),
            ("sqlite://data/x.db?mode=rwc", DbKind::Sqlite)
        );
        let (url, _) = prepare_url("sqlite::memory:").unwrap();
        assert_eq!(url, "sqlite://:memory:?mode=rwc");
        assert!(prepare_url("mysql://x").is_err());
        assert_eq!(prepare_url("postgres://h/db").unwrap().1, DbKind::Postgres);
        assert_eq!(
            prepare_url("postgres://h/db?sslmode=disable").unwrap().0,
            "postgres://h/db?sslmode=disable&options=-c%20jit%3Doff"
        );
        let own = "postgres://h/db?options=-c%20work_mem%3D64MB";
        assert_eq!(prepare_url(own).unwrap().0, own);
    }
}
