//! Leases in memory: two [`LeaseSlot`]s per event, the holder key and counter
//! of a Redis lease in one value, with the same two steps as the two scripts.

use std::time::{Duration, Instant};

use super::MemoryStore;
use crate::domain::ids::EventId;
use crate::store::{Leases, StoreError};

/// A lease and its counter: `ss:{e}:lease` + `ss:{e}:token`, or `leader` + `term`.
#[derive(Debug, Default)]
pub(super) struct LeaseSlot {
    /// `(owner, number, expiry)`; expired counts as free, as a key past its TTL.
    holder: Option<(String, u64, Instant)>,
    counter: u64,
}

impl LeaseSlot {
    /// `lua/lease_acquire.lua`: the same owner keeps its number (TTL renewed),
    /// a free slot — or any slot, with `seize` — gets the next number.
    fn acquire(&mut self, owner: &str, ttl_ms: u64, seize: bool) -> Option<u64> {
        let now = Instant::now();
        let until = now + Duration::from_millis(ttl_ms);
        match &mut self.holder {
            Some((holder, n, expiry)) if *expiry > now && !seize => (holder == owner).then(|| {
                *expiry = until;
                *n
            }),
            _ => {
                self.counter += 1;
                self.holder = Some((owner.to_owned(), self.counter, until));
                Some(self.counter)
            }
        }
    }

    /// `lua/lease_renew.lua`: extends (or, with `ttl_ms` 0, releases) the
    /// lease if `owner` still holds it with `number`.
    fn renew(&mut self, owner: &str, number: u64, ttl_ms: u64) -> bool {
        let now = Instant::now();
        match &mut self.holder {
            Some((holder, n, expiry)) if *expiry > now && holder == owner && *n == number => {
                if ttl_ms == 0 {
                    self.holder = None;
                } else {
                    *expiry = now + Duration::from_millis(ttl_ms);
                }
                true
            }
            _ => false,
        }
    }

    /// `(owner, number)` while the lease is held.
    pub(super) fn holder(&self) -> Option<(String, u64)> {
        match &self.holder {
            Some((owner, n, expiry)) if *expiry > Instant::now() => Some((owner.clone(), *n)),
            _ => None,
        }
    }
}

impl Leases for MemoryStore {
    /// Mirrors `lua/lease_acquire.lua` on the leadership.
    async fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let taken = self.with_event(event, |s| s.leader.acquire(owner, ttl_ms, false));
        Ok(taken.flatten())
    }

    /// Mirrors `lua/lease_renew.lua` with TTL 0 on the leadership.
    async fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> Result<(), StoreError> {
        self.event_flag(event, |s| s.leader.renew(owner, term, 0));
        Ok(())
    }

    /// Mirrors `lua/lease_acquire.lua`.
    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let taken = self.with_event(event, |s| s.lease.acquire(owner, ttl_ms, false));
        Ok(taken.flatten())
    }

    /// Mirrors `lua/lease_acquire.lua` with `seize`.
    async fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        self.with_event(event, |s| s.lease.acquire(owner, ttl_ms, true))
            .flatten()
            .ok_or_else(|| StoreError::Stale(event.to_string()))
    }

    /// Mirrors `lua/lease_renew.lua`.
    async fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.event_flag(event, |s| s.lease.renew(owner, token, ttl_ms)))
    }

    /// Mirrors `lua/lease_renew.lua` with TTL 0.
    async fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> Result<(), StoreError> {
        self.renew_lease(event, owner, token, 0).await.map(drop)
    }

    /// A GET of the lease key: an expired lease is no lease.
    async fn lease_holder(&self, event: &EventId) -> Result<Option<(String, u64)>, StoreError> {
        Ok(self.with_event(event, |s| s.lease.holder()).flatten())
    }
}
