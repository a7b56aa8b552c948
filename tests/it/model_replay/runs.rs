//! The steps of an engine's runs (`Action::Run`), as the store steps
//! `control::reshard` and `control::lifecycle::close` take for them, under
//! the run's real lease token.
//!
//! Each step answers whether the run goes on, where a store reply decides
//! it (fenced, stale, refused, switched), and that is held against the
//! model's run: gone on to its next step, or ended. A run the model ends
//! gives its lease back, as the real runs do.

use shardstock::domain::ids::{OrderId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::{LayoutChange, OrderEntry, RequestRecord};
use shardstock::domain::routing::{home, user_hash};
use shardstock::domain::transfer::{Forget, reshard_xid, target_generation};
use shardstock::store::{EndReshardReply, RestoreReply, Store, TransferReply};
use shardstock_model::state::State;
use shardstock_model::steps::Step;

use super::driver::{Replay, owner_of, stale_is_none};

/// What a run's step decided, from the store's replies: go on, or end.
/// `None` where no reply decides (nothing to do, or the model ends the run
/// by its program).
type Decided = Option<bool>;

/// A raise that forgets nothing: the model keeps every applied id.
const KEEP_ALL: Forget = Forget {
    mover_below: 0,
    reshard_below: 0,
};

/// Takes engine `e`'s `step` in the store; the replies that disagree with
/// the model.
pub async fn run<S: Store>(
    replay: &mut Replay<'_, S>,
    e: u8,
    step: Step,
    before: &State,
    after: &State,
) -> Vec<String> {
    let mut problems = Vec::new();
    let run = before.engines[e as usize].expect("a run");
    let token = replay.token(run.token);
    let decided = match take(
        replay,
        e,
        step,
        token,
        u32::from(run.pass) + 1,
        (before, after),
    )
    .await
    {
        Ok(decided) => decided,
        Err(why) => {
            problems.push(why);
            None
        }
    };
    let went_on = after.engines[e as usize].is_some_and(|r| r.pc == run.pc + 1);
    if let Some(go) = decided
        && go != went_on
    {
        problems.push(format!(
            "the store's replies {} the run; the model {} it",
            if go { "go on with" } else { "end" },
            if went_on {
                "goes on with"
            } else {
                "ends or repeats"
            }
        ));
    }
    if after.engines[e as usize].is_none() {
        // The real runs release the lease however they end.
        let released = replay
            .store()
            .release_lease(&replay.event, &owner_of(e), token)
            .await;
        if let Err(err) = released {
            problems.push(format!("release_lease failed: {err}"));
        }
    }
    problems
}

fn fenced(reply: &TransferReply) -> bool {
    matches!(reply, TransferReply::Fenced { .. })
}

/// The step's store calls. `Err` for a store error no step expects.
async fn take<S: Store>(
    replay: &mut Replay<'_, S>,
    e: u8,
    step: Step,
    token: u64,
    pass: u32,
    (before, after): (&State, &State),
) -> Result<Decided, String> {
    let fail = |what: &str, e: shardstock::StoreError| format!("{what}: {e}");
    let store = replay.engine.store();
    let event = replay.event.clone();
    let now = replay.clock.now();
    let bounds = replay.model.bounds;
    let (old, new) = (u32::from(bounds.old_buckets), u32::from(bounds.new_buckets));
    Ok(match step {
        Step::Begin => Some(
            store
                .begin_reshard(&event, 1, new)
                .await
                .map_err(|e| fail("begin_reshard", e))?,
        ),
        Step::InitNew => {
            for b in replay.model.layout(1) {
                store
                    .init_bucket(&replay.bucket(b), 0)
                    .await
                    .map_err(|e| fail("init_bucket", e))?;
            }
            Some(true)
        }
        Step::Fence => {
            let mut go = true;
            for b in 0..bounds.buckets() {
                let fence =
                    stale_is_none(store.raise_fence(&replay.bucket(b), token, KEEP_ALL).await)
                        .map_err(|e| fail("raise_fence", e))?;
                if let Some(f) = fence
                    && !before.buckets[b].exists
                {
                    replay.stray_fences.insert(b, f);
                }
                if fence.is_some_and(|f| f > token) {
                    go = false;
                    break;
                }
            }
            Some(go)
        }
        Step::Seal(b) => {
            stale_is_none(store.seal(&replay.bucket(b as usize)).await)
                .map_err(|e| fail("seal", e))?;
            Some(true)
        }
        Step::Settle(b) => {
            let bucket = replay.bucket(b as usize);
            let meta = store
                .load_meta(&event)
                .await
                .map_err(|e| fail("load_meta", e))?;
            let meta = meta.expect("the event's meta");
            let pending = stale_is_none(store.pending(&bucket).await)
                .map_err(|e| fail("pending", e))?
                .unwrap_or_default();
            for (rid, record) in pending {
                replay
                    .engine
                    .settle_pending(&meta, bucket.index, &rid, &record)
                    .await
                    .map_err(|e| format!("settle_pending: {e}"))?;
            }
            Some(true)
        }
        Step::Restore(j) => Some(restore(replay, j as usize, token, old, new).await?),
        Step::Out(i) => {
            let source = replay.bucket(i as usize);
            let Some(state) = stale_is_none(store.bucket_state(&source).await)
                .map_err(|e| fail("bucket_state", e))?
            else {
                return Ok(Some(true));
            };
            if state.stock == 0 {
                let fence = store
                    .raise_fence(&source, token, KEEP_ALL)
                    .await
                    .map_err(|e| fail("raise_fence", e))?;
                Some(fence <= token)
            } else {
                let target = source.index % new;
                let xid = reshard_xid(1, source.index, target, token, pass);
                let reply = store
                    .drain_out(&source, token, &xid, target, state.stock)
                    .await
                    .map_err(|e| fail("drain_out", e))?;
                Some(!fenced(&reply))
            }
        }
        Step::In(i) => complete(replay, i as usize, token, false).await?,
        Step::Clear(i) => {
            let source = replay.bucket(i as usize);
            let Some(fence) = stale_is_none(store.raise_fence(&source, token, KEEP_ALL).await)
                .map_err(|e| fail("raise_fence", e))?
            else {
                return Ok(Some(false));
            };
            if fence > token {
                return Ok(Some(false));
            }
            for t in store
                .open_transfers(&source)
                .await
                .map_err(|e| fail("open_transfers", e))?
            {
                let target = target_of(replay, &source, &t.xid, t.target);
                if store
                    .delivered(&target, &t.xid)
                    .await
                    .map_err(|e| fail("delivered", e))?
                {
                    let reply = store
                        .transfer_clear(&source, token, &t.xid)
                        .await
                        .map_err(|e| fail("transfer_clear", e))?;
                    if fenced(&reply) {
                        return Ok(Some(false));
                    }
                }
            }
            Some(true)
        }
        Step::CheckEmpty => {
            let mut empty = true;
            for b in replay.model.layout(0) {
                let state = stale_is_none(store.bucket_state(&replay.bucket(b)).await)
                    .map_err(|e| fail("bucket_state", e))?;
                empty &= state.is_none_or(|s| s.stock == 0 && s.in_transfer == 0);
            }
            Some(empty)
        }
        Step::Switch => {
            let change = LayoutChange {
                generation: 1,
                buckets: new,
                at_ms: now,
                reason: "manual".into(),
            };
            let reply = store
                .end_reshard(&event, &change, &[(0, old)], &owner_of(e), token)
                .await
                .map_err(|e| fail("end_reshard", e))?;
            let switched = before.meta.generation == 0 && after.meta.generation == 1;
            if (reply == EndReshardReply::Switched) != switched {
                return Err(format!(
                    "end_reshard answered {reply:?}; the model switched: {switched}"
                ));
            }
            None
        }
        Step::Complete(b) => complete(replay, b as usize, token, true).await?,
        Step::Void(b) => {
            let bucket = replay.bucket(b as usize);
            let meta = store
                .load_meta(&event)
                .await
                .map_err(|e| fail("load_meta", e))?;
            if meta.is_some_and(|m| m.generation == bucket.generation) {
                replay
                    .engine
                    .void_holds(&bucket)
                    .await
                    .map_err(|e| fail("void_holds", e))?;
            }
            Some(true)
        }
        Step::Retire(b) => {
            stale_is_none(store.retire(&replay.bucket(b as usize), now).await)
                .map_err(|e| fail("retire", e))?;
            Some(true)
        }
        Step::LedgerClose => None,
    })
}

/// The bucket a transfer out of `source` lands in.
fn target_of<S: Store>(
    replay: &Replay<'_, S>,
    source: &BucketRef,
    xid: &str,
    target: u32,
) -> BucketRef {
    BucketRef::new(
        &replay.event,
        target_generation(xid, source.generation),
        target,
    )
}

/// IN of every transfer open out of model bucket `b` (`mover::complete`),
/// and with `clear` its CLEAR too (a close's takeover).
async fn complete<S: Store>(
    replay: &Replay<'_, S>,
    b: usize,
    token: u64,
    clear: bool,
) -> Result<Decided, String> {
    let store = replay.store();
    let source = replay.bucket(b);
    let Some(open) = stale_is_none(store.open_transfers(&source).await)
        .map_err(|e| format!("open_transfers: {e}"))?
    else {
        return Ok(Some(true));
    };
    if open.is_empty() {
        // Nothing to do: the model's step may still end on the fence.
        return Ok(if clear { None } else { Some(true) });
    }
    for t in open {
        let target = target_of(replay, &source, &t.xid, t.target);
        match store
            .transfer_in(&target, token, &t.xid, source.index, t.units)
            .await
        {
            Ok(reply) if fenced(&reply) => return Ok(Some(false)),
            Ok(_) => {}
            Err(shardstock::StoreError::Stale(_)) => return Ok(Some(false)),
            Err(e) => return Err(format!("transfer_in: {e}")),
        }
        if clear {
            let reply = store
                .transfer_clear(&source, token, &t.xid)
                .await
                .map_err(|e| format!("transfer_clear: {e}"))?;
            if fenced(&reply) {
                return Ok(Some(false));
            }
        }
    }
    Ok(Some(true))
}

/// `restore` into new bucket `j` of what the old layout keeps for the users
/// homed there now (`control::reshard`'s `move_contents`, one call for the
/// three kinds of record).
async fn restore<S: Store>(
    replay: &Replay<'_, S>,
    j: usize,
    token: u64,
    old: u32,
    new: u32,
) -> Result<bool, String> {
    let store = replay.store();
    let target = replay.bucket(j);
    let mut holdings: Vec<(UserId, u64)> = Vec::new();
    let mut orders: Vec<(OrderId, OrderEntry)> = Vec::new();
    let mut records: Vec<(String, RequestRecord)> = Vec::new();
    for i in 0..old {
        let source = BucketRef::new(&replay.event, 0, i);
        let Some(c) =
            stale_is_none(store.contents(&source).await).map_err(|e| format!("contents: {e}"))?
        else {
            continue;
        };
        let here = |user: &UserId| home(user_hash(user), new) == target.index;
        holdings.extend(c.holdings.into_iter().filter(|(u, _)| here(u)));
        orders.extend(c.orders.into_iter().filter(|(oid, _)| {
            OrderId::parse(oid.as_str()).is_ok_and(|(_, _, hash)| home(hash, new) == target.index)
        }));
        records.extend(c.records.into_iter().filter(|(rid, _)| {
            rid.split_once('/')
                .and_then(|(u, _)| UserId::parse(u).ok())
                .is_some_and(|u| here(&u))
        }));
    }
    match store
        .restore(&target, token, &holdings, &orders, &records, &[])
        .await
    {
        Ok(RestoreReply::Restored) => Ok(true),
        Ok(RestoreReply::Fenced { .. }) | Err(shardstock::StoreError::Stale(_)) => Ok(false),
        Err(e) => Err(format!("restore: {e}")),
    }
}
