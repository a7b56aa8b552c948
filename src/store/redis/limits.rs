//! The shared per-user rate on Redis: `rate_admit.lua` on the user's key.

use super::RedisStore;
use super::num;
use crate::domain::ids::UserId;
use crate::domain::keys::user_rate_key;
use crate::store::{Admit, Limits, Rate, StoreError};

impl Limits for RedisStore {
    async fn admit(&self, user: &UserId, rate: Rate) -> Result<Admit, StoreError> {
        let keys = vec![user_rate_key(&self.namespace, user)];
        let args = vec![
            rate.interval_us().to_string(),
            rate.tolerance_us().to_string(),
        ];
        let wait_us = num(&self.eval(&self.scripts.rate_admit, keys, args).await?)?;
        Ok(match wait_us {
            0 => Admit::Yes,
            us => Admit::Wait(std::time::Duration::from_micros(us)),
        })
    }
}
