//! Live resharding: moving a running event to another bucket count.
//!
//! 1. The meta says "resharding to (gen+1, M)" — purchases wait for the new
//!    layout rather than sell from the old one (`begin_reshard.lua`).
//! 2. Under the mover lease, kept renewed for the whole run: the new layout is
//!    created empty, every bucket of both layouts is fenced to the lease's
//!    token and open transfers are completed; then the old buckets are
//!    sealed (no purchase, take, cancel or transfer changes them any more),
//!    sagas cut off mid-way are settled, and in a release's pool every order
//!    not ended with a take there is refused and the take given back
//!    (`Engine::settle_pool_orders`).
//! 3. Each user's holdings, order index entries and request records move to the
//!    user's home in the new layout (`hash % M`), so per-user limits and
//!    idempotency carry over. Every write is fenced by the token
//!    (`restore.lua`): a run that stalled past its lease cannot overwrite a
//!    layout that a newer run finished and that has been selling since.
//! 4. The stock moves by journaled, fenced transfers in passes: each pass
//!    reads what the old buckets still hold and what the new ones already
//!    have, and plans from that — never from what an earlier, interrupted
//!    run meant to move — with transfer ids unique per run and pass
//!    (`rs.<gen>.<from>.<to>.<token>.<pass>`), so an id is never reused for
//!    another amount. Passes repeat until the old layout is empty.
//! 5. One step switches the meta to the new layout and back on sale
//!    (`end_reshard.lua`), only if the old layout was found empty, the event
//!    is still `resharding` (a close that wrote `closed` wins) and this run
//!    still holds the lease; the old layout stays listed as retired until its
//!    streams are flushed.
//!
//! Every step is idempotent: a reshard interrupted anywhere is resumed by
//! asking for the same bucket count again (the rebalancer leader also resumes
//! one it finds stalled). `control::checkpoint` names the points between the
//! steps, where the tests crash and pause runs.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::try_join_all;
use futures::{FutureExt, StreamExt, stream};

use crate::control::ControlError;
use crate::control::checkpoint::{self, Checkpoint};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{
    EventMeta, EventStatus, LayoutChange, MAX_BUCKETS, OrderEntry, RequestRecord, SpecError,
    split_even,
};
use crate::domain::routing::{home, user_hash};
use crate::domain::token::token_user;
use crate::engine::mover::{self, MoverError};
use crate::engine::{Engine, EngineError, EventView, KeepAlive, Lease};
use crate::store::{
    BucketContents, EndReshardReply, RestoreReply, Store, StoreError, TransferReply,
};

/// Moves `event` to `buckets` buckets while it sells; returns the new view.
pub async fn reshard<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    buckets: u32,
) -> Result<EventView, ControlError> {
    reshard_because(engine, event, buckets, Why::Manual).await
}

/// Refuses to start a reshard of a pool of a release with holds: a held
/// order's markers stay in the layout its lines were taken in, and the
/// reshard's settle (`Engine::settle_pool_orders`) ends pending and refused
/// orders, not held ones, so a confirm or give-back after the switch would
/// miss its take. (An adaptive count is refused on such a release at its
/// creation.) A run already under way is resumed.
async fn held_pool<S: Store>(engine: &Engine<S>, event: &EventId) -> Result<(), ControlError> {
    if let Some(release) = engine.pool_release(event).await?
        && engine.release_spec(&release).await?.hold_seconds.is_some()
    {
        return Err(ControlError::HeldPool {
            event: event.clone(),
            release,
        });
    }
    Ok(())
}

/// Refuses to start a reshard of a drawn draw event: its waiting list's
/// units (aside, reserved, offered) and ticket records are kept in the
/// buckets they came back to, and the list names those buckets; a reshard
/// moves stock and orders, not them (docs/DESIGN.md, "As built (the
/// waiting list)"). Before the draw nothing is aside, and a reshard runs.
async fn waiting_list<S: Store>(
    engine: &Engine<S>,
    meta: &crate::domain::model::EventMeta,
) -> Result<(), ControlError> {
    if meta.spec.draw.is_some()
        && engine
            .store()
            .draw_record(&meta.spec.id)
            .await
            .map_err(EngineError::from)?
            .is_some_and(|r| r.done.is_some())
    {
        return Err(ControlError::WaitingList(meta.spec.id.clone()));
    }
    Ok(())
}

/// Why a reshard runs: the `reason` label of `shardstock_reshards_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `PUT /v1/events/{id}/buckets`.
    Manual,
    /// The configured count changed.
    Config,
    /// The leader resumed one that stalled.
    Resumed,
    /// The adaptive policy (`rebalancer::resize`).
    Auto(crate::control::rebalancer::resize::Reason),
}

