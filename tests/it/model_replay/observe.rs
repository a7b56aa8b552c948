//! What the store holds, read through the `Store` trait, beside what the
//! model's state says it must hold, after every step.
//!
//! Per bucket of both layouts: whether it exists, its stock, sealed flag,
//! fence (model tokens mapped to the real lease's), units journaled out by
//! open transfers and those transfers (id, target, units), the transfer ids
//! applied into it, units in live holds (`hunits`), each user's count
//! (`users`), each order's index entry (`idx`: H, C, E, X), each request's
//! record (`reqs`: pending, bought, sold out, over the limit), the sagas
//! pending there (`pend`) and the saga takes whose marker stands. For the
//! event: its status and layout generation, and who holds the mover lease.
//! For the ledger: every stream record written since the last step, read as
//! the flusher reads them, counted per order by kind (take, hold, confirm,
//! expire, cancel, void) and the leftover's units.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;
use shardstock::domain::model::{EntryState, EventStatus, RequestRecord};
use shardstock::domain::stream::RecordKind;
use shardstock::domain::transfer::reshard_xid;
use shardstock::store::Store;
use shardstock_model::state::{Bucket, Entry, Marker, Rec, State, Status};

use super::driver::{Replay, owner_of, stale_is_none};

/// One bucket, as either side sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct BucketView {
    stock: u64,
    sealed: bool,
    fence: u64,
    in_transfer: u64,
    hunits: u64,
    /// User index → units (a count of 0 is no count: both read as none).
    users: BTreeMap<usize, u64>,
    /// Order index → its entry's letter.
    orders: BTreeMap<usize, char>,
    /// Request index → its record's letter.
    records: BTreeMap<usize, char>,
    pend: BTreeSet<usize>,
    /// Requests whose take marker stands here.
    taken: BTreeSet<usize>,
    /// Open transfers out: (xid, target index, units).
    open: BTreeSet<(String, u32, u64)>,
    applied: BTreeSet<String>,
}

fn entry_letter(e: Entry) -> Option<char> {
    Some(match e {
        Entry::None => return None,
        Entry::Held => 'H',
        Entry::Confirmed => 'C',
        Entry::Expired => 'E',
        Entry::Cancelled => 'X',
    })
}

fn rec_letter(r: Rec) -> Option<char> {
    Some(match r {
        Rec::None => return None,
        Rec::Pending => 'P',
        Rec::Bought => 'B',
        Rec::SoldOut => 'S',
        Rec::Limit => 'L',
    })
}

fn record_letter(r: &RequestRecord) -> char {
    match r {
        RequestRecord::Pending { .. } => 'P',
        RequestRecord::Bought { .. } => 'B',
        RequestRecord::SoldOut { .. } => 'S',
        RequestRecord::LimitExceeded { .. } => 'L',
    }
}

fn state_letter(s: EntryState) -> char {
    match s {
        EntryState::Held => 'H',
        EntryState::Confirmed => 'C',
        EntryState::Expired => 'E',
        EntryState::Cancelled => 'X',
    }
}

