//! The rows a batch writes: its streams' numbers and its records.
//!
//! A record is one row of `order_records`, keyed by its stream id — the
//! stream named by its number in `ledger_streams` (given once per stream, on
//! its first batch, and remembered by the `Ledger` after that commit), the
//! entry by `<ms>-<seq>` — and its part (its place among the orders of one
//! purchase call's entry, 0 for any other). On PostgreSQL a batch is one binary `COPY`; on
//! SQLite multi-row `VALUES`. Both on their own driver's connection, not `Any`'s.
//!
//! Fast inserts are plain: a duplicate key fails the statement, and the caller
//! writes the batch again with `careful` set, which skips the records already
//! there (`ON CONFLICT DO NOTHING`; on PostgreSQL one `INSERT … SELECT FROM
//! UNNEST(…)` of thirteen arrays) and says which were new (`RETURNING`).

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use sqlx::{AssertSqlSafe, Postgres, Row, Sqlite, Transaction};

use super::LedgerError;
use super::apply::FlushRecord;

/// Rows per multi-row INSERT on SQLite (13 parameters a row), largest
/// first. A batch is cut into statements of these sizes only, so every
/// statement is one of five texts the connection has prepared before: cut
/// into "whatever was left" instead, nearly every batch had a statement of
/// its own, and SQLite parsed and planned a 3,000-placeholder INSERT for each
/// (a third of the embedded flusher's CPU under load, in `callgrind`).
pub(super) const CHUNKS: [usize; 5] = [256, 64, 16, 4, 1];

/// `rows` cut into runs whose lengths are all in [`CHUNKS`], largest first.
pub(super) fn chunked<T>(mut rows: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    for size in CHUNKS {
        while rows.len() >= size {
            let (head, rest) = rows.split_at(size);
            out.push(head);
            rows = rest;
        }
    }
    out
}

const COLUMNS: &str = "stream_no, ms, seq, part, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id, pay_by_ms";

fn placeholders(rows: usize, cols: usize) -> String {
    (0..rows)
        .map(|r| {
            let cells: Vec<String> = (1..=cols).map(|c| format!("${}", r * cols + c)).collect();
            format!("({})", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `rows` tuples of `cols` anonymous `?` parameters, for SQLite's big
/// inserts: sqlx binds a numbered parameter by asking SQLite its name, and
/// SQLite finds a name by scanning the statement's list of them, so a
/// 5,500-parameter `$N` insert cost O(n²) — 69% of the embedded service's CPU
/// under load (`perf`). Anonymous parameters have no names to scan.
pub(super) fn anonymous(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(", "));
    vec![row; rows].join(", ")
}

/// The text of SQLite's insert of `rows` records (one of [`CHUNKS`]), built
/// once per size and kind: a chunk of 256 is 8 KiB of text.
fn sqlite_insert(rows: usize, careful: bool) -> &'static str {
    static TEXTS: OnceLock<Vec<[String; 2]>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        CHUNKS
            .iter()
            .map(|&n| {
                let values = format!("({COLUMNS}) VALUES {}", anonymous(n, 13));
                let fast = format!("INSERT INTO order_records {values}");
                let careful = format!(
                    "INSERT INTO order_records {values} ON CONFLICT DO NOTHING RETURNING stream_no, ms, seq, part"
                );
                [fast, careful]
            })
            .collect()
    });
    let at = CHUNKS
        .iter()
        .position(|&n| n == rows)
        .expect("a chunk has one of the CHUNKS sizes");
    &texts[at][usize::from(careful)]
}

/// The stored request id without its user scope.
fn client_request_id(rid: &str) -> &str {
    rid.split_once('/').map_or("", |(_, r)| r)
}

/// The numbers the ledger knows for the batch's streams, and the streams it
/// has no number for yet, with their events.
pub(super) fn numbered<'a>(
    batch: &'a [FlushRecord],
    known: &HashMap<String, i64>,
) -> (HashMap<String, i64>, Vec<(&'a str, &'a str)>) {
    let mut numbers = HashMap::new();
    let mut unnamed = Vec::new();
    for r in batch {
        if numbers.contains_key(&r.stream) || unnamed.iter().any(|(s, _)| *s == r.stream) {
            continue;
        }
        match known.get(&r.stream) {
            Some(n) => {
                numbers.insert(r.stream.clone(), *n);
            }
            None => unnamed.push((r.stream.as_str(), r.event.as_str())),
        }
    }
    // One order for every writer: two batches naming the same new streams
    // wait for each other instead of deadlocking.
    unnamed.sort_unstable();
    (numbers, unnamed)
}

