//! An event's life beyond the hot path, across the store and the ledger:
//! creating it in both, closing it (the end of a sale), and rebuilding it when
//! Redis lost its state.
//!
//! Close: the status goes to `closed` (new purchases are refused; a
//! compare-and-set retried until it lands, so a reshard beginning meanwhile
//! cannot leave the event resharding, and `end_reshard.lua` never switches a
//! closed event back on sale), the mover lease is seized and kept renewed (a
//! close never waits for background work, nor for an instance that died
//! holding the lease), every bucket of every layout is
//! fenced to its token and open transfers completed, every bucket is sealed (stale
//! instances are refused too), sagas cut off mid-way are settled (and, in a
//! release's pool, every order not ended with a take there refused and the
//! take given back), each bucket's
//! leftover stock becomes a leftover record, every stream is drained into the
//! ledger, the ledger marks the event closed, the event's keys expire, and it
//! leaves the open events (`retire_event`): nothing in the background visits
//! it again. Every step is idempotent: a close cut off anywhere is finished by
//! running it again, which the rebalancer's leader does for one that looks
//! abandoned.
//!
//! Rebuild: an event the ledger knows as on sale but Redis does not (a Redis
//! that restarted empty) must not be sold again from full stock. With the
//! `rebuild` policy the buckets are recreated from the ledger — remaining units,
//! every user's holdings, every confirmed order and its request id; with
//! `refuse` the event stays unavailable, with a clear error, until an operator
//! runs `shardstock recover EVENT`.

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::LostState;
use crate::control::ControlError;
use crate::control::checkpoint::{self, Checkpoint};
use crate::control::flusher::Flusher;
use crate::control::rebalancer::{Resizing, resize};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{
    EntryState, EventSpec, EventStatus, OrderEntry, RequestRecord, split_even,
};
use crate::domain::routing::{home, user_hash};
use crate::engine::mover::{self, MoverError};
use crate::engine::{Engine, EngineError, EventView, Lease};
use crate::ledger::{DbEvent, Ledger};
use crate::store::{CreateEventReply, RestoreReply, Store, StoreError};

/// How long the keys of a closed event live on (orders are read from the ledger).
const CLOSED_TTL: Duration = Duration::from_secs(3600);

/// The spec an event is created with by the service: an adaptive one starts
/// at the count `resize::starting` gives (on a Redis Cluster, spread over
/// every master as far as its range and stock allow; else its minimum), so
/// a hot sale's first purchases wait for no reshard. Deterministic for one
/// slot table: instances creating the same configured event at once agree.
/// An invalid spec comes back as it was, for `create` to refuse.
pub fn starting_layout<S: Store>(
    engine: &Engine<S>,
    mut spec: EventSpec,
    resizing: &Resizing,
) -> EventSpec {
    // An invalid spec is left for `create` to refuse (its range may be out
    // of order, which a clamp cannot take).
    if let Some(range) = spec.auto_buckets
        && spec.validate().is_ok()
    {
        let spread = engine.store().spread(&spec.id, 0, range.max);
        spec.buckets = resize::starting(
            range,
            spec.stock,
            u64::from(spec.max_per_order),
            spread,
            resizing,
        );
    }
    spec
}

/// Creates an event in the ledger and the store (refused if either has it).
pub async fn create<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    spec: EventSpec,
) -> Result<EventView, ControlError> {
    spec.validate().map_err(EngineError::from)?;
    if ledger.event(&spec.id).await?.is_some()
        && engine.store().load_meta(&spec.id).await?.is_none()
    {
        return Err(ControlError::Exists(spec.id));
    }
    let view = engine.create_event(spec.clone()).await?;
    ledger
        .register_event(&spec, engine.clock().now_ms())
        .await?;
    Ok(view)
}

