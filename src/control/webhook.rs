//! Webhook delivery: the outbox's changes POSTed to each subscription, in
//! sequence order, signed, at least once.
//!
//! **The relay's leader delivers.** The [`Dispatcher`] takes the relay's
//! leadership ([`RELAY_LEASE`](super::relay::RELAY_LEASE)) under the same
//! owner as the instance's JetStream relay, so one instance leads both, and
//! the term fences every cursor it moves (`Ledger::mark_outbox`). Each round
//! (at most a second apart) it reads the subscriptions from the ledger,
//! renews the lease if there is any (none: it neither takes nor renews it,
//! so an idle deployment costs one read of an empty table a second), and
//! keeps one worker task per active subscription: a
//! subscription made, changed, paused, resumed or deleted (through any
//! instance) is followed within a round. Losing the lease stops every
//! worker.
//!
//! **A worker per subscription**, so a slow or failing endpoint holds up no
//! other subscription, no JetStream publishing and no flush (the flusher
//! never reads what a relay does; workers read committed rows on the
//! ledger's pool). A worker reads the changes after its cursor, skips the
//! types the subscription does not want, POSTs the rest one at a time in
//! `seq` order (per order, creation first: the outbox's order), and moves
//! the cursor after the batch. A crash between a POST and the move sends
//! the change again: receivers deduplicate by `Shardstock-Event-Id`.
//!
//! **Failures**: a delivery that times out (`webhook_timeout_ms`), cannot
//! connect or is answered anything but 2xx is retried after a random wait
//! of up to `webhook_retry_min_ms × 2^(failures − 1)`, capped at
//! `webhook_retry_max_ms` (full jitter). After `webhook_pause_after_failures`
//! failures in a row, or `webhook_pause_after_ms` of failing without a
//! success, the subscription is paused in the ledger, logged and shown by
//! `shardstock_webhook_paused`; the admin API resumes it from its cursor.
//! A paused subscription holds the outbox only until the retention prunes
//! it (`relay::prune`): changes older than that are not delivered.
//!
//! **Transport**: `http://` or `https://` (rustls on ring, the system's
//! trusted roots plus `webhook_ca_file`'s; no client certificate), HTTP/1.1,
//! redirects not followed (a 3xx is a failure), connections kept alive.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use rustls::pki_types::CertificateDer;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::domain::ids::EventId;
use crate::domain::webhook::{self as hook, EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER};
use crate::engine::Engine;
use crate::ledger::{Change, Ledger, Subscription, webhook_target};
use crate::metrics as m;
use crate::store::Store;

/// How the webhooks are delivered (from `[outbox]`).
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Changes a worker reads at once.
    pub batch: usize,
    /// How long a worker with nothing to send waits.
    pub interval: Duration,
    /// The relay leadership's lease.
    pub lease_ttl_ms: u64,
    pub timeout: Duration,
    pub retry_min_ms: u64,
    pub retry_max_ms: u64,
    pub pause_after_failures: u32,
    pub pause_after: Duration,
    /// Roots trusted for `https://` receivers besides the system's
    /// (`webhook_ca_file`).
    pub extra_roots: Vec<CertificateDer<'static>>,
}

/// The POST body of a change: the fields the JetStream message has
/// (`relay::body`), its payload as `data`, and `created`, when it happened
/// (RFC 3339, UTC).
pub fn body(change: &Change) -> Vec<u8> {
    json!({
        "id": change.change_id,
        "type": change.kind,
        "created": crate::domain::model::rfc3339_ms::format(change.at_ms),
        "data": change.payload,
        "seq": change.seq,
        "event_id": change.event_id,
        "subject": change.subject,
        "at_ms": change.at_ms,
    })
    .to_string()
    .into_bytes()
}

/// Why one POST failed: its `outcome` label.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// Answered, but not 2xx.
    Rejected(u16),
    Timeout,
    Unreachable(String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Failure::Rejected(_) => "rejected",
            Failure::Timeout => "timeout",
            Failure::Unreachable(_) => "unreachable",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Rejected(status) => write!(f, "answered {status}"),
            Failure::Timeout => write!(f, "timed out"),
            Failure::Unreachable(e) => write!(f, "unreachable: {e}"),
        }
    }
}