impl Why {
    pub const ALL: [&'static str; 6] = ["manual", "config", "resumed", "hot", "spread", "drain"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manual => "manual",
            Self::Config => "config",
            Self::Resumed => "resumed",
            Self::Auto(r) => r.as_str(),
        }
    }
}

/// [`reshard`], counted under `why`.
pub async fn reshard_because<S: Store>(
    engine: &Engine<S>,
    event: &EventId,
    buckets: u32,
    why: Why,
) -> Result<EventView, ControlError> {
    if !(1..=MAX_BUCKETS).contains(&buckets) {
        return Err(EngineError::Spec(SpecError::Buckets(buckets)).into());
    }
    let started = std::time::Instant::now();
    let store = engine.store();
    let meta = engine.reload(event).await?;
    let target = match (meta.status, meta.reshard_to) {
        (EventStatus::OnSale, _) if meta.spec.buckets == buckets => {
            return Ok(engine.view(event).await?);
        }
        (EventStatus::OnSale, _) => {
            held_pool(engine, event).await?;
            waiting_list(engine, &meta).await?;
            (meta.generation + 1, buckets)
        }
        (EventStatus::Resharding, Some(to)) if to.1 == buckets => to,
        (EventStatus::Resharding, _) => {
            return Err(ControlError::Busy(format!(
                "{event} is being resharded to another bucket count"
            )));
        }
        (_, _) => return Err(not_on_sale(event)),
    };
    if !store.begin_reshard(event, target.0, target.1).await? {
        return Err(ControlError::Busy(format!(
            "{event} changed state; try again"
        )));
    }
    let owner = Lease::owner(engine.instance(), "reshard");
    let Some(lease) = Lease::wait(store, event, &owner, LEASE_TTL, LEASE_PATIENCE).await? else {
        return Err(ControlError::Busy(format!(
            "the mover lease of {event} stayed busy"
        )));
    };
    // Read under the lease: a close may have come first, or another run
    // finished this reshard (and maybe began the next one) while this one
    // waited.
    let meta = engine.reload(event).await?;
    if meta.status != EventStatus::Resharding || meta.reshard_to != Some(target) {
        lease.release(store).await;
        return match meta.status {
            EventStatus::OnSale if meta.spec.buckets == buckets => Ok(engine.view(event).await?),
            EventStatus::OnSale | EventStatus::Resharding => Err(ControlError::Busy(format!(
                "{event} changed layout while this reshard waited; try again"
            ))),
            _ => Err(not_on_sale(event)),
        };
    }
    // Kept renewed for as long as the reshard runs, however long that is.
    let keep = lease.keep_alive(store);
    let result = Run::new(engine, &meta, &lease, &keep, target, why)
        .go()
        .await;
    drop(keep);
    lease.release(store).await;
    result?;
    metrics::counter!(crate::metrics::RESHARDS, "event" => event.to_string(), "reason" => why.as_str())
        .increment(1);
    engine.forget(event);
    tracing::info!(
        %event,
        from = meta.spec.buckets,
        to = buckets,
        reason = why.as_str(),
        took_ms = started.elapsed().as_millis() as u64,
        "resharded"
    );
    Ok(engine.view(event).await?)
}

/// The reshard's mover lease: renewed every third of this while it runs.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// How long a reshard waits for another mover (a rebalancer round, a saga's
/// consolidation) to give the lease back.
const LEASE_PATIENCE: Duration = Duration::from_secs(10);
/// Passes over the old layout before a reshard gives up on emptying it (a
/// pass only leaves units behind when some came back during it).
const MAX_PASSES: u32 = 8;

fn not_on_sale(event: &EventId) -> ControlError {
    EngineError::NotOnSale {
        event: event.clone(),
        why: "not on sale",
        starts_at: None,
    }
    .into()
}

fn stale_ok<T: Default>(r: Result<T, StoreError>) -> Result<T, StoreError> {
    match r {
        Err(StoreError::Stale(_)) => Ok(T::default()),
        other => other,
    }
}

/// One run of a reshard, under one lease.
struct Run<'a, S: Store> {
    engine: &'a Engine<S>,
    meta: &'a EventMeta,
    lease: &'a Lease,
    keep: &'a KeepAlive,
    generation: u32,
    old: Vec<BucketRef>,
    new: Vec<BucketRef>,
    /// Transfers this run has made (for the checkpoints).
    transfers: u32,
    why: Why,
}

