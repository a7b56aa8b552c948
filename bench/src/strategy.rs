//! [`Strategy`]: a way to sell stock, as the runner drives it, and
//! [`Outcome`]: the answer to one attempt as the client sees it.

use std::future::Future;

use crate::Workload;

/// The answer to one purchase attempt, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The units are the buyer's.
    Bought { units: u32 },
    /// Not enough stock for this quantity.
    SoldOut,
    /// The user's per-user limit would be exceeded.
    LimitExceeded,
    /// The request id was seen before; the earlier answer stands (its units
    /// were counted when it was `Bought`).
    Replayed,
    /// Anything else: a timeout, a backend error, a retry budget spent.
    Error(String),
}

/// A way to sell stock, driven by [`run`](crate::run).
///
/// Implementations are shared by all clients of a run (`&self`), so they hold
/// their connections inside (a pool, a pipelining Redis client).
pub trait Strategy: Send + Sync + 'static {
    /// A short, stable name for reports, e.g. `"pg-for-update"`.
    fn name(&self) -> String;
    /// Whether the strategy promises never to sell more than the stock. Naive
    /// strategies answer `false`; the report holds the others to it.
    fn claims_no_oversell(&self) -> bool;
    /// Sets up fresh state with `w.stock` units (and nothing sold).
    fn prepare(&self, w: &Workload) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// One purchase attempt of `qty` units by `user` under `request_id`.
    fn attempt(
        &self,
        user: &str,
        qty: u32,
        request_id: &str,
    ) -> impl Future<Output = Outcome> + Send;
    /// Units left according to the strategy's own store; negative when a naive
    /// strategy oversold.
    fn remaining(&self) -> impl Future<Output = anyhow::Result<i64>> + Send;
    /// Removes what `prepare` and the attempts left behind.
    fn cleanup(&self) -> impl Future<Output = anyhow::Result<()>> + Send {
        async { Ok(()) }
    }
}
