//! `Faulty<S>`: any store, with a failure injected into the Nth call of a
//! saga step (`take`, `finish`), either before the step runs or after it
//! applied (the reply lost, as when a command times out after Redis ran it).
//! Every other step passes through unchanged.

use std::sync::{Arc, Mutex};

use shardstock::domain::ids::{EventId, OrderId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::{
    BucketState, EventMeta, EventSpec, EventStatus, OrderEntry, RequestRecord,
};
use shardstock::domain::stream::{StreamEntry, StreamId};
use shardstock::store::{
    BucketAudit, BucketContents, Buckets, CancelReply, CreateEventReply, EndReshardReply, Events,
    FinishArgs, FinishReply, Leases, OpenTransfer, PurchaseEntry, PurchaseReply, RestoreReply,
    Retirement, SeqBump, Store, StoreError, Streams, TakeArgs, TakeReply, TransferReply, Transfers,
};

/// The saga steps a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Take,
    Finish,
}

/// Whether the failing call runs first (its reply lost) or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Before,
    After,
}

/// A fault armed for the `nth` next call of `step`.
#[derive(Debug)]
struct Armed {
    step: Step,
    nth: u32,
    when: When,
}

/// A store whose saga steps fail when told to.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    armed: Arc<Mutex<Vec<Armed>>>,
}

impl<S: Store> Faulty<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            armed: Arc::default(),
        }
    }

    /// The `nth` next call of `step` (1: the next one) fails, `when`.
    pub fn fail(&self, step: Step, nth: u32, when: When) {
        self.armed.lock().unwrap().push(Armed { step, nth, when });
    }

    /// Counts a call of `step`: the fault due now, if any.
    fn due(&self, step: Step) -> Option<When> {
        let mut armed = self.armed.lock().unwrap();
        let mut due = None;
        armed.retain_mut(|a| {
            if a.step != step {
                return true;
            }
            a.nth -= 1;
            if a.nth == 0 {
                due = Some(a.when);
                return false;
            }
            true
        });
        due
    }
}

fn injected(step: &str) -> StoreError {
    StoreError::Unavailable(format!("injected: {step} timed out"))
}

impl<S: Store> Store for Faulty<S> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

impl<S: Store> Events for Faulty<S> {
    async fn create_event(
        &self,
        spec: &EventSpec,
        now_ms: i64,
    ) -> Result<CreateEventReply, StoreError> {
        self.inner.create_event(spec, now_ms).await
    }
    async fn register_event(&self, event: &EventId) -> Result<(), StoreError> {
        self.inner.register_event(event).await
    }
    async fn list_events(&self) -> Result<Vec<EventId>, StoreError> {
        self.inner.list_events().await
    }
    async fn load_meta(&self, event: &EventId) -> Result<Option<EventMeta>, StoreError> {
        self.inner.load_meta(event).await
    }
    async fn set_status(
        &self,
        event: &EventId,
        from: EventStatus,
        to: EventStatus,
    ) -> Result<bool, StoreError> {
        self.inner.set_status(event, from, to).await
    }
    async fn set_layout(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        self.inner
            .set_layout(event, generation, buckets, retired)
            .await
    }
    async fn bump_seq(&self, event: &EventId) -> Result<SeqBump, StoreError> {
        self.inner.bump_seq(event).await
    }
    async fn epochs_bumped(&self, event: &EventId, due: u64) -> Result<bool, StoreError> {
        self.inner.epochs_bumped(event, due).await
    }
    async fn mark_sold_out(
        &self,
        event: &EventId,
        seq: u64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner.mark_sold_out(event, seq, now_ms).await
    }
    async fn begin_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
    ) -> Result<bool, StoreError> {
        self.inner.begin_reshard(event, generation, buckets).await
    }
    async fn end_reshard(
        &self,
        event: &EventId,
        generation: u32,
        buckets: u32,
        retired: &[(u32, u32)],
        owner: &str,
        token: u64,
    ) -> Result<EndReshardReply, StoreError> {
        self.inner
            .end_reshard(event, generation, buckets, retired, owner, token)
            .await
    }
    async fn set_retired(
        &self,
        event: &EventId,
        generation: u32,
        retired: &[(u32, u32)],
    ) -> Result<bool, StoreError> {
        self.inner.set_retired(event, generation, retired).await
    }
}

