//! The outbox relay: the ledger's order changes, published to NATS
//! JetStream in sequence order.
//!
//! **One leader.** Every instance with a NATS URL runs a relay; only the one
//! holding the relay's leadership publishes. The leadership is the store's
//! (the rebalancer's lease, on a reserved id, [`RELAY_LEASE`]), renewed every
//! round (the embedded store serves one process, which leads alone), and its
//! term fences the ledger: the target's cursor is moved only
//! by a term at least the one that moved it last (`Ledger::mark_outbox`), so
//! a relay that paused past its lease cannot move it back.
//!
//! **At least once, deduplicated.** A round reads the changes after the
//! target's cursor, publishes them in order, awaits the server's
//! acknowledgements, then moves the cursor to the last one acknowledged in
//! an unbroken run. A relay that dies between publishing and moving the
//! cursor publishes those changes again; each carries `Nats-Msg-Id` = its
//! change id, so the stream drops the copies within its duplicate window
//! (`outbox.duplicate_window_ms`). Past the window a copy is delivered, and
//! consumers deduplicate by the same id (it is in the body too).
//!
//! **Subjects** are `<prefix>.<event>.<type>`, e.g.
//! `shardstock.demo.order.created`; a `.` in the event id is written `_`
//! there (the body has the id as it is).
//!
//! Webhooks are delivered by the same leader (`control::webhook`).
//!
//! **Pruning** ([`prune`], every instance): a change every target (the
//! stream, each webhook subscription) has goes
//! `replay_ms` after it happened; any change goes `retention_ms` after it
//! happened, delivered or not, so the outbox stays bounded while a target is
//! down (its lag alert fires long before).
//!
//! **Cheap per change**, since it shares the process and the cores with the
//! flusher: a round reads up to `batch` changes in one statement with their
//! payloads as the stored JSON text (written into the body unparsed), sends
//! every publish before awaiting any acknowledgement, and moves the cursor
//! with one statement. While it leads, the relay keeps its cursor in memory
//! (it alone moves it, fenced), renews the lease once a third of it has
//! passed rather than every round, and sets the lag gauges at most once a
//! second.
//!
//! **Woken by the flush.** Between rounds the relay waits `interval`, or
//! less: a commit of this process that wrote the outbox wakes it
//! (`Ledger::outbox_written`), so a change goes out a round after its
//! flush; the poll still finds what other instances wrote.
//!
//! **Second to the flush.** The relay reads committed rows on its own
//! connections, but it shares the cores with the flusher, and so does the
//! NATS server it publishes to (on a 2-core machine, JetStream spent about
//! 12 µs of CPU a message, more than the flush's own work an order). While
//! this process's flusher has a backlog (its rounds come back full,
//! `Ledger::flush_busy`), the relay publishes one batch an `interval` and
//! is not woken by the commits: the database, the truth, keeps the cores,
//! and the publish lag catches up once the backlog is written. At the
//! default 512 and 100 ms that is still about 5,000 changes a second.
//! Failures are logged and counted, the connection is dropped and made
//! again on the next round.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;

use crate::domain::ids::EventId;
use crate::engine::Engine;
use crate::ledger::{Change, Ledger, Outgoing};
use crate::metrics as m;
use crate::store::Store;

/// The id whose leadership is the relay's (no event is sold under it: the
/// leadership keys are the only keys it has).
pub const RELAY_LEASE: &str = "_outbox-relay";

/// How the relay runs (from `[outbox]`).
#[derive(Debug, Clone)]
pub struct RelayOptions {
    pub nats_url: String,
    pub stream: String,
    pub subject_prefix: String,
    pub duplicate_window: Duration,
    pub batch: usize,
    pub interval: Duration,
    pub lease_ttl_ms: u64,
    pub publish_timeout: Duration,
}

