//! Writing flushed batches: exactly once, with the final guard.
//!
//! One transaction per batch: number the batch's new streams, insert its
//! records (`records`), move the per-event totals by what was new, and write
//! the order changes the new records make into the outbox (`outbox`). Orders
//! are not written: `orders` is a view deriving each order from its records
//! (migration 0002), so a flushed order costs one row.
//!
//! **Exactly once.** A record's key is its stream id. The insert is first
//! tried plain — a batch is almost always new — and a duplicate key (a batch a
//! dead flusher committed but never acknowledged, claimed again; a commit whose
//! answer was lost) rolls the transaction back; the batch is then written again
//! skipping what is already there, so it adds only what is new. Two flushers
//! meeting on the same rows (a close claiming a live consumer's records) may
//! deadlock: the database aborts one, and it retries.
//!
//! **The guard** is `sold − released + leftover ≤ stock` on the totals. The
//! streams are flushed independently, so the flushed totals may pass the stock
//! with no unit oversold: a cancel's release, written on the buyer's home
//! bucket stream, may reach the database after the re-sale of its unit from
//! another bucket. So an excess while the sale is open is *pending*: reported
//! (`Applied::guard_violations`, and one in `Totals::guard_violations` while it
//! lasts), logged as a warning, and gone when the release arrives; the audit,
//! which sees the releases still in the streams too, counts it only if they
//! do not cover it. It becomes a *violation* — counted in
//! `event_totals.guard_violations` and `shardstock_db_guard_violations_total`,
//! logged as an error — when it outlasts the close (every stream of the event
//! is flushed by then: `Ledger::close_event`), or when records flushed after
//! the close raise it. Either way the records are written: Redis already
//! confirmed those units to buyers, and the ledger must say what happened.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{Postgres, Sqlite, Transaction};

use super::{Ledger, LedgerError, Writer, outbox, records};
use crate::domain::stream::{RecordKind, StreamEntry};

/// A stream record on its way to the database.
#[derive(Debug, Clone)]
pub struct FlushRecord {
    /// `<event>#<gen>#<bucket>`.
    pub stream: String,
    pub event: String,
    pub entry: StreamEntry,
}

/// What a batch changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Records written now (the rest were in the database already).
    pub new_records: usize,
    /// Events whose net sold this batch raised past the stock (pending while
    /// the sale is open, a violation after its close; see the module docs).
    pub guard_violations: Vec<String>,
}

/// Tries of one batch: a deadlock or a duplicate key starts it again.
const ATTEMPTS: u32 = 8;

/// An event's totals after a batch moved them.
#[derive(Debug)]
struct Moved {
    event: String,
    /// `sold − released + leftover − stock` now.
    excess: i64,
    /// The batch raised the net (sold more than it released).
    raised: bool,
    /// The event is closed: the excess is a violation, counted.
    confirmed: bool,
}

/// Per event: units sold, released and left over by the new records.
fn moves<'a>(new: &[&'a FlushRecord]) -> BTreeMap<&'a str, (i64, i64, i64)> {
    let mut moved: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new();
    for r in new {
        let t = moved.entry(r.event.as_str()).or_default();
        let q = r.entry.qty as i64;
        match r.entry.kind {
            RecordKind::Order => t.0 += q,
            RecordKind::Cancel | RecordKind::Void | RecordKind::Expire => t.1 += q,
            RecordKind::Leftover => t.2 += q,
            // A hold's start and its confirmation move no units.
            RecordKind::Hold | RecordKind::Confirm => {}
        }
    }
    moved
}

/// Moves the totals of every event (in event order: two batches lock the
/// rows they share in the same order) and applies the guard.
macro_rules! move_totals {
    ($name:ident, $db:ty) => {
        async fn $name(
            tx: &mut Transaction<'_, $db>,
            new: &[&FlushRecord],
        ) -> Result<Vec<Moved>, LedgerError> {
            let mut out = Vec::new();
            for (event, (sold, released, leftover)) in moves(new) {
                let excess: Option<i64> = sqlx::query_scalar(
                    "UPDATE event_totals SET sold = sold + $2, released = released + $3, leftover = leftover + $4 \
                     WHERE event_id = $1 RETURNING sold - released + leftover - stock",
                )
                .bind(event)
                .bind(sold)
                .bind(released)
                .bind(leftover)
                .fetch_optional(&mut **tx)
                .await?;
                let Some(excess) = excess else {
                    return Err(LedgerError::Data(format!(
                        "records for event {event}, which the ledger does not know"
                    )));
                };
                let raised = sold - released + leftover > 0;
                let mut confirmed = false;
                if excess > 0 && raised {
                    confirmed = sqlx::query(
                        "UPDATE event_totals SET guard_violations = guard_violations + 1 WHERE event_id = $1 \
                         AND EXISTS (SELECT 1 FROM events WHERE event_id = $1 AND status = 'closed')",
                    )
                    .bind(event)
                    .execute(&mut **tx)
                    .await?
                    .rows_affected()
                        == 1;
                }
                out.push(Moved {
                    event: event.to_owned(),
                    excess,
                    raised,
                    confirmed,
                });
            }
            Ok(out)
        }
    };
}
move_totals!(move_totals_pg, Postgres);
move_totals!(move_totals_sqlite, Sqlite);

