//! The flusher: every bucket's order stream into the ledger, exactly once.
//!
//! Each instance runs one, as a consumer of the `flusher` group on every bucket
//! stream, so instances share the work and a dead instance's unacknowledged
//! records are claimed by the others once idle `claim_idle_ms` (each worker
//! claims on a bucket at most every half of that, so within 1.5×: the claim
//! scans the stream's pending list, too costly for every read). A round reads up to
//! a batch from the buckets (starting at a rotating bucket, so none starves),
//! writes it in one transaction (`Ledger::apply`: idempotent by stream id, with
//! the final guard), and only then acknowledges the records (and trims the
//! head of the stream no consumer still needs: `Streams::stream_ack`). When
//! the database is down the batch is kept and retried with backoff; nothing is
//! read meanwhile, so the streams — and the lag gauge — grow, and drain when the
//! database is back.
//!
//! Which buckets a round reads follows activity, not the number of events: the
//! buckets this process wrote since the last round (`engine::Activity`, marked
//! by every step that appends to a stream), the ones a full batch left
//! unfinished, and what the slow [`StreamScan`] finds holding records (buckets
//! written by other or dead instances). An idle flusher reads nothing but the
//! scan's paced `XLEN`s.
//!
//! Batches are filled by waiting: a round that read less than a batch pauses
//! `idle`, as a round that read nothing does, before the next. A commit costs
//! the database a fixed amount whatever its size, so a sale flushed as it
//! arrives, in rounds of a few records, cost several times more per order than
//! the same sale in rounds of hundreds; now a round reads what arrived during
//! the pause, and when sales outrun the batches they come back full and the
//! worker goes on at once. The lag stays what it was when idle: one `idle`
//! (and a round). A close and the final drain never wait (`drain`), and the
//! audit counts what is still in the streams.
//!
//! Of the `workers`, one (the lead) reads every round; the others help only
//! while rounds come back full (`busy`). Each worker reading on its own pause
//! made rounds `workers` times as often, each a `workers`th of the records:
//! four workers at a sale rate one could keep up with cost PostgreSQL 8–10 µs
//! an order against 6 for one (BENCHMARKS.md, "Fifth round"). When the sales
//! outrun one worker's full batches, the helpers read too, side by side.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use tokio_util::sync::CancellationToken;

use crate::control::stream_scan::{Lag, SCAN_PER_S, StreamScan};
use crate::control::ticker::Ticker;
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::stream::StreamId;
use crate::engine::{Engine, EngineError};
use crate::ledger::{FlushRecord, Ledger, LedgerError};
use crate::metrics as m;
use crate::store::{Store, StoreError};

/// A batch whose write took this long is logged (the database's statement
/// logging is off: it would print the whole multi-thousand-placeholder text).
const SLOW_BATCH: Duration = Duration::from_secs(1);

/// Tunables (from `[database]`).
#[derive(Debug, Clone)]
pub struct FlushOptions {
    pub batch: usize,
    /// Concurrent workers in `run` (the consumer group gives each record to one).
    pub workers: usize,
    /// Pause after a round that found nothing.
    pub idle: Duration,
    pub claim_idle_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("stopped before the batch was written")]
    Stopped,
}

/// Whether a round claims records other consumers left pending.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// On every bucket read, those pending at least this many ms.
    Always(u64),
    /// The same, but on each bucket at most every half of that (the worker
    /// loop: a claim scans the stream's pending list, which holds the other
    /// workers' batches in flight, and nothing there is claimable sooner).
    Paced(u64),
}

/// The last claim on each bucket a worker read. Entries older than a claim
/// period are pruned once there are many (idle buckets are claimed again on
/// their next read anyway).
#[derive(Clone, Default)]
struct Claims(HashMap<BucketRef, Instant>);

impl Claims {
    /// Whether `bucket` is due a claim of records idle `idle_ms`; if so, records it as claimed now.
    fn due(&mut self, bucket: &BucketRef, idle_ms: u64) -> bool {
        let period = Duration::from_millis(idle_ms / 2);
        let now = Instant::now();
        if self.0.len() >= 4096 {
            self.0.retain(|_, at| now.duration_since(*at) < period);
        }
        match self.0.get_mut(bucket) {
            Some(at) if now.duration_since(*at) < period => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                self.0.insert(bucket.clone(), now);
                true
            }
        }
    }
}