/// How the outbox is pruned (from `[outbox]`).
#[derive(Debug, Clone)]
pub struct PruneOptions {
    pub replay: Duration,
    pub retention: Duration,
    pub interval: Duration,
    /// The relay targets a change must reach before its replay window ends
    /// ([`target`] of each).
    pub targets: Vec<String>,
}

/// The cursor row of the relay to `stream`.
pub fn target(stream: &str) -> String {
    format!("nats:{stream}")
}

/// Prunes the outbox every interval until `stop` (see the module docs).
pub async fn prune<S: Store>(
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    opts: PruneOptions,
    stop: CancellationToken,
) {
    let mut ticker = super::ticker::Ticker::new(opts.interval, &stop);
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    while ticker.tick().await {
        let now = engine.clock().now_ms();
        let pruned = async {
            // Every webhook subscription, paused or not, is a target too:
            // a paused one holds the outbox until the retention only.
            let mut targets = opts.targets.clone();
            targets.extend(
                ledger
                    .webhooks()
                    .await?
                    .iter()
                    .map(|s| crate::ledger::webhook_target(&s.id)),
            );
            let upto = ledger.lowest_cursor(&targets).await?;
            ledger
                .prune_outbox(
                    now.saturating_sub(ms(opts.retention)),
                    now.saturating_sub(ms(opts.replay)),
                    upto,
                )
                .await
        };
        match pruned.await {
            Ok(0) => {}
            Ok(n) => tracing::info!(pruned = n, "outbox pruned"),
            Err(e) => tracing::warn!(error = %e, "pruning the outbox failed; trying again later"),
        }
    }
}

/// Failures of a relay round.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("ledger: {0}")]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("NATS: {0}")]
    Nats(String),
}

fn nats(e: impl std::fmt::Display) -> RelayError {
    RelayError::Nats(e.to_string())
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// This instance led the round.
    pub led: bool,
    /// Changes acknowledged as new by the server.
    pub published: usize,
    /// Changes the server already had (sent again after a crash).
    pub duplicates: usize,
    /// The cursor after the round.
    pub cursor: i64,
}

/// The relay of one instance.
pub struct Relay<S: Store> {
    engine: Arc<Engine<S>>,
    ledger: Ledger,
    opts: RelayOptions,
    owner: String,
    lease: EventId,
    /// The cursor's row in `outbox_cursors`.
    target: String,
    /// Connected, with the stream ensured; dropped on a failure.
    jet: Option<jetstream::Context>,
    term: Option<u64>,
    /// When the lease was last taken or renewed (before the call).
    renewed: Option<Instant>,
    /// The target's cursor while this relay leads: it alone moves it (a
    /// move by a newer term fails `mark_outbox`, and the relay steps down).
    /// Read again after a new term or a failure.
    cursor: Option<i64>,
    /// When the lag gauges were last set.
    measured: Option<Instant>,
    subjects: Subjects,
}

/// The subjects of the latest (event, type) pairs: a batch's changes are a
/// few events' few types, so each subject is formatted once, not once a
/// change (a `Subject` clone is a reference count).
#[derive(Default)]
struct Subjects(Vec<(String, String, async_nats::Subject)>);

impl Subjects {
    /// Pairs kept at most; past it the list starts again.
    const MAX: usize = 64;

    fn get(&mut self, prefix: &str, event: &str, kind: &str) -> async_nats::Subject {
        if let Some((_, _, s)) = self.0.iter().find(|(e, k, _)| e == event && k == kind) {
            return s.clone();
        }
        if self.0.len() == Self::MAX {
            self.0.clear();
        }
        let s = async_nats::Subject::from(subject(prefix, event, kind));
        self.0.push((event.to_owned(), kind.to_owned(), s.clone()));
        s
    }
}

/// A relay leadership owner of this instance: one for its relay and its
/// webhook dispatcher, which lead together.
pub fn owner<S: Store>(engine: &Engine<S>) -> String {
    format!("{}/relay-{:08x}", engine.instance(), rand::random::<u32>())
}