/// The deliveries' HTTP client: `http://` and `https://`.
type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<hyper::body::Bytes>,
>;

/// The most of an answer's body a delivery reads (then drops the
/// connection rather than the rest): receivers answer a few bytes.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// What every worker shares.
struct Shared {
    ledger: Ledger,
    opts: WebhookOptions,
    client: Client,
}

/// The client: the system's trusted roots (those that parse) and `extra`.
/// rustls on ring, which async-nats already builds: ring's provider is
/// deprecated for lacking post-quantum key exchange (aws-lc-rs has it, and
/// a C build); classical ECDHE protects a webhook's body here.
#[allow(deprecated)]
fn client(extra: &[CertificateDer<'static>]) -> Client {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    if let Some(e) = native.errors.first() {
        tracing::warn!(error = %e, "webhooks: some of the system's trusted roots could not be read");
    }
    let (_, unparsed) = roots.add_parsable_certificates(native.certs);
    roots.add_parsable_certificates(extra.iter().cloned());
    if unparsed > 0 {
        tracing::debug!(unparsed, "webhooks: system roots skipped");
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https)
}

/// A running worker, and the subscription it was started for.
struct Worker {
    sub: Subscription,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The webhook side of the relay leader (see the module docs).
pub struct Dispatcher<S: Store> {
    engine: Arc<Engine<S>>,
    shared: Arc<Shared>,
    owner: String,
    lease: EventId,
    term: Option<u64>,
    workers: HashMap<String, Worker>,
    /// Subscriptions whose paused gauge this instance set.
    gauged: Vec<String>,
}

impl<S: Store> Dispatcher<S> {
    /// `owner`: the instance's relay owner (`relay::owner`), so the relay
    /// and the dispatcher of one instance lead together.
    pub fn new(
        engine: Arc<Engine<S>>,
        ledger: Ledger,
        opts: WebhookOptions,
        owner: String,
    ) -> Self {
        let client = client(&opts.extra_roots);
        Self {
            engine,
            shared: Arc::new(Shared {
                ledger,
                opts,
                client,
            }),
            owner,
            lease: EventId::parse(super::relay::RELAY_LEASE).expect("a valid id"),
            term: None,
            workers: HashMap::new(),
            gauged: Vec::new(),
        }
    }

    /// How often a round runs: a second, or a third of the lease if less.
    fn period(&self) -> Duration {
        Duration::from_secs(1).min(Duration::from_millis(
            (self.shared.opts.lease_ttl_ms / 3).max(10),
        ))
    }