#[derive(Clone)]
pub struct Flusher<S: Store> {
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    consumer: String,
    opts: FlushOptions,
    cursor: usize,
    /// When this worker last claimed each bucket's long-pending records (see
    /// [`Claims`]).
    claims: Claims,
    /// The slow scan, shared by the workers: whoever finds it here runs it.
    scan: Arc<Mutex<Option<StreamScan>>>,
    lag: Arc<Lag>,
    /// The workers' last round read a full batch or left buckets unfinished:
    /// the helpers read too (see the module docs).
    busy: Arc<AtomicBool>,
    /// The last round's batch, emptied: its capacity stays, so a round does
    /// not grow a fresh vector to thousands of records again, each growth a
    /// new region the kernel faults in and zeroes (the embedded service's
    /// page faults under load halved).
    spare: Vec<FlushRecord>,
    /// Batches written whose acknowledgement failed, acknowledged first
    /// thing next round: else they waited `claim_idle_ms` for a claim (in
    /// the stream, pending under this consumer, counted as the flush lag),
    /// to be read and written again for nothing. At most [`UNACKED_CAP`]
    /// (past it, the claim still gets them).
    unacked: Vec<(BucketRef, Vec<StreamId>)>,
}

/// Written batches a worker keeps to acknowledge again.
const UNACKED_CAP: usize = 1024;

impl<S: Store> Flusher<S> {
    pub fn new(
        engine: Arc<Engine<S>>,
        ledger: Ledger,
        consumer: String,
        opts: FlushOptions,
    ) -> Self {
        Self {
            engine,
            ledger,
            consumer,
            opts,
            claims: Claims::default(),
            cursor: 0,
            scan: Arc::new(Mutex::new(Some(StreamScan::new(SCAN_PER_S)))),
            lag: Arc::default(),
            busy: Arc::default(),
            spare: Vec::new(),
            unacked: Vec::new(),
        }
    }

    /// Sweeps `per_s` buckets a second for records other instances left
    /// (default [`SCAN_PER_S`]).
    pub fn with_scan(self, per_s: u32) -> Self {
        *self.scan.lock().expect("scan poisoned") = Some(StreamScan::new(per_s));
        self
    }

    /// Reads one batch from `buckets`, writes it, acknowledges it. Returns the
    /// number of records read (0: nothing to do). Retries the write until it
    /// succeeds or `stop` fires (then the records stay pending, nothing is lost).
    pub async fn flush_once(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
    ) -> Result<usize, FlushError> {
        self.flush_round(buckets, stop, Claim::Always(self.opts.claim_idle_ms))
            .await
    }

    /// `flush_once`, claiming records other consumers have held as `claim` says.
    async fn flush_round(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
        claim: Claim,
    ) -> Result<usize, FlushError> {
        let (n, _) = self.flush_some(buckets, stop, claim).await?;
        Ok(n)
    }

