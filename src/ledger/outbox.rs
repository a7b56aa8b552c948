//! The transactional outbox: the changes a flushed batch (or a close) makes,
//! written in the same transaction as the change itself, and read back in
//! sequence order by the relay and the changes endpoint.
//!
//! **What a batch's new records say** ([`changes_of`], pure): an order's
//! creation is its take (`o`) on an event without holds; on an event with
//! holds, its take when the fast path bought it (the take carries the
//! `pay_by`) or when it is a waiting list's offer (no rid: bought outright,
//! never held), else its saga's hold record (`h`, the deadline its `at_ms`),
//! so every hold's `order.created` has its deadline; a saga's take there is
//! not a change (and a saga that never finished, whose takes were all given
//! back, creates no order). A confirm (`k`), cancel (`c`) or expiry (`e`) is
//! the order's `order.confirmed`, `order.cancelled` or `order.expired`. A
//! leftover (`l`) is not an order change (the leftovers are in
//! `event.closed`'s counts).
//!
//! **A take given back** (`v`, a saga's take undone) changes an order only
//! when it leaves the order with every take given back, which the ledger
//! then derives as voided (`derive`): the order never existed, its client was
//! never answered 201 for it. The batch's orders with a void are looked up
//! in `order_records` (this batch's records are in already): if the order is
//! voided and its `order.created` was written by an earlier batch,
//! `order.voided` follows it; if its take is in this batch, neither is
//! written; if no take of it is in yet (a void flushed before its take, from
//! another stream), an `order.voided` is parked as a marker, and the batch
//! that brings the take looks again (so a voided order's take creates
//! nothing). An order with a hold, confirm, cancel or expiry record is never
//! voided: its saga finished and its client was answered. On an event with
//! holds a void changes nothing: a saga's order is created there by its
//! hold record, written only once the saga finished.
//!
//! **A void taken back** (`order.restored`). A saga with two drivers can
//! give back the loser's take while the winner's take, in another bucket's
//! stream, is not flushed yet: the loser's void then finds every take it
//! knows given back and writes `order.voided`, and the winner's take,
//! flushed after, finds `order.created` there already. That batch (written
//! `careful`, since its `order.created` failed the plain insert) sees the
//! order's `order.voided` and the order standing, and writes
//! `order.restored`, once: the ledger had the order voided for that moment,
//! and now has it again; the stream says both, in that order.
//!
//! **Exactly once.** Only the records a batch wrote anew make changes (a batch
//! applied twice makes none the second time), and (subject, type) is unique:
//! a change already there (a second take of one order, in another batch)
//! fails the plain insert, and the batch is written again `careful`, which
//! skips it.
//!
//! **In order.** `seq` comes from `outbox_head`, locked first (before the
//! reads below) and held to the commit: the outbox sections of two writers
//! run one after the other, and their numbers become visible in order. Per
//! order, `order.created` comes first: a terminal change whose order has no
//! `order.created` yet is parked (`outbox_parked`) and numbered right after
//! the creation that releases it.
//!
//! Both databases run the same steps; the statements differ in how a list
//! is passed: the changes go in as the records do (arrays and `UNNEST` on
//! PostgreSQL, multi-row `VALUES` in fixed chunk sizes on SQLite), the rare
//! lists of order ids as one JSON parameter (`json_array_elements_text`,
//! `json_each`).

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Postgres, Row, Sqlite, Transaction};

use super::apply::FlushRecord;
use super::records::{CHUNKS, anonymous, chunked};
use super::{DbKind, Ledger, LedgerError};
use crate::domain::stream::RecordKind;

/// The change types, as published (`shardstock.<event>.<type>`).
pub const ORDER_CREATED: &str = "order.created";
pub const ORDER_CONFIRMED: &str = "order.confirmed";
pub const ORDER_CANCELLED: &str = "order.cancelled";
pub const ORDER_EXPIRED: &str = "order.expired";
/// An order downstream was told of (`order.created`) that the ledger then
/// found never existed: every take of its saga was given back (`v`).
pub const ORDER_VOIDED: &str = "order.voided";
/// An `order.voided` taken back: the order stands after all (see the module
/// docs, "A void taken back").
pub const ORDER_RESTORED: &str = "order.restored";
pub const EVENT_CLOSED: &str = "event.closed";

/// A change as stored: the row of `outbox_changes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Its place in the deployment's one sequence.
    pub seq: i64,
    /// `<subject>:<type>`: stable, the id consumers deduplicate by.
    pub change_id: String,
    pub event_id: String,
    /// The order id (the event id for `event.closed`).
    pub subject: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// When the change happened (unix ms).
    pub at_ms: i64,
    /// The change's body (JSON).
    pub payload: Value,
}

/// A change on its way out: a [`Change`] whose payload is the JSON text as
/// stored, for the relay to pass on as it is (parsing it only to write it
/// back was a third of the relay's work per change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub seq: i64,
    pub change_id: String,
    pub event_id: String,
    pub subject: String,
    pub kind: String,
    pub at_ms: i64,
    /// JSON text (written by `serde_json`, so compact and valid).
    pub payload: String,
}

