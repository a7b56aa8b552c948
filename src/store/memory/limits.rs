//! The per-user rate in memory: each user's theoretical arrival time, the
//! state `lua/rate_admit.lua` keeps in Redis, stepped by the same arithmetic
//! (`store::limits::gcra`). Entries in the past are dropped now and then, as
//! their keys expire in Redis.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::MemoryStore;
use crate::domain::ids::UserId;
use crate::store::limits::gcra;
use crate::store::{Admit, Limits, Rate, StoreError};

impl Limits for MemoryStore {
    /// Mirrors `lua/rate_admit.lua`.
    async fn admit(&self, user: &UserId, rate: Rate) -> Result<Admit, StoreError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut rates = self.inner.rates.lock().expect("rates poisoned");
        if rates.len() >= 1024 && rates.len().is_power_of_two() {
            rates.retain(|_, tat| *tat > now);
        }
        Ok(match gcra(rates.get(user).copied(), now, rate) {
            Ok(tat) => {
                rates.insert(user.clone(), tat);
                Admit::Yes
            }
            Err(wait_us) => Admit::Wait(Duration::from_micros(wait_us)),
        })
    }
}