impl<'a, S: Store> Run<'a, S> {
    fn new(
        engine: &'a Engine<S>,
        meta: &'a EventMeta,
        lease: &'a Lease,
        keep: &'a KeepAlive,
        (generation, buckets): (u32, u32),
        why: Why,
    ) -> Self {
        let event = &meta.spec.id;
        Self {
            engine,
            meta,
            lease,
            keep,
            generation,
            old: (0..meta.spec.buckets)
                .map(|b| BucketRef::new(event, meta.generation, b))
                .collect(),
            new: (0..buckets)
                .map(|b| BucketRef::new(event, generation, b))
                .collect(),
            transfers: 0,
            why,
        }
    }

    fn event(&self) -> &EventId {
        &self.meta.spec.id
    }

    fn store(&self) -> &S {
        self.engine.store()
    }

    fn token(&self) -> u64 {
        self.lease.token()
    }

    /// Between two steps: stops if the lease was found lost (its next fenced
    /// step would be refused anyway), then the tests' checkpoint.
    async fn step(&self, at: Checkpoint) -> Result<(), ControlError> {
        if self.keep.lost().is_cancelled() {
            return Err(self.lost());
        }
        checkpoint::reach(self.event(), at).await?;
        Ok(())
    }

    fn lost(&self) -> ControlError {
        ControlError::Busy(format!(
            "the reshard of {} lost its mover lease; it resumes under a new one",
            self.event()
        ))
    }

    fn fenced(&self, bucket: &BucketRef, highest: u64) -> ControlError {
        EngineError::from(MoverError::Fenced {
            bucket: bucket.index,
            token: self.token(),
            highest,
        })
        .into()
    }

    async fn go(mut self) -> Result<(), ControlError> {
        let store = self.store();
        for b in &self.new {
            store.init_bucket(b, 0).await?;
        }
        // Both layouts fenced: a run with an older token is refused by the
        // new buckets too, not only by the old ones it drains.
        let both: Vec<BucketRef> = self.old.iter().chain(&self.new).cloned().collect();
        mover::take_over(store, self.meta, &both, self.token())
            .await
            .map_err(EngineError::from)?;
        self.step(Checkpoint::ReshardFenced).await?;
        for b in &self.old {
            stale_ok(store.seal(b).await)?;
        }
        for b in &self.old {
            for (rid, record) in stale_ok(store.pending(b).await)? {
                self.engine
                    .settle_pending(self.meta, b.index, &rid, &record)
                    .await?;
            }
        }
        // A release pool: no order not ended keeps a take in the old layout,
        // whose markers do not move (`engine::pool_cut`).
        self.engine.settle_pool_orders(self.meta).await?;
        self.step(Checkpoint::ReshardSealed).await?;
        self.move_contents().await?;
        self.step(Checkpoint::ReshardRestored).await?;
        self.move_stock().await?;
        self.switch().await
    }

    /// Everything the old buckets remember about users, into the users' new
    /// homes. The old buckets are read at once and the new ones written at
    /// once, up to [`RESTORES_IN_FLIGHT`] chunks at a time: the event's
    /// purchases wait for this step, and on a Cluster the buckets' masters
    /// work in parallel.
    async fn move_contents(&self) -> Result<(), ControlError> {
        let store = self.store();
        let contents = try_join_all(
            self.old
                .iter()
                .map(|b| async move { stale_ok(store.contents(b).await) }),
        )
        .await?;
        let moved = regroup(self.event(), contents, self.new.len() as u32)?;
        let mut writes = Vec::new();
        for (h, c) in &moved {
            let bucket = &self.new[*h as usize];
            writes.extend(
                c.holdings
                    .chunks(CHUNK)
                    .map(|chunk| (bucket, Chunk::Holdings(chunk))),
            );
            writes.extend(
                c.orders
                    .chunks(CHUNK)
                    .map(|chunk| (bucket, Chunk::Orders(chunk))),
            );
            writes.extend(
                c.records
                    .chunks(CHUNK)
                    .map(|chunk| (bucket, Chunk::Records(chunk))),
            );
            writes.extend(
                c.tokens
                    .chunks(CHUNK)
                    .map(|chunk| (bucket, Chunk::Tokens(chunk))),
            );
        }
        // Boxed: a stream of borrowing futures is otherwise not provably
        // `Send` in the rebalancer's spawned task (rust-lang/rust#102211).
        let writes: Vec<_> = writes
            .into_iter()
            .map(|(bucket, chunk)| self.restore(bucket, chunk).boxed())
            .collect();
        let mut replies = stream::iter(writes).buffer_unordered(RESTORES_IN_FLIGHT);
        while let Some(reply) = replies.next().await {
            reply?;
        }
        Ok(())
    }