/// A change on its way in, before it has a `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct Pending {
    pub change_id: String,
    pub event_id: String,
    pub subject: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub at_ms: i64,
    /// JSON text.
    pub payload: String,
}

impl Pending {
    pub(super) fn new(
        event: &str,
        subject: &str,
        kind: &'static str,
        at_ms: i64,
        payload: Value,
    ) -> Self {
        Self {
            change_id: format!("{subject}:{kind}"),
            event_id: event.to_owned(),
            subject: subject.to_owned(),
            kind,
            at_ms,
            payload: payload.to_string(),
        }
    }
}

/// The changes `new` records make: creations, and terminal changes, each
/// (subject, type) once, in the batch's order. `held`: the batch's events
/// that have holds.
pub(super) fn changes_of(
    new: &[&FlushRecord],
    held: &HashSet<String>,
    now_ms: i64,
) -> (Vec<Pending>, Vec<Pending>) {
    let mut seen = HashSet::new();
    let (mut created, mut terminal) = (Vec::new(), Vec::new());
    for r in new {
        let e = &r.entry;
        let order = e.order_id.as_str();
        let (kind, at_ms, payload) = match e.kind {
            // A saga's take on an event with holds: its hold record creates
            // it. A saga's take always carries its rid; one without a rid
            // and without a deadline is a waiting list's offer, bought
            // outright (`claim_offer.lua`): no hold record ever follows it.
            RecordKind::Order
                if e.pay_by.is_none() && !e.rid.is_empty() && held.contains(&r.event) =>
            {
                continue;
            }
            RecordKind::Order => {
                let mut p = json!({"user_id": e.user, "quantity": e.qty});
                if let Some(pay_by) = e.pay_by {
                    p["pay_by_ms"] = json!(pay_by);
                }
                (ORDER_CREATED, e.at_ms, p)
            }
            // A saga's hold: its `at_ms` is the deadline, not a time of change.
            RecordKind::Hold => (
                ORDER_CREATED,
                now_ms,
                json!({"user_id": e.user, "quantity": e.qty, "pay_by_ms": e.at_ms}),
            ),
            RecordKind::Confirm => (
                ORDER_CONFIRMED,
                e.at_ms,
                json!({"user_id": e.user, "quantity": e.qty}),
            ),
            RecordKind::Cancel => (
                ORDER_CANCELLED,
                e.at_ms,
                json!({"user_id": e.user, "quantity": e.qty}),
            ),
            RecordKind::Expire => (
                ORDER_EXPIRED,
                e.at_ms,
                json!({"user_id": e.user, "quantity": e.qty}),
            ),
            RecordKind::Void | RecordKind::Leftover => continue,
        };
        if !seen.insert((order, kind)) {
            continue;
        }
        let mut payload = payload;
        payload["order_id"] = json!(order);
        payload["event_id"] = json!(r.event);
        let change = Pending::new(&r.event, order, kind, at_ms, payload);
        if kind == ORDER_CREATED {
            created.push(change);
        } else {
            terminal.push(change);
        }
    }
    (created, terminal)
}

/// The changes in the order they are numbered: creations, then the terminal
/// changes they release (parked before), then the batch's terminal changes
/// whose order has its creation; the others are returned to be parked.
fn sequence(
    created: Vec<Pending>,
    released: Vec<Pending>,
    terminal: Vec<Pending>,
    has_creation: &HashSet<String>,
) -> (Vec<Pending>, Vec<Pending>) {
    let now: HashSet<String> = created.iter().map(|c| c.subject.clone()).collect();
    let (ready, parked): (Vec<Pending>, Vec<Pending>) = terminal
        .into_iter()
        .partition(|t| now.contains(&t.subject) || has_creation.contains(&t.subject));
    let mut out = created;
    out.extend(released);
    out.extend(ready);
    (out, parked)
}

fn json_list<T: Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("plain rows serialize")
}

/// A `Pending` from a row of `subject, type, change_id, event_id, at_ms, payload`.
fn pending_of<R: Row>(row: &R) -> Result<Pending, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'c> String: sqlx::Decode<'c, R::Database> + sqlx::Type<R::Database>,
    for<'c> i64: sqlx::Decode<'c, R::Database> + sqlx::Type<R::Database>,
{
    let kind: String = row.try_get(1)?;
    Ok(Pending {
        subject: row.try_get(0)?,
        kind: static_kind(&kind),
        change_id: row.try_get(2)?,
        event_id: row.try_get(3)?,
        at_ms: row.try_get(4)?,
        payload: row.try_get(5)?,
    })
}

fn static_kind(kind: &str) -> &'static str {
    match kind {
        ORDER_CREATED => ORDER_CREATED,
        ORDER_CONFIRMED => ORDER_CONFIRMED,
        ORDER_CANCELLED => ORDER_CANCELLED,
        ORDER_EXPIRED => ORDER_EXPIRED,
        ORDER_VOIDED => ORDER_VOIDED,
        _ => EVENT_CLOSED,
    }
}