/// `<prefix>.<event>.<type>`, the event's dots written `_`.
pub fn subject(prefix: &str, event: &str, kind: &str) -> String {
    format!("{prefix}.{}.{kind}", event.replace('.', "_"))
}

/// The message body of a change read for publishing: the bytes [`body`]
/// makes of the parsed change (same fields, same order, compact), with the
/// payload's stored text written as it is instead of parsed and written
/// back.
pub fn outgoing_body(change: &Outgoing) -> Vec<u8> {
    let mut b = Vec::with_capacity(
        96 + 2 * change.change_id.len()
            + change.event_id.len()
            + change.subject.len()
            + change.kind.len()
            + change.payload.len(),
    );
    fn text(b: &mut Vec<u8>, key: &[u8], value: &str) {
        b.extend_from_slice(key);
        serde_json::to_writer(&mut *b, value).expect("a string serializes");
    }
    text(&mut b, b"{\"id\":", &change.change_id);
    write!(b, ",\"seq\":{}", change.seq).expect("writing to a Vec");
    text(&mut b, b",\"type\":", &change.kind);
    text(&mut b, b",\"event_id\":", &change.event_id);
    text(&mut b, b",\"subject\":", &change.subject);
    write!(b, ",\"at_ms\":{},\"payload\":", change.at_ms).expect("writing to a Vec");
    b.extend_from_slice(change.payload.as_bytes());
    b.push(b'}');
    b
}

/// The message body: the change as the changes endpoint shows it.
pub fn body(change: &Change) -> Vec<u8> {
    /// Borrows the change (a `json!` map copied every string and the
    /// payload once more for each message).
    #[derive(serde::Serialize)]
    struct Body<'a> {
        id: &'a str,
        seq: i64,
        #[serde(rename = "type")]
        kind: &'a str,
        event_id: &'a str,
        subject: &'a str,
        at_ms: i64,
        payload: &'a serde_json::Value,
    }
    serde_json::to_vec(&Body {
        id: &change.change_id,
        seq: change.seq,
        kind: &change.kind,
        event_id: &change.event_id,
        subject: &change.subject,
        at_ms: change.at_ms,
        payload: &change.payload,
    })
    .expect("a change serializes")
}

impl<S: Store> Relay<S> {
    pub fn new(engine: Arc<Engine<S>>, ledger: Ledger, opts: RelayOptions) -> Self {
        let owner = owner(&engine);
        let target = target(&opts.stream);
        Self {
            engine,
            ledger,
            opts,
            owner,
            lease: EventId::parse(RELAY_LEASE).expect("a valid id"),
            target,
            jet: None,
            term: None,
            renewed: None,
            cursor: None,
            measured: None,
            subjects: Subjects::default(),
        }
    }

    /// Leads as `owner` (the instance's webhook `Dispatcher` shares it, so
    /// one instance leads both).
    pub fn with_owner(mut self, owner: String) -> Self {
        self.owner = owner;
        self
    }