/// Creates a release: its spec and every pool in the store (the engine),
/// then each pool's event in the ledger. A creation cut off is resumed by
/// the same call again (both sides skip what they have).
pub async fn create_release<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    spec: crate::domain::release::ReleaseSpec,
) -> Result<std::sync::Arc<crate::domain::release::ReleaseSpec>, ControlError> {
    let spec = engine.create_release(spec).await?;
    for k in 0..spec.pools.len() {
        let pool = spec.pool_spec(k).map_err(EngineError::from)?;
        // Also when the pool is registered: one registered before the
        // ledger named releases learns its release here.
        ledger
            .register_pool(&pool, &spec.id, engine.clock().now_ms())
            .await?;
    }
    Ok(spec)
}

/// Ensures a configured event exists: created when neither side knows it,
/// left alone when the store has it; when only the ledger has it, the start-up
/// rebuild decides.
pub async fn ensure<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    spec: EventSpec,
) -> Result<bool, ControlError> {
    if let Some(meta) = engine.store().load_meta(&spec.id).await? {
        ledger
            .register_event(&meta.spec, engine.clock().now_ms())
            .await?;
        if meta.spec.auto_buckets != spec.auto_buckets {
            tracing::warn!(event = %spec.id, "whether the bucket count adapts, and its bounds, are set when an event is created: the configuration's change is not applied");
        }
        // An adaptive count is the leader's to change.
        let to = match (meta.spec.auto_buckets, spec.auto_buckets) {
            (Some(range), _) => range.clamp(meta.spec.buckets),
            (None, Some(_)) => meta.spec.buckets,
            (None, None) => spec.buckets,
        };
        if meta.spec.buckets != to && meta.status != EventStatus::Closed {
            tracing::info!(event = %spec.id, from = meta.spec.buckets, to, "bucket count changed in the configuration: resharding");
            crate::control::reshard::reshard_because(
                engine,
                &spec.id,
                to,
                crate::control::reshard::Why::Config,
            )
            .await?;
            ledger.set_buckets(&spec.id, to).await?;
        }
        return Ok(false);
    }
    if ledger.event(&spec.id).await?.is_some() {
        return Ok(false);
    }
    match create(engine, ledger, spec).await {
        Ok(_) => Ok(true),
        // Another instance, started at the same moment from the same
        // configuration, created it between our look and our create.
        Err(ControlError::Engine(EngineError::EventExists(_))) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ends a sale: see the module docs. Idempotent; returns the final view.
pub async fn close<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    flusher: &mut Flusher<S>,
    event: &EventId,
    stop: &CancellationToken,
) -> Result<EventView, ControlError> {
    let store = engine.store();
    let meta = engine.reload(event).await?;
    checkpoint::reach(event, Checkpoint::CloseBegin).await?;
    set_closed(engine, event, meta.status).await?;
    let meta = engine.reload(event).await?;
    let owner = Lease::owner(engine.instance(), "close");
    let buckets = meta.all_buckets();
    // A close wins over background work: it seizes the mover lease (a holder
    // that died, a rebalancer round, a saga's consolidation or a reshard) and
    // fences every bucket of every layout before it moves anything, so the
    // displaced holder is refused everywhere. A close fenced in turn (another
    // close seized the lease) seizes again: every step below is idempotent.
    let mut attempts = 0;
    let lease = loop {
        attempts += 1;
        let lease = Lease::seize(store, event, &owner, CLOSE_LEASE_TTL).await?;
        match mover::take_over(store, &meta, &buckets, lease.token()).await {
            Ok(_) => break lease,
            Err(MoverError::Fenced { .. }) if attempts < 5 => continue,
            Err(e) => return Err(EngineError::from(e).into()),
        }
    };
    // Renewed while the close runs (a long drain), so the leader does not
    // take a close at work for an abandoned one.
    let keep = lease.keep_alive(store);
    let result = async {
        checkpoint::reach(event, Checkpoint::CloseFenced).await?;
        for b in &buckets {
            store.seal(b).await.or_else(ignore_stale)?;
        }
        checkpoint::reach(event, Checkpoint::CloseSealed).await?;
        for b in &buckets {
            for (rid, record) in store.pending(b).await.or_else(ignore_stale_vec)? {
                engine.settle_pending(&meta, b.index, &rid, &record).await?;
            }
        }
        // A release pool: every order not ended with a take here is refused
        // and the take given back, so the counts below are final
        // (`engine::pool_cut`).
        engine.settle_pool_orders(&meta).await?;
        // A release's held orders with a line here are decided at their
        // home (expired unless confirmed first) and their lines finished
        // while the buckets still take records (sealed, not yet leftover).
        engine.close_pool_holds(event).await?;
        // Live holds are voided (API.md): their units go back to their
        // bucket before it turns into leftover, and each gets its expire
        // record, so the ledger shows them expired and the units unsold.
        // Only the current layout's: a retired layout keeps copies of holds a
        // reshard moved on (some confirmed since), and a layout a reshard was
        // filling keeps copies of holds that count in the current one.
        for b in buckets.iter().filter(|b| b.generation == meta.generation) {
            engine.void_holds(b).await?;
        }
        for b in &buckets {
            store
                .retire(b, engine.clock().now_ms())
                .await
                .or_else(|e| ignore_stale(e).map(|_| None))?;
        }
        checkpoint::reach(event, Checkpoint::CloseRetired).await?;
        flusher.drain_parallel(&buckets, stop).await?;
        checkpoint::reach(event, Checkpoint::CloseDrained).await?;
        ledger.close_event(event, engine.clock().now_ms()).await?;
        for b in &buckets {
            store
                .expire_bucket(b, CLOSED_TTL.as_millis() as u64)
                .await
                .or_else(|e| ignore_stale(e).map(drop))?;
        }
        Ok::<_, ControlError>(())
    }
    .await;
    drop(keep);
    lease.release(store).await;
    result?;
    // Flushed and closed in the ledger: background work no longer visits it
    // (it is still listed, viewed and audited).
    store.retire_event(event).await?;
    engine.activity().forget(event);
    engine.forget(event);
    ledger.forget_event(event);
    let view = final_view(engine, ledger, event).await?;
    // Its gauges say the sale is over now, not at the next refresh.
    crate::control::gauges::publish_closed(&view);
    Ok(view)
}

/// Sets the status to `closed` from whatever it is: a compare-and-set,
/// retried when the status changed under it (a reshard began or ended), so a
/// close never goes on with the event still on sale or resharding. Nothing
/// moves an event out of `closed` (`end_reshard.lua` only switches from
/// `resharding`), so this ends.
async fn set_closed<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    mut status: EventStatus,
) -> Result<(), ControlError> {
    for _ in 0..CLOSE_CAS_ATTEMPTS {
        if status == EventStatus::Closed
            || engine
                .store()
                .set_status(event, status, EventStatus::Closed)
                .await?
        {
            return Ok(());
        }
        status = engine.reload(event).await?.status;
    }
    Err(ControlError::Busy(format!(
        "the status of {event} kept changing under the close; try again"
    )))
}