    /// Rounds until `stop`; then stops every worker and gives the
    /// leadership up.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut ticker = super::ticker::Ticker::new(self.period(), &stop);
        while ticker.tick().await {
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "webhook round failed; trying again");
            }
        }
        self.stop_all().await;
        if let Some(term) = self.term.take() {
            let _ = self
                .engine
                .store()
                .release_leadership(&self.lease, &self.owner, term)
                .await;
        }
    }

    /// One round: lead (or not), then match the workers to the ledger's
    /// active subscriptions.
    pub async fn round(&mut self) -> Result<usize, super::relay::RelayError> {
        let subs = self.shared.ledger.webhooks().await?;
        // No subscription: nothing to lead for (the lease is left to lapse,
        // or to the instance's JetStream relay, which shares it).
        let store = self.engine.store();
        let term = if subs.is_empty() {
            None
        } else if store.capabilities().remote {
            store
                .acquire_leadership(&self.lease, &self.owner, self.shared.opts.lease_ttl_ms)
                .await?
        } else {
            Some(1)
        };
        if term != self.term {
            self.stop_all().await;
            self.term = term;
        }
        let Some(term) = term else {
            for id in self.gauged.drain(..) {
                metrics::gauge!(m::WEBHOOK_PAUSED, "subscription" => id).set(0.0);
            }
            return Ok(0);
        };
        // Workers whose subscription went, paused, changed or ended.
        let gone: Vec<String> = self
            .workers
            .iter()
            .filter(|(id, w)| {
                w.task.is_finished() || !subs.iter().any(|s| s.id == **id && *s == w.sub)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(w) = self.workers.remove(&id) {
                w.stop.cancel();
                let _ = w.task.await;
            }
        }
        for sub in &subs {
            let paused = sub.paused_ms.is_some();
            metrics::gauge!(m::WEBHOOK_PAUSED, "subscription" => sub.id.clone()).set(if paused {
                1.0
            } else {
                0.0
            });
            if paused || self.workers.contains_key(&sub.id) {
                continue;
            }
            let stop = CancellationToken::new();
            let task = tokio::spawn(deliver(
                self.shared.clone(),
                self.engine.clone(),
                sub.clone(),
                term,
                stop.clone(),
            ));
            self.workers.insert(
                sub.id.clone(),
                Worker {
                    sub: sub.clone(),
                    stop,
                    task,
                },
            );
        }
        for id in self
            .gauged
            .iter()
            .filter(|id| !subs.iter().any(|s| s.id == **id))
        {
            metrics::gauge!(m::WEBHOOK_PAUSED, "subscription" => id.clone()).set(0.0);
        }
        self.gauged = subs.iter().map(|s| s.id.clone()).collect();
        Ok(self.workers.len())
    }

    async fn stop_all(&mut self) {
        for (_, w) in self.workers.drain() {
            w.stop.cancel();
            let _ = w.task.await;
        }
    }
}

/// Sleeps `d` unless `stop` fires first (then false).
async fn pause(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// POSTs one change, signed by each of the subscription's secrets.
async fn post(shared: &Shared, sub: &Subscription, change: &Change) -> Result<(), Failure> {
    let body = body(change);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let request = hyper::Request::post(sub.url.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::USER_AGENT,
            concat!("shardstock-webhooks/", env!("CARGO_PKG_VERSION")),
        )
        .header(SIGNATURE_HEADER, hook::signature(&sub.secrets, t, &body))
        .header(EVENT_ID_HEADER, &change.change_id)
        .header(EVENT_TYPE_HEADER, &change.kind)
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .map_err(|e| Failure::Unreachable(format!("the request: {e}")))?;
    let exchange = async {
        let answer = shared
            .client
            .request(request)
            .await
            .map_err(|e| Failure::Unreachable(error_chain(&e)))?;
        let status = answer.status();
        // Read (a bounded part of) the answer, so the connection is reused.
        let _ = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            answer.into_body(),
            MAX_ANSWER_BYTES,
        ))
        .await;
        Ok(status)
    };
    match tokio::time::timeout(shared.opts.timeout, exchange).await {
        Err(_) => Err(Failure::Timeout),
        Ok(Err(e)) => Err(e),
        Ok(Ok(status)) if status.is_success() => Ok(()),
        Ok(Ok(status)) => Err(Failure::Rejected(status.as_u16())),
    }
}

