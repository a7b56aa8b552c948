//! [`Workload`]: what to throw at a strategy — stock, users, attempts,
//! clients, the quantity mix and retries — and the check that the runner can
//! drive it.

use serde::{Deserialize, Serialize};

use crate::BenchError;

/// What to throw at a strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// S: units of stock at the start.
    pub stock: u64,
    /// U: distinct users.
    pub users: u64,
    /// `None`: users are picked uniformly; `Some(s)`: Zipf with exponent `s`
    /// over the users (user 0 the most active).
    pub zipf: Option<f64>,
    /// A: purchase attempts in total (retries included).
    pub attempts: u64,
    /// C: concurrent clients.
    pub concurrency: usize,
    /// The quantity mix as (units, weight); weights need not sum to 1.
    pub quantities: Vec<(u32, f64)>,
    /// Share of attempts that re-send an earlier attempt (same request id,
    /// user and quantity), as a client retrying after a lost answer would.
    pub retry_rate: f64,
    /// Units one user may hold; strategies without limits ignore it.
    pub per_user_limit: Option<u32>,
    /// Seeds every random choice of the workload.
    pub seed: u64,
}

impl Default for Workload {
    /// A flash sale big enough to sell out: S=10,000, U=100,000, A=50,000,
    /// C=64, mostly single units, no retries.
    fn default() -> Self {
        Self {
            stock: 10_000,
            users: 100_000,
            zipf: None,
            attempts: 50_000,
            concurrency: 64,
            quantities: vec![(1, 0.8), (2, 0.15), (3, 0.05)],
            retry_rate: 0.0,
            per_user_limit: None,
            seed: 42,
        }
    }
}

impl Workload {
    /// Refuses workloads the runner cannot drive (no clients, no users, an
    /// empty or negative quantity mix, a rate outside [0, 1], …).
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Workload(m.to_string()));
        if self.users == 0 {
            return bad("users must be at least 1");
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.retry_rate) {
            return bad("retry_rate must be within [0, 1]");
        }
        if let Some(s) = self.zipf
            && !(s.is_finite() && s >= 0.0)
        {
            return bad("the Zipf exponent must be finite and >= 0");
        }
        if self.quantities.is_empty() {
            return bad("the quantity mix is empty");
        }
        if self.quantities.iter().any(|&(q, _)| q == 0) {
            return bad("quantities must be at least 1");
        }
        if self
            .quantities
            .iter()
            .any(|&(_, w)| !(w.is_finite() && w >= 0.0))
        {
            return bad("quantity weights must be finite and >= 0");
        }
        if self.quantities.iter().all(|&(_, w)| w == 0.0) {
            return bad("the quantity weights sum to 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workload_is_valid() {
        assert!(Workload::default().validate().is_ok());
    }

    #[test]
    fn a_workload_without_clients_or_quantities_is_refused() {
        let w = Workload {
            concurrency: 0,
            ..Workload::default()
        };
        assert!(w.validate().is_err());
        let w = Workload {
            quantities: vec![(1, 0.0)],
            ..Workload::default()
        };
        assert!(w.validate().is_err());
        let w = Workload {
            retry_rate: 1.5,
            ..Workload::default()
        };
        assert!(w.validate().is_err());
    }
}