    /// Rounds until `stop`; then gives the leadership up.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut pause = Duration::ZERO;
        // Woken by this process's outbox commits only between successful
        // rounds while leading: a failure keeps its back-off.
        let mut wake = false;
        let ledger = self.ledger.clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
                _ = ledger.outbox_written(), if wake => {}
            }
            (pause, wake) = match self.round().await {
                // Second to the flush: while this process's flusher has a
                // backlog, one batch an interval, not woken.
                Ok(r) if r.led && ledger.flush_busy() => (self.opts.interval, false),
                Ok(r) if r.led && r.published + r.duplicates == self.opts.batch => {
                    (Duration::ZERO, false)
                }
                Ok(r) => (self.opts.interval, r.led),
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay round failed; trying again");
                    self.jet = None;
                    (self.opts.interval.max(Duration::from_millis(500)), false)
                }
            };
        }
        if let Some(term) = self.term.take() {
            let _ = self
                .engine
                .store()
                .release_leadership(&self.lease, &self.owner, term)
                .await;
            metrics::gauge!(m::OUTBOX_LEADER).set(0.0);
        }
    }

    /// Connects and makes sure the stream exists (once per connection).
    async fn connect(&self) -> Result<jetstream::Context, RelayError> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(self.opts.publish_timeout)
            .connect(self.opts.nats_url.as_str())
            .await
            .map_err(nats)?;
        let mut jet = jetstream::new(client);
        jet.set_timeout(self.opts.publish_timeout);
        jet.get_or_create_stream(jetstream::stream::Config {
            name: self.opts.stream.clone(),
            subjects: vec![format!("{}.>", self.opts.subject_prefix)],
            duplicate_window: self.opts.duplicate_window,
            ..Default::default()
        })
        .await
        .map_err(nats)?;
        Ok(jet)
    }

    /// One round: lead (or not), publish the next changes, move the cursor.
    pub async fn round(&mut self) -> Result<Round, RelayError> {
        let round = self.publish().await;
        if round.is_err() {
            // A failure may have moved the cursor unseen (a mark committed,
            // its answer lost): read it again.
            self.cursor = None;
        }
        round
    }

    /// The term this instance leads in, if it does: the lease is taken, or
    /// renewed once a third of it has passed (the cursor's fencing is in
    /// the database, whatever the lease does meanwhile).
    async fn lead(&mut self) -> Result<Option<u64>, RelayError> {
        let store = self.engine.store();
        let renew_after = Duration::from_millis(self.opts.lease_ttl_ms / 3);
        if let (Some(term), Some(at)) = (self.term, self.renewed)
            && at.elapsed() < renew_after
        {
            return Ok(Some(term));
        }
        let asked = Instant::now();
        // The embedded store serves one process: it leads alone (the memory
        // store keeps leaderships only for events it has).
        let term = if store.capabilities().remote {
            store
                .acquire_leadership(&self.lease, &self.owner, self.opts.lease_ttl_ms)
                .await?
        } else {
            Some(1)
        };
        let Some(term) = term else {
            self.renewed = None;
            self.cursor = None;
            if self.term.take().is_some() {
                metrics::gauge!(m::OUTBOX_LEADER).set(0.0);
                tracing::info!("no longer leading the outbox relay");
            }
            return Ok(None);
        };
        self.renewed = Some(asked);
        if self.term != Some(term) {
            self.term = Some(term);
            self.cursor = None;
            metrics::gauge!(m::OUTBOX_LEADER).set(1.0);
            tracing::info!(term, "leading the outbox relay");
        }
        Ok(Some(term))
    }

    async fn publish(&mut self) -> Result<Round, RelayError> {
        let Some(term) = self.lead().await? else {
            return Ok(Round::default());
        };
        let jet = match &self.jet {
            Some(jet) => jet.clone(),
            None => {
                let jet = self.connect().await?;
                self.jet = Some(jet.clone());
                jet
            }
        };
        let cursor = match self.cursor {
            Some(cursor) => cursor,
            None => self.ledger.outbox_cursor(&self.target).await?,
        };
        self.cursor = Some(cursor);
        let changes = self.ledger.outgoing(cursor, self.opts.batch as i64).await?;
        let mut round = Round {
            led: true,
            cursor,
            ..Round::default()
        };
        // Sent in order, every one before any acknowledgement is awaited,
        // and acknowledged in order: the cursor moves over an unbroken run
        // of acknowledged changes only.
        let mut acks = Vec::with_capacity(changes.len());
        for change in &changes {
            let publish = jetstream::message::PublishMessage::build()
                .payload(outgoing_body(change).into())
                .message_id(change.change_id.as_str());
            let subject =
                self.subjects
                    .get(&self.opts.subject_prefix, &change.event_id, &change.kind);
            match jet.send_publish(subject, publish).await {
                Ok(ack) => acks.push((change.seq, ack)),
                Err(e) => {
                    tracing::warn!(seq = change.seq, error = %e, "outbox relay: publish failed");
                    break;
                }
            }
        }
        let sent = acks.len();
        let mut failure = None;
        for (seq, ack) in acks {
            match ack.await {
                Ok(ack) => {
                    if ack.duplicate {
                        round.duplicates += 1;
                    } else {
                        round.published += 1;
                    }
                    round.cursor = seq;
                }
                Err(e) => {
                    failure = Some(nats(e));
                    break;
                }
            }
        }
        // Counted once a round, not once a change (each label set is a
        // lookup in the registry).
        for (outcome, n) in [
            ("published", round.published),
            ("duplicate", round.duplicates),
            (
                "failed",
                changes.len() - (round.published + round.duplicates),
            ),
        ] {
            if n > 0 {
                metrics::counter!(m::OUTBOX_DELIVERIES, "target" => self.target.clone(), "outcome" => outcome)
                    .increment(n as u64);
            }
        }
        if round.cursor > cursor {
            let now = self.engine.clock().now_ms();
            if !self
                .ledger
                .mark_outbox(&self.target, round.cursor, term as i64, now)
                .await?
            {
                tracing::warn!(
                    term,
                    "outbox relay: a newer leader moved the cursor; stepping down"
                );
                self.term = None;
                self.renewed = None;
                self.cursor = None;
                metrics::gauge!(m::OUTBOX_LEADER).set(0.0);
                return Ok(Round::default());
            }
            self.cursor = Some(round.cursor);
        }
        if self
            .measured
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            self.measure(round.cursor).await?;
            self.measured = Some(Instant::now());
        }
        match failure {
            Some(e) => Err(e),
            None if sent < changes.len() => Err(RelayError::Nats("a publish failed".into())),
            None => Ok(round),
        }
    }

    /// The lag gauges: changes after the cursor, and the oldest's age.
    async fn measure(&self, cursor: i64) -> Result<(), RelayError> {
        let backlog = self.ledger.backlog(cursor).await?;
        let now = self.engine.clock().now_ms();
        let age = backlog
            .oldest_ms
            .map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0);
        metrics::gauge!(m::OUTBOX_LAG_CHANGES, "target" => self.target.clone())
            .set(backlog.changes as f64);
        metrics::gauge!(m::OUTBOX_LAG_SECONDS, "target" => self.target.clone()).set(age);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_name_the_event_and_the_type() {
        assert_eq!(
            subject("shardstock", "demo", "order.created"),
            "shardstock.demo.order.created"
        );
        assert_eq!(
            subject("ss", "drop.2026", "event.closed"),
            "ss.drop_2026.event.closed"
        );
        assert!(EventId::parse(RELAY_LEASE).is_ok());
    }

    #[test]
    fn a_body_is_the_change_as_the_changes_endpoint_shows_it() {
        let change = Change {
            seq: 7,
            change_id: "o-1:order.created".into(),
            event_id: "demo".into(),
            subject: "o-1".into(),
            kind: "order.created".into(),
            at_ms: 1_750_000_000_000,
            payload: serde_json::json!({"user_id": "u-1", "quantity": 2}),
        };
        let got: serde_json::Value = serde_json::from_slice(&body(&change)).unwrap();
        // Read for publishing, the payload unparsed: the same bytes.
        let outgoing = Outgoing {
            seq: 7,
            change_id: "o-1:order.created".into(),
            event_id: "demo".into(),
            subject: "o-1".into(),
            kind: "order.created".into(),
            at_ms: 1_750_000_000_000,
            payload: change.payload.to_string(),
        };
        assert_eq!(outgoing_body(&outgoing), body(&change));
        assert_eq!(
            got,
            serde_json::json!({
                "id": "o-1:order.created", "seq": 7, "type": "order.created",
                "event_id": "demo", "subject": "o-1", "at_ms": 1_750_000_000_000i64,
                "payload": {"user_id": "u-1", "quantity": 2},
            })
        );
    }
}