/// The statements of one database (see the module docs).
struct Sql {
    lock_head: &'static str,
    /// Of a JSON list of event ids: each one's id, whether it has holds,
    /// and its release (a pool's).
    events_of: &'static str,
    set_head: &'static str,
    created_of: &'static str,
    /// Which of a JSON list of order ids have an `order.voided`.
    voided_of: &'static str,
    release: &'static str,
    park: &'static str,
    any_parked: &'static str,
    /// `order_id, kind, bucket` of the takes, voids and lifecycle records of
    /// a JSON list of order ids.
    void_check: &'static str,
}

const PG: Sql = Sql {
    lock_head: "SELECT seq FROM outbox_head WHERE id = 1 FOR UPDATE",
    events_of: "SELECT event_id, hold_seconds IS NOT NULL, release_id FROM events \
         WHERE event_id IN (SELECT value FROM json_array_elements_text($1::json))",
    set_head: "UPDATE outbox_head SET seq = $1 WHERE id = 1",
    created_of: "SELECT o.subject FROM json_array_elements_text($1::json) j JOIN outbox_changes o \
         ON right(o.subject, 8) = right(j.value, 8) AND o.subject = j.value AND o.type = 'order.created'",
    voided_of: "SELECT o.subject FROM json_array_elements_text($1::json) j JOIN outbox_changes o \
         ON right(o.subject, 8) = right(j.value, 8) AND o.subject = j.value AND o.type = 'order.voided'",
    release: "DELETE FROM outbox_parked WHERE subject IN (SELECT value FROM json_array_elements_text($1::json)) \
         RETURNING subject, type, change_id, event_id, at_ms, payload",
    park: "INSERT INTO outbox_parked (change_id, event_id, subject, type, at_ms, payload) \
         SELECT change_id, event_id, subject, type, at_ms, payload FROM json_to_recordset($1::json) \
         AS x(change_id text, event_id text, subject text, type text, at_ms int8, payload text) ON CONFLICT DO NOTHING",
    any_parked: "SELECT EXISTS (SELECT 1 FROM outbox_parked)",
    void_check: "SELECT r.order_id, r.kind, r.bucket FROM json_array_elements_text($1::json) j \
         JOIN order_records r ON r.order_id = j.value WHERE r.kind IN ('o', 'v', 'h', 'k', 'c', 'e')",
};

const SQLITE: Sql = Sql {
    lock_head: "SELECT seq FROM outbox_head WHERE id = 1",
    events_of: "SELECT event_id, hold_seconds IS NOT NULL, release_id FROM events \
         WHERE event_id IN (SELECT value FROM json_each($1))",
    set_head: "UPDATE outbox_head SET seq = $1 WHERE id = 1",
    created_of: "SELECT o.subject FROM json_each($1) j JOIN outbox_changes o \
         ON substr(o.subject, -8) = substr(j.value, -8) AND +o.subject = j.value AND o.type = 'order.created'",
    voided_of: "SELECT o.subject FROM json_each($1) j JOIN outbox_changes o \
         ON substr(o.subject, -8) = substr(j.value, -8) AND +o.subject = j.value AND o.type = 'order.voided'",
    release: "DELETE FROM outbox_parked WHERE subject IN (SELECT value FROM json_each($1)) \
         RETURNING subject, type, change_id, event_id, at_ms, payload",
    park: "INSERT INTO outbox_parked (change_id, event_id, subject, type, at_ms, payload) \
         SELECT json_extract(value, '$.change_id'), json_extract(value, '$.event_id'), json_extract(value, '$.subject'), \
         json_extract(value, '$.type'), json_extract(value, '$.at_ms'), json_extract(value, '$.payload') \
         FROM json_each($1) WHERE true ON CONFLICT DO NOTHING",
    any_parked: "SELECT EXISTS (SELECT 1 FROM outbox_parked)",
    void_check: "SELECT r.order_id, r.kind, r.bucket FROM json_each($1) j \
         JOIN order_records r ON substr(r.order_id, -8) = substr(j.value, -8) AND +r.order_id = j.value \
         WHERE r.kind IN ('o', 'v', 'h', 'k', 'c', 'e')",
};

/// A release's lines are orders of its pools (`<release>.<pool>`): their
/// changes name the release order they belong to, its release and the
/// pool (as the `orders` view does), so a consumer groups a multi-line
/// order's lines without a lookup. Only batches with pools' records pay the
/// re-serialization.
fn name_lines(changes: &mut [Pending], releases: &HashMap<String, String>) {
    for c in changes {
        let Some(release) = releases.get(&c.event_id) else {
            continue;
        };
        let (Some(line), Some(pool)) = (
            c.subject.strip_prefix(c.event_id.as_str()),
            c.event_id
                .strip_prefix(release.as_str())
                .and_then(|p| p.strip_prefix('.')),
        ) else {
            continue;
        };
        let Ok(mut payload) = serde_json::from_str::<Value>(&c.payload) else {
            continue;
        };
        payload["release_id"] = json!(release);
        payload["release_order"] = json!(format!("{release}{line}"));
        payload["pool"] = json!(pool);
        c.payload = payload.to_string();
    }
}

