//! Reading the ledger: orders, events, totals, the audit's view, and what a
//! recovery needs to rebuild buckets. Orders are derived from their records
//! here (`derive`), by the rule the `orders` view states for other readers.

use std::collections::{HashMap, HashSet};

use sqlx::{Row, any::AnyRow};

use super::derive::{self, Rec, Status};
use super::{DbKind, Ledger, LedgerError};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::model::{BucketRange, EventSpec, OrderStatus, OrderView};
use crate::domain::release::release_order_id;
use crate::domain::stream::StreamId;
use crate::domain::token::Access;

/// An event as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbEvent {
    /// Its spec as registered; a `token` event's without its keys (the
    /// ledger does not keep them: `tokens` is `None`, `token_access` says).
    pub spec: EventSpec,
    pub closed: bool,
    /// Sells by access token (migration 0011: `token`, or `draw`, whose
    /// winners buy with tokens): not to be rebuilt from this spec, which
    /// would sell to anyone.
    pub token_access: bool,
    /// Its access mode as registered (the view of an archived event shows it).
    pub access: Access,
}

/// An event's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub stock: u64,
    pub sold: u64,
    pub released: u64,
    pub leftover: u64,
    /// Violations of the guard, counting a pending one (`guard_pending`).
    pub guard_violations: u64,
    /// The sale is open and its flushed records are over the stock: one of
    /// `guard_violations` unless a release still in a stream covers it (see
    /// `apply`).
    pub guard_pending: bool,
}

/// `stock, sold, released, leftover, guard_violations` and the event's status.
const TOTALS: &str = "SELECT t.stock, t.sold, t.released, t.leftover, t.guard_violations, COALESCE(e.status, 'on_sale') \
     FROM event_totals t LEFT JOIN events e ON e.event_id = t.event_id WHERE t.event_id = $1";

fn totals_from(row: &AnyRow) -> Result<Totals, LedgerError> {
    let mut t = Totals {
        stock: u(row, 0)?,
        sold: u(row, 1)?,
        released: u(row, 2)?,
        leftover: u(row, 3)?,
        guard_violations: u(row, 4)?,
        guard_pending: false,
    };
    let open = row.try_get::<String, _>(5)? != "closed";
    t.guard_pending = open && (t.sold + t.leftover).saturating_sub(t.released) > t.stock;
    t.guard_violations += u64::from(t.guard_pending);
    Ok(t)
}

/// A confirmed order, for rebuilding buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbOrder {
    pub order_id: String,
    pub user: String,
    pub qty: u64,
    pub bucket: u64,
    pub request_id: String,
    pub at_ms: i64,
    /// A hold not confirmed yet: its pay-by deadline (a rebuild keeps it held).
    pub(crate) held_until: Option<i64>,
}

/// One order of an event and every record the ledger has of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderHistory {
    pub order_id: String,
    /// The order as derived (`None`: its only take was voided, or it has no
    /// take nor release yet).
    pub order: Option<OrderView>,
    /// `(kind, quantity)` of each record, in stream order within a stream.
    pub records: Vec<(String, u64)>,
}

/// The order `records` (all of one order id) make, as the service shows it;
/// `release`: the event is a pool of that release, the order one of its lines.
fn view_of(
    id: OrderId,
    event: &EventId,
    release: Option<&EventId>,
    records: &[Rec],
) -> Result<Option<OrderView>, LedgerError> {
    let Some((rec, bucket, status)) = derive::derive(records) else {
        return Ok(None);
    };
    let status = match status {
        Status::Confirmed => OrderStatus::Confirmed,
        Status::Cancelled => OrderStatus::Cancelled,
        Status::Held => OrderStatus::Held,
        Status::Expired => OrderStatus::Expired,
        Status::Voided => return Ok(None), // the take never became this order
    };
    Ok(Some(OrderView {
        event_id: event.clone(),
        user_id: UserId::parse(rec.user.clone())
            .map_err(|e| LedgerError::Data(format!("user {:?}: {e}", rec.user)))?,
        quantity: rec.qty.max(0) as u32,
        bucket: bucket.max(0) as u32,
        status,
        request_id: Some(rec.rid.clone()).filter(|r| !r.is_empty()),
        created_at: Some(rec.at_ms),
        pay_by: derive::pay_by(records),
        release_order: release.map(|r| release_order_id(&id, event, r)),
        order_id: id,
    }))
}

