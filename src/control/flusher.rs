//! The flusher: every bucket's order stream into the ledger, exactly once.
//!
//! Each instance runs one, as a consumer of the `flusher` group on every bucket
//! stream, so instances share the work and a dead instance's unacknowledged
//! records are claimed by the others after `claim_idle_ms`. A round reads up to
//! a batch from the buckets (starting at a rotating bucket, so none starves),
//! writes it in one transaction (`Ledger::apply`: idempotent by stream id, with
//! the final guard), and only then acknowledges and deletes the records. When
//! the database is down the batch is kept and retried with backoff; nothing is
//! read meanwhile, so the streams — and the lag gauge — grow, and drain when the
//! database is back.
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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::stream::StreamId;
use crate::engine::{Engine, EngineError};
use crate::ledger::{FlushRecord, Ledger, LedgerError};
use crate::metrics as m;
use crate::store::{Store, StoreError};

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

#[derive(Clone)]
pub struct Flusher<S: Store> {
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    consumer: String,
    opts: FlushOptions,
    registered: HashSet<EventId>,
    cursor: usize,
}

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
            registered: HashSet::new(),
            cursor: 0,
        }
    }

    /// Reads one batch from `buckets`, writes it, acknowledges it. Returns the
    /// number of records read (0: nothing to do). Retries the write until it
    /// succeeds or `stop` fires (then the records stay pending, nothing is lost).
    pub async fn flush_once(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
    ) -> Result<usize, FlushError> {
        self.flush_round(buckets, stop, self.opts.claim_idle_ms)
            .await
    }

    /// `flush_once`, claiming records other consumers have held for `claim_idle_ms`.
    async fn flush_round(
        &mut self,
        buckets: &[BucketRef],
        stop: &CancellationToken,
        claim_idle_ms: u64,
    ) -> Result<usize, FlushError> {
        let mut batch: Vec<FlushRecord> = Vec::new();
        let mut read: Vec<(BucketRef, Vec<StreamId>)> = Vec::new();
        let n = buckets.len();
        for i in 0..n {
            let left = self.opts.batch - batch.len();
            if left == 0 {
                break;
            }
            let b = &buckets[(self.cursor + i) % n];
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
                    return Err(e.into());
                }
            };
            if entries.is_empty() {
                continue;
            }
            read.push((b.clone(), entries.iter().map(|e| e.id).collect()));
            let stream = b.name();
            batch.extend(entries.into_iter().map(|entry| FlushRecord {
                stream: stream.clone(),
                event: b.event.to_string(),
                entry,
            }));
        }
        self.cursor = self.cursor.wrapping_add(1);
        if batch.is_empty() {
            return Ok(0);
        }
        for (b, _) in &read {
            self.register(&b.event).await?;
        }
        let started = Instant::now();
        let applied = self.write(&batch, stop).await?;
        metrics::histogram!(m::FLUSH_BATCH_DURATION).record(started.elapsed().as_secs_f64());
        metrics::counter!(m::ORDERS_FLUSHED).increment(applied as u64);
        for (b, ids) in read {
            if let Err(e) = self.engine.store().stream_ack(&b, &ids).await {
                // Harmless: the records are claimed again later and skipped as duplicates.
                tracing::warn!(bucket = %b.tag(), error = %e, "acknowledging flushed records failed");
            }
        }
        Ok(batch.len())
    }

    /// `Ledger::apply`, retried with backoff while the database is unreachable.
    async fn write(
        &self,
        batch: &[FlushRecord],
        stop: &CancellationToken,
    ) -> Result<usize, FlushError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.ledger.apply(batch, self.engine.clock().now_ms()).await {
                Ok(applied) => return Ok(applied.new_records),
                Err(e) => {
                    metrics::counter!(m::FLUSH_ERRORS).increment(1);
                    tracing::warn!(error = %e, records = batch.len(), ?backoff, "flush failed; retrying");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return Err(FlushError::Stopped),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Makes sure the ledger knows the event (created elsewhere, or before the ledger).
    async fn register(&mut self, event: &EventId) -> Result<(), FlushError> {
        if self.registered.contains(event) {
            return Ok(());
        }
        if let Some(meta) = self.engine.store().load_meta(event).await? {
            self.ledger
                .register_event(&meta.spec, meta.created_ms)
                .await?;
        }
        self.registered.insert(event.clone());
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
            while self.flush_round(buckets, stop, claim_idle_ms).await? > 0 {}
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
        let mut workers = tokio::task::JoinSet::new();
        for w in 1..self.opts.workers {
            let mut worker = self.clone();
            worker.cursor = w * 7;
            let (buckets, stop) = (buckets.to_vec(), stop.clone());
            workers.spawn(async move { worker.drain(&buckets, &stop).await });
        }
        let mine = self.drain(buckets, stop).await;
        while let Some(done) = workers.join_next().await {
            done.map_err(|e| FlushError::Store(StoreError::Unavailable(e.to_string())))??;
        }
        mine
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
        workers.spawn(self.work(stop.clone(), Some(deadline)));
        let mut drained = Ok(());
        while let Some(done) = workers.join_next().await {
            if let Ok(Err(e)) = done {
                drained = Err(e);
            }
        }
        drained
    }

    /// One worker's loop; the one given a `deadline` drains what is left at
    /// the stop, until the deadline.
    async fn work(
        mut self,
        stop: CancellationToken,
        deadline: Option<CancellationToken>,
    ) -> Result<(), FlushError> {
        let mut buckets: Vec<BucketRef> = Vec::new();
        let mut refreshed = Instant::now() - Duration::from_secs(60);
        while !stop.is_cancelled() {
            if refreshed.elapsed() >= Duration::from_secs(1) {
                match self.all_buckets().await {
                    Ok(found) => buckets = found,
                    Err(e) => tracing::warn!(error = %e, "flusher: listing buckets failed"),
                }
                self.publish_lag(&buckets).await;
                refreshed = Instant::now();
            }
            match self.flush_once(&buckets, &stop).await {
                // A full batch: more is waiting.
                Ok(n) if n >= self.opts.batch => continue,
                // Less than a batch: wait as an idle worker does, so the next
                // round writes a fuller one (see the module docs).
                Ok(_) => {}
                Err(FlushError::Stopped) => break,
                Err(e) => {
                    metrics::counter!(m::FLUSH_ERRORS).increment(1);
                    tracing::warn!(error = %e, "flush round failed");
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

    async fn all_buckets(&self) -> Result<Vec<BucketRef>, FlushError> {
        let mut out = Vec::new();
        for event in self.engine.store().list_events().await? {
            if let Some(meta) = self.engine.store().load_meta(&event).await? {
                out.extend(meta.all_buckets());
            }
        }
        Ok(out)
    }

    async fn publish_lag(&self, buckets: &[BucketRef]) {
        let mut lag = 0;
        for b in buckets {
            lag += self.engine.store().stream_len(b).await.unwrap_or(0);
        }
        metrics::gauge!(m::FLUSH_LAG).set(lag as f64);
    }
}