/// How an order with a void stands once a batch's records are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Voiding {
    /// No take of it is in yet (its void came first).
    NoTake,
    /// Every take given back: the order never existed.
    Voided,
    /// A take stands, or its saga finished (hold, confirm, cancel, expiry).
    Stands,
}

/// Each order's [`Voiding`], from its `(order_id, kind, bucket)` rows.
fn voidings(rows: &[(String, String, i64)]) -> HashMap<&str, Voiding> {
    let mut by_order: HashMap<&str, Vec<(&str, i64)>> = Default::default();
    for (order, kind, bucket) in rows {
        by_order
            .entry(order.as_str())
            .or_default()
            .push((kind.as_str(), *bucket));
    }
    by_order
        .into_iter()
        .map(|(order, recs)| {
            let voided = |b: i64| recs.iter().any(|&(k, vb)| k == "v" && vb == b);
            let takes: Vec<i64> = recs.iter().filter(|r| r.0 == "o").map(|r| r.1).collect();
            let v = if recs.iter().any(|r| matches!(r.0, "h" | "k" | "c" | "e")) {
                Voiding::Stands
            } else if takes.is_empty() {
                Voiding::NoTake
            } else if takes.iter().all(|&b| voided(b)) {
                Voiding::Voided
            } else {
                Voiding::Stands
            };
            (order, v)
        })
        .collect()
}

/// The batch's voids, one `order.voided` per order (the first void's), on
/// events without holds (with holds, a saga's order is created by its hold
/// record, written only when the saga finished: a void there only gives
/// back a losing take).
fn voids_of(new: &[&FlushRecord], held: &HashSet<String>) -> Vec<Pending> {
    let mut seen = HashSet::new();
    new.iter()
        .filter(|r| r.entry.kind == RecordKind::Void && !held.contains(&r.event))
        .filter(|r| seen.insert(r.entry.order_id.as_str()))
        .map(|r| {
            let e = &r.entry;
            let payload = json!({
                "user_id": e.user,
                "quantity": e.qty,
                "order_id": e.order_id,
                "event_id": r.event,
            });
            Pending::new(&r.event, &e.order_id, ORDER_VOIDED, e.at_ms, payload)
        })
        .collect()
}

