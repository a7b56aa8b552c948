//! The application: build from settings, then run until stopped.
//!
//! `Application::build` picks the store (Redis when a URL is configured, the
//! embedded memory store otherwise), creates the configured events that do not
//! exist yet, binds the listener and starts the background tasks (gauges,
//! flusher, rebalancer, audits, the saga sweeper, housekeeping); `port()` tells
//! tests where it listens; `run_until_stopped` serves until ctrl-c or SIGTERM,
//! lets in-flight requests finish (up to the grace period) and stops every
//! background task through one cancellation token.
//!
//! `options` maps the settings onto each layer's options; `commands` holds
//! the operator commands (`audit`, `recover`) that run without serving.

mod audits;
mod commands;
pub mod options;

pub use commands::{audit, recover};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{LostState, Settings, mask_url};
use crate::control::flusher::Flusher;
use crate::control::lifecycle;
use crate::control::rebalancer::Rebalancer;
use crate::control::ticker::Ticker;
use crate::engine::Engine;
use crate::http::serve::ServeOptions;
use crate::http::{self, AppState, Quarantine, guard::RateLimits};
use crate::ledger::Ledger;
use crate::metrics as m;
use crate::store::{MemoryStore, RedisStore, Store};

/// The process-wide Prometheus recorder (installed once, shared by every app
/// in the process: tests run several).
pub fn metrics_handle() -> PrometheusHandle {
    metrics_handle_keeping(Duration::from_millis(
        crate::config::ServerSettings::default().metrics_retention_ms,
    ))
}

/// [`metrics_handle`], dropping every series not updated for `retention`
/// (the first call in a process sets it): a closed or archived event's
/// series go; the open events' are refreshed within it (`control::gauges`),
/// and every handle kept is looked up again within it (`http::Meters`).
pub(crate) fn metrics_handle_keeping(retention: Duration) -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let seconds = [
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0,
            ];
            let counts = [
                0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
            ];
            let handle = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::ALL, Some(retention))
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(m::PROBE_DEPTH.into()), &counts)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(m::BATCH_SIZE.into()), &counts)
                })
                .and_then(|b| b.install_recorder())
                .expect("the Prometheus recorder is installed once");
            m::describe();
            handle
        })
        .clone()
}

/// A built application, ready to serve.
pub struct Application {
    listener: TcpListener,
    router: Router,
    tasks: JoinSet<anyhow::Result<()>>,
    /// Fires at the shutdown signal: background loops stop.
    stop: CancellationToken,
    /// Fires when the grace period is over: the last work gives up.
    deadline: CancellationToken,
    grace: Duration,
    serve: ServeOptions,
}

/// A background task that ends when `stop` fires and has nothing to report.
async fn quietly(task: impl Future<Output = ()>) -> anyhow::Result<()> {
    task.await;
    Ok(())
}

