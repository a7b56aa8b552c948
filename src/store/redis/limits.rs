//! The shared per-user rate on Redis: `rate_admit.lua` on the user's key.

use super::steps;
use super::{At, RedisStore, num};
use crate::domain::ids::UserId;
use crate::domain::keys::user_rate_key;
use crate::store::{Admit, Limits, Rate, StoreError};

use super::steps::prelude::*;

steps! {
    /// Admits a request under the user's shared rate.
    RateAdmit = rate_admit {
        keys: [K::Given("rate")],
        argv: { interval: u64, tolerance: u64 },
        reply: Reply::Number,
        writes: [],
    }
}

impl Limits for RedisStore {
    async fn admit(&self, user: &UserId, rate: Rate) -> Result<Admit, StoreError> {
        let step = steps::RateAdmit {
            interval: rate.interval_us(),
            tolerance: rate.tolerance_us(),
        };
        let at = At::Given(vec![user_rate_key(&self.namespace, user)]);
        let wait_us = num(&self.run(step, at).await?)?;
        Ok(match wait_us {
            0 => Admit::Yes,
            us => Admit::Wait(std::time::Duration::from_micros(us)),
        })
    }
}
