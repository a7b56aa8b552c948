//! The outbox (order events, `Ledger::with_outbox`) held against the
//! database alone, once a schedule settled and its close drained every
//! stream into the ledger: the changes an event's orders made are what their
//! records in the ledger say, each once, in order, and nothing is left
//! parked. The rules of what makes a change are `ledger/outbox.rs`'s (its
//! module docs); here they are read from the other side, per order as the
//! ledger derives it (`Ledger::order_histories`), not per answer a client
//! got (`checks` does that).
//!
//! A release's pools are events of their own: a line is an order of its
//! pool (a take `o`, a give-back `v`, `c` or `e`), so the same rules hold
//! there. A pool is never an event with holds (a release's holds live in its
//! home record): a held line's `order.created` has no `pay_by_ms`, and its
//! confirm writes no record in the pool, hence no `order.confirmed`.

use std::collections::{HashMap, HashSet};

use shardstock::domain::ids::EventId;
use shardstock::domain::model::OrderStatus;
use shardstock::ledger::{
    Change, EVENT_CLOSED, Ledger, ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_CREATED, ORDER_EXPIRED,
    ORDER_RESTORED, ORDER_VOIDED, OrderHistory,
};

use super::settle::Violations;

const CHECK: &str = "outbox";

/// More changes than any schedule's event makes: one read takes them all.
const ALL: i64 = 1_000_000;

/// The terminal change each kind of record makes.
const TERMINALS: &[(&str, &str)] = &[
    ("k", ORDER_CONFIRMED),
    ("c", ORDER_CANCELLED),
    ("e", ORDER_EXPIRED),
];

/// Checks `event`'s outbox against its orders in the ledger: written when
/// `on` (the rules of the module docs), empty when not. Returns how many
/// changes it read (a schedule's summary says so: a check of nothing would
/// pass too).
pub async fn check(ledger: &Ledger, event: &EventId, on: bool, v: &mut Violations) -> usize {
    let changes = ledger
        .changes(Some(event.as_str()), 0, ALL)
        .await
        .expect("the outbox's changes");
    let parked = ledger
        .parked_changes_of(event.as_str())
        .await
        .expect("the outbox's parked changes");
    if !on {
        if !changes.is_empty() || !parked.is_empty() {
            v.push((
                CHECK,
                format!(
                    "{event}: the outbox is off, yet {} changes and {} parked were written: {:?}",
                    changes.len(),
                    parked.len(),
                    ids(&changes)
                ),
            ));
        }
        return changes.len();
    }
    if !parked.is_empty() {
        v.push((
            CHECK,
            format!("{event}: changes left parked after the close: {parked:?}"),
        ));
    }
    one_sequence(event, &changes, v);
    let closed = ledger
        .event(event)
        .await
        .expect("the ledger's event")
        .is_some_and(|e| e.closed);
    closed_with_totals(ledger, event, closed, &changes, v).await;
    let histories = ledger
        .order_histories(event, None)
        .await
        .expect("the ledger's orders");
    let mut per_order: HashMap<&str, Vec<&Change>> = HashMap::new();
    for c in changes.iter().filter(|c| c.kind != EVENT_CLOSED) {
        per_order.entry(c.subject.as_str()).or_default().push(c);
    }
    for h in &histories {
        let mine = per_order.remove(h.order_id.as_str()).unwrap_or_default();
        if let Some(broken) = order_changes(h, &mine) {
            v.push((
                CHECK,
                format!(
                    "{event}: order {} ({:?}, records {:?}): {broken}; its changes {:?}",
                    h.order_id,
                    h.order.as_ref().map(|o| o.status),
                    h.records,
                    kinds(&mine)
                ),
            ));
        }
    }
    for (subject, mine) in per_order {
        v.push((
            CHECK,
            format!(
                "{event}: changes {:?} of {subject}, an order the database does not have",
                kinds(&mine)
            ),
        ));
    }
    changes.len()
}

/// Every change of the event once, by its id `<subject>:<type>`, in one
/// rising sequence.
fn one_sequence(event: &EventId, changes: &[Change], v: &mut Violations) {
    let mut seen = HashSet::new();
    let mut last = i64::MIN;
    for c in changes {
        if !seen.insert(c.change_id.as_str()) {
            v.push((CHECK, format!("{event}: change {} twice", c.change_id)));
        }
        if c.seq <= last {
            v.push((
                CHECK,
                format!("{event}: seq {} after {last} ({})", c.seq, c.change_id),
            ));
        }
        last = c.seq;
        if c.change_id != format!("{}:{}", c.subject, c.kind) || c.event_id != event.as_str() {
            v.push((CHECK, format!("{event}: a change not of its own id: {c:?}")));
        }
    }
}