/// Writes `created` and `terminal` into the outbox in the open transaction:
/// lock the head, find which terminal changes have their creation, release
/// parked ones, number and insert, park the rest. Returns the changes
/// numbered.
macro_rules! write_changes {
    ($name:ident, $db:ty, $sql:expr, $insert:ident) => {
        pub(super) async fn $name(
            tx: &mut Transaction<'_, $db>,
            new: &[&FlushRecord],
            now_ms: i64,
            careful: bool,
        ) -> Result<usize, LedgerError> {
            if new.iter().all(|r| r.entry.kind == RecordKind::Leftover) {
                return Ok(0);
            }
            let sql: &Sql = &$sql;
            let head: i64 = sqlx::query_scalar(sql.lock_head)
                .fetch_one(&mut **tx)
                .await?;
            let events: HashSet<&str> = new.iter().map(|r| r.event.as_str()).collect();
            let events: Vec<&str> = events.into_iter().collect();
            let rows: Vec<(String, bool, Option<String>)> = sqlx::query_as(sql.events_of)
                .bind(json_list(&events))
                .fetch_all(&mut **tx)
                .await?;
            let held: HashSet<String> = rows.iter().filter(|r| r.1).map(|r| r.0.clone()).collect();
            let releases: HashMap<String, String> = rows
                .into_iter()
                .filter_map(|(event, _, release)| Some((event, release?)))
                .collect();
            let (mut created, mut terminal) = changes_of(new, &held, now_ms);
            let mut voids = voids_of(new, &held);
            if !releases.is_empty() {
                for changes in [&mut created, &mut terminal, &mut voids] {
                    name_lines(changes, &releases);
                }
            }
            let mut has_creation = HashSet::new();
            if !terminal.is_empty() {
                let subjects: Vec<&str> = terminal.iter().map(|t| t.subject.as_str()).collect();
                for s in sqlx::query_scalar::<_, String>(sql.created_of)
                    .bind(json_list(&subjects))
                    .fetch_all(&mut **tx)
                    .await?
                {
                    has_creation.insert(s);
                }
            }
            let mut released = Vec::new();
            // Almost always nothing is parked: one probe instead of a lookup
            // of every created order.
            let parked_any = !created.is_empty()
                && sqlx::query_scalar::<_, bool>(sql.any_parked)
                    .fetch_one(&mut **tx)
                    .await?;
            if parked_any {
                let subjects: Vec<&str> = created.iter().map(|c| c.subject.as_str()).collect();
                for row in sqlx::query(sql.release)
                    .bind(json_list(&subjects))
                    .fetch_all(&mut **tx)
                    .await?
                {
                    released.push(pending_of(&row)?);
                }
                // Per order, in the order they happened.
                released.sort_by_key(|p| (p.subject.clone(), p.at_ms));
            }
            // Voids: a parked `order.voided` is a marker (its void came
            // before the take this batch brings), looked at again with the
            // batch's own voids.
            let (markers, released): (Vec<Pending>, Vec<Pending>) =
                released.into_iter().partition(|p| p.kind == ORDER_VOIDED);
            for m in markers {
                if !voids.iter().any(|v| v.subject == m.subject) {
                    voids.push(m);
                }
            }
            let mut voided = Vec::new();
            let mut park_voids = Vec::new();
            if !voids.is_empty() {
                let subjects: Vec<&str> = voids.iter().map(|v| v.subject.as_str()).collect();
                let rows: Vec<(String, String, i64)> = sqlx::query_as(sql.void_check)
                    .bind(json_list(&subjects))
                    .fetch_all(&mut **tx)
                    .await?;
                let stands = voidings(&rows);
                let announced: HashSet<String> = sqlx::query_scalar::<_, String>(sql.created_of)
                    .bind(json_list(&subjects))
                    .fetch_all(&mut **tx)
                    .await?
                    .into_iter()
                    .collect();
                for v in voids {
                    match stands
                        .get(v.subject.as_str())
                        .copied()
                        .unwrap_or(Voiding::NoTake)
                    {
                        Voiding::Stands => {}
                        Voiding::NoTake => park_voids.push(v),
                        Voiding::Voided => {
                            // Its take in this batch creates nothing; one
                            // already announced is taken back, after it.
                            created.retain(|c| c.subject != v.subject);
                            if announced.contains(&v.subject) {
                                voided.push(v);
                            }
                        }
                    }
                }
            }
            // A void taken back: only a batch written `careful` can bring
            // a take whose order was announced (its `order.created` makes
            // the plain insert fail), so the fast path never looks.
            let mut restored = Vec::new();
            if careful && !created.is_empty() {
                let subjects: Vec<&str> = created.iter().map(|c| c.subject.as_str()).collect();
                let was_voided: Vec<String> = sqlx::query_scalar(sql.voided_of)
                    .bind(json_list(&subjects))
                    .fetch_all(&mut **tx)
                    .await?;
                if !was_voided.is_empty() {
                    let rows: Vec<(String, String, i64)> = sqlx::query_as(sql.void_check)
                        .bind(json_list(&was_voided))
                        .fetch_all(&mut **tx)
                        .await?;
                    let stands = voidings(&rows);
                    for c in &created {
                        if was_voided.contains(&c.subject)
                            && stands.get(c.subject.as_str()) == Some(&Voiding::Stands)
                            && !restored.iter().any(|r: &Pending| r.subject == c.subject)
                        {
                            restored.push(Pending {
                                change_id: format!("{}:{ORDER_RESTORED}", c.subject),
                                kind: ORDER_RESTORED,
                                ..c.clone()
                            });
                        }
                    }
                }
            }
            let (mut ordered, mut parked) = sequence(created, released, terminal, &has_creation);
            ordered.extend(voided);
            ordered.extend(restored);
            parked.extend(park_voids);
            if !parked.is_empty() {
                sqlx::query(sql.park)
                    .bind(json_list(&parked))
                    .execute(&mut **tx)
                    .await?;
            }
            if ordered.is_empty() {
                return Ok(0);
            }
            sqlx::query(sql.set_head)
                .bind(head + ordered.len() as i64)
                .execute(&mut **tx)
                .await?;
            $insert(tx, &ordered, head + 1, careful).await
        }
    };
}
write_changes!(write_pg, Postgres, PG, insert_pg);
write_changes!(write_sqlite, Sqlite, SQLITE, insert_sqlite);

/// Inserts `changes` numbered from `first`: one `INSERT … SELECT FROM
/// UNNEST(…)` of seven arrays. Plain, as the records' fast insert: a change
/// already there (a second take of one order in another batch) fails the
/// statement and the batch is written again `careful`, skipping it (`ON
/// CONFLICT DO NOTHING` costs PostgreSQL a speculative insertion a row:
/// 6.9 µs against 4.1 a row of this table, in one 100,000-row statement).
async fn insert_pg(
    tx: &mut Transaction<'_, Postgres>,
    changes: &[Pending],
    first: i64,
    careful: bool,
) -> Result<usize, LedgerError> {
    const PLAIN: &str = "INSERT INTO outbox_changes (seq, change_id, event_id, subject, type, at_ms, payload) \
         SELECT * FROM UNNEST($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[])";
    const SKIPPING: &str = "INSERT INTO outbox_changes (seq, change_id, event_id, subject, type, at_ms, payload) \
         SELECT * FROM UNNEST($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[]) \
         ON CONFLICT DO NOTHING";
    let seqs: Vec<i64> = (first..).take(changes.len()).collect();
    let text = |f: fn(&Pending) -> &str| changes.iter().map(f).collect::<Vec<&str>>();
    let written = sqlx::query(if careful { SKIPPING } else { PLAIN })
        .bind(seqs)
        .bind(text(|c| &c.change_id))
        .bind(text(|c| &c.event_id))
        .bind(text(|c| &c.subject))
        .bind(text(|c| c.kind))
        .bind(changes.iter().map(|c| c.at_ms).collect::<Vec<i64>>())
        .bind(text(|c| &c.payload))
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(written as usize)
}

