//! The flusher's slow scan and its lag count: the background reads whose
//! cost does not grow with the number of events.
//!
//! The flusher reads the buckets this process wrote (`engine::Activity` marks
//! them dirty) at once. What other processes wrote — a dead instance's last
//! orders, records a consumer read and never acknowledged, another replica's
//! sale whose flusher is behind — is found by the [`StreamScan`]: it walks every
//! bucket of every open event, round-robin, at a fixed rate
//! (`flush_sweep_buckets_per_s`, 256 by default), with one `XLEN` per bucket
//! and one meta read per event, and hands the buckets whose stream is not empty
//! to the flusher. An idle service thus costs the same few hundred cheap
//! commands a second whether it has 3 events or 3,000; a full pass over 4,800
//! buckets takes about 19 s, which bounds how late another instance's orphaned
//! records reach the ledger.
//!
//! The scan also retires events: a closed event whose streams are all empty
//! and which the ledger has closed leaves the open set (`Events::retire_event`),
//! so nothing visits it again.
//!
//! [`Lag`] keeps the stream length of the buckets known to hold records (found
//! by a read or by the scan); the flusher's lag task reads only those, so the
//! `shardstock_flush_lag_orders` gauge costs nothing at idle and keeps growing
//! while the database is down (the flush workers are then stuck retrying).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::model::EventStatus;
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::metrics as m;
use crate::store::{Store, StoreError};

/// The default scan rate, in buckets (and event metas) per second.
pub(crate) const SCAN_PER_S: u32 = 256;

/// The event the scan is walking.
#[derive(Debug)]
struct Visit {
    event: EventId,
    closed: bool,
    buckets: VecDeque<BucketRef>,
    /// Records seen in its streams so far.
    records: u64,
}

/// Bucket visits one call of [`StreamScan::next`] makes at most, whatever the
/// rate: a call is part of a flush round.
pub(crate) const BURST: f64 = 4096.0;

/// A round-robin walk over every bucket of every open event, paced by a token
/// bucket: each store read (the event list, a meta, a stream length) costs one
/// token, and tokens accrue at the scan rate, at most one second's worth.
#[derive(Debug)]
pub(crate) struct StreamScan {
    per_s: f64,
    tokens: f64,
    at: Instant,
    events: VecDeque<EventId>,
    visit: Option<Visit>,
}

impl StreamScan {
    pub fn new(per_s: u32) -> Self {
        Self {
            per_s: f64::from(per_s),
            tokens: 0.0,
            at: Instant::now(),
            events: VecDeque::new(),
            visit: None,
        }
    }

    /// Spends the tokens accrued since the last call (at most [`BURST`]);
    /// returns the buckets
    /// whose stream holds records (for the flusher to read).
    pub async fn next<S: Store>(
        &mut self,
        engine: &Engine<S>,
        ledger: &Ledger,
        lag: &Lag,
    ) -> Result<Vec<BucketRef>, StoreError> {
        let now = Instant::now();
        let accrued = now.duration_since(self.at).as_secs_f64() * self.per_s;
        // At most a second's worth, and never more than BURST visits in one
        // call: the call runs inside a flush round, and a second's worth at
        // the largest accepted rate (a million) held the round for a minute.
        self.tokens = (self.tokens + accrued).min(self.per_s.clamp(1.0, BURST));
        self.at = now;
        let store = engine.store();
        let mut found = Vec::new();
        while self.tokens >= 1.0 {
            self.tokens -= 1.0;
            let Some(visit) = self.visit.as_mut() else {
                if self.events.is_empty() {
                    // A new pass: the open events as they are now.
                    self.events = store.list_open_events().await?.into();
                    if self.events.is_empty() {
                        break;
                    }
                    continue;
                }
                let Some(event) = self.events.pop_front() else {
                    continue;
                };
                self.visit = Some(match store.load_meta(&event).await? {
                    Some(meta) => Visit {
                        event,
                        closed: meta.status == EventStatus::Closed,
                        buckets: meta.all_buckets().into(),
                        records: 0,
                    },
                    // Its keys expired: only the ledger knows it now.
                    None => Visit {
                        event,
                        closed: true,
                        buckets: VecDeque::new(),
                        records: 0,
                    },
                });
                continue;
            };
            match visit.buckets.pop_front() {
                Some(b) => {
                    let len = store.stream_len(&b).await?;
                    lag.note(&b, len);
                    visit.records += len;
                    if len > 0 {
                        found.push(b);
                    }
                }
                None => {
                    let done = self.visit.take().expect("a visit is under way");
                    if done.closed && done.records == 0 {
                        retire(engine, ledger, &done.event).await;
                    }
                }
            }
        }
        Ok(found)
    }
}

/// Retires a closed event whose streams are empty, once the ledger has it
/// closed too (the close drained it): a close still under way keeps it open.
async fn retire<S: Store>(engine: &Engine<S>, ledger: &Ledger, event: &EventId) {
    match ledger.event(event).await {
        Ok(Some(db)) if db.closed => {}
        Ok(_) => return,
        Err(e) => {
            tracing::debug!(%event, error = %e, "stream scan: reading the ledger failed");
            return;
        }
    }
    match engine.store().retire_event(event).await {
        Ok(()) => {
            engine.activity().forget(event);
            tracing::info!(%event, "closed and flushed: retired from the open events");
        }
        Err(e) => {
            m::store_error("retire_event");
            tracing::warn!(%event, error = %e, "retiring a closed event failed");
        }
    }
}

/// The stream lengths of the buckets known to hold records.
#[derive(Debug, Default)]
pub(crate) struct Lag {
    lengths: Mutex<HashMap<BucketRef, u64>>,
}

impl Lag {
    /// Records a bucket's stream length (0 forgets the bucket).
    pub(crate) fn note(&self, bucket: &BucketRef, len: u64) {
        let mut lengths = self.lengths.lock().expect("lag poisoned");
        if len == 0 {
            lengths.remove(bucket);
        } else {
            lengths.insert(bucket.clone(), len);
        }
    }

    /// A read found records in `bucket`: count it at least that long.
    pub fn read(&self, bucket: &BucketRef, records: u64) {
        let mut lengths = self.lengths.lock().expect("lag poisoned");
        let len = lengths.entry(bucket.clone()).or_default();
        *len = (*len).max(records);
    }

    /// Measures the known buckets again and publishes the sum.
    pub(crate) async fn publish<S: Store>(&self, store: &S) {
        let known: Vec<BucketRef> = self
            .lengths
            .lock()
            .expect("lag poisoned")
            .keys()
            .cloned()
            .collect();
        for b in known {
            match store.stream_len(&b).await {
                Ok(len) => self.note(&b, len),
                Err(_) => break,
            }
        }
        let total: u64 = self.lengths.lock().expect("lag poisoned").values().sum();
        metrics::gauge!(m::FLUSH_LAG).set(total as f64);
    }
}