/// The model's bucket `b`, in the store's terms (`None`: not created).
fn expected<S: Store>(replay: &Replay<'_, S>, i: usize, b: &Bucket) -> Option<BucketView> {
    if !b.exists {
        return None;
    }
    let stray_fence = replay.stray_fences.get(&i).copied().unwrap_or(0);
    // A reshard's transfer id names its target's index in the new layout.
    let xid = |x: &shardstock_model::state::Xid, target: u8| {
        reshard_xid(
            1,
            u32::from(x.source),
            u32::from(target),
            replay.token(x.token),
            u32::from(x.pass) + 1,
        )
    };
    let index = |v: &[bool]| -> BTreeSet<usize> { (0..v.len()).filter(|&i| v[i]).collect() };
    Some(BucketView {
        stock: u64::from(b.stock),
        sealed: b.sealed,
        fence: replay.token(b.fence).max(stray_fence),
        in_transfer: b
            .xfer
            .iter()
            .filter(|j| j.open)
            .map(|j| u64::from(j.units))
            .sum(),
        hunits: u64::from(b.hunits),
        users: (0..b.users.len())
            .filter_map(|u| b.users[u].filter(|&n| n > 0).map(|n| (u, u64::from(n))))
            .collect(),
        orders: (0..b.idx.len())
            .filter_map(|o| entry_letter(b.idx[o]).map(|l| (o, l)))
            .collect(),
        records: (0..b.reqs.len())
            .filter_map(|r| rec_letter(b.reqs[r]).map(|l| (r, l)))
            .collect(),
        pend: index(&b.pend),
        taken: index(
            &b.markers
                .iter()
                .map(|m| *m == Marker::Taken)
                .collect::<Vec<_>>(),
        ),
        open: b
            .xfer
            .iter()
            .filter(|j| j.open)
            .map(|j| {
                let target = replay.state.buckets[j.target as usize].index;
                (xid(&j.xid, target), u32::from(target), u64::from(j.units))
            })
            .collect(),
        applied: b.xin.iter().map(|x| xid(x, b.index)).collect(),
    })
}

/// Model bucket `b` as the store holds it (`None`: it does not exist).
async fn actual<S: Store>(replay: &Replay<'_, S>, b: usize) -> Result<Option<BucketView>, String> {
    let store = replay.store();
    let bucket = replay.bucket(b);
    let Some(state) = stale_is_none(store.bucket_state(&bucket).await)
        .map_err(|e| format!("bucket_state: {e}"))?
    else {
        return Ok(None);
    };
    let requests = 0..replay.rids.len();
    // Markers only where the model's saga of the request probes.
    let probed: Vec<usize> = requests
        .clone()
        .filter(|&r| replay.state.saga[r].is_some_and(|g| g == replay.state.buckets[b].generation))
        .collect();
    // One round of reads at once (fred pipelines them on Redis).
    let (audit, contents, pending, markers) = futures::join!(
        store.audit_bucket(&bucket),
        store.contents(&bucket),
        store.pending(&bucket),
        join_all(probed.into_iter().map(|r| {
            let bucket = &bucket;
            async move { (r, store.take_markers(bucket, &replay.rids[r], 1).await) }
        })),
    );
    let audit = audit.map_err(|e| format!("audit_bucket: {e}"))?;
    let contents = contents.map_err(|e| format!("contents: {e}"))?;
    let pending = pending.map_err(|e| format!("pending: {e}"))?;
    let mut view = BucketView {
        stock: state.stock,
        sealed: state.sealed,
        fence: state.fence,
        in_transfer: state.in_transfer,
        hunits: state.held,
        open: audit.open.into_iter().collect(),
        applied: audit.applied.into_iter().collect(),
        ..BucketView::default()
    };
    for (user, units) in contents.holdings {
        let u = replay.users.iter().position(|x| *x == user);
        let u = u.ok_or_else(|| format!("a count of an unknown user {user}"))?;
        if units > 0 {
            view.users.insert(u, units);
        }
    }
    for (oid, entry) in contents.orders {
        let o = replay
            .order_index(oid.as_str())
            .ok_or_else(|| format!("an entry of an unknown order {oid}"))?;
        view.orders.insert(o, state_letter(entry.state));
    }
    let request = |rid: &str| {
        let r = replay.rids.iter().position(|x| x == rid);
        r.ok_or_else(|| format!("a record of an unknown request {rid}"))
    };
    // A pending record is read with its entry in `pend` (`contents` keeps
    // the final ones): the two are written and removed in one step.
    for (rid, record) in pending {
        let r = request(&rid)?;
        view.pend.insert(r);
        view.records.insert(r, record_letter(&record));
    }
    for (rid, record) in contents.records {
        view.records.insert(request(&rid)?, record_letter(&record));
    }
    for (r, taken) in markers {
        let taken = taken.map_err(|e| format!("take_markers: {e}"))?;
        if taken.iter().any(|(_, oid)| *oid == replay.orders[r]) {
            view.taken.insert(r);
        }
    }
    Ok(Some(view))
}