/// The text of SQLite's insert of `rows` changes (one of the records'
/// chunk sizes, so the connection prepares each once), plain or skipping
/// changes already there.
fn sqlite_insert(rows: usize, careful: bool) -> &'static str {
    static TEXTS: OnceLock<Vec<[String; 2]>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        CHUNKS
            .iter()
            .map(|&n| {
                let plain = format!(
                    "INSERT INTO outbox_changes (seq, change_id, event_id, subject, type, at_ms, payload) VALUES {}",
                    anonymous(n, 7)
                );
                let careful = format!("{plain} ON CONFLICT DO NOTHING");
                [plain, careful]
            })
            .collect()
    });
    let at = CHUNKS
        .iter()
        .position(|&n| n == rows)
        .expect("a chunk has one of the CHUNKS sizes");
    &texts[at][usize::from(careful)]
}

/// Inserts `changes` numbered from `first`: multi-row `VALUES` in the
/// records' chunk sizes, plain unless `careful` (as [`insert_pg`]).
async fn insert_sqlite(
    tx: &mut Transaction<'_, Sqlite>,
    changes: &[Pending],
    first: i64,
    careful: bool,
) -> Result<usize, LedgerError> {
    let numbered: Vec<(i64, &Pending)> = (first..).zip(changes).collect();
    let mut written = 0;
    for chunk in chunked(&numbered) {
        let mut q = sqlx::query(AssertSqlSafe(sqlite_insert(chunk.len(), careful)));
        for (seq, c) in chunk {
            q = q
                .bind(*seq)
                .bind(c.change_id.as_str())
                .bind(c.event_id.as_str())
                .bind(c.subject.as_str())
                .bind(c.kind)
                .bind(c.at_ms)
                .bind(c.payload.as_str());
        }
        written += q.execute(&mut **tx).await?.rows_affected();
    }
    Ok(written as usize)
}

/// The columns of a [`Change`], in [`outgoing_of`]'s order.
const CHANGE_COLUMNS: &str = "seq, change_id, event_id, subject, type, at_ms, payload";

fn outgoing_of(row: &sqlx::any::AnyRow) -> Result<Outgoing, LedgerError> {
    Ok(Outgoing {
        seq: row.try_get(0)?,
        change_id: row.try_get(1)?,
        event_id: row.try_get(2)?,
        subject: row.try_get(3)?,
        kind: row.try_get(4)?,
        at_ms: row.try_get(5)?,
        payload: row.try_get(6)?,
    })
}

impl Outgoing {
    /// The change with its payload parsed: what the changes endpoint serves.
    fn parsed(self) -> Result<Change, LedgerError> {
        let payload = serde_json::from_str(&self.payload)
            .map_err(|e| LedgerError::Data(format!("outbox payload of seq {}: {e}", self.seq)))?;
        Ok(Change {
            seq: self.seq,
            change_id: self.change_id,
            event_id: self.event_id,
            subject: self.subject,
            kind: self.kind,
            at_ms: self.at_ms,
            payload,
        })
    }
}

/// How far a relay target is behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Changes after the target's cursor (at most: sequence numbers may skip).
    pub changes: i64,
    /// The first of them: when it happened (unix ms).
    pub oldest_ms: Option<i64>,
}