/// What the audit reads from the ledger for one snapshot of the buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditDb {
    pub totals: Totals,
    /// Stream records the buckets still hold that the ledger already has.
    pub already: HashSet<(String, StreamId)>,
}

/// One stream as the audit saw it in Redis.
#[derive(Debug, Clone)]
pub struct StreamCut {
    pub stream: String,
    /// Records after this id were written after the buckets were read…
    pub last: StreamId,
    /// …unless they are older than the read (the store's clock, ms; 0: no
    /// such check): the stream never generated them, the store lost them
    /// (a partial loss), and the audit counts them as the ledger has them.
    pub(crate) read_ms: i64,
    /// Ids still in the stream.
    pub(crate) present: Vec<StreamId>,
}

fn u(row: &AnyRow, i: usize) -> Result<u64, LedgerError> {
    Ok(row.try_get::<i64, _>(i)?.max(0) as u64)
}

fn event_from(row: &AnyRow) -> Result<DbEvent, LedgerError> {
    let name = row.try_get::<String, _>(11)?;
    let access =
        Access::parse(&name).ok_or_else(|| LedgerError::Data(format!("access mode {name:?}")))?;
    let id: String = row.try_get(0)?;
    Ok(DbEvent {
        spec: EventSpec {
            id: EventId::parse(id.clone())
                .map_err(|e| LedgerError::Data(format!("event id {id:?}: {e}")))?,
            stock: u(row, 1)?,
            buckets: u(row, 2)? as u32,
            per_user_limit: row.try_get::<Option<i64>, _>(3)?.map(|l| l as u32),
            max_per_order: u(row, 4)? as u32,
            starts_at: row.try_get(5)?,
            ends_at: row.try_get(6)?,
            hold_seconds: row.try_get::<Option<i64>, _>(8)?.map(|s| s as u32),
            auto_buckets: match (
                row.try_get::<Option<i64>, _>(9)?,
                row.try_get::<Option<i64>, _>(10)?,
            ) {
                (Some(min), Some(max)) => Some(BucketRange {
                    min: min as u32,
                    max: max as u32,
                }),
                _ => None,
            },
            tokens: None,
            draw: None,
        },
        closed: row.try_get::<String, _>(7)? == "closed",
        token_access: access != Access::Open,
        access,
    })
}

const EVENT_COLUMNS: &str = "event_id, stock, buckets, per_user_limit, max_per_order, starts_ms, ends_ms, status, hold_seconds, buckets_min, buckets_max, access";

impl Ledger {
    pub async fn event(&self, id: &EventId) -> Result<Option<DbEvent>, LedgerError> {
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE event_id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(event_from).transpose()
    }

