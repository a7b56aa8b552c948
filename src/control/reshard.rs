//! Live resharding: moving a running event to another bucket count.
//!
//! 1. The meta says "resharding to (gen+1, M)" — purchases wait for the new
//!    layout rather than sell from the old one (`begin_reshard.lua`).
//! 2. Under the mover lease (every bucket fenced to its token, open transfers
//!    completed), the old buckets are sealed: no purchase, take, cancel or
//!    transfer changes them any more; sagas cut off mid-way are settled.
//! 3. Each user's holdings, order index entries and request records move to the
//!    user's home in the new layout (`hash % M`), so per-user limits and
//!    idempotency carry over; the stock moves by journaled, fenced transfers
//!    with deterministic ids, so a resumed reshard never moves a unit twice.
//! 4. One step switches the meta to the new layout and back on sale; the old
//!    layout stays listed as retired until its streams are flushed.
//!
//! Every step is idempotent: a reshard interrupted anywhere is resumed by
//! asking for the same bucket count again (the rebalancer leader also resumes
//! one it finds stalled).

use std::collections::HashMap;
use std::time::Duration;

use crate::control::ControlError;
use crate::control::checkpoint::{self, Checkpoint};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{
    EventMeta, EventStatus, MAX_BUCKETS, OrderEntry, RequestRecord, SpecError, split_even,
};
use crate::domain::routing::{home, user_hash};
use crate::engine::mover::{self, MoverError};
use crate::engine::{Engine, EngineError, EventView, Lease};
use crate::store::{BucketContents, Store, StoreError};

/// Moves `event` to `buckets` buckets while it sells; returns the new view.
pub async fn reshard<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    buckets: u32,
) -> Result<EventView, ControlError> {
    if !(1..=MAX_BUCKETS).contains(&buckets) {
        return Err(EngineError::Spec(SpecError::Buckets(buckets)).into());
    }
    let store = engine.store();
    let meta = engine.reload(event).await?;
    let target = match (meta.status, meta.reshard_to) {
        (EventStatus::OnSale, _) if meta.spec.buckets == buckets => {
            return Ok(engine.view(event).await?);
        }
        (EventStatus::OnSale, _) => (meta.generation + 1, buckets),
        (EventStatus::Resharding, Some(to)) if to.1 == buckets => to,
        (EventStatus::Resharding, _) => {
            return Err(ControlError::Busy(format!(
                "{event} is being resharded to another bucket count"
            )));
        }
        (_, _) => {
            return Err(EngineError::NotOnSale {
                event: event.clone(),
                why: "not on sale",
            }
            .into());
        }
    };
    if !store.begin_reshard(event, target.0, target.1).await? {
        return Err(ControlError::Busy(format!(
            "{event} changed state; try again"
        )));
    }
    let meta = engine.reload(event).await?;
    let owner = Lease::owner(engine.instance(), "reshard");
    let Some(lease) = Lease::wait(store, event, &owner, LEASE_TTL, LEASE_PATIENCE).await? else {
        return Err(ControlError::Busy(format!(
            "the mover lease of {event} stayed busy"
        )));
    };
    // Kept renewed for as long as the reshard runs, however long that is.
    let keep = lease.keep_alive(store);
    let result = run(engine, &meta, lease.token(), target).await;
    drop(keep);
    lease.release(store).await;
    result?;
    metrics::counter!(crate::metrics::RESHARDS, "event" => event.to_string()).increment(1);
    engine.forget(event);
    tracing::info!(%event, from = meta.spec.buckets, to = buckets, "resharded");
    Ok(engine.view(event).await?)
}

/// The reshard's mover lease: renewed every third of this while it runs.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// How long a reshard waits for another mover (a rebalancer round, a saga's
/// consolidation) to give the lease back.
const LEASE_PATIENCE: Duration = Duration::from_secs(10);

fn mover_error(e: MoverError) -> ControlError {
    ControlError::Engine(e.into())
}

fn stale_ok<T: Default>(r: Result<T, StoreError>) -> Result<T, StoreError> {
    match r {
        Err(StoreError::Stale(_)) => Ok(T::default()),
        other => other,
    }
}