/// A failure that writing the batch again can get past.
fn retryable(e: &LedgerError) -> bool {
    is_duplicate(e)
        || matches!(e, LedgerError::Db(sqlx::Error::Database(d)) if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

/// A key already there: some of the batch was written before.
fn is_duplicate(e: &LedgerError) -> bool {
    matches!(e, LedgerError::Db(sqlx::Error::Database(d)) if d.is_unique_violation())
}

impl Ledger {
    /// Writes a batch of stream records exactly once, with the changes they
    /// make in the outbox (`outbox`; `now_ms` stamps a saga hold's creation).
    pub async fn apply(&self, batch: &[FlushRecord], now_ms: i64) -> Result<Applied, LedgerError> {
        if batch.is_empty() {
            return Ok(Applied::default());
        }
        let mut careful = false;
        let mut attempt = 0;
        let (new_records, moved) = loop {
            attempt += 1;
            match self.write(batch, careful, now_ms).await {
                Ok(done) => break done,
                Err(e) if attempt < ATTEMPTS && retryable(&e) => {
                    if is_duplicate(&e) {
                        careful = true;
                    } else {
                        tracing::info!(error = %e, attempt, "flushed batch met another writer; retrying");
                        let jitter = u64::from(rand::random::<u8>() % 20);
                        tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt) + jitter))
                            .await;
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let mut violations = Vec::new();
        for m in moved.iter().filter(|m| m.excess > 0 && m.raised) {
            let (event, excess) = (&m.event, m.excess);
            if m.confirmed {
                metrics::counter!(crate::metrics::DB_GUARD_VIOLATIONS, "event" => event.clone())
                    .increment(1);
                tracing::error!(%event, excess, "DB guard: records flushed after the close put sold - released + leftover over the stock; written and alarmed");
            } else {
                tracing::warn!(%event, excess, "DB guard: sold - released + leftover is over the stock until a release still in another stream arrives (alarmed if it outlasts the close)");
            }
            violations.push(event.clone());
        }
        Ok(Applied {
            new_records,
            guard_violations: violations,
        })
    }

    /// One transaction: streams, records, totals, outbox. Returns the records
    /// that were new and how the totals moved.
    async fn write(
        &self,
        batch: &[FlushRecord],
        careful: bool,
        now_ms: i64,
    ) -> Result<(usize, Vec<Moved>), LedgerError> {
        let (mut numbers, unnamed) = records::numbered(
            batch,
            &self.streams.lock().unwrap_or_else(|p| p.into_inner()),
        );
        let (new, moved, named) = match &self.writer {
            Writer::Postgres(pg) => {
                let mut tx = pg.begin().await?;
                let named = records::name_streams_pg(&mut tx, &unnamed).await?;
                numbers.extend(named.clone());
                let new = records::insert_pg(&mut tx, batch, &numbers, careful).await?;
                let moved = move_totals_pg(&mut tx, &new).await?;
                // Last: the outbox's head stays locked from here to the commit.
                if self.outbox {
                    outbox::write_pg(&mut tx, &new, now_ms, careful).await?;
                }
                tx.commit().await?;
                (new.len(), moved, named)
            }
            Writer::Sqlite(sqlite) => {
                let mut tx = sqlite.begin().await?;
                let named = records::name_streams_sqlite(&mut tx, &unnamed).await?;
                numbers.extend(named.clone());
                let new = records::insert_sqlite(&mut tx, batch, &numbers, careful).await?;
                let moved = move_totals_sqlite(&mut tx, &new).await?;
                if self.outbox {
                    outbox::write_sqlite(&mut tx, &new, now_ms, careful).await?;
                }
                tx.commit().await?;
                (new.len(), moved, named)
            }
        };
        if self.outbox && new > 0 {
            self.wrote_outbox();
        }
        if !named.is_empty() {
            // Only once committed: a number rolled back may be given to another stream.
            self.streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(named);
        }
        Ok((new, moved))
    }
}