    /// `flush_round`, also returning the buckets it did not finish: those the
    /// full batch left unread, and those that filled what was left of it.
    async fn flush_some(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
        claim: Claim,
    ) -> Result<(usize, Vec<BucketRef>), FlushError> {
        for (b, ids) in std::mem::take(&mut self.unacked) {
            self.acknowledge(b, ids).await;
        }
        // Always stored empty (below); an error leaves a fresh one.
        let mut batch = std::mem::take(&mut self.spare);
        let mut read: Vec<(BucketRef, Vec<StreamId>)> = Vec::new();
        let mut unfinished = Vec::new();
        let n = buckets.len();
        for i in 0..n {
            let b = &buckets[(self.cursor + i) % n];
            let left = self.opts.batch.saturating_sub(batch.len());
            if left == 0 {
                unfinished.push(b.clone());
                continue;
            }
            let claim_idle_ms = match claim {
                Claim::Always(ms) => Some(ms),
                Claim::Paced(ms) => self.claims.due(b, ms).then_some(ms),
            };
            let entries = match self
                .engine
                .store()
                .stream_read(b, &self.consumer, left, claim_idle_ms)
                .await
            {
                Ok(entries) => entries,
                Err(StoreError::Stale(_)) => continue,
                Err(e) => {
                    crate::metrics::store_error("stream_read");
                    if batch.is_empty() {
                        return Err(e.into());
                    }
                    // What this round read is pending under this consumer,
                    // and a later read takes only new records: write it now
                    // (else it waits `claim_idle_ms` for a claim), and leave
                    // this bucket and the rest to the next round.
                    tracing::warn!(bucket = %b.tag(), error = %e, "flusher: a read failed; writing what the round read");
                    unfinished.extend((i..n).map(|j| buckets[(self.cursor + j) % n].clone()));
                    break;
                }
            };
            if entries.is_empty() {
                continue;
            }
            // The stream's entries: a purchase call's orders share one (its
            // parts, which come together), and a read counts entries.
            let mut ids: Vec<StreamId> = entries.iter().map(|e| e.id).collect();
            ids.dedup();
            if ids.len() >= left {
                unfinished.push(b.clone());
            }
            self.lag.read(b, ids.len() as u64);
            read.push((b.clone(), ids));
            let (stream, event) = (b.name(), b.event.to_string());
            batch.extend(entries.into_iter().map(|entry| FlushRecord {
                stream: stream.clone(),
                event: event.clone(),
                entry,
            }));
        }
        self.cursor = self.cursor.wrapping_add(1);
        if batch.is_empty() {
            self.spare = batch;
            return Ok((0, unfinished));
        }
        for (b, _) in &read {
            self.register(&b.event, stop, batch.len()).await?;
        }
        let started = Instant::now();
        let applied = self
            .write(&batch, stop)
            .instrument(tracing::debug_span!("flush_batch", records = batch.len()))
            .await?;
        let took = started.elapsed();
        metrics::histogram!(m::FLUSH_BATCH_DURATION).record(took.as_secs_f64());
        if took >= SLOW_BATCH {
            tracing::warn!(
                records = batch.len(),
                seconds = took.as_secs_f64(),
                "a flush batch was slow"
            );
        }
        metrics::counter!(m::ORDERS_FLUSHED).increment(applied as u64);
        for (b, ids) in read {
            self.acknowledge(b, ids).await;
        }
        let read_records = batch.len();
        batch.clear();
        self.spare = batch;
        Ok((read_records, unfinished))
    }

    /// Acknowledges records the database has; on a failure keeps them for
    /// the next round (harmless meanwhile: read again, they are skipped as
    /// duplicates).
    async fn acknowledge(&mut self, bucket: BucketRef, ids: Vec<StreamId>) {
        if let Err(e) = self.engine.store().stream_ack(&bucket, &ids).await {
            tracing::warn!(bucket = %bucket.tag(), error = %e, "acknowledging flushed records failed; again next round");
            if self.unacked.len() < UNACKED_CAP {
                self.unacked.push((bucket, ids));
            }
        }
    }

    /// `Ledger::apply`, retried with backoff while the database is unreachable.
    async fn write(
        &self,
        batch: &[FlushRecord],
        stop: &CancellationToken,
    ) -> Result<usize, FlushError> {
        let mut backoff = Backoff::default();
        loop {
            match self.ledger.apply(batch, self.engine.clock().now_ms()).await {
                Ok(applied) => return Ok(applied.new_records),
                Err(e) => backoff.failed("flush failed; retrying", &e, batch.len()),
            }
            backoff.wait(stop).await?;
        }
    }

    /// Makes sure the ledger knows the event (created elsewhere, or before the ledger).
    /// (The ledger remembers which it registered, for the whole process and
    /// until the event closes: a set a flusher kept for itself grew with
    /// every event it ever flushed.)
    ///
    /// Retried like the write: the batch is read, pending under this
    /// consumer, and a batch given up here waited `claim_idle_ms` (up to an
    /// hour) for a claim once the database was back.
    async fn register(
        &self,
        event: &EventId,
        stop: &CancellationToken,
        records: usize,
    ) -> Result<(), FlushError> {
        let mut backoff = Backoff::default();
        while !self.ledger.is_registered(event) {
            let done: Result<(), FlushError> = async {
                if let Some(meta) = self.engine.store().load_meta(event).await? {
                    self.ledger
                        .register_event(&meta.spec, meta.created_ms)
                        .await?;
                }
                Ok(())
            }
            .await;
            match done {
                Ok(()) => return Ok(()),
                Err(e) => backoff.failed("registering the event failed; retrying", &e, records),
            }
            backoff.wait(stop).await?;
        }
        Ok(())
    }