/// Reads the records written since the last step from every bucket's
/// stream (the flusher's read, never acknowledged), into the replay's
/// ledger.
async fn read_streams<S: Store>(replay: &mut Replay<'_, S>) -> Vec<String> {
    let mut problems = Vec::new();
    let reads = join_all((0..replay.state.buckets.len()).map(|b| {
        let bucket = replay.bucket(b);
        let store = replay.store();
        async move { store.stream_read(&bucket, "replay", 1_000, None).await }
    }))
    .await;
    for (b, read) in reads.into_iter().enumerate() {
        let entries = match stale_is_none(read) {
            Ok(entries) => entries.unwrap_or_default(),
            Err(e) => {
                problems.push(format!("stream_read of bucket {b}: {e}"));
                continue;
            }
        };
        for entry in entries {
            if entry.kind == RecordKind::Leftover {
                replay.leftover += entry.qty;
                continue;
            }
            let Some(o) = replay.order_index(&entry.order_id) else {
                problems.push(format!(
                    "bucket {b}: a record of unknown order {:?}",
                    entry.order_id
                ));
                continue;
            };
            let r = &mut replay.ledger[o];
            let count = match entry.kind {
                RecordKind::Order => &mut r.t,
                RecordKind::Hold => &mut r.h,
                RecordKind::Confirm => &mut r.k,
                RecordKind::Expire => &mut r.e,
                RecordKind::Cancel => &mut r.c,
                RecordKind::Void => &mut r.v,
                RecordKind::Leftover => unreachable!("counted above"),
            };
            *count += 1;
        }
    }
    problems
}

fn status(s: Status) -> EventStatus {
    match s {
        Status::OnSale => EventStatus::OnSale,
        Status::Resharding => EventStatus::Resharding,
        Status::Closed => EventStatus::Closed,
    }
}

/// Every difference between the store and the model's state.
pub async fn compare<S: Store>(replay: &mut Replay<'_, S>) -> Vec<String> {
    let mut problems = read_streams(replay).await;
    let state: &State = &replay.state;
    let store = replay.store();
    let found = join_all((0..state.buckets.len()).map(|b| actual(replay, b))).await;
    for (b, found) in found.into_iter().enumerate() {
        let want = expected(replay, b, &state.buckets[b]);
        match found {
            Err(why) => problems.push(format!("bucket {b}: {why}")),
            Ok(found) if found != want => problems.push(format!(
                "bucket {b} (layout {}, index {}):\n      model {want:?}\n      store {found:?}",
                state.buckets[b].generation, state.buckets[b].index
            )),
            Ok(_) => {}
        }
    }
    let (meta, holder) = futures::join!(
        store.load_meta(&replay.event),
        store.lease_holder(&replay.event)
    );
    match meta {
        Ok(Some(meta)) => {
            let want = (status(state.meta.status), u32::from(state.meta.generation));
            if (meta.status, meta.generation) != want {
                problems.push(format!(
                    "meta: model {want:?}, store {:?}",
                    (meta.status, meta.generation)
                ));
            }
        }
        other => problems.push(format!("load_meta: {other:?}")),
    }
    let want = state
        .lease
        .filter(|l| !l.lapsed)
        .map(|l| (owner_of(l.owner), replay.token(l.token)));
    match holder {
        Ok(found) if found != want => {
            problems.push(format!("lease: model {want:?}, store {found:?}"))
        }
        Ok(_) => {}
        Err(e) => problems.push(format!("lease_holder: {e}")),
    }
    for (o, (want, found)) in state.ledger.iter().zip(&replay.ledger).enumerate() {
        if want != found {
            problems.push(format!(
                "order {o}'s records: model {want:?}, streams {found:?}"
            ));
        }
    }
    if u64::from(state.leftover) != replay.leftover {
        problems.push(format!(
            "leftover: model {}, streams {}",
            state.leftover, replay.leftover
        ));
    }
    problems
}
