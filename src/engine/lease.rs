//! [`Lease`]: the event's mover lease, held.
//!
//! Whoever moves units between buckets (a saga gathering fragments, a
//! rebalancer round, a reshard, a close) holds the event's one mover lease, and
//! every transfer step carries its fencing token. This type is the only way the
//! crate takes that lease, so the four ways of taking it sit side by side:
//! - [`Lease::acquire`]: now or not at all (a rebalancer round skips a busy event);
//! - [`Lease::wait`]: polls until it is free, or gives up after a patience
//!   (a saga's consolidation, a reshard);
//! - [`Lease::seize`]: takes it whoever holds it (a close: it never waits for
//!   background work). The seizer must fence every bucket before moving;
//! - [`Lease::is_held`]: whether anyone holds it, without taking a token (a
//!   leader checking whether a reshard stalled).
//!
//! A held lease is renewed with [`Lease::renew`] (a long reshard keeps it with
//! [`Lease::keep_alive`]) and given back with [`Lease::release`]; one that is
//! never released expires after its TTL.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::ids::EventId;
use crate::store::{Store, StoreError};

/// The mover lease of one event, held by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    event: EventId,
    owner: String,
    token: u64,
    ttl_ms: u64,
}

impl Lease {
    /// A lease-owner id for `role` in this process: unique, so two movers in
    /// one process never share a lease.
    pub fn owner(instance: &str, role: &str) -> String {
        format!("{instance}/{role}-{:08x}", rand::random::<u32>())
    }

    /// Takes the lease if it is free (or already `owner`'s: then renewed).
    pub async fn acquire<S: Store>(
        store: &S,
        event: &EventId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, StoreError> {
        let ttl_ms = ttl_ms(ttl);
        Ok(store
            .acquire_lease(event, owner, ttl_ms)
            .await?
            .map(|token| Self::held(event, owner, token, ttl_ms)))
    }

    /// Takes the lease as soon as it is free, polling for up to `patience`;
    /// `None` when it stayed busy that long.
    pub async fn wait<S: Store>(
        store: &S,
        event: &EventId,
        owner: &str,
        ttl: Duration,
        patience: Duration,
    ) -> Result<Option<Self>, StoreError> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(lease) = Self::acquire(store, event, owner, ttl).await? {
                return Ok(Some(lease));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Takes the lease whoever holds it, with a fresh fencing token. Before it
    /// moves anything the caller must raise every bucket's fence to
    /// [`Lease::token`], so the displaced holder is refused everywhere.
    pub async fn seize<S: Store>(
        store: &S,
        event: &EventId,
        owner: &str,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        let ttl_ms = ttl_ms(ttl);
        let token = store.seize_lease(event, owner, ttl_ms).await?;
        Ok(Self::held(event, owner, token, ttl_ms))
    }

    /// Whether anyone holds the lease now. Takes no token.
    pub(crate) async fn is_held<S: Store>(store: &S, event: &EventId) -> Result<bool, StoreError> {
        Ok(store.lease_holder(event).await?.is_some())
    }

    fn held(event: &EventId, owner: &str, token: u64, ttl_ms: u64) -> Self {
        Self {
            event: event.clone(),
            owner: owner.to_owned(),
            token,
            ttl_ms,
        }
    }

    /// The fencing token every transfer step under this lease carries.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn owner_id(&self) -> &str {
        &self.owner
    }

    /// Extends the lease by its TTL; false when it was lost (expired and taken,
    /// or seized): the holder must stop moving units.
    pub async fn renew<S: Store>(&self, store: &S) -> Result<bool, StoreError> {
        store
            .renew_lease(&self.event, &self.owner, self.token, self.ttl_ms)
            .await
    }

    /// Gives the lease back (it expires anyway if this fails).
    pub async fn release<S: Store>(self, store: &S) {
        if let Err(e) = store
            .release_lease(&self.event, &self.owner, self.token)
            .await
        {
            tracing::warn!(event = %self.event, error = %e, "releasing the mover lease failed; it expires");
        }
    }

    /// Renews the lease every third of its TTL until the returned guard is
    /// dropped. The guard's [`KeepAlive::lost`] fires when a renewal finds the
    /// lease gone (expired and taken, or seized by a close): the work under it
    /// must stop, its next fenced step would be refused anyway.
    pub(crate) fn keep_alive<S: Store>(&self, store: &S) -> KeepAlive {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let (lease, store, fired, done) = (self.clone(), store.clone(), lost.clone(), stop.clone());
        let every = Duration::from_millis((self.ttl_ms / 3).max(1));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = done.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                match lease.renew(&store).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(event = %lease.event, "the mover lease was lost");
                        fired.cancel();
                        return;
                    }
                    // A hiccup: the next renewal may still be in time.
                    Err(e) => {
                        tracing::warn!(event = %lease.event, error = %e, "renewing the mover lease failed")
                    }
                }
            }
        });
        KeepAlive { lost, stop }
    }
}

/// Keeps a [`Lease`] renewed while it lives (see [`Lease::keep_alive`]).
#[derive(Debug)]
pub struct KeepAlive {
    lost: CancellationToken,
    stop: CancellationToken,
}

impl KeepAlive {
    /// Fires when the lease was found lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How often a waiting mover asks again.
const POLL: Duration = Duration::from_millis(10);

fn ttl_ms(ttl: Duration) -> u64 {
    (ttl.as_millis() as u64).max(1)
}