    /// Flushes `buckets` until their streams are empty (the end of a sale).
    ///
    /// Records another consumer read but has not acknowledged are claimed at
    /// once after the first round that cannot read them: that consumer may have
    /// died (a killed instance), and waiting `claim_idle_ms` for it would stall
    /// a close. If it is alive, both write the records, which the ledger keys by
    /// stream id: the second write adds nothing.
    pub async fn drain(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
    ) -> Result<(), FlushError> {
        let mut claim_idle_ms = self.opts.claim_idle_ms;
        loop {
            while self
                .flush_round(buckets, stop, Claim::Always(claim_idle_ms))
                .await?
                > 0
            {}
            let mut left = 0;
            for b in buckets {
                left += self.engine.store().stream_len(b).await?;
            }
            if left == 0 {
                return Ok(());
            }
            // Records delivered to another consumer: claim them next round.
            claim_idle_ms = 0;
            tokio::select! {
                _ = stop.cancelled() => return Err(FlushError::Stopped),
                _ = tokio::time::sleep(self.opts.idle) => {}
            }
        }
    }

    /// `drain` with the configured number of workers side by side.
    pub async fn drain_parallel(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
    ) -> Result<(), FlushError> {
        // A drain is a backlog: the relay paces itself meanwhile.
        self.ledger.set_flush_busy(true);
        let mut workers = tokio::task::JoinSet::new();
        for w in 1..self.opts.workers {
            let mut worker = self.clone();
            worker.cursor = w * 7;
            let (buckets, stop) = (buckets.to_vec(), stop.clone());
            workers.spawn(async move { worker.drain(&buckets, &stop).await });
        }
        let mine = self.drain(buckets, stop).await;
        let mut joined = Ok(());
        while let Some(done) = workers.join_next().await {
            let done = done
                .map_err(|e| FlushError::Store(StoreError::Unavailable(e.to_string())))
                .and_then(|d| d);
            joined = joined.and(done);
        }
        self.ledger.set_flush_busy(false);
        mine.and(joined)
    }

    /// `workers` loops sharing the streams (the consumer group hands each record
    /// to one of them), until `stop`; then a final drain.
    ///
    /// The final drain goes on after `stop` until `deadline` fires; `Err` when
    /// records were left in the streams (they are flushed by another instance,
    /// or by this one after a restart — on the embedded store they are lost).
    pub async fn run(
        self,
        stop: CancellationToken,
        deadline: CancellationToken,
    ) -> Result<(), FlushError> {
        let mut workers = tokio::task::JoinSet::new();
        for w in 1..self.opts.workers {
            let mut worker = self.clone();
            worker.cursor = w * 7;
            workers.spawn(worker.work(stop.clone(), None));
        }
        let (lag, store, lag_stop) = (self.lag.clone(), self.engine.store().clone(), stop.clone());
        let lag_task = tokio::spawn(async move {
            let mut ticker = Ticker::new(Duration::from_secs(1), &lag_stop);
            while ticker.tick().await {
                // Shutdown does not wait for a count under way: cut short.
                tokio::select! {
                    _ = lag_stop.cancelled() => return,
                    () = lag.publish(&store) => {}
                }
            }
        });
        workers.spawn(self.work(stop.clone(), Some(deadline)));
        let mut drained = Ok(());
        while let Some(done) = workers.join_next().await {
            if let Ok(Err(e)) = done {
                drained = Err(e);
            }
        }
        lag_task.abort();
        drained
    }

