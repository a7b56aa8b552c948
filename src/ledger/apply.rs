//! Writing flushed batches: exactly once, with the final guard.
//!
//! One transaction per batch: insert the stream records (duplicates by stream
//! id are skipped — a batch a dead flusher committed but never acknowledged
//! comes back and adds nothing), derive the order rows, and move the per-event
//! totals by what was new. The totals update carries the final guard: the
//! net units sold plus the leftover may never pass the stock. A violation
//! cannot be undone here — Redis already confirmed those units to buyers — so
//! it is written, counted (`shardstock_db_guard_violations_total`), logged as
//! an error and shows in every audit; it never passes silently.

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use super::{Ledger, LedgerError};
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
    /// Events whose guard refused the batch's sales (written anyway, alarmed).
    pub guard_violations: Vec<String>,
}

/// Rows per multi-row INSERT (12 parameters a row stays far below every limit).
const CHUNK: usize = 500;

fn placeholders(rows: usize, cols: usize) -> String {
    (0..rows)
        .map(|r| {
            let cells: Vec<String> = (1..=cols).map(|c| format!("${}", r * cols + c)).collect();
            format!("({})", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The stored request id without its user scope.
fn client_request_id(rid: &str) -> &str {
    rid.split_once('/').map_or("", |(_, r)| r)
}

impl Ledger {
    /// Writes a batch of stream records exactly once.
    pub async fn apply(&self, batch: &[FlushRecord], now_ms: i64) -> Result<Applied, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let mut new: Vec<&FlushRecord> = Vec::new();
        for chunk in batch.chunks(CHUNK) {
            new.extend(insert_records(&mut tx, chunk).await?);
        }
        let mut recompute: HashSet<&str> = HashSet::new();
        let orders: Vec<&FlushRecord> = new
            .iter()
            .copied()
            .filter(|r| r.entry.kind == RecordKind::Order)
            .collect();
        for chunk in orders.chunks(CHUNK) {
            let inserted = insert_orders(&mut tx, chunk, now_ms).await?;
            // An order id already present (a cancel flushed first, or a second
            // take of a saga) is derived again from all its records.
            recompute.extend(
                chunk
                    .iter()
                    .map(|r| r.entry.order_id.as_str())
                    .filter(|id| !inserted.contains(*id)),
            );
        }
        recompute.extend(
            new.iter()
                .filter(|r| matches!(r.entry.kind, RecordKind::Cancel | RecordKind::Void))
                .map(|r| r.entry.order_id.as_str()),
        );
        for order_id in recompute {
            derive_order(&mut tx, order_id, now_ms).await?;
        }
        let mut moved: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new();
        for r in &new {
            let t = moved.entry(r.event.as_str()).or_default();
            let q = r.entry.qty as i64;
            match r.entry.kind {
                RecordKind::Order => t.0 += q,
                RecordKind::Cancel | RecordKind::Void => t.1 += q,
                RecordKind::Leftover => t.2 += q,
            }
        }
        let mut violations = Vec::new();
        for (event, (sold, released, leftover)) in moved {
            if !guarded_totals(&mut tx, event, sold, released, leftover).await? {
                violations.push(event.to_owned());
            }
        }
        tx.commit().await?;
        for event in &violations {
            metrics::counter!(crate::metrics::DB_GUARD_VIOLATIONS, "event" => event.clone())
                .increment(1);
            tracing::error!(%event, "DB guard: sold - released + leftover would exceed the stock; written and alarmed");
        }
        Ok(Applied {
            new_records: new.len(),
            guard_violations: violations,
        })
    }
}

/// Inserts records; returns those that were new.
async fn insert_records<'a>(
    tx: &mut Transaction<'_, Any>,
    chunk: &'a [FlushRecord],
) -> Result<Vec<&'a FlushRecord>, LedgerError> {
    let sql = format!(
        "INSERT INTO order_records (stream, ms, seq, event_id, kind, order_id, user_id, quantity, bucket, home, request_id, at_ms) \
         VALUES {} ON CONFLICT (stream, ms, seq) DO NOTHING RETURNING stream, ms, seq",
        placeholders(chunk.len(), 12)
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for r in chunk {
        let e = &r.entry;
        q = q
            .bind(r.stream.as_str())
            .bind(e.id.ms as i64)
            .bind(e.id.seq as i64)
            .bind(r.event.as_str())
            .bind(e.kind.code())
            .bind(e.order_id.as_str())
            .bind(e.user.as_str())
            .bind(e.qty as i64)
            .bind(i64::from(e.bucket))
            .bind(i64::from(e.home))
            .bind(client_request_id(&e.rid))
            .bind(e.at_ms);
    }
    let rows = q.fetch_all(&mut **tx).await?;
    let fresh: HashSet<(String, i64, i64)> = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(chunk
        .iter()
        .filter(|r| {
            fresh.contains(&(
                r.stream.clone(),
                r.entry.id.ms as i64,
                r.entry.id.seq as i64,
            ))
        })
        .collect())
}

/// Inserts order rows for new order records; returns the order ids inserted.
async fn insert_orders(
    tx: &mut Transaction<'_, Any>,
    chunk: &[&FlushRecord],
    now_ms: i64,
) -> Result<HashSet<String>, LedgerError> {
    // The same order id twice in one statement would conflict with itself.
    let mut seen = HashSet::new();
    let unique: Vec<&&FlushRecord> = chunk
        .iter()
        .filter(|r| seen.insert(r.entry.order_id.as_str()))
        .collect();
    let sql = format!(
        "INSERT INTO orders (order_id, event_id, user_id, quantity, bucket, request_id, status, created_ms, updated_ms) \
         VALUES {} ON CONFLICT (order_id) DO NOTHING RETURNING order_id",
        placeholders(unique.len(), 9)
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for r in &unique {
        let e = &r.entry;
        q = q
            .bind(e.order_id.as_str())
            .bind(r.event.as_str())
            .bind(e.user.as_str())
            .bind(e.qty as i64)
            .bind(i64::from(e.bucket))
            .bind(client_request_id(&e.rid))
            .bind("confirmed")
            .bind(e.at_ms)
            .bind(now_ms);
    }
    let rows = q.fetch_all(&mut **tx).await?;
    rows.iter()
        .map(|row| row.try_get::<String, _>(0))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// Derives an order's row from all its records, whatever order they came in:
/// the live take is an order record whose bucket has no void; the order is
/// cancelled once a cancel record exists, voided when no take is live.
async fn derive_order(
    tx: &mut Transaction<'_, Any>,
    order_id: &str,
    now_ms: i64,
) -> Result<(), LedgerError> {
    let rows = sqlx::query(
        "SELECT kind, bucket, quantity, user_id, request_id, at_ms, event_id FROM order_records WHERE order_id = $1",
    )
    .bind(order_id)
    .fetch_all(&mut **tx)
    .await?;
    let mut takes: HashMap<i64, (i64, String, String, i64, String)> = HashMap::new();
    let (mut voided, mut cancelled) = (HashSet::new(), None);
    for row in &rows {
        let kind: String = row.try_get(0)?;
        let bucket: i64 = row.try_get(1)?;
        let detail = (
            row.try_get(2)?,
            row.try_get(3)?,
            row.try_get(4)?,
            row.try_get(5)?,
            row.try_get(6)?,
        );
        match kind.as_str() {
            "o" => {
                takes.insert(bucket, detail);
            }
            "v" => {
                voided.insert(bucket);
            }
            "c" => cancelled = Some(detail),
            _ => {}
        }
    }
    let live = takes
        .iter()
        .filter(|(b, _)| !voided.contains(*b))
        .min_by_key(|(b, _)| **b);
    let (bucket, (qty, user, rid, at, event), status) = match (live, &cancelled) {
        (Some((b, d)), None) => (*b, d.clone(), "confirmed"),
        (Some((b, d)), Some(_)) => (*b, d.clone(), "cancelled"),
        // The cancel arrived before its order: keep what it says until the order comes.
        (None, Some(d)) if takes.is_empty() => (-1, d.clone(), "cancelled"),
        (None, _) => match takes.iter().min_by_key(|(b, _)| **b) {
            Some((b, d)) => (*b, d.clone(), "voided"),
            None => return Ok(()),
        },
    };
    sqlx::query(
        "INSERT INTO orders (order_id, event_id, user_id, quantity, bucket, request_id, status, created_ms, updated_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (order_id) DO UPDATE SET user_id = excluded.user_id, quantity = excluded.quantity, \
         bucket = excluded.bucket, request_id = excluded.request_id, status = excluded.status, updated_ms = excluded.updated_ms",
    )
    .bind(order_id)
    .bind(event)
    .bind(user)
    .bind(qty)
    .bind(bucket)
    .bind(rid)
    .bind(status)
    .bind(at)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Moves an event's totals; false (and moved anyway, counted) when the guard refused.
async fn guarded_totals(
    tx: &mut Transaction<'_, Any>,
    event: &str,
    sold: i64,
    released: i64,
    leftover: i64,
) -> Result<bool, LedgerError> {
    let guarded = sqlx::query(
        "UPDATE event_totals SET sold = sold + $2, released = released + $3, leftover = leftover + $4 \
         WHERE event_id = $1 AND sold + $2 - released - $3 + leftover + $4 <= stock",
    )
    .bind(event)
    .bind(sold)
    .bind(released)
    .bind(leftover)
    .execute(&mut **tx)
    .await?;
    if guarded.rows_affected() == 1 {
        return Ok(true);
    }
    let forced = sqlx::query(
        "UPDATE event_totals SET sold = sold + $2, released = released + $3, leftover = leftover + $4, \
         guard_violations = guard_violations + 1 WHERE event_id = $1",
    )
    .bind(event)
    .bind(sold)
    .bind(released)
    .bind(leftover)
    .execute(&mut **tx)
    .await?;
    if forced.rows_affected() == 0 {
        return Err(LedgerError::Data(format!(
            "records for event {event}, which the ledger does not know"
        )));
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_every_cell() {
        assert_eq!(placeholders(2, 2), "($1, $2), ($3, $4)");
    }

    #[test]
    fn request_ids_lose_their_user_scope() {
        assert_eq!(client_request_id("u-1/abc"), "abc");
        assert_eq!(client_request_id("~0123"), "");
        assert_eq!(client_request_id(""), "");
    }
}
