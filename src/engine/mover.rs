//! The mover: fenced, journaled transfers of units between buckets.
//!
//! A transfer is three idempotent steps: `OUT(a)` moves units from a's stock
//! into a's journal, `IN(b)` adds them to b once per transfer id, then the seq
//! is bumped (units appeared in b) and `CLEAR(a)` closes the journal entry. A
//! crash between any two steps leaves an open journal entry that the next mover
//! completes ([`complete_open`]) before doing anything else, so no unit is lost
//! or counted twice. Every step carries the mover's fencing token: a bucket
//! refuses a token lower than the highest it has accepted, so a mover that
//! paused past its lease cannot write after a newer one has.
//!
//! The lease itself (who may move units of an event) is taken by the caller:
//! the engine for an on-demand consolidation, the rebalancer for its rounds.

use futures::future::try_join_all;

use crate::domain::keys::BucketRef;
use crate::domain::model::EventMeta;
use crate::domain::transfer::Forget;
use crate::store::{OpenTransfer, Store, StoreError, TransferReply};

#[derive(Debug, thiserror::Error)]
pub enum MoverError {
    /// A bucket has accepted a newer token: this mover must stop.
    #[error("bucket {bucket} refused token {token}: it has accepted {highest}")]
    Fenced {
        bucket: u32,
        token: u64,
        highest: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counts of what a mover did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub transfers: u64,
    pub units: u64,
}

fn bucket(meta: &EventMeta, index: u32) -> BucketRef {
    BucketRef::new(&meta.spec.id, meta.generation, index)
}

fn applied(reply: TransferReply, index: u32, token: u64) -> Result<u64, MoverError> {
    match reply {
        TransferReply::Applied(n) | TransferReply::Duplicate(n) => Ok(n),
        TransferReply::Fenced { highest } => Err(MoverError::Fenced {
            bucket: index,
            token,
            highest,
        }),
    }
}

/// Moves up to `units` from bucket `from` to bucket `to`; returns the units moved.
pub async fn transfer<S: Store>(
    store: &S,
    meta: &EventMeta,
    token: u64,
    from: u32,
    to: u32,
    units: u64,
) -> Result<u64, MoverError> {
    let xid = crate::domain::transfer::mover_xid(token, from, to, rand::random());
    let out = store
        .transfer_out(&bucket(meta, from), token, &xid, to, units)
        .await?;
    let moved = applied(out, from, token)?;
    if moved > 0 {
        let open = OpenTransfer {
            xid,
            target: to,
            units: moved,
            token,
        };
        complete(store, meta, token, from, &open).await?;
    }
    Ok(moved)
}

/// After units were added to a bucket (a cancel, an untake, a transfer IN):
/// bumps the event's seq, and if the event was marked sold out, every bucket's
/// epoch too, so no bucket answers "sold out" from its empty mark any more.
///
/// Retryable until it completes: the store remembers that epochs are due
/// until this reports them bumped, so a caller that failed or died between
/// the seq and the epochs leaves the work to the next call (any later cancel,
/// untake or transfer, or the retried cancel).
pub(crate) async fn units_came_back<S: Store>(
    store: &S,
    event: &crate::domain::ids::EventId,
    meta: &EventMeta,
) -> Result<(), StoreError> {
    if let Some(due) = store.bump_seq(event).await?.epochs_due {
        try_join_all(
            (0..meta.spec.buckets).map(|b| async move { store.bump_epoch(&bucket(meta, b)).await }),
        )
        .await?;
        store.epochs_bumped(event, due).await?;
    }
    Ok(())
}

pub use crate::domain::transfer::reshard_xid;
use crate::domain::transfer::target_generation;

/// IN, seq bump, CLEAR: the rest of a journaled transfer.
pub(crate) async fn complete<S: Store>(
    store: &S,
    meta: &EventMeta,
    token: u64,
    source: u32,
    t: &OpenTransfer,
) -> Result<(), MoverError> {
    let target = BucketRef::new(
        &meta.spec.id,
        target_generation(&t.xid, meta.generation),
        t.target,
    );
    // Into a sealed target too, for a mover's own transfer and for one a
    // takeover finishes: the units left their source already, and a target
    // sealed since the OUT (a reshard or close that sealed part of its
    // layout, then lost the lease to a mover with a newer token and a cached
    // meta) would otherwise keep them in the journal for good (fault seed
    // 31025). Safe: whoever sealed the layout moves them on (a reshard) or
    // counts them (a close) under a newer token, which fences this mover out
    // of every bucket first; a mover with a newer token means that run lost
    // its lease, and its switch or close is refused.
    let reply = store
        .complete_in(&target, token, &t.xid, source, t.units)
        .await?;
    applied(reply, t.target, token)?;
    // Units appeared in the target: a sold-out decision spanning this must retry.
    units_came_back(store, &meta.spec.id, meta).await?;
    let reply = store
        .transfer_clear(&bucket(meta, source), token, &t.xid)
        .await?;
    applied(reply, source, token)?;
    Ok(())
}

/// Takes over as the mover with `token`: raises the fence of every bucket in
/// `buckets` to it (so a mover holding an older token is refused by every
/// bucket, not only by those this one happens to touch), then completes every
/// transfer a previous mover left open. `Fenced` when a bucket has already
/// accepted a newer token: another mover took over since.
///
/// When `buckets` holds the whole current layout, a takeover that got this
/// far has closed every transfer made there under a lower token, and says so
/// (`Transfers::settle_transfers`); the next takeover's fences let the
/// buckets forget those ids (`domain::transfer`), so what a bucket remembers
/// of transfers stays bounded however long the sale runs.
pub async fn take_over<S: Store>(
    store: &S,
    meta: &EventMeta,
    buckets: &[BucketRef],
    token: u64,
) -> Result<Moved, MoverError> {
    let settled = store.settled_transfers(&meta.spec.id).await?;
    let settled_in = |generation: u32| {
        settled
            .iter()
            .find(|(g, _)| *g == generation)
            .map_or(0, |(_, t)| *t)
    };
    for b in buckets {
        let forget = Forget {
            mover_below: settled_in(b.generation),
            // A layout that is or was the event's current one holds no open
            // reshard transfer into it (the switch waited for none).
            reshard_below: if b.generation <= meta.generation {
                u64::MAX
            } else {
                0
            },
        };
        let fence = match store.raise_fence(b, token, forget).await {
            Ok(fence) => fence,
            // A bucket of a layout that is gone: nothing to fence.
            Err(StoreError::Stale(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if fence > token {
            return Err(MoverError::Fenced {
                bucket: b.index,
                token,
                highest: fence,
            });
        }
    }
    let done = complete_open(store, meta, token).await?;
    let whole = (0..meta.spec.buckets).all(|i| buckets.contains(&bucket(meta, i)));
    if whole {
        store
            .settle_transfers(&meta.spec.id, meta.generation, token)
            .await?;
    }
    Ok(done)
}

/// Completes every transfer a previous mover left open; returns what it completed.
pub async fn complete_open<S: Store>(
    store: &S,
    meta: &EventMeta,
    token: u64,
) -> Result<Moved, MoverError> {
    let open = try_join_all((0..meta.spec.buckets).map(|b| async move {
        store
            .open_transfers(&bucket(meta, b))
            .await
            .map(|list| (b, list))
    }))
    .await?;
    let mut done = Moved::default();
    for (source, list) in open {
        for t in list {
            complete(store, meta, token, source, &t).await?;
            done.transfers += 1;
            done.units += t.units;
        }
    }
    Ok(done)
}

/// Gathers units from other buckets into `target` until it holds `want`
/// (or nothing more can be found); returns what moved.
pub async fn gather<S: Store>(
    store: &S,
    meta: &EventMeta,
    token: u64,
    target: u32,
    want: u64,
) -> Result<Moved, MoverError> {
    let states = try_join_all((0..meta.spec.buckets).map(|b| async move {
        store
            .bucket_state(&bucket(meta, b))
            .await
            .map(|s| (b, s.stock))
    }))
    .await?;
    let have = states.iter().find(|(b, _)| *b == target).map_or(0, |s| s.1);
    let mut need = want.saturating_sub(have);
    let mut sources: Vec<(u32, u64)> = states
        .into_iter()
        .filter(|&(b, stock)| b != target && stock > 0)
        .collect();
    sources.sort_by_key(|&(_, stock)| std::cmp::Reverse(stock));
    let mut done = Moved::default();
    for (source, stock) in sources {
        if need == 0 {
            break;
        }
        let moved = transfer(store, meta, token, source, target, stock.min(need)).await?;
        need = need.saturating_sub(moved);
        done.units += moved;
        done.transfers += u64::from(moved > 0);
    }
    Ok(done)
}
