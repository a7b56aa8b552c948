//! The answers held against the ledger, once the close drained every
//! stream into it: units, limits, one order per 201, replays, whether
//! "nothing deducted" was true, and the oracle from the database alone
//! (`harness::oracle`) held against what every client was told
//! (`told`).

use std::collections::{HashMap, HashSet};

use shardstock::domain::ids::OrderId;
use shardstock::domain::model::OrderStatus;
use shardstock::ledger::DbOrder;
use shardstock::store::Store;

use super::log::{Answer, Reply};
use super::rig::Rig;
use super::settle::Violations;
use super::told::Story;
use crate::harness::oracle;

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
                    let may_end = log.stories[oid].may_end(log.holds());
                    self.check_order(rid, oid, *qty, &may_end, v).await;
                }
            }
        }
        // A waiting list's offer is bought without a request id: the check
        // `offers` holds those orders against the claims.
        let claimed = log.offers.claimed();
        for (rid, mut orders) in by_rid {
            orders.retain(|o| !claimed.contains(&o.order_id));
            if orders.is_empty() {
                continue;
            }
            v.push((
                "bought_once",
                format!("orders {orders:?} of request {rid:?}, which no answer knows"),
            ));
        }
    }

    /// One order answered 201: in the ledger, with its quantity, and a
    /// status its answers explain (`told`): cancelled exactly when a cancel
    /// said so, confirmed when a confirm said so, a hold never confirmed
    /// expired.
    async fn check_order(
        &self,
        rid: &str,
        oid: &OrderId,
        qty: u32,
        may_end: &[OrderStatus],
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
        if row.quantity != qty || !may_end.contains(&row.status) {
            v.push((
                "bought_once",
                format!("{rid}: order {oid} answered 201 for {qty} (may end {may_end:?}) is {row:?} in the ledger"),
            ));
        }
    }

    /// The oracle from the database alone, then every order in it against
    /// what its client was told (`told`): an order no answer named is one
    /// nobody could confirm or cancel. Every order a client was told of is
    /// there, and no request answered "no order" has one.
    pub(super) async fn check_database(&self, v: &mut Violations) {
        let sale = oracle::closed_sale(&self.ledger, &self.id, self.plan.spec.stock).await;
        v.extend(sale.broken.into_iter().map(|b| ("database_oracle", b)));
        let log = self.log.lock().unwrap().clone();
        let stories: HashMap<&str, &Story> =
            log.stories.iter().map(|(o, s)| (o.as_str(), s)).collect();
        let untold = Story::default();
        for (oid, order) in &sale.orders {
            let story = stories.get(oid.as_str()).copied().unwrap_or(&untold);
            let may_end = story.may_end(log.holds());
            let check = if !may_end.contains(&order.status) {
                "database_oracle"
            } else if !story.may_end_in_order(log.holds()).contains(&order.status) {
                "answers_in_order"
            } else {
                continue;
            };
            v.push((
                check,
                format!(
                    "order {oid} ({} units) is {:?} in the database; its clients heard {:?} \
                     (it may end {may_end:?})",
                    order.quantity, order.status, story.heard
                ),
            ));
        }
        for oid in &log.told {
            if !sale.orders.contains_key(oid.as_str()) {
                v.push((
                    "database_oracle",
                    format!("order {oid}, which clients were told of, is not in the database"),
                ));
            }
        }
        let requests: HashSet<(&str, &str)> = sale
            .orders
            .values()
            .filter_map(|o| Some((o.user_id.as_str(), o.request_id.as_deref()?)))
            .collect();
        for rid in &log.order {
            let sent = &log.sent[rid];
            if let Some(no) = sent.answers().find(|a| a.says_no_order())
                && requests.contains(&(sent.req.user.as_str(), rid.as_str()))
            {
                v.push((
                    "database_oracle",
                    format!("{rid} was answered {no:?}, but the database has an order of it"),
                ));
            }
        }
    }
}

/// Once a request had a final answer, every later final answer is the same;
/// a request told it bought is never told it made no order.
fn replays_agree(rid: &str, replies: &[Reply], v: &mut Violations) {
    let bought = replies
        .iter()
        .find(|r| matches!(r.answer, Answer::Bought(..)));
    let no_order = replies.iter().find(|r| r.answer == Answer::NoOrder);
    if let (Some(b), Some(n)) = (bought, no_order) {
        v.push((
            "replays_agree",
            format!(
                "{rid}: answered {:?}, and after the close {:?}",
                b.answer, n.answer
            ),
        ));
    }
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
