//! The answers held against the ledger, once the close drained every
//! stream into it: units, limits, one order per 201, replays, and whether
//! "nothing deducted" was true.

use std::collections::HashMap;

use shardstock::domain::ids::OrderId;
use shardstock::domain::model::OrderStatus;
use shardstock::ledger::DbOrder;
use shardstock::store::Store;

use super::log::{Answer, Cancelled, Reply};
use super::rig::Rig;
use super::settle::Violations;

impl<S: Store> Rig<S> {
    /// The answers against the ledger (every stream is drained by the close).
    pub(super) async fn check_ledger(&self, v: &mut Violations) {
        let spec = &self.plan.spec;
        let confirmed = self
            .ledger
            .confirmed_orders(&self.id)
            .await
            .expect("ledger orders");
        let totals = self
            .ledger
            .totals(&self.id)
            .await
            .expect("ledger totals")
            .unwrap_or_default();
        let log = self.log.lock().unwrap().clone();

        let net: u64 = confirmed.iter().map(|o| o.qty).sum();
        let sold = totals.sold.saturating_sub(totals.released);
        if net != sold || sold + totals.leftover != spec.stock {
            v.push((
                "no_double_sale",
                format!(
                    "confirmed orders hold {net} units; the ledger has {totals:?}; stock {}",
                    spec.stock
                ),
            ));
        }
        if let Some(limit) = spec.per_user_limit {
            let mut per_user: HashMap<&str, u64> = HashMap::new();
            for o in &confirmed {
                *per_user.entry(o.user.as_str()).or_default() += o.qty;
            }
            for (u, held) in per_user {
                if held > u64::from(limit) {
                    v.push(("limits", format!("{u} holds {held} > {limit}")));
                }
            }
        }
        let mut by_rid: HashMap<&str, Vec<&DbOrder>> = HashMap::new();
        for o in &confirmed {
            by_rid.entry(o.request_id.as_str()).or_default().push(o);
        }
        for rid in &log.order {
            let sent = &log.sent[rid];
            let orders = by_rid.remove(rid.as_str()).unwrap_or_default();
            replays_agree(rid, &sent.replies, v);
            nothing_deducted_is_true(rid, &sent.replies, &orders, v);
            if let Some(refused @ Answer::Refused(_)) = sent.answers().find(|a| a.is_final())
                && !orders.is_empty()
            {
                v.push((
                    "refusal_is_true",
                    format!("{rid} was answered {refused:?}, but orders {orders:?} exist"),
                ));
            }
            if orders.len() > 1 {
                v.push((
                    "bought_once",
                    format!("{rid} has {} confirmed orders: {orders:?}", orders.len()),
                ));
            }
            let mut seen = Vec::new();
            for a in sent.answers() {
                if let Answer::Bought(oid, qty) = a
                    && !seen.contains(&oid)
                {
                    seen.push(oid);
                    let cancelled = log.cancels.get(oid).copied().unwrap_or(Cancelled::No);
                    self.check_order(rid, oid, *qty, cancelled, v).await;
                }
            }
        }
        for (rid, orders) in by_rid {
            v.push((
                "bought_once",
                format!("orders {orders:?} of request {rid:?}, which no answer knows"),
            ));
        }
    }

    /// One order answered 201: in the ledger, with its quantity, cancelled
    /// exactly when a cancel said so.
    async fn check_order(
        &self,
        rid: &str,
        oid: &OrderId,
        qty: u32,
        cancelled: Cancelled,
        v: &mut Violations,
    ) {
        let row = self
            .ledger
            .order(oid, &self.id)
            .await
            .expect("ledger order");
        let Some(row) = row else {
            v.push((
                "bought_once",
                format!("{rid}: order {oid} (answered 201) is not in the ledger"),
            ));
            return;
        };
        let status_ok = match cancelled {
            Cancelled::Yes => row.status == OrderStatus::Cancelled,
            Cancelled::No => row.status == OrderStatus::Confirmed,
            Cancelled::Unknown => true,
        };
        if row.quantity != qty || !status_ok {
            v.push((
                "bought_once",
                format!("{rid}: order {oid} answered 201 for {qty} (cancel: {cancelled:?}) is {row:?} in the ledger"),
            ));
        }
    }
}

/// Once a request had a final answer, every later final answer is the same.
fn replays_agree(rid: &str, replies: &[Reply], v: &mut Violations) {
    let mut finals = replies.iter().map(|r| &r.answer).filter(|a| a.is_final());
    let Some(want) = finals.next() else {
        return;
    };
    for later in finals.filter(|a| *a != want) {
        v.push((
            "replays_agree",
            format!("{rid}: answered {want:?}, then {later:?}"),
        ));
    }
}

/// "Nothing deducted" is a lie when an order of the request existed before
/// the call was made (a retry of a request that bought), or when it was the
/// request's last answer and an order exists (the call itself deducted).
fn nothing_deducted_is_true(rid: &str, replies: &[Reply], orders: &[&DbOrder], v: &mut Violations) {
    let Some(first_order) = orders.iter().map(|o| o.at_ms).min() else {
        return;
    };
    for (i, r) in replies.iter().enumerate() {
        let Answer::NothingDeducted(why) = &r.answer else {
            continue;
        };
        let retry_of_a_purchase = first_order < r.sent_ms;
        if retry_of_a_purchase || i + 1 == replies.len() {
            let what = if retry_of_a_purchase {
                "a retry of a request that had bought"
            } else {
                "the call that deducted"
            };
            v.push((
                "nothing_deducted_is_true",
                format!(
                    "{rid}: {what} was answered \"nothing deducted\" ({why}); its order {} exists",
                    orders[0].order_id
                ),
            ));
        }
    }
}