/// An error and its sources, `a: b: c` (a TLS failure is a source of a
/// connect error of the client's).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One subscription's worker: delivers from its cursor until `stop`, a
/// pause, or a newer leader's term (see the module docs).
async fn deliver<S: Store>(
    shared: Arc<Shared>,
    engine: Arc<Engine<S>>,
    sub: Subscription,
    term: u64,
    stop: CancellationToken,
) {
    let target = webhook_target(&sub.id);
    let ledger = &shared.ledger;
    let opts = &shared.opts;
    let count = |outcome: &'static str| {
        metrics::counter!(m::OUTBOX_DELIVERIES, "target" => target.clone(), "outcome" => outcome)
            .increment(1);
    };
    let mut failures = 0u32;
    let mut failing_since: Option<Instant> = None;
    loop {
        let read = async {
            let cursor = ledger.outbox_cursor(&target).await?;
            let changes = ledger.changes(None, cursor, opts.batch as i64).await?;
            let backlog = ledger.backlog(cursor).await?;
            Ok::<_, crate::ledger::LedgerError>((cursor, changes, backlog))
        };
        let (cursor, changes, backlog) = match read.await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(subscription = %sub.id, error = %e, "webhook: reading the outbox failed");
                if !pause(opts.interval.max(Duration::from_millis(500)), &stop).await {
                    return;
                }
                continue;
            }
        };
        let now = engine.clock().now_ms();
        let age = backlog
            .oldest_ms
            .map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0);
        metrics::gauge!(m::OUTBOX_LAG_CHANGES, "target" => target.clone())
            .set(backlog.changes as f64);
        metrics::gauge!(m::OUTBOX_LAG_SECONDS, "target" => target.clone()).set(age);
        if changes.is_empty() {
            if !pause(opts.interval, &stop).await {
                return;
            }
            continue;
        }
        let mut done = cursor;
        let mut paused = None;
        'changes: for change in &changes {
            if !sub.wants(&change.kind) {
                done = change.seq;
                continue;
            }
            loop {
                if stop.is_cancelled() {
                    break 'changes;
                }
                match post(&shared, &sub, change).await {
                    Ok(()) => {
                        count("delivered");
                        failures = 0;
                        failing_since = None;
                        done = change.seq;
                        break;
                    }
                    Err(failure) => {
                        count(failure.outcome());
                        failures += 1;
                        let since = *failing_since.get_or_insert_with(Instant::now);
                        tracing::debug!(subscription = %sub.id, seq = change.seq, failures, %failure, "webhook delivery failed");
                        if failures >= opts.pause_after_failures
                            || since.elapsed() >= opts.pause_after
                        {
                            paused = Some(format!(
                                "{failures} deliveries failed in a row over {} s; the last {failure} (change {})",
                                since.elapsed().as_secs(),
                                change.change_id
                            ));
                            break 'changes;
                        }
                        let most = hook::backoff(opts.retry_min_ms, opts.retry_max_ms, failures);
                        let wait = rand::rng().random_range(0..=most);
                        if !pause(Duration::from_millis(wait), &stop).await {
                            break 'changes;
                        }
                    }
                }
            }
        }
        if done > cursor {
            match ledger
                .mark_outbox(&target, done, term as i64, engine.clock().now_ms())
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(subscription = %sub.id, term, "webhook: a newer relay leader moved the cursor; stopping");
                    return;
                }
                Err(e) => {
                    tracing::warn!(subscription = %sub.id, error = %e, "webhook: moving the cursor failed; the changes will be sent again");
                }
            }
        }
        if let Some(reason) = paused {
            tracing::warn!(subscription = %sub.id, url = %crate::config::mask_url(&sub.url), %reason, "webhook subscription paused; resume it with POST /v1/webhooks/{{id}}/resume");
            if let Err(e) = ledger
                .pause_webhook(&sub.id, engine.clock().now_ms(), &reason)
                .await
            {
                tracing::warn!(subscription = %sub.id, error = %e, "webhook: pausing failed; delivering on");
                failures = 0;
                failing_since = None;
                continue;
            }
            metrics::gauge!(m::WEBHOOK_PAUSED, "subscription" => sub.id.clone()).set(1.0);
            return;
        }
        if stop.is_cancelled() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_body_names_the_change_and_carries_its_payload_as_data() {
        let change = Change {
            seq: 7,
            change_id: "o1:order.created".into(),
            event_id: "demo".into(),
            subject: "o1".into(),
            kind: "order.created".into(),
            at_ms: 1_700_000_000_123,
            payload: json!({"order_id": "o1", "quantity": 2}),
        };
        let body: Value = serde_json::from_slice(&body(&change)).unwrap();
        assert_eq!(body["id"], "o1:order.created");
        assert_eq!(body["type"], "order.created");
        assert_eq!(body["created"], "2023-11-14T22:13:20.123Z");
        assert_eq!(body["data"]["quantity"], 2);
        assert_eq!(body["seq"], 7);
    }
}