    /// One chunk of a bucket's contents, fenced by this run's token.
    async fn restore(&self, bucket: &BucketRef, chunk: Chunk<'_>) -> Result<(), ControlError> {
        self.step(Checkpoint::ReshardRestore).await?;
        let (store, token) = (self.store(), self.token());
        let reply = match chunk {
            Chunk::Holdings(c) => store.restore(bucket, token, c, &[], &[], &[]).await?,
            Chunk::Orders(c) => store.restore(bucket, token, &[], c, &[], &[]).await?,
            Chunk::Records(c) => store.restore(bucket, token, &[], &[], c, &[]).await?,
            Chunk::Tokens(c) => store.restore(bucket, token, &[], &[], &[], c).await?,
        };
        match reply {
            RestoreReply::Fenced { highest } => Err(self.fenced(bucket, highest)),
            RestoreReply::Restored => Ok(()),
        }
    }

    /// The stock, old → new, in passes planned from what the buckets hold.
    async fn move_stock(&mut self) -> Result<(), ControlError> {
        for pass in 1..=MAX_PASSES {
            let from = self.stocks(&self.old).await?;
            if from.iter().all(|&s| s == 0) {
                return Ok(());
            }
            let mut wants = plan(&from, &self.stocks(&self.new).await?);
            for (source, mut have) in from.into_iter().enumerate() {
                for (to, want) in wants.iter_mut().enumerate() {
                    let units = have.min(*want);
                    if units == 0 {
                        continue;
                    }
                    let moved = self.transfer(source, to, pass, units).await?;
                    have -= moved;
                    *want -= moved;
                    if moved < units {
                        // The bucket held less than read: the next pass replans.
                        break;
                    }
                }
            }
        }
        Err(ControlError::Busy(format!(
            "{}'s old layout still holds units after {MAX_PASSES} passes",
            self.event()
        )))
    }

    async fn stocks(&self, layout: &[BucketRef]) -> Result<Vec<u64>, StoreError> {
        try_join_all(
            layout.iter().map(|b| async move {
                stale_ok(self.store().bucket_state(b).await.map(|s| s.stock))
            }),
        )
        .await
    }

    /// One transfer of `units` from old bucket `source` to new bucket `to`:
    /// OUT, IN, seq bump, CLEAR. Returns the units moved.
    async fn transfer(
        &mut self,
        source: usize,
        to: usize,
        pass: u32,
        units: u64,
    ) -> Result<u64, ControlError> {
        let store = self.engine.store();
        let token = self.token();
        let (from, into) = (&self.old[source], &self.new[to]);
        let xid = mover::reshard_xid(self.generation, from.index, into.index, token, pass);
        let moved = self.units(
            from,
            store
                .drain_out(from, token, &xid, into.index, units)
                .await?,
        )?;
        if moved == 0 {
            return Ok(0);
        }
        self.transfers += 1;
        self.step(Checkpoint::ReshardOut(self.transfers)).await?;
        let (from, into) = (&self.old[source], &self.new[to]);
        self.units(
            into,
            store
                .transfer_in(into, token, &xid, from.index, moved)
                .await?,
        )?;
        store.bump_seq(self.event()).await?;
        self.units(from, store.transfer_clear(from, token, &xid).await?)?;
        self.step(Checkpoint::ReshardMoved(self.transfers)).await?;
        Ok(moved)
    }

    fn units(&self, bucket: &BucketRef, reply: TransferReply) -> Result<u64, ControlError> {
        match reply {
            TransferReply::Applied(n) | TransferReply::Duplicate(n) => Ok(n),
            TransferReply::Fenced { highest } => Err(self.fenced(bucket, highest)),
        }
    }

