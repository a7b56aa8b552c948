//! Leases on Redis: `lease_acquire.lua` and `lease_renew.lua` on a holder key
//! and its counter — `leader`/`term` for the leadership, `lease`/`token` for
//! the mover lease.

use fred::prelude::*;

use super::scripts::reply;
use super::steps;
use super::{At, RedisStore, arg, code, num, unknown};
use crate::domain::ids::EventId;
use crate::domain::records::LeaseHolder;
use crate::store::{Leases, StoreError};

use super::steps::prelude::*;

steps! {
    /// Takes a lease (or leadership) unless another owner holds it.
    LeaseAcquire = lease_acquire {
        keys: [K::Given("lease"), K::Given("token")],
        argv: { owner: String, ttl: u64, seize: Option<&'static str> },
        reply: Reply::Codes(&[reply::OK, reply::HELD]),
        writes: [Lease],
    }
    /// Extends or releases a lease the owner holds.
    LeaseRenew = lease_renew {
        keys: [K::Given("lease")],
        argv: { owner: String, token: u64, ttl: u64, legacy: String },
        reply: Reply::Flag,
        writes: [Lease],
    }
}

impl RedisStore {
    /// `lease_acquire.lua` on a holder key and its counter: the caller's
    /// number, or `None` when another owner holds it.
    async fn lease_acquire(
        &self,
        holder: String,
        counter: String,
        owner: &str,
        ttl_ms: u64,
        seize: bool,
    ) -> Result<Option<u64>, StoreError> {
        let step = steps::LeaseAcquire {
            owner: owner.to_owned(),
            ttl: ttl_ms,
            seize: seize.then_some("seize"),
        };
        let parts = self
            .run(step, At::Given(vec![holder, counter]))
            .await?
            .into_array();
        match code(&parts)?.as_str() {
            reply::OK => Ok(Some(num(arg(&parts, 1)?)?)),
            reply::HELD => Ok(None),
            other => Err(unknown("lease_acquire", other)),
        }
    }

    /// `lease_renew.lua`: extends (or, with `ttl_ms` 0, releases) a lease the
    /// owner still holds with this number; false when it does not.
    async fn lease_renew(
        &self,
        holder: String,
        owner: &str,
        number: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let holder_then = LeaseHolder {
            owner: owner.to_owned(),
            token: number,
        };
        let step = steps::LeaseRenew {
            owner: owner.to_owned(),
            token: number,
            ttl: ttl_ms,
            legacy: holder_then.legacy(),
        };
        self.run_flag(step, At::Given(vec![holder])).await
    }
}

impl Leases for RedisStore {
    async fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let k = self.event_keys(event);
        self.lease_acquire(k.leader, k.term, owner, ttl_ms, false)
            .await
    }

    async fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> Result<(), StoreError> {
        let k = self.event_keys(event);
        self.lease_renew(k.leader, owner, term, 0).await.map(drop)
    }

    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let k = self.event_keys(event);
        self.lease_acquire(k.lease, k.token, owner, ttl_ms, false)
            .await
    }

    async fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        let k = self.event_keys(event);
        self.lease_acquire(k.lease, k.token, owner, ttl_ms, true)
            .await?
            .ok_or_else(|| StoreError::Protocol("a seized lease was refused".into()))
    }

    async fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let k = self.event_keys(event);
        self.lease_renew(k.lease, owner, token, ttl_ms).await
    }

    async fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> Result<(), StoreError> {
        self.renew_lease(event, owner, token, 0).await.map(drop)
    }

    async fn lease_holder(&self, event: &EventId) -> Result<Option<(String, u64)>, StoreError> {
        // A hash {o, t}, as lease_acquire.lua writes it; an older holder is
        // a string "owner|token" (HMGET refuses it: WRONGTYPE).
        let key = self.event_keys(event).lease;
        let held: Result<(Option<String>, Option<u64>), StoreError> = self
            .call(|| self.client.hmget(key.clone(), vec!["o", "t"]))
            .await;
        let holder = match held {
            Ok((Some(owner), Some(token))) => Some(LeaseHolder { owner, token }),
            Ok(_) => None,
            Err(StoreError::Protocol(e)) if e.contains("WRONGTYPE") => {
                let v: Option<String> = self.call(|| self.client.get(key.clone())).await?;
                match v {
                    None => None,
                    Some(v) => Some(
                        LeaseHolder::decode_legacy(&v)
                            .ok_or_else(|| StoreError::Protocol(format!("bad lease {v:?}")))?,
                    ),
                }
            }
            Err(e) => return Err(e),
        };
        Ok(holder.map(|h| (h.owner, h.token)))
    }
}