    /// One worker's loop; the one given a `deadline` is the lead: it reads
    /// every round, and drains what is left at the stop, until the deadline.
    /// The others (helpers) read only while the rounds come back full.
    async fn work(
        mut self,
        stop: CancellationToken,
        deadline: Option<CancellationToken>,
    ) -> Result<(), FlushError> {
        let lead = deadline.is_some();
        let mut unfinished: Vec<BucketRef> = Vec::new();
        while !stop.is_cancelled() {
            // A helper with buckets left over finishes them first: nobody
            // else will read them (their marks were taken).
            let resting = !lead && unfinished.is_empty() && !self.busy.load(Ordering::Relaxed);
            let buckets = if resting {
                Vec::new()
            } else {
                self.due(std::mem::take(&mut unfinished)).await
            };
            if !buckets.is_empty() {
                let claim = Claim::Paced(self.opts.claim_idle_ms);
                match self.flush_some(&buckets, &stop, claim).await {
                    Ok((n, left)) => {
                        // A full batch, or buckets it left unfinished: more is
                        // waiting. Less than a batch: wait as an idle worker
                        // does, so the next round writes a fuller one (see the
                        // module docs).
                        let more = n >= self.opts.batch || !left.is_empty();
                        self.busy.store(more, Ordering::Relaxed);
                        self.ledger.set_flush_busy(more);
                        unfinished = left;
                        if more {
                            continue;
                        }
                    }
                    Err(FlushError::Stopped) => break,
                    Err(e) => {
                        // Read them again next round.
                        self.engine.activity().again(&buckets);
                        metrics::counter!(m::FLUSH_ERRORS).increment(1);
                        tracing::warn!(error = %e, "flush round failed");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.opts.idle) => {}
            }
        }
        let Some(deadline) = deadline else {
            return Ok(());
        };
        // What was sold before the stop still goes to the ledger (for the
        // embedded store this is the only chance), until the deadline. A store
        // or database that does not answer must not hold the process: every
        // step races the deadline.
        let drained = tokio::select! {
            _ = deadline.cancelled() => Err(FlushError::Stopped),
            drained = async {
                let buckets = self.all_buckets().await?;
                self.drain(&buckets, &deadline).await
            } => drained,
        };
        match &drained {
            Ok(()) => tracing::info!("flusher stopped; every record is in the ledger"),
            Err(e) => {
                tracing::error!(error = %e, "flusher stopped with records left in the streams")
            }
        }
        drained
    }

    /// This round's buckets: what the last round left unfinished, what this
    /// process wrote since, and what the scan (if no other worker is running
    /// it) found holding records.
    async fn due(&mut self, unfinished: Vec<BucketRef>) -> Vec<BucketRef> {
        let mut seen = HashSet::new();
        let mut due: Vec<BucketRef> = unfinished;
        due.extend(self.engine.activity().take_dirty());
        let scan = self.scan.lock().expect("scan poisoned").take();
        if let Some(mut scan) = scan {
            match scan.next(&self.engine, &self.ledger, &self.lag).await {
                Ok(found) => due.extend(found),
                Err(e) => tracing::warn!(error = %e, "flusher: the scan failed"),
            }
            *self.scan.lock().expect("scan poisoned") = Some(scan);
        }
        due.retain(|b| seen.insert(b.clone()));
        due
    }

    /// Every bucket of every open event (the final drain).
    async fn all_buckets(&self) -> Result<Vec<BucketRef>, FlushError> {
        let mut out = Vec::new();
        for event in self.engine.store().list_open_events().await? {
            if let Some(meta) = self.engine.store().load_meta(&event).await? {
                out.extend(meta.all_buckets());
            }
        }
        Ok(out)
    }
}

/// The pause between tries of a step that failed on an error that passes (a
/// database or store outage): from 50 ms to 2 s. What a round has read stays
/// pending meanwhile; it is never given up but for `stop`.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(50))
    }
}

impl Backoff {
    /// Counts and logs a failed try.
    fn failed(&self, what: &'static str, error: &dyn std::fmt::Display, records: usize) {
        metrics::counter!(m::FLUSH_ERRORS).increment(1);
        tracing::warn!(error = %error, records, backoff = ?self.0, "{what}");
    }

    /// Waits before the next try; `Stopped` when `stop` fires first.
    async fn wait(&mut self, stop: &CancellationToken) -> Result<(), FlushError> {
        tokio::select! {
            _ = stop.cancelled() => return Err(FlushError::Stopped),
            _ = tokio::time::sleep(self.0) => {}
        }
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        Ok(())
    }
}