    /// Switches to the new layout once the old one is found empty.
    async fn switch(&self) -> Result<(), ControlError> {
        let store = self.store();
        for b in &self.old {
            // Its stock and the units of its open transfers, in one read (an
            // open transfer always journals some units): not the audit, which
            // also reads the bucket's whole stream.
            match store.bucket_state(b).await {
                Ok(s) if s.stock > 0 || s.in_transfer > 0 => {
                    return Err(ControlError::Busy(format!(
                        "old bucket {} still holds units; the reshard resumes",
                        b.name()
                    )));
                }
                Ok(_) | Err(StoreError::Stale(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.step(Checkpoint::ReshardSwitch).await?;
        let mut retired = self.meta.retired.clone();
        retired.insert(0, (self.meta.generation, self.meta.spec.buckets));
        let reply = store
            .end_reshard(
                self.event(),
                &LayoutChange {
                    generation: self.generation,
                    buckets: self.new.len() as u32,
                    at_ms: self.engine.clock().now_ms(),
                    reason: self.why.as_str().into(),
                },
                &retired,
                self.lease.owner_id(),
                self.token(),
            )
            .await?;
        match reply {
            EndReshardReply::Switched => Ok(()),
            EndReshardReply::LeaseLost => Err(self.lost()),
            // A close came first, or another run switched while this one
            // stalled: only the first is "not on sale".
            EndReshardReply::NotResharding => {
                match self.engine.reload(self.event()).await?.status {
                    EventStatus::OnSale | EventStatus::Resharding => Err(self.lost()),
                    _ => Err(not_on_sale(self.event())),
                }
            }
        }
    }
}

/// Restore writes per call.
const CHUNK: usize = 500;
/// Restore calls in flight at once while a reshard moves users' records.
const RESTORES_IN_FLIGHT: usize = 8;

/// A slice of what moves to one new bucket: one kind of record per call.
enum Chunk<'a> {
    Holdings(&'a [(UserId, u64)]),
    Orders(&'a [(OrderId, OrderEntry)]),
    Records(&'a [(String, RequestRecord)]),
    Tokens(&'a [(String, u64)]),
}

/// What the old buckets remember (`contents`), grouped by each user's home
/// among `buckets` new ones. A token record whose id names no user stops
/// the reshard ([`ControlError::TokenRecord`]): skipped, its consumption
/// would be left behind in the old layout and the token would buy its
/// allowance again in the new one.
fn regroup(
    event: &EventId,
    contents: Vec<BucketContents>,
    buckets: u32,
) -> Result<HashMap<u32, BucketContents>, ControlError> {
    let mut moved: HashMap<u32, BucketContents> = HashMap::new();
    for c in contents {
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
        // A token's record goes with its user (the id's first part).
        for (id, used) in c.tokens {
            let Some(user) = token_user(&id) else {
                return Err(ControlError::TokenRecord {
                    event: event.clone(),
                    id,
                });
            };
            moved
                .entry(home(user_hash(&user), buckets))
                .or_default()
                .tokens
                .push((id, used));
        }
    }
    Ok(moved)
}

/// How many units each new bucket should still get, given what the old
/// buckets hold (`from`) and the new ones already have (`have`): an even
/// split of the whole, less what is there. That is never less than `from` in
/// total (Σ max(goal − have, 0) ≥ Σ goal − Σ have = Σ from), so a pass can
/// always place every unit it reads.
fn plan(from: &[u64], have: &[u64]) -> Vec<u64> {
    let total = from.iter().sum::<u64>() + have.iter().sum::<u64>();
    split_even(total, have.len() as u32)
        .into_iter()
        .zip(have)
        .map(|(goal, have)| goal.saturating_sub(*have))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_moves_exactly_what_the_old_layout_holds() {
        // A fresh run: 17 + 20 into 4 empty buckets.
        assert_eq!(plan(&[17, 20], &[0, 0, 0, 0]), vec![10, 9, 9, 9]);
        // Resumed after 10 units reached bucket 0: the rest goes elsewhere.
        assert_eq!(plan(&[7, 20], &[10, 0, 0, 0]), vec![0, 9, 9, 9]);
        // Units came back after a pass: bucket 0 is over its share already.
        let wants = plan(&[0, 3], &[20, 8, 8, 9]);
        assert_eq!(wants, vec![0, 4, 4, 3]);
        assert!(wants.iter().sum::<u64>() >= 3);
    }

    #[test]
    fn each_tokens_consumption_goes_to_its_users_new_home() {
        let event = EventId::parse("e").unwrap();
        let u = UserId::parse("u.1").unwrap();
        let old = BucketContents {
            tokens: vec![("u.1.2.1900000000".into(), 2)],
            ..Default::default()
        };
        let moved = regroup(&event, vec![old], 5).unwrap();
        assert_eq!(
            moved[&home(user_hash(&u), 5)].tokens,
            vec![("u.1.2.1900000000".to_owned(), 2)]
        );
    }

    #[test]
    fn a_token_record_naming_no_user_stops_the_reshard() {
        let event = EventId::parse("e").unwrap();
        for id in ["2.1900000000", "u{1}.2.1900000000", ""] {
            let old = BucketContents {
                tokens: vec![(id.into(), 1)],
                ..Default::default()
            };
            match regroup(&event, vec![old], 3) {
                Err(ControlError::TokenRecord { event: e, id: got }) => {
                    assert_eq!((e, got.as_str()), (event.clone(), id));
                }
                other => panic!("{id:?}: {other:?}"),
            }
        }
    }
}