/// Names `streams` (an existing name keeps its number) and returns their numbers.
macro_rules! name_streams {
    ($name:ident, $db:ty) => {
        pub(super) async fn $name(
            tx: &mut Transaction<'_, $db>,
            streams: &[(&str, &str)],
        ) -> Result<HashMap<String, i64>, LedgerError> {
            if streams.is_empty() {
                return Ok(HashMap::new());
            }
            let sql = format!(
                "INSERT INTO ledger_streams (stream, event_id) VALUES {} ON CONFLICT (stream) DO NOTHING",
                placeholders(streams.len(), 2)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (stream, event) in streams {
                q = q.bind(*stream).bind(*event);
            }
            q.execute(&mut **tx).await?;
            let list: Vec<String> = (1..=streams.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT stream, stream_no FROM ledger_streams WHERE stream IN ({})",
                list.join(", ")
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (stream, _) in streams {
                q = q.bind(*stream);
            }
            let rows = q.fetch_all(&mut **tx).await?;
            rows.iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect()
        }
    };
}
name_streams!(name_streams_pg, Postgres);
name_streams!(name_streams_sqlite, Sqlite);

/// The batch in key order, each record with its stream's number: inserted in
/// this order, a batch's entries go to the right end of each stream's range.
fn keyed<'a>(
    batch: &'a [FlushRecord],
    numbers: &HashMap<String, i64>,
) -> Result<Vec<(i64, &'a FlushRecord)>, LedgerError> {
    let mut out = batch
        .iter()
        .map(|r| {
            numbers
                .get(&r.stream)
                .map(|n| (*n, r))
                .ok_or_else(|| LedgerError::Data(format!("stream {} has no number", r.stream)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable_by_key(|(n, r)| (*n, r.entry.id, r.entry.part));
    Ok(out)
}

/// A record's key as `RETURNING stream_no, ms, seq, part` gives it.
type Key = (i64, i64, i64, i64);

fn key_of(n: i64, r: &FlushRecord) -> Key {
    (
        n,
        r.entry.id.ms as i64,
        r.entry.id.seq as i64,
        i64::from(r.entry.part),
    )
}

/// The records of `rows` whose keys `returned` lists (all of them when `None`).
fn new_ones(rows: Vec<(i64, &FlushRecord)>, returned: Option<HashSet<Key>>) -> Vec<&FlushRecord> {
    rows.into_iter()
        .filter(|(n, r)| {
            returned
                .as_ref()
                .is_none_or(|keys| keys.contains(&key_of(*n, r)))
        })
        .map(|(_, r)| r)
        .collect()
}

/// The batch in PostgreSQL's binary `COPY` format, in key order.
fn copy_data(rows: &[(i64, &FlushRecord)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(19 + rows.len() * 200 + 2);
    out.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    out.extend_from_slice(&0i32.to_be_bytes()); // flags
    out.extend_from_slice(&0i32.to_be_bytes()); // header extension
    for (no, r) in rows {
        let e = &r.entry;
        out.extend_from_slice(&13i16.to_be_bytes());
        for n in [
            *no,
            e.id.ms as i64,
            e.id.seq as i64,
            i64::from(e.part),
            e.qty as i64,
            i64::from(e.bucket),
            i64::from(e.home),
            e.at_ms,
        ] {
            out.extend_from_slice(&8i32.to_be_bytes());
            out.extend_from_slice(&n.to_be_bytes());
        }
        for text in [
            e.kind.code(),
            e.order_id.as_str(),
            e.user.as_str(),
            client_request_id(&e.rid),
        ] {
            out.extend_from_slice(&(text.len() as i32).to_be_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        match e.pay_by {
            Some(pay_by) => {
                out.extend_from_slice(&8i32.to_be_bytes());
                out.extend_from_slice(&pay_by.to_be_bytes());
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()), // NULL
        }
    }
    out.extend_from_slice(&(-1i16).to_be_bytes());
    out
}

/// Batches from this size go in with `COPY`; smaller ones cost less as one
/// prepared `INSERT` (a `COPY` has a fixed cost of its own, and a small one
/// met TCP's delayed acknowledgement: ~40 ms a batch of 100 on loopback).
const COPY_FROM: usize = 300;

/// Inserts the batch on PostgreSQL; returns the records that were new.
///
/// Fast: one binary `COPY` for a batch of `COPY_FROM` or more, the cheapest
/// way into a table (rows parsed without a plan, the heap written a page at
/// a time), else one prepared `INSERT … SELECT FROM UNNEST(…)`; either fails
/// on a duplicate key. Careful: the `INSERT`, skipping the keys already there.
pub(super) async fn insert_pg<'a>(
    tx: &mut Transaction<'_, Postgres>,
    batch: &'a [FlushRecord],
    numbers: &HashMap<String, i64>,
    careful: bool,
) -> Result<Vec<&'a FlushRecord>, LedgerError> {
    let rows = keyed(batch, numbers)?;
    if !careful && rows.len() >= COPY_FROM {
        let mut copy = tx
            .copy_in_raw(&format!(
                "COPY order_records ({COLUMNS}) FROM STDIN (FORMAT binary)"
            ))
            .await?;
        copy.send(copy_data(&rows)).await?;
        copy.finish().await?;
        return Ok(new_ones(rows, None));
    }
    let n = rows.len();
    let mut ints: [Vec<i64>; 8] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut texts: [Vec<&str>; 4] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut pay_by: Vec<Option<i64>> = Vec::with_capacity(n);
    for (no, r) in &rows {
        let e = &r.entry;
        let row = [
            *no,
            e.id.ms as i64,
            e.id.seq as i64,
            i64::from(e.part),
            e.qty as i64,
            i64::from(e.bucket),
            i64::from(e.home),
            e.at_ms,
        ];
        for (col, v) in ints.iter_mut().zip(row) {
            col.push(v);
        }
        let row = [
            e.kind.code(),
            e.order_id.as_str(),
            e.user.as_str(),
            client_request_id(&e.rid),
        ];
        for (col, v) in texts.iter_mut().zip(row) {
            col.push(v);
        }
        pay_by.push(e.pay_by);
    }
    let [stream_no, ms, seq, part, qty, bucket, home, at] = ints;
    let [kind, order, user, rid] = texts;
    const PLAIN: &str = "INSERT INTO order_records (stream_no, ms, seq, part, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id, pay_by_ms) \
         SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[], \
         $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[])";
    const SKIPPING: &str = "INSERT INTO order_records (stream_no, ms, seq, part, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id, pay_by_ms) \
         SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[], \
         $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[]) \
         ON CONFLICT DO NOTHING RETURNING stream_no, ms, seq, part";
    let q = sqlx::query(if careful { SKIPPING } else { PLAIN })
        .bind(stream_no)
        .bind(ms)
        .bind(seq)
        .bind(part)
        .bind(qty)
        .bind(bucket)
        .bind(home)
        .bind(at)
        .bind(kind)
        .bind(order)
        .bind(user)
        .bind(rid)
        .bind(pay_by);
    if !careful {
        q.execute(&mut **tx).await?;
        return Ok(new_ones(rows, None));
    }
    let returned = q
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
            ))
        })
        .collect::<Result<HashSet<Key>, sqlx::Error>>()?;
    Ok(new_ones(rows, Some(returned)))
}

/// Inserts the batch on SQLite; returns the records that were new.
pub(super) async fn insert_sqlite<'a>(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &'a [FlushRecord],
    numbers: &HashMap<String, i64>,
    careful: bool,
) -> Result<Vec<&'a FlushRecord>, LedgerError> {
    let rows = keyed(batch, numbers)?;
    let mut returned = careful.then(HashSet::new);
    for chunk in chunked(&rows) {
        let mut q = sqlx::query(AssertSqlSafe(sqlite_insert(chunk.len(), careful)));
        for (no, r) in chunk {
            let e = &r.entry;
            q = q
                .bind(*no)
                .bind(e.id.ms as i64)
                .bind(e.id.seq as i64)
                .bind(i64::from(e.part))
                .bind(e.qty as i64)
                .bind(i64::from(e.bucket))
                .bind(i64::from(e.home))
                .bind(e.at_ms)
                .bind(e.kind.code())
                .bind(e.order_id.as_str())
                .bind(e.user.as_str())
                .bind(client_request_id(&e.rid))
                .bind(e.pay_by);
        }
        match &mut returned {
            None => {
                q.execute(&mut **tx).await?;
            }
            Some(keys) => {
                for row in q.fetch_all(&mut **tx).await? {
                    keys.insert((
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                    ));
                }
            }
        }
    }
    Ok(new_ones(rows, returned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_cut_into_statements_of_a_few_sizes() {
        let rows: Vec<u32> = (0..600).collect();
        let lens: Vec<usize> = chunked(&rows).iter().map(|c| c.len()).collect();
        assert_eq!(lens, [256, 256, 64, 16, 4, 4]);
        let joined: Vec<u32> = chunked(&rows).concat();
        assert_eq!(joined, rows);
        assert!(chunked::<u32>(&[]).is_empty());
        assert_eq!(chunked(&[7]).concat(), [7]);
    }

    #[test]
    fn placeholders_number_every_cell() {
        assert_eq!(placeholders(2, 2), "($1, $2), ($3, $4)");
        assert_eq!(anonymous(2, 3), "(?, ?, ?), (?, ?, ?)");
    }

    #[test]
    fn sqlite_inserts_are_built_once_per_size() {
        for rows in CHUNKS {
            let fast = sqlite_insert(rows, false);
            assert!(fast.starts_with("INSERT INTO order_records (stream_no, "));
            assert_eq!(fast.matches('?').count(), rows * 13);
            assert!(!fast.contains("CONFLICT"));
            let careful = sqlite_insert(rows, true);
            assert_eq!(careful.matches('?').count(), rows * 13);
            assert!(careful.ends_with("ON CONFLICT DO NOTHING RETURNING stream_no, ms, seq, part"));
            // The same text every time: the connection's prepared statement is found again.
            assert!(std::ptr::eq(fast, sqlite_insert(rows, false)));
        }
    }

    #[test]
    fn request_ids_lose_their_user_scope() {
        assert_eq!(client_request_id("u-1/abc"), "abc");
        assert_eq!(client_request_id("~0123"), "");
        assert_eq!(client_request_id(""), "");
    }
}
