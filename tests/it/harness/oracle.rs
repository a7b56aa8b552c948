//! The oracle from the database alone: what a closed sale must look like in
//! the ledger whatever the audit's own bookkeeping says.
//!
//! The audit balances an equation over totals it keeps itself (sold,
//! released, leftover); two defects kept it balanced while buyers were told
//! one thing and the database said another (a resumed reshard that returned
//! expired holds' units twice; a close that voided confirmed holds). So a
//! closed event is also read as orders, derived from every record each one
//! has, and checked against the stock and against itself:
//! - the units of confirmed orders and the leftover add up to the stock;
//! - no order is still held (a close voids live holds);
//! - no order has two records that end it differently: at most one release
//!   (a cancel `c` or an expiry `e`), at most one confirm `k`, never a
//!   confirm and an expiry, at most one hold record `h`.
//!
//! What each client was last told is the caller's to compare (the fault
//! schedules keep a log of it): [`closed_sale`] returns the orders by id.

use std::collections::HashMap;

use shardstock::domain::ids::EventId;
use shardstock::domain::model::{OrderStatus, OrderView};
use shardstock::ledger::Ledger;

/// A closed event's orders in the ledger, and what breaks the oracle.
pub struct ClosedSale {
    /// Derived orders by order id (voided takes left out).
    pub orders: HashMap<String, OrderView>,
    /// Each broken rule, said in a sentence.
    pub broken: Vec<String>,
}

/// Reads a closed event's orders and checks the rules of the module docs.
pub async fn closed_sale(ledger: &Ledger, event: &EventId, stock: u64) -> ClosedSale {
    let histories = ledger
        .order_histories(event, None)
        .await
        .expect("the ledger's orders");
    let totals = ledger
        .totals(event)
        .await
        .expect("the ledger's totals")
        .unwrap_or_default();
    let mut broken = Vec::new();
    let mut orders = HashMap::new();
    let mut confirmed = 0u64;
    for h in histories {
        let count = |k: &str| h.records.iter().filter(|(kind, _)| kind == k).count();
        let (c, e, k, held) = (count("c"), count("e"), count("k"), count("h"));
        if c + e > 1 || k > 1 || (k > 0 && e > 0) || held > 1 {
            broken.push(format!(
                "order {} has records that end it differently: {:?}",
                h.order_id, h.records
            ));
        }
        let Some(order) = h.order else { continue };
        match order.status {
            OrderStatus::Confirmed => confirmed += u64::from(order.quantity),
            OrderStatus::Held => broken.push(format!(
                "order {} is still held after the close: {:?}",
                h.order_id, h.records
            )),
            OrderStatus::Cancelled | OrderStatus::Expired => {}
        }
        orders.insert(h.order_id, order);
    }
    if confirmed + totals.leftover != stock {
        broken.push(format!(
            "confirmed orders hold {confirmed} units and the leftover is {}: {} for a stock of {stock}",
            totals.leftover,
            confirmed + totals.leftover
        ));
    }
    ClosedSale { orders, broken }
}