impl Application {
    /// Connects the store, creates the configured events, binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        match options::redis(&settings) {
            Some(opts) => {
                let store = RedisStore::connect(&opts)
                    .await
                    .with_context(|| format!("connecting to Redis at {}", mask_url(&opts.url)))?;
                Self::with_store(store, settings).await
            }
            None => Self::with_store(MemoryStore::new(), settings).await,
        }
    }

    /// Builds on a given store (the embedded one, or Redis).
    pub async fn with_store<S: Store>(store: S, settings: Settings) -> anyhow::Result<Self> {
        let retention = Duration::from_millis(settings.server.metrics_retention_ms);
        let metrics = metrics_handle_keeping(retention);
        let db = &settings.database;
        let ledger = Ledger::connect(&db.url, db.max_connections)
            .await
            .with_context(|| format!("connecting to the database at {}", mask_url(&db.url)))?
            .with_outbox(settings.outbox.enabled);
        let backend = store.capabilities();
        let policy = db.lost_state.unwrap_or(if backend.durable {
            LostState::Refuse
        } else {
            LostState::Rebuild
        });
        let mut engine_options = options::engine(&settings);
        if !backend.remote {
            // Group commit saves round trips; in process there are none, and
            // the batcher's queue, channel and driver task only cost.
            engine_options.max_batch = None;
        }
        let engine = Arc::new(Engine::new(store, engine_options));
        let (rebuilt, refused) = lifecycle::recover_lost(&engine, &ledger, policy)
            .await
            .context("checking the store against the database")?;
        if !rebuilt.is_empty() {
            let events = rebuilt
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            // The embedded store starts empty at every start: rebuilding its
            // events is the normal start. Redis losing them is not.
            if !backend.durable {
                tracing::info!(%events, "rebuilt the events on sale from the database");
            } else {
                tracing::warn!(%events, "rebuilt events the store had lost, from the database");
            }
        }
        let resizing = options::rebalance(&settings.rebalancer).resizing;
        for spec in settings.event_specs()? {
            let spec = lifecycle::starting_layout(&engine, spec, &resizing);
            let id = spec.id.clone();
            let created = lifecycle::ensure(&engine, &ledger, spec)
                .await
                .with_context(|| format!("creating the configured event {id}"))?;
            tracing::info!(event = %id, created, "configured event ready");
        }
        if settings.outbox.enabled {
            let now = engine.clock().now_ms();
            ledger
                .sync_config_webhooks(&options::config_webhooks(&settings.outbox, now), now)
                .await
                .context("writing the configured webhook subscriptions ([[outbox.webhooks]])")?;
        }
        for spec in settings.release_specs()? {
            let id = spec.id.clone();
            lifecycle::create_release(&engine, &ledger, spec)
                .await
                .with_context(|| format!("creating the configured release {id}"))?;
            tracing::info!(release = %id, "configured release ready");
        }
        let stop = CancellationToken::new();
        let admin_token = Some(settings.server.admin_token.as_str()).filter(|t| !t.is_empty());
        if admin_token.is_none() {
            tracing::warn!(
                "no admin token is configured: the admin endpoints are disabled (they answer \
                 401); set [server] admin_token or SHARDSTOCK_ADMIN_TOKEN"
            );
        }
        let state = AppState::new(http::Shared {
            engine: engine.clone(),
            ledger: ledger.clone(),
            admin_token: admin_token.map(Arc::from),
            limits: Arc::new(RateLimits::new(&options::rate_limits(&settings.rate_limit))),
            metrics: metrics.clone(),
            // After the recorder is installed: the handles are its series.
            meters: Arc::new(http::Meters::refreshed_within(retention)),
            quarantine: Arc::new(Quarantine::lost(refused)),
            flush: options::flush(db, ledger.kind()),
            rebalance: options::rebalance(&settings.rebalancer),
            stop: stop.clone(),
            admin_wait: Duration::from_millis(settings.server.request_timeout_ms * 3 / 4),
            live: http::Live::default(),
        });
        let router = http::router(state.clone(), &options::router(&settings));
        let listener = TcpListener::bind(&settings.server.listen)
            .await
            .with_context(|| format!("binding {}", settings.server.listen))?;
        let mut tasks = JoinSet::new();
        let deadline = CancellationToken::new();
        let interval = Duration::from_millis(settings.server.gauges_interval_ms);
        tasks.spawn(quietly(crate::control::gauges::run(
            engine.clone(),
            interval,
            retention,
            stop.clone(),
        )));
        let flusher = Flusher::new(
            engine.clone(),
            ledger.clone(),
            engine.instance().to_owned(),
            options::flush(db, ledger.kind()),
        )
        .with_scan(db.flush_sweep_buckets_per_s);
        let (flush_stop, flush_deadline) = (stop.clone(), deadline.clone());
        tasks.spawn(async move {
            flusher
                .run(flush_stop, flush_deadline)
                .await
                .context("orders were left unflushed at shutdown")
        });
        if settings.rebalancer.enabled {
            let rebalancer = Rebalancer::new(
                engine.clone(),
                ledger.clone(),
                options::flush(db, ledger.kind()),
                options::rebalance(&settings.rebalancer),
            );
            tasks.spawn(quietly(rebalancer.run(stop.clone())));
        }
        // Order events off (the default): no outbox, so no relay, no
        // webhooks and no pruning.
        if settings.outbox.enabled {
            // The relay and the webhook dispatcher lead together.
            let owner = crate::control::relay::owner(&engine);
            if let Some(relay) = options::relay(&settings.outbox) {
                let relay =
                    crate::control::relay::Relay::new(engine.clone(), ledger.clone(), relay)
                        .with_owner(owner.clone());
                tasks.spawn(quietly(relay.run(stop.clone())));
            }
            let dispatcher = crate::control::webhook::Dispatcher::new(
                engine.clone(),
                ledger.clone(),
                options::webhooks(&settings.outbox),
                owner,
            );
            tasks.spawn(quietly(dispatcher.run(stop.clone())));
            tasks.spawn(quietly(crate::control::relay::prune(
                engine.clone(),
                ledger.clone(),
                options::prune(&settings.outbox),
                stop.clone(),
            )));
        }
        if db.audit_interval_ms > 0 {
            let every = Duration::from_millis(db.audit_interval_ms);
            tasks.spawn(quietly(audits::run(
                engine.clone(),
                ledger.clone(),
                every,
                audits::Reaction {
                    quarantine: state.quarantine.clone(),
                    repair: policy == LostState::Rebuild,
                },
                stop.clone(),
            )));
        }
        tasks.spawn(quietly(crate::control::saga_sweeper::run(
            engine.clone(),
            options::sweep(&settings),
            stop.clone(),
        )));
        tasks.spawn(quietly(crate::control::release_sweeper::run(
            engine.clone(),
            options::sweep(&settings),
            stop.clone(),
        )));
        tasks.spawn(quietly(crate::control::hold_expiry::run(
            engine.clone(),
            Default::default(),
            stop.clone(),
        )));
        tasks.spawn(quietly(crate::control::draw_timer::run(
            engine.clone(),
            stop.clone(),
        )));
        tasks.spawn(quietly(crate::control::release_sweeper::run_holds(
            engine.clone(),
            Default::default(),
            stop.clone(),
        )));
        tasks.spawn(quietly(housekeeping(state, stop.clone())));
        tracing::info!(
            store = engine.store().kind(),
            addr = %listener.local_addr()?,
            workers = tokio::runtime::Handle::current().metrics().num_workers(),
            "shardstock ready"
        );
        Ok(Self {
            listener,
            router,
            tasks,
            stop,
            deadline,
            grace: Duration::from_millis(settings.server.shutdown_grace_ms),
            serve: options::serve(&settings),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    /// Serves until ctrl-c or SIGTERM.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `signal` completes, then shuts down within the grace
    /// period: in-flight requests finish, background loops stop, the flusher
    /// drains what is left. Past the grace period whatever still runs is
    /// dropped. `Err` when shutdown could not finish its work (orders left in
    /// the streams, or tasks cut off): the process should exit non-zero.
    pub async fn run_until(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = self.stop.clone();
        let serve = http::serve::serve(self.listener, self.router, self.serve, async move {
            signal.await;
            tracing::info!("shutting down: finishing in-flight requests");
            stop.cancel();
        });
        let mut serve = std::pin::pin!(serve);
        // A finished `serve` must not be polled again (it would panic:
        // "`async fn` resumed after completion"): remember whether it did.
        let served = tokio::select! {
            _ = &mut serve => true,
            _ = self.stop.cancelled() => false,
        };
        let deadline = tokio::time::Instant::now() + self.grace;
        let timer = self.deadline.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            timer.cancel();
        });
        let mut complete = true;
        if !served && tokio::time::timeout_at(deadline, &mut serve).await.is_err() {
            tracing::warn!(grace = ?self.grace, "grace period over; dropping remaining requests");
            complete = false;
        }
        self.stop.cancel();
        // The deadline token lets the flusher give up cleanly; the margin lets
        // it say so before the tasks are cut off.
        let cutoff = deadline + Duration::from_millis(250);
        loop {
            match tokio::time::timeout_at(cutoff, self.tasks.join_next()).await {
                Ok(None) => break,
                Ok(Some(Ok(Ok(())))) => {}
                Ok(Some(Ok(Err(e)))) => {
                    tracing::error!(error = %format!("{e:#}"), "a background task ended badly");
                    complete = false;
                }
                Ok(Some(Err(e))) => {
                    tracing::error!(error = %e, "a background task panicked");
                    complete = false;
                }
                Err(_) => {
                    tracing::error!(
                        tasks = self.tasks.len(),
                        "grace period over; cutting off background tasks"
                    );
                    self.tasks.abort_all();
                    complete = false;
                    break;
                }
            }
        }
        anyhow::ensure!(
            complete,
            "shutdown did not finish its work within the grace period ({:?})",
            self.grace
        );
        tracing::info!("stopped");
        Ok(())
    }
}

/// Small periodic chores: the Prometheus upkeep (it also drops series past
/// their retention), forgetting the HTTP meters of events not served lately.
async fn housekeeping<S: Store>(state: AppState<S>, stop: CancellationToken) {
    let mut ticker = Ticker::new(Duration::from_secs(5), &stop);
    while ticker.tick().await {
        state.metrics.run_upkeep();
        state.meters.forget_old();
    }
}

/// ctrl-c or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