async fn run<S: Store>(
    engine: &Engine<S>,
    meta: &EventMeta,
    token: u64,
    (generation, buckets): (u32, u32),
) -> Result<(), ControlError> {
    let store = engine.store();
    let event = &meta.spec.id;
    let old: Vec<BucketRef> = (0..meta.spec.buckets)
        .map(|b| BucketRef::new(event, meta.generation, b))
        .collect();
    let new: Vec<BucketRef> = (0..buckets)
        .map(|b| BucketRef::new(event, generation, b))
        .collect();
    mover::take_over(store, meta, &old, token)
        .await
        .map_err(mover_error)?;
    checkpoint::reach(event, Checkpoint::ReshardFenced).await?;
    for b in &old {
        stale_ok(store.seal(b).await)?;
    }
    for b in &old {
        for (rid, record) in stale_ok(store.pending(b).await)? {
            engine.settle_pending(meta, b.index, &rid, &record).await?;
        }
    }
    checkpoint::reach(event, Checkpoint::ReshardSealed).await?;
    // The new layout, empty, then everything the old buckets remember about users.
    for b in &new {
        store.init_bucket(b, 0).await?;
    }
    let mut moved: HashMap<u32, BucketContents> = HashMap::new();
    for b in &old {
        let c = stale_ok(store.contents(b).await)?;
        for (user, units) in c.holdings {
            moved
                .entry(home(user_hash(&user), buckets))
                .or_default()
                .holdings
                .push((user, units));
        }
        for (oid, entry) in c.orders {
            let h = OrderId::parse(oid.as_str())
                .map(|(_, _, hash)| home(hash, buckets))
                .unwrap_or(0);
            moved.entry(h).or_default().orders.push((oid, entry));
        }
        for (rid, record) in c.records {
            let Some(user) = rid.split_once('/').and_then(|(u, _)| UserId::parse(u).ok()) else {
                continue;
            };
            moved
                .entry(home(user_hash(&user), buckets))
                .or_default()
                .records
                .push((rid, record));
        }
    }
    for (h, c) in moved {
        write_contents(store, &new[h as usize], c).await?;
    }
    checkpoint::reach(event, Checkpoint::ReshardRestored).await?;
    let mut transfers = 0;
    // The stock, old → new, by journaled transfers with deterministic ids.
    let mut stocks = Vec::with_capacity(old.len());
    for b in &old {
        stocks.push(stale_ok(store.bucket_state(b).await)?.stock);
    }
    let total: u64 = stocks.iter().sum();
    let mut wants = split_even(total, buckets);
    let mut to = 0usize;
    for (from, mut have) in stocks.into_iter().enumerate() {
        while have > 0 && to < wants.len() {
            let units = have.min(wants[to]);
            if units > 0 {
                let xid = mover::reshard_xid(generation, from as u32, to as u32);
                mover::move_between(store, event, token, &old[from], &new[to], &xid, units)
                    .await
                    .map_err(mover_error)?;
                transfers += 1;
                checkpoint::reach(event, Checkpoint::ReshardMoved(transfers)).await?;
                have -= units;
                wants[to] -= units;
            }
            if wants[to] == 0 {
                to += 1;
            }
        }
    }
    let mut retired = meta.retired.clone();
    retired.insert(0, (meta.generation, meta.spec.buckets));
    checkpoint::reach(event, Checkpoint::ReshardSwitch).await?;
    if !store
        .end_reshard(event, generation, buckets, &retired)
        .await?
    {
        return Err(ControlError::Busy(format!(
            "{event} left the reshard state under this reshard"
        )));
    }
    Ok(())
}

async fn write_contents<S: Store>(
    store: &S,
    bucket: &BucketRef,
    c: BucketContents,
) -> Result<(), ControlError> {
    let event = &bucket.event;
    for chunk in c.holdings.chunks(500) {
        checkpoint::reach(event, Checkpoint::ReshardRestore).await?;
        store.restore(bucket, chunk, &[], &[]).await?;
    }
    let orders: Vec<(OrderId, OrderEntry)> = c.orders;
    for chunk in orders.chunks(500) {
        checkpoint::reach(event, Checkpoint::ReshardRestore).await?;
        store.restore(bucket, &[], chunk, &[]).await?;
    }
    let records: Vec<(String, RequestRecord)> = c.records;
    for chunk in records.chunks(500) {
        checkpoint::reach(event, Checkpoint::ReshardRestore).await?;
        store.restore(bucket, &[], &[], chunk).await?;
    }
    Ok(())
}