/// Compare-and-set attempts of a close (each one lost to a status change).
const CLOSE_CAS_ATTEMPTS: u32 = 100;

/// How long a close holds the mover lease without finishing (it seizes it
/// again when it resumes).
const CLOSE_LEASE_TTL: Duration = Duration::from_secs(30);

fn ignore_stale(e: StoreError) -> Result<u64, StoreError> {
    match e {
        StoreError::Stale(_) => Ok(0),
        e => Err(e),
    }
}

fn ignore_stale_vec<T>(e: StoreError) -> Result<Vec<T>, StoreError> {
    ignore_stale(e).map(|_| Vec::new())
}

/// The view of a closed event, from the ledger (its buckets are retired).
pub(crate) async fn final_view<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    event: &EventId,
) -> Result<EventView, ControlError> {
    let mut view = match engine.view(event).await {
        Ok(view) => view,
        Err(EngineError::UnknownEvent(_) | EngineError::Store(StoreError::Stale(_))) => {
            let db = ledger
                .event(event)
                .await?
                .ok_or_else(|| EngineError::UnknownEvent(event.clone()))?;
            let mut view = EventView::new(
                &crate::domain::model::EventMeta {
                    spec: db.spec.clone(),
                    status: EventStatus::Closed,
                    generation: 0,
                    seq: 0,
                    sold_out: None,
                    created_ms: 0,
                    retired: Vec::new(),
                    reshard_to: None,
                    history: Vec::new(),
                },
                &[],
                engine.clock().now_ms(),
            );
            // The ledger keeps the mode, not the keys (its spec has none):
            // read from the spec, an archived token event showed `open`
            // (and a draw event `token`, when the ledger wrote only those two).
            view.access = db.access;
            view
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(t) = ledger.totals(event).await? {
        view.remaining = 0;
        view.sold = t.sold.saturating_sub(t.released);
        view.leftover = Some(t.leftover);
        view.status = "closed";
        for b in &mut view.buckets {
            b.remaining = 0;
        }
        view.skew = 1.0;
    }
    Ok(view)
}

/// Rebuilds events the ledger has on sale and the store lost. Returns the
/// events rebuilt and the events refused.
pub async fn recover_lost<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    policy: LostState,
) -> Result<(Vec<EventId>, Vec<EventId>), ControlError> {
    let (mut rebuilt, mut refused) = (Vec::new(), Vec::new());
    for db in ledger.events().await? {
        if db.closed || engine.store().load_meta(&db.spec.id).await?.is_some() {
            continue;
        }
        match policy {
            LostState::Rebuild if db.token_access => {
                tracing::error!(event = %db.spec.id, "{}", ControlError::TokenEvent(db.spec.id.clone()));
                refused.push(db.spec.id.clone());
            }
            LostState::Rebuild => {
                rebuild(engine, ledger, &db).await?;
                rebuilt.push(db.spec.id.clone());
            }
            LostState::Refuse => {
                tracing::error!(
                    event = %db.spec.id,
                    "the store lost this event, which the ledger has on sale; it stays unavailable \
                     until an operator runs `shardstock recover {}`",
                    db.spec.id
                );
                refused.push(db.spec.id.clone());
            }
        }
    }
    Ok((rebuilt, refused))
}

/// Recreates an event's buckets from the ledger (see the module docs).
pub async fn rebuild<S: Store>(
    engine: &Engine<S>,
    ledger: &Ledger,
    db: &DbEvent,
) -> Result<(), ControlError> {
    if db.token_access {
        return Err(ControlError::TokenEvent(db.spec.id.clone()));
    }
    let spec = &db.spec;
    let store = engine.store();
    let totals = ledger.totals(&spec.id).await?.unwrap_or_default();
    let remaining = spec
        .stock
        .saturating_sub(totals.sold.saturating_sub(totals.released) + totals.leftover);
    match store.create_event(spec, engine.clock().now_ms()).await? {
        CreateEventReply::Created => {}
        CreateEventReply::Exists(meta) if meta.status == EventStatus::Creating => {}
        CreateEventReply::Exists(_) => return Ok(()),
    }
    store.register_event(&spec.id).await?;
    // A fresh generation: no stream of the rebuilt buckets reuses an old name.
    let generation = ledger.max_generation(&spec.id).await?.map_or(0, |g| g + 1);
    store
        .set_layout(&spec.id, generation, spec.buckets, &[])
        .await?;
    let orders = ledger.confirmed_orders(&spec.id).await?;
    let mut holdings: HashMap<u32, HashMap<UserId, u64>> = HashMap::new();
    let mut entries: HashMap<u32, Vec<(OrderId, OrderEntry)>> = HashMap::new();
    for o in orders {
        let Ok(user) = UserId::parse(o.user.clone()) else {
            continue;
        };
        let h = home(user_hash(&user), spec.buckets);
        *holdings
            .entry(h)
            .or_default()
            .entry(user.clone())
            .or_default() += o.qty;
        let entry = OrderEntry {
            state: if o.held_until.is_some() {
                EntryState::Held
            } else {
                EntryState::Confirmed
            },
            user: user.clone(),
            qty: o.qty as u32,
            bucket: o.bucket as u32,
            request_id: if o.request_id.is_empty() {
                String::new()
            } else {
                format!("{user}/{}", o.request_id)
            },
            at_ms: o.at_ms,
            pay_by: o.held_until,
        };
        entries
            .entry(h)
            .or_default()
            .push((OrderId::from_stored(&o.order_id), entry));
    }
    for (b, units) in split_even(remaining, spec.buckets).into_iter().enumerate() {
        let bucket = BucketRef::new(&spec.id, generation, b as u32);
        store.init_bucket(&bucket, units).await?;
        let users: Vec<(UserId, u64)> = holdings
            .remove(&(b as u32))
            .unwrap_or_default()
            .into_iter()
            .collect();
        let orders = entries.remove(&(b as u32)).unwrap_or_default();
        // Token 0: a fresh layout no mover has fenced yet.
        for chunk in users.chunks(500) {
            restored(
                &bucket,
                store.restore(&bucket, 0, chunk, &[], &[], &[]).await?,
            )?;
        }
        for chunk in orders.chunks(500) {
            // Replays of client request ids answer what the ledger recorded.
            let records: Vec<(String, RequestRecord)> = chunk
                .iter()
                .filter(|(_, e)| !e.request_id.is_empty())
                .map(|(oid, e)| {
                    let record = RequestRecord::Bought {
                        qty: e.qty,
                        order_id: oid.clone(),
                        bucket: e.bucket,
                        probes: 0,
                    };
                    (e.request_id.clone(), record)
                })
                .collect();
            restored(
                &bucket,
                store.restore(&bucket, 0, &[], chunk, &records, &[]).await?,
            )?;
        }
    }
    store
        .set_status(&spec.id, EventStatus::Creating, EventStatus::OnSale)
        .await?;
    engine.forget(&spec.id);
    // Info: on the embedded store this is every start. Whether a rebuild is
    // an alarm is the caller's to say (a store that lost its state is).
    tracing::info!(event = %spec.id, remaining, "rebuilt the event's buckets from the ledger");
    Ok(())
}

/// A rebuild's restore was refused: a mover fenced the fresh layout under it.
fn restored(bucket: &BucketRef, reply: RestoreReply) -> Result<(), ControlError> {
    match reply {
        RestoreReply::Restored => Ok(()),
        RestoreReply::Fenced { highest } => Err(EngineError::from(MoverError::Fenced {
            bucket: bucket.index,
            token: 0,
            highest,
        })
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::token::{Access, TokenAccess};

    /// The ledger keeps a `token` event's access mode, not its keys: read
    /// from there (the store no longer has the event), its final view still
    /// says `token`, a draw event's `draw` (it said `token` when the ledger
    /// wrote only those two), and an open one's `open`.
    #[tokio::test]
    async fn a_final_view_from_the_ledger_keeps_the_access_mode() {
        let dir = std::env::temp_dir().join(format!(
            "shardstock-final-view-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/ledger.db", dir.display());
        let ledger = Ledger::connect(&url, 2).await.unwrap();
        let engine = Engine::new(crate::store::memory::MemoryStore::new(), Default::default());
        let key = TokenAccess {
            keys: vec!["k".repeat(16)],
        };
        let draw = crate::domain::draw::DrawSpec::new(1, None, 1.0, 1, 3600, 600).unwrap();
        for (name, tokens, draw, access) in [
            ("open-e", None, None, Access::Open),
            ("token-e", Some(key.clone()), None, Access::Token),
            ("draw-e", Some(key), Some(draw), Access::Draw),
        ] {
            let spec = EventSpec {
                id: EventId::parse(name).unwrap(),
                stock: 10,
                buckets: 1,
                per_user_limit: None,
                max_per_order: 10,
                starts_at: None,
                ends_at: None,
                hold_seconds: None,
                auto_buckets: None,
                tokens,
                draw,
            };
            ledger.register_event(&spec, 0).await.unwrap();
            let view = final_view(&engine, &ledger, &spec.id).await.unwrap();
            assert_eq!(view.access, access, "{name}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