    pub async fn events(&self) -> Result<Vec<DbEvent>, LedgerError> {
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY event_id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from).collect()
    }

    /// The release `event` is a pool of (`events.release_id`, migration
    /// 0010), `None` for a plain event. A release id has no `.`, so a pool's
    /// event id has one: an id without costs no read.
    pub async fn release_of(&self, event: &EventId) -> Result<Option<EventId>, LedgerError> {
        if !event.as_str().contains('.') {
            return Ok(None);
        }
        let release: Option<Option<String>> =
            sqlx::query_scalar("SELECT release_id FROM events WHERE event_id = $1")
                .bind(event.as_str())
                .fetch_optional(&self.pool)
                .await?;
        release
            .flatten()
            .map(|r| {
                EventId::parse(r.clone())
                    .map_err(|e| LedgerError::Data(format!("release id {r:?}: {e}")))
            })
            .transpose()
    }

    pub async fn totals(&self, event: &EventId) -> Result<Option<Totals>, LedgerError> {
        let row = sqlx::query(TOTALS)
            .bind(event.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(totals_from).transpose()
    }

    /// An order as flushed, derived from all its records (`derive`).
    pub async fn order(
        &self,
        id: &OrderId,
        event: &EventId,
    ) -> Result<Option<OrderView>, LedgerError> {
        // SQLite indexes an order by its id's last 8 characters (migration
        // 0007): the lookup names them, or it would scan the table. The `+`
        // keeps SQLite from substituting the id into that term (its constant
        // propagation), which would leave no term for the index.
        let by_id = match self.kind {
            DbKind::Postgres => "order_id = $1",
            DbKind::Sqlite => "substr(order_id, -8) = substr($1, -8) AND +order_id = $1",
        };
        let sql = format!(
            "SELECT {} FROM order_records WHERE {by_id}",
            derive::COLUMNS
        );
        let records = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(Rec::from_row)
            .collect::<Result<Vec<_>, _>>()?;
        if records.is_empty() {
            return Ok(None);
        }
        let release = self.release_of(event).await?;
        view_of(id.clone(), event, release.as_ref(), &records)
    }

    /// Every order of `event` (of `user` alone when given) as the ledger
    /// derives it, with every record each one has: what the order lookups
    /// answer after a close, and what a check from the database alone reads
    /// (an order with two records that end it differently is a defect
    /// whatever the totals say).
    pub async fn order_histories(
        &self,
        event: &EventId,
        user: Option<&UserId>,
    ) -> Result<Vec<OrderHistory>, LedgerError> {
        let by_user = if user.is_some() {
            " AND user_id = $2"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {} FROM order_records WHERE stream_no IN \
             (SELECT stream_no FROM ledger_streams WHERE event_id = $1) AND kind IN ('o', 'c', 'v', 'h', 'k', 'e'){by_user}",
            derive::COLUMNS
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(event.as_str());
        if let Some(u) = user {
            query = query.bind(u.as_str());
        }
        let mut by_order: HashMap<String, Vec<Rec>> = HashMap::new();
        for row in query.fetch_all(&self.pool).await? {
            let rec = Rec::from_row(&row)?;
            by_order.entry(rec.order_id.clone()).or_default().push(rec);
        }
        let release = self.release_of(event).await?;
        let mut out = Vec::with_capacity(by_order.len());
        for (oid, mut records) in by_order {
            records.sort_by_key(|r| r.key);
            let order = view_of(
                OrderId::from_stored(&oid),
                event,
                release.as_ref(),
                &records,
            )?;
            out.push(OrderHistory {
                order_id: oid,
                order,
                records: records
                    .iter()
                    .map(|r| (r.kind.clone(), r.qty.max(0) as u64))
                    .collect(),
            });
        }
        out.sort_unstable_by(|a, b| a.order_id.cmp(&b.order_id));
        Ok(out)
    }

    /// The order a client's request made in `event`, by the request id it
    /// sent (request ids are the user's own: two users' equal ids are two
    /// requests). What a retry learns once the store no longer answers: the
    /// event closed, or the store lost its state. `None`: no order of the
    /// event carries it (the request was refused, or bought nothing yet).
    pub async fn order_by_request(
        &self,
        event: &EventId,
        user: &UserId,
        request_id: &str,
    ) -> Result<Option<OrderView>, LedgerError> {
        Ok(self
            .order_histories(event, Some(user))
            .await?
            .into_iter()
            .filter_map(|h| h.order)
            .find(|o| o.request_id.as_deref() == Some(request_id)))
    }

    /// The highest bucket-layout generation any record of the event came from.
    pub(crate) async fn max_generation(&self, event: &EventId) -> Result<Option<u32>, LedgerError> {
        let rows = sqlx::query("SELECT stream FROM ledger_streams WHERE event_id = $1")
            .bind(event.as_str())
            .fetch_all(&self.pool)
            .await?;
        let mut max = None;
        for row in &rows {
            let stream: String = row.try_get(0)?;
            let generation = stream
                .rsplit('#')
                .nth(1)
                .and_then(|g| g.parse::<u32>().ok());
            max = max.max(generation);
        }
        Ok(max)
    }

    /// Confirmed orders of an event (what a rebuilt bucket must remember):
    /// its records read stream by stream, each order derived (`derive`).
    pub async fn confirmed_orders(&self, event: &EventId) -> Result<Vec<DbOrder>, LedgerError> {
        let sql = format!(
            "SELECT {} FROM order_records WHERE kind IN ('o', 'c', 'v', 'h', 'k', 'e') AND stream_no IN \
             (SELECT stream_no FROM ledger_streams WHERE event_id = $1)",
            derive::COLUMNS
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(event.as_str())
            .fetch_all(&self.pool)
            .await?;
        let mut by_order: HashMap<String, Vec<Rec>> = HashMap::new();
        for row in &rows {
            let rec = Rec::from_row(row)?;
            by_order.entry(rec.order_id.clone()).or_default().push(rec);
        }
        let mut out: Vec<DbOrder> = by_order
            .values()
            .filter_map(|records| match derive::derive(records)? {
                (rec, bucket, status @ (Status::Confirmed | Status::Held)) => Some(DbOrder {
                    order_id: rec.order_id.clone(),
                    user: rec.user.clone(),
                    qty: rec.qty.max(0) as u64,
                    bucket: bucket.max(0) as u64,
                    request_id: rec.rid.clone(),
                    at_ms: rec.at_ms,
                    held_until: (status == Status::Held)
                        .then(|| derive::pay_by(records))
                        .flatten(),
                }),
                _ => None,
            })
            .collect();
        out.sort_unstable_by(|a, b| a.order_id.cmp(&b.order_id));
        Ok(out)
    }

    /// The ledger's side of an audit, in one snapshot: the totals without the
    /// records written after the buckets were read, and which of the records
    /// the buckets still hold are already here.
    pub(crate) async fn audit_view(
        &self,
        event: &EventId,
        cuts: &[StreamCut],
    ) -> Result<AuditDb, LedgerError> {
        let mut tx = self.pool.begin().await?;
        if self.kind == DbKind::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await?;
        }
        let row = sqlx::query(TOTALS)
            .bind(event.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let mut view = AuditDb::default();
        if let Some(r) = row {
            view.totals = totals_from(&r)?;
        }
        let numbers: HashMap<String, i64> =
            sqlx::query("SELECT stream, stream_no FROM ledger_streams WHERE event_id = $1")
                .bind(event.as_str())
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, sqlx::Error>>()?;
        for cut in cuts {
            // A stream the ledger has no number for has no record in it.
            let Some(&no) = numbers.get(&cut.stream) else {
                continue;
            };
            // Newer: after the stream's last id, and not older than the read
            // (a record older than the read that the stream never generated
            // is a write the store lost: it stays counted, see `StreamCut`).
            let newer = sqlx::query(
                "SELECT kind, CAST(COALESCE(SUM(quantity), 0) AS BIGINT) FROM order_records \
                 WHERE stream_no = $1 AND ms >= $2 AND (ms > $2 OR seq > $3) AND ms >= $4 \
                 GROUP BY kind",
            )
            .bind(no)
            .bind(cut.last.ms as i64)
            .bind(cut.last.seq as i64)
            .bind(cut.read_ms)
            .fetch_all(&mut *tx)
            .await?;
            for r in &newer {
                let kind: String = r.try_get(0)?;
                let q = u(r, 1)?;
                let t = &mut view.totals;
                match kind.as_str() {
                    "o" => t.sold = t.sold.saturating_sub(q),
                    "c" | "v" | "e" => t.released = t.released.saturating_sub(q),
                    "l" => t.leftover = t.leftover.saturating_sub(q),
                    _ => {}
                }
            }
            let Some(first) = cut.present.iter().min() else {
                continue;
            };
            let rows = sqlx::query(
                "SELECT ms, seq FROM order_records WHERE stream_no = $1 AND ms BETWEEN $2 AND $4 \
                 AND (ms > $2 OR seq >= $3) AND (ms < $4 OR seq <= $5)",
            )
            .bind(no)
            .bind(first.ms as i64)
            .bind(first.seq as i64)
            .bind(cut.last.ms as i64)
            .bind(cut.last.seq as i64)
            .fetch_all(&mut *tx)
            .await?;
            let present: HashSet<StreamId> = cut.present.iter().copied().collect();
            for r in &rows {
                let id = StreamId {
                    ms: u(r, 0)?,
                    seq: u(r, 1)?,
                };
                if present.contains(&id) {
                    view.already.insert((cut.stream.clone(), id));
                }
            }
        }
        tx.commit().await?;
        Ok(view)
    }
}