/// A closed event has one `event.closed`, whose counts are the ledger's
/// totals (the close drained every stream first, so none came after it); an
/// open one has none.
async fn closed_with_totals(
    ledger: &Ledger,
    event: &EventId,
    closed: bool,
    changes: &[Change],
    v: &mut Violations,
) {
    let closes: Vec<&Change> = changes.iter().filter(|c| c.kind == EVENT_CLOSED).collect();
    match (closed, closes.as_slice()) {
        (true, [close]) => {
            let t = ledger
                .totals(event)
                .await
                .expect("the ledger's totals")
                .unwrap_or_default();
            let want = serde_json::json!({
                "event_id": event.as_str(),
                "stock": t.stock,
                "sold": t.sold,
                "released": t.released,
                "net_sold": t.sold as i64 - t.released as i64,
                "leftover": t.leftover,
                "guard_violations": t.guard_violations,
            });
            if close.payload != want || close.subject != event.as_str() {
                v.push((
                    CHECK,
                    format!(
                        "{event}: event.closed says {} (of {}), the ledger's totals {want}",
                        close.payload, close.subject
                    ),
                ));
            }
        }
        (false, []) => {}
        (closed, closes) => v.push((
            CHECK,
            format!(
                "{event}: {} event.closed for an event {}",
                closes.len(),
                if closed { "closed" } else { "not closed" }
            ),
        )),
    }
}

/// What is wrong with `mine`, one order's changes in sequence order, for the
/// order `h` the ledger derives: `None` when nothing.
///
/// - Voided (every take given back: the order never existed): no change, or
///   `order.created` then `order.voided` (announced before its void was
///   flushed).
/// - An order: one `order.created`, first, carrying its quantity, user and
///   deadline; then a terminal change for each kind of record that ends it
///   (`k`, `c`, `e`), once each, the one of its status among them, and no
///   `order.voided` unless `order.restored` takes it back right after (a
///   saga's loser given back before its winner was flushed). Held (or
///   bought without a confirm): its creation alone.
/// - No take nor give-back in the ledger: no change.
fn order_changes(h: &OrderHistory, mine: &[&Change]) -> Option<String> {
    let got = kinds(mine);
    let has = |k: &str| h.records.iter().any(|(kind, _)| kind == k);
    let Some(order) = &h.order else {
        let fine = if has("o") {
            got.is_empty() || got == [ORDER_CREATED, ORDER_VOIDED]
        } else {
            got.is_empty()
        };
        return (!fine).then(|| {
            if has("o") {
                "voided, so no change or its creation then its voiding".to_owned()
            } else {
                "no take in the ledger, yet changes".to_owned()
            }
        });
    };
    let Some((first, rest)) = mine.split_first() else {
        return Some("an order without order.created".into());
    };
    if first.kind != ORDER_CREATED {
        return Some("its first change is not order.created".into());
    }
    let p = &first.payload;
    let pay_by = p.get("pay_by_ms").and_then(|p| p.as_i64());
    if p["quantity"] != order.quantity
        || p["user_id"] != order.user_id.as_str()
        || pay_by != order.pay_by
    {
        return Some(format!(
            "order.created says {p}: not its quantity {}, user {} and deadline {:?}",
            order.quantity, order.user_id, order.pay_by
        ));
    }
    let mut want: Vec<&str> = TERMINALS
        .iter()
        .filter(|(record, _)| has(record))
        .map(|(_, change)| *change)
        .collect();
    let mut terminal: Vec<&str> = rest.iter().map(|c| c.kind.as_str()).collect();
    if let Some(at) = terminal.iter().position(|k| *k == ORDER_VOIDED) {
        if terminal.get(at + 1) != Some(&ORDER_RESTORED) {
            return Some(format!(
                "it stands, yet {terminal:?}: a void not taken back"
            ));
        }
        terminal.drain(at..at + 2);
    }
    if terminal.contains(&ORDER_RESTORED) {
        return Some(format!("{terminal:?}: order.restored without order.voided"));
    }
    want.sort_unstable();
    terminal.sort_unstable();
    if terminal != want {
        return Some(format!(
            "after its creation {terminal:?}, where its records make {want:?}"
        ));
    }
    let own = match order.status {
        OrderStatus::Cancelled => Some(ORDER_CANCELLED),
        OrderStatus::Expired => Some(ORDER_EXPIRED),
        OrderStatus::Confirmed if order.pay_by.is_some() => Some(ORDER_CONFIRMED),
        OrderStatus::Confirmed | OrderStatus::Held => None,
    };
    if let Some(own) = own
        && !terminal.contains(&own)
    {
        return Some(format!("{:?}, yet no {own}", order.status));
    }
    if let Some(c) = rest
        .iter()
        .find(|c| c.payload["quantity"] != order.quantity)
    {
        return Some(format!("{} says {}", c.change_id, c.payload));
    }
    None
}

fn kinds<'a>(changes: &[&'a Change]) -> Vec<&'a str> {
    changes.iter().map(|c| c.kind.as_str()).collect()
}

fn ids(changes: &[Change]) -> Vec<&str> {
    changes.iter().map(|c| c.change_id.as_str()).collect()
}