impl Ledger {
    /// Writes `event.closed` with the event's final counts, in the close's
    /// transaction (`close_event`).
    pub(super) async fn write_closed(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        event: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let lock = match self.kind {
            DbKind::Postgres => PG.lock_head,
            DbKind::Sqlite => SQLITE.lock_head,
        };
        let head: i64 = sqlx::query_scalar(lock).fetch_one(&mut **tx).await?;
        let row = sqlx::query(
            "SELECT stock, sold, released, leftover, guard_violations FROM event_totals WHERE event_id = $1",
        )
        .bind(event)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            return Ok(());
        };
        let (stock, sold, released, leftover, violations): (i64, i64, i64, i64, i64) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
            row.try_get(4)?,
        );
        let payload = json!({
            "event_id": event,
            "stock": stock,
            "sold": sold,
            "released": released,
            "net_sold": sold - released,
            "leftover": leftover,
            "guard_violations": violations,
        });
        let change = Pending::new(event, event, EVENT_CLOSED, now_ms, payload);
        let seq = head + 1;
        sqlx::query("UPDATE outbox_head SET seq = $1 WHERE id = 1")
            .bind(seq)
            .execute(&mut **tx)
            .await?;
        sqlx::query(
            "INSERT INTO outbox_changes (seq, change_id, event_id, subject, type, at_ms, payload) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(seq)
        .bind(&change.change_id)
        .bind(&change.event_id)
        .bind(&change.subject)
        .bind(change.kind)
        .bind(change.at_ms)
        .bind(&change.payload)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Changes after `after` in sequence order, at most `limit`: of one event,
    /// or of all (`None`).
    pub async fn changes(
        &self,
        event: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Change>, LedgerError> {
        self.read_outgoing(event, after, limit)
            .await?
            .into_iter()
            .map(Outgoing::parsed)
            .collect()
    }

    /// Changes after `after` in sequence order, at most `limit`, their
    /// payloads unparsed: what the relay publishes.
    pub async fn outgoing(&self, after: i64, limit: i64) -> Result<Vec<Outgoing>, LedgerError> {
        self.read_outgoing(None, after, limit).await
    }

    async fn read_outgoing(
        &self,
        event: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Outgoing>, LedgerError> {
        let rows = match event {
            Some(event) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {CHANGE_COLUMNS} FROM outbox_changes WHERE event_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
                )))
                .bind(event)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {CHANGE_COLUMNS} FROM outbox_changes WHERE seq > $1 ORDER BY seq LIMIT $2"
                )))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(outgoing_of).collect()
    }

    /// The changes after `after`: how many (the numbers handed out since,
    /// which may skip: at most that many), and when the first happened. Two
    /// index lookups, whatever the backlog: the relay asks every round, and
    /// counting the rows made each round cost the backlog's length (50,000
    /// changes behind, the relay spent more on counting than on publishing).
    pub async fn backlog(&self, after: i64) -> Result<Backlog, LedgerError> {
        let row = sqlx::query(
            "SELECT COALESCE((SELECT seq - $1 FROM outbox_head WHERE id = 1 AND seq > $1), 0), \
             (SELECT at_ms FROM outbox_changes WHERE seq > $1 ORDER BY seq LIMIT 1)",
        )
        .bind(after)
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            changes: row.try_get(0)?,
            oldest_ms: row.try_get(1)?,
        })
    }

    /// Prunes the outbox from its oldest change on, in sequence order, and
    /// stops at the first change it must keep. A change goes when it
    /// happened before `any_before_ms` (the retention: the outbox stays
    /// bounded while a target is down), or before `delivered_before_ms` (the
    /// replay window of the changes endpoint) if every target has it
    /// (`delivered_upto`: the lowest target cursor; `None` without targets).
    /// Parked changes older than the retention go too. Returns the changes
    /// pruned.
    pub async fn prune_outbox(
        &self,
        any_before_ms: i64,
        delivered_before_ms: i64,
        delivered_upto: Option<i64>,
    ) -> Result<u64, LedgerError> {
        const CHUNK: i64 = 1_000;
        let upto = delivered_upto.unwrap_or(i64::MAX);
        let mut pruned = 0;
        loop {
            let rows = sqlx::query("SELECT seq, at_ms FROM outbox_changes ORDER BY seq LIMIT $1")
                .bind(CHUNK)
                .fetch_all(&self.pool)
                .await?;
            let mut last = None;
            for row in &rows {
                let (seq, at_ms): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
                let goes = at_ms < any_before_ms || (at_ms < delivered_before_ms && seq <= upto);
                if !goes {
                    break;
                }
                last = Some(seq);
            }
            let Some(last) = last else { break };
            pruned += sqlx::query("DELETE FROM outbox_changes WHERE seq <= $1")
                .bind(last)
                .execute(&self.pool)
                .await?
                .rows_affected();
            if rows.len() < CHUNK as usize
                || rows.last().and_then(|r| r.try_get::<i64, _>(0).ok()) != Some(last)
            {
                break;
            }
        }
        sqlx::query("DELETE FROM outbox_parked WHERE at_ms < $1")
            .bind(any_before_ms)
            .execute(&self.pool)
            .await?;
        Ok(pruned)
    }

    /// The lowest cursor of `targets` (0 for one never seen); `None` without
    /// targets.
    pub async fn lowest_cursor(&self, targets: &[String]) -> Result<Option<i64>, LedgerError> {
        let mut lowest = None;
        for target in targets {
            let cursor = self.outbox_cursor(target).await?;
            lowest = Some(lowest.map_or(cursor, |l: i64| l.min(cursor)));
        }
        Ok(lowest)
    }

    /// Terminal changes waiting for their order's creation.
    pub async fn parked_changes(&self) -> Result<i64, LedgerError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM outbox_parked")
            .fetch_one(&self.pool)
            .await?)
    }

    /// The change ids of `event`'s terminal changes still waiting for their
    /// order's creation: [`Ledger::parked_changes`] counts the whole
    /// deployment's, and a check of one event (the fault schedules share one
    /// database across events and backends) needs its own.
    pub async fn parked_changes_of(&self, event: &str) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            "SELECT change_id FROM outbox_parked WHERE event_id = $1 ORDER BY change_id",
        )
        .bind(event)
        .fetch_all(&self.pool)
        .await?)
    }

    /// A relay target's cursor: every change up to it is delivered; 0 for a
    /// target never seen.
    pub async fn outbox_cursor(&self, target: &str) -> Result<i64, LedgerError> {
        Ok(
            sqlx::query_scalar("SELECT seq FROM outbox_cursors WHERE target = $1")
                .bind(target)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    /// Moves a target's cursor to `seq`, fenced by the relay leader's `term`:
    /// false (nothing written) when a leader of a newer term has written it.
    pub async fn mark_outbox(
        &self,
        target: &str,
        seq: i64,
        term: i64,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "INSERT INTO outbox_cursors (target, seq, term, updated_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (target) DO UPDATE SET seq = excluded.seq, term = excluded.term, updated_ms = excluded.updated_ms \
             WHERE outbox_cursors.term <= excluded.term",
        )
        .bind(target)
        .bind(seq)
        .bind(term)
        .bind(now_ms)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::stream::{StreamEntry, StreamId};

    fn rec(kind: RecordKind, order: &str, seq: u64) -> FlushRecord {
        FlushRecord {
            stream: "e#0#0".into(),
            event: "e".into(),
            entry: StreamEntry {
                id: StreamId { ms: 1, seq },
                kind,
                order_id: order.into(),
                user: "u".into(),
                qty: 2,
                bucket: 0,
                home: 0,
                rid: String::new(),
                at_ms: 1_000 + seq as i64,
                pay_by: None,
                part: 0,
            },
        }
    }

    #[test]
    fn records_make_one_change_per_order_and_type() {
        let mut held = rec(RecordKind::Order, "a", 1);
        held.entry.pay_by = Some(9_000);
        let all = [
            held,
            rec(RecordKind::Order, "a", 2),
            rec(RecordKind::Void, "a", 3),
            rec(RecordKind::Confirm, "a", 4),
            rec(RecordKind::Cancel, "b", 5),
            rec(RecordKind::Leftover, "", 6),
            rec(RecordKind::Expire, "c", 7),
        ];
        let new: Vec<&FlushRecord> = all.iter().collect();
        let (created, terminal) = changes_of(&new, &HashSet::new(), 5);
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].change_id, "a:order.created");
        let payload: Value = serde_json::from_str(&created[0].payload).unwrap();
        assert_eq!(payload["pay_by_ms"], 9_000);
        assert_eq!(payload["quantity"], 2);
        let kinds: Vec<&str> = terminal.iter().map(|t| t.change_id.as_str()).collect();
        assert_eq!(
            kinds,
            ["a:order.confirmed", "b:order.cancelled", "c:order.expired"]
        );
    }

    #[test]
    fn on_an_event_with_holds_a_sagas_hold_record_creates_its_order() {
        let mut fast = rec(RecordKind::Order, "a", 1);
        fast.entry.pay_by = Some(9_000);
        let mut hold = rec(RecordKind::Hold, "b", 3);
        hold.entry.at_ms = 7_000;
        let mut take = rec(RecordKind::Order, "b", 2);
        take.entry.rid = "u/r".into();
        let all = [fast, take, hold];
        let new: Vec<&FlushRecord> = all.iter().collect();
        let held: HashSet<String> = ["e".to_owned()].into();
        let (created, _) = changes_of(&new, &held, 5);
        let deadlines: Vec<(String, Value)> = created
            .iter()
            .map(|c| {
                let p: Value = serde_json::from_str(&c.payload).unwrap();
                (c.subject.clone(), p["pay_by_ms"].clone())
            })
            .collect();
        assert_eq!(
            deadlines,
            [
                ("a".to_owned(), json!(9_000)),
                ("b".to_owned(), json!(7_000))
            ]
        );
        // Without holds, the take creates its order.
        let (created, _) = changes_of(&new[1..2], &HashSet::new(), 5);
        assert_eq!(created[0].change_id, "b:order.created");
    }

    /// A waiting list's offer (no rid, no deadline) on an event with holds
    /// is bought outright: its take creates it (before, it was taken for a
    /// saga's and never created, and a cancel of it stayed parked).
    #[test]
    fn on_an_event_with_holds_an_offers_order_is_created_by_its_take() {
        let all = [
            rec(RecordKind::Order, "offer", 1),
            rec(RecordKind::Cancel, "offer", 2),
        ];
        let new: Vec<&FlushRecord> = all.iter().collect();
        let held: HashSet<String> = ["e".to_owned()].into();
        let (created, terminal) = changes_of(&new, &held, 5);
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].change_id, "offer:order.created");
        let payload: Value = serde_json::from_str(&created[0].payload).unwrap();
        assert!(payload.get("pay_by_ms").is_none(), "{payload}");
        assert_eq!(terminal[0].change_id, "offer:order.cancelled");
    }

    #[test]
    fn a_terminal_change_waits_for_its_orders_creation() {
        let all = [
            rec(RecordKind::Order, "a", 1),
            rec(RecordKind::Cancel, "a", 2),
            rec(RecordKind::Cancel, "b", 3),
            rec(RecordKind::Expire, "c", 4),
        ];
        let new: Vec<&FlushRecord> = all.iter().collect();
        let (created, terminal) = changes_of(&new, &HashSet::new(), 5);
        let before: HashSet<String> = ["c".to_owned()].into();
        let released = vec![Pending::new("e", "a", ORDER_CONFIRMED, 0, json!({}))];
        let (ordered, parked) = sequence(created, released, terminal, &before);
        let ids: Vec<&str> = ordered.iter().map(|c| c.change_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "a:order.created",
                "a:order.confirmed",
                "a:order.cancelled",
                "c:order.expired"
            ]
        );
        assert_eq!(parked.len(), 1);
        assert_eq!(parked[0].change_id, "b:order.cancelled");
    }
}