impl<S: Store> Buckets for Faulty<S> {
    async fn init_bucket(&self, bucket: &BucketRef, stock: u64) -> Result<(), StoreError> {
        self.inner.init_bucket(bucket, stock).await
    }
    async fn purchase(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        entries: &[PurchaseEntry],
    ) -> Result<Vec<PurchaseReply>, StoreError> {
        self.inner.purchase(bucket, now_ms, entries).await
    }
    async fn take(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &TakeArgs,
    ) -> Result<TakeReply, StoreError> {
        let fault = self.due(Step::Take);
        if fault == Some(When::Before) {
            return Err(injected("take"));
        }
        let reply = self.inner.take(bucket, now_ms, args).await;
        if fault == Some(When::After) {
            return Err(injected("take"));
        }
        reply
    }
    async fn untake(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &TakeArgs,
    ) -> Result<bool, StoreError> {
        self.inner.untake(bucket, now_ms, args).await
    }
    async fn finish(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        args: &FinishArgs,
    ) -> Result<FinishReply, StoreError> {
        let fault = self.due(Step::Finish);
        if fault == Some(When::Before) {
            return Err(injected("finish"));
        }
        let reply = self.inner.finish(bucket, now_ms, args).await;
        if fault == Some(When::After) {
            return Err(injected("finish"));
        }
        reply
    }
    async fn clear_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<u32, StoreError> {
        self.inner.clear_markers(bucket, rid, passes).await
    }
    async fn stale_pending(
        &self,
        bucket: &BucketRef,
        before_ms: i64,
        count: u32,
    ) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        self.inner.stale_pending(bucket, before_ms, count).await
    }
    async fn cancel(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        order: &OrderId,
    ) -> Result<CancelReply, StoreError> {
        self.inner.cancel(bucket, now_ms, order).await
    }
    async fn order_entry(
        &self,
        bucket: &BucketRef,
        order: &OrderId,
    ) -> Result<Option<OrderEntry>, StoreError> {
        self.inner.order_entry(bucket, order).await
    }
    async fn request_record(
        &self,
        bucket: &BucketRef,
        rid: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        self.inner.request_record(bucket, rid).await
    }
    async fn held(&self, bucket: &BucketRef, user: &UserId) -> Result<u64, StoreError> {
        self.inner.held(bucket, user).await
    }
    async fn counters(&self, bucket: &BucketRef) -> Result<(u64, u64), StoreError> {
        self.inner.counters(bucket).await
    }
    async fn set_empty(
        &self,
        bucket: &BucketRef,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        self.inner.set_empty(bucket, epoch, ttl_ms).await
    }
    async fn bump_epoch(&self, bucket: &BucketRef) -> Result<(), StoreError> {
        self.inner.bump_epoch(bucket).await
    }
    async fn bucket_state(&self, bucket: &BucketRef) -> Result<BucketState, StoreError> {
        self.inner.bucket_state(bucket).await
    }
}

impl<S: Store> Leases for Faulty<S> {
    async fn acquire_leadership(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.acquire_leadership(event, owner, ttl_ms).await
    }
    async fn release_leadership(
        &self,
        event: &EventId,
        owner: &str,
        term: u64,
    ) -> Result<(), StoreError> {
        self.inner.release_leadership(event, owner, term).await
    }
    async fn acquire_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.acquire_lease(event, owner, ttl_ms).await
    }
    async fn seize_lease(
        &self,
        event: &EventId,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        self.inner.seize_lease(event, owner, ttl_ms).await
    }
    async fn renew_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        self.inner.renew_lease(event, owner, token, ttl_ms).await
    }
    async fn release_lease(
        &self,
        event: &EventId,
        owner: &str,
        token: u64,
    ) -> Result<(), StoreError> {
        self.inner.release_lease(event, owner, token).await
    }
    async fn lease_holder(&self, event: &EventId) -> Result<Option<(String, u64)>, StoreError> {
        self.inner.lease_holder(event).await
    }
}

impl<S: Store> Transfers for Faulty<S> {
    async fn transfer_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.inner
            .transfer_out(bucket, token, xid, target, units)
            .await
    }
    async fn drain_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.inner
            .drain_out(bucket, token, xid, target, units)
            .await
    }
    async fn raise_fence(&self, bucket: &BucketRef, token: u64) -> Result<u64, StoreError> {
        self.inner.raise_fence(bucket, token).await
    }
    async fn transfer_in(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.inner
            .transfer_in(bucket, token, xid, source, units)
            .await
    }
    async fn transfer_clear(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
    ) -> Result<TransferReply, StoreError> {
        self.inner.transfer_clear(bucket, token, xid).await
    }
    async fn open_transfers(&self, bucket: &BucketRef) -> Result<Vec<OpenTransfer>, StoreError> {
        self.inner.open_transfers(bucket).await
    }
}

impl<S: Store> Streams for Faulty<S> {
    async fn stream_read(
        &self,
        bucket: &BucketRef,
        consumer: &str,
        count: usize,
        claim_idle_ms: u64,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        self.inner
            .stream_read(bucket, consumer, count, claim_idle_ms)
            .await
    }
    async fn stream_ack(&self, bucket: &BucketRef, ids: &[StreamId]) -> Result<u64, StoreError> {
        self.inner.stream_ack(bucket, ids).await
    }
    async fn stream_len(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        self.inner.stream_len(bucket).await
    }
}

impl<S: Store> Retirement for Faulty<S> {
    async fn seal(&self, bucket: &BucketRef) -> Result<u64, StoreError> {
        self.inner.seal(bucket).await
    }
    async fn retire(&self, bucket: &BucketRef, now_ms: i64) -> Result<Option<u64>, StoreError> {
        self.inner.retire(bucket, now_ms).await
    }
    async fn audit_bucket(&self, bucket: &BucketRef) -> Result<BucketAudit, StoreError> {
        self.inner.audit_bucket(bucket).await
    }
    async fn pending(
        &self,
        bucket: &BucketRef,
    ) -> Result<Vec<(String, RequestRecord)>, StoreError> {
        self.inner.pending(bucket).await
    }
    async fn take_markers(
        &self,
        bucket: &BucketRef,
        rid: &str,
        passes: u32,
    ) -> Result<Vec<(u32, OrderId)>, StoreError> {
        self.inner.take_markers(bucket, rid, passes).await
    }
    async fn restore(
        &self,
        bucket: &BucketRef,
        token: u64,
        holdings: &[(UserId, u64)],
        orders: &[(OrderId, OrderEntry)],
        records: &[(String, RequestRecord)],
    ) -> Result<RestoreReply, StoreError> {
        self.inner
            .restore(bucket, token, holdings, orders, records)
            .await
    }
    async fn contents(&self, bucket: &BucketRef) -> Result<BucketContents, StoreError> {
        self.inner.contents(bucket).await
    }
    async fn expire_bucket(&self, bucket: &BucketRef, ttl_ms: u64) -> Result<(), StoreError> {
        self.inner.expire_bucket(bucket, ttl_ms).await
    }
}
