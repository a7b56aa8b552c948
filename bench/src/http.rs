//! The whole shardstock service as a benchmark strategy: the HTTP API through
//! the service's own typed client (`shardstock::client`), every order also
//! written to the database by the service's flusher.
//!
//! Three ways to have a service to load:
//! - [`HttpStrategy::start`] runs the real `shardstock` binary in its own
//!   process, as `--compare` and `--strategy http` (on Redis and PostgreSQL)
//!   and `--strategy http-embedded` (the quickstart setup: the embedded store
//!   and SQLite in a scratch file) do; [`service_binary`] finds it next to
//!   `shardstock-bench` (cargo puts every binary of the workspace in one
//!   `target/<profile>/`).
//! - [`HttpStrategy::in_process`] serves the same application from the
//!   caller's runtime instead, for the tests: a test of this crate cannot ask
//!   cargo for another package's binary. Either way the service gets the same
//!   settings ([`Setup`]): every default, no configured events, an admin token,
//!   and its own key namespace or its own SQLite file.
//! - [`HttpStrategy::target`] starts nothing: it loads a service already
//!   running at a URL (`--target`), creating its event through the admin API
//!   with the operator's token, and closes that event at the end so the
//!   target's background work does not keep serving it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::Method;
use shardstock::app::Application;
use shardstock::client::{Bought, Client, ClientError, NewEvent, NewPurchase};
use shardstock::config::Settings;
use shardstock::domain::ids::EventId;
use tokio::sync::oneshot;

use crate::engine::{current, event, spec};
use crate::{BenchError, Outcome, Strategy, Workload};

/// The whole service over HTTP: the `shardstock` binary in its own process,
/// the same application in process, or a service running elsewhere.
pub struct HttpStrategy {
    name: String,
    /// The service's URL, for messages.
    base: String,
    /// The typed client of the API (`shardstock::client`), with the admin token.
    client: Client,
    service: Mutex<Option<Service>>,
    buckets: u32,
    event: Mutex<Option<EventId>>,
    /// Close the event once measured ([`HttpStrategy::target`]: a service
    /// that outlives the run).
    close_after: bool,
}

/// What serves the API, stopped when the strategy is dropped.
enum Service {
    /// `shardstock serve`: killed, then its scratch directory removed.
    Process { child: Child, scratch: PathBuf },
    /// An `Application` on the caller's runtime: dropping `_stop` is its
    /// shutdown signal.
    InProcess { _stop: oneshot::Sender<()> },
}

/// What the service the bench starts runs on.
#[derive(Debug, Clone)]
pub enum Setup {
    /// Redis and a database (PostgreSQL): the production setup.
    Redis { redis: String, database: String },
    /// The quickstart setup: no `--redis` (the embedded store), and the
    /// orders in a SQLite file of the run's own scratch directory.
    Embedded,
}

impl Setup {
    /// The strategy's name for this setup.
    fn name(&self, buckets: u32) -> String {
        match self {
            Self::Redis { .. } => format!("shardstock-http-n{buckets}"),
            Self::Embedded => format!("shardstock-http-embedded-n{buckets}"),
        }
    }

    /// The database URL under `scratch`, where the setup has one there.
    fn database(&self, scratch: &Path) -> String {
        match self {
            Self::Redis { database, .. } => database.clone(),
            Self::Embedded => format!("sqlite://{}", scratch.join("ledger.db").display()),
        }
    }

    /// The arguments of `shardstock serve` after `--listen`, and the
    /// configuration file they name (written under `scratch`): an explicit
    /// file, so a `config/shardstock.toml` in the working directory (the
    /// quickstart's demo event) is not read.
    pub fn serve_args(&self, scratch: &Path) -> std::io::Result<Vec<String>> {
        let config = scratch.join("bench.toml");
        let mut args = Vec::new();
        let toml = match self {
            Self::Redis { redis, .. } => {
                args.extend(["--redis".to_owned(), redis.clone()]);
                format!("[store]\nnamespace = \"{}\"\n", namespace())
            }
            Self::Embedded => String::new(),
        };
        std::fs::write(&config, toml)?;
        args.extend(["--database-url".to_owned(), self.database(scratch)]);
        args.extend(["--admin-token".to_owned(), TOKEN.to_owned()]);
        args.extend(["--config".to_owned(), config.display().to_string()]);
        Ok(args)
    }

    /// The same settings as [`Setup::serve_args`], for an in-process service.
    fn settings(&self, scratch: &Path) -> Settings {
        let mut settings = Settings::default();
        settings.server.listen = "127.0.0.1:0".to_owned();
        settings.server.admin_token = TOKEN.to_owned();
        if let Self::Redis { redis, .. } = self {
            settings.store.redis_url = Some(redis.clone());
            settings.store.namespace = namespace();
        }
        settings.database.url = self.database(scratch);
        settings
    }
}

const TOKEN: &str = "bench-admin-token";

/// How long a service must take to answer `/readyz`: one the bench started
/// (migrations, connections), one already running (reachability only).
const START_WITHIN: Duration = Duration::from_secs(30);
const REACH_WITHIN: Duration = Duration::from_secs(5);

/// How many times the end of a `--target` run asks for its event's close
/// (a close still running answers `503 try-again`; asking again joins it).
const CLOSE_TRIES: u32 = 60;

/// A key namespace of the strategy's own, so runs never meet.
fn namespace() -> String {
    format!("benchhttp{:04x}", rand::random::<u16>())
}

/// The `shardstock` binary [`HttpStrategy::start`] runs: `explicit` when
/// given, else the one next to this executable.
pub fn service_binary(explicit: Option<&Path>) -> Result<PathBuf, BenchError> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| BenchError::Unavailable(format!("where am I: {e}")))?
            .with_file_name(format!("shardstock{}", std::env::consts::EXE_SUFFIX)),
    };
    if path.is_file() {
        return Ok(path);
    }
    Err(BenchError::Unavailable(format!(
        "the HTTP strategy runs the service binary, and there is none at {}: \
         build it with `{}` (or pass --service PATH)",
        path.display(),
        build_command(&path)
    )))
}

/// The cargo command that puts the service binary at `binary`: the profile
/// is the directory's name under `target/` (dev builds go to `debug/`).
fn build_command(binary: &Path) -> String {
    fn name(p: Option<&Path>) -> Option<&str> {
        p.and_then(Path::file_name).and_then(|n| n.to_str())
    }
    let dir = binary.parent();
    match (name(dir), name(dir.and_then(Path::parent))) {
        (Some("debug"), _) => "cargo build -p shardstock".to_owned(),
        (Some(profile), Some("target")) if profile != "release" => {
            format!("cargo build --profile {profile} -p shardstock")
        }
        _ => "cargo build --release -p shardstock".to_owned(),
    }
}

impl HttpStrategy {
    /// Starts `binary serve` on a free port on `setup`'s stores.
    pub async fn start(
        binary: &Path,
        setup: &Setup,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let port = crate::cluster::free_port();
        let base = format!("http://127.0.0.1:{port}");
        let strategy = Self::new(&base, TOKEN, setup.name(buckets), buckets, clients)?;
        let scratch = crate::cluster::scratch_dir("bench-http");
        let args = setup
            .serve_args(&scratch)
            .map_err(|e| BenchError::Unavailable(e.to_string()))?;
        let child = Command::new(binary)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                BenchError::Unavailable(format!("cannot start {}: {e}", binary.display()))
            })?;
        // Held by the strategy from here: a service that never gets ready is
        // killed when the strategy is dropped.
        *strategy.service.lock().expect("service slot") = Some(Service::Process { child, scratch });
        strategy.ready(START_WITHIN).await
    }

    /// Serves the application on the caller's runtime, on a free port, with
    /// the settings [`start`](Self::start) gives the binary.
    pub async fn in_process(
        setup: &Setup,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let settings = setup.settings(&crate::cluster::scratch_dir("bench-http"));
        let unavailable = |e: anyhow::Error| BenchError::Unavailable(format!("{e:#}"));
        settings.validate().map_err(|e| unavailable(e.into()))?;
        let app = Application::build(settings).await.map_err(unavailable)?;
        let base = format!("http://127.0.0.1:{}", app.port());
        let strategy = Self::new(&base, TOKEN, setup.name(buckets), buckets, clients)?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let signal = async move {
                let _ = stopped.await;
            };
            if let Err(e) = app.run_until(signal).await {
                eprintln!("the in-process service failed: {e:#}");
            }
        });
        *strategy.service.lock().expect("service slot") = Some(Service::InProcess { _stop: stop });
        strategy.ready(START_WITHIN).await
    }

    /// A service already running at `url` (`http://host:port`): nothing is
    /// started. Its event is created with `admin_token` and closed at the end.
    pub async fn target(
        url: &str,
        admin_token: &str,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let name = format!("shardstock-http-target-n{buckets}");
        let mut strategy = Self::new(url, admin_token, name, buckets, clients)?;
        strategy.close_after = true;
        strategy.ready(REACH_WITHIN).await
    }

    /// The strategy's client of the service at `base`, no service held yet.
    fn new(
        base: &str,
        token: &str,
        name: String,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(clients)
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BenchError::Unavailable(e.to_string()))?;
        Ok(Self {
            name,
            base: base.to_owned(),
            client: Client::with_http(base, http).with_token(token),
            service: Mutex::new(None),
            buckets,
            event: Mutex::new(None),
            close_after: false,
        })
    }

    /// Waits until the service answers `/readyz`, at most `within`.
    async fn ready(self, within: Duration) -> Result<Self, BenchError> {
        let start = Instant::now();
        while !self.client.ready().await {
            if start.elapsed() > within {
                return Err(BenchError::Unavailable(format!(
                    "the service at {} did not answer GET /readyz with 200 within {within:?}",
                    self.base
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(self)
    }

    fn current(&self) -> EventId {
        current(&self.event)
    }

    /// Closes the run's event, asking again while the close runs.
    async fn close(&self, id: &EventId) -> anyhow::Result<()> {
        let path = format!("/v1/events/{id}/close");
        for _ in 0..CLOSE_TRIES {
            let r = self.client.request(Method::POST, &path).send().await?;
            match r.status().as_u16() {
                200 => return Ok(()),
                503 => tokio::time::sleep(Duration::from_secs(1)).await,
                status => anyhow::bail!("closing {id}: {status} {}", r.text().await?),
            }
        }
        anyhow::bail!("closing {id}: still running after {CLOSE_TRIES} tries")
    }
}

impl Drop for HttpStrategy {
    fn drop(&mut self) {
        let service = self.service.lock().ok().and_then(|mut s| s.take());
        if let Some(Service::Process { mut child, scratch }) = service {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(scratch);
        }
    }
}

impl Strategy for HttpStrategy {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn claims_no_oversell(&self) -> bool {
        true
    }

    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        let id = event("benchhttp");
        let s = spec(&id, w, self.buckets);
        self.client
            .create_event(&NewEvent {
                id: id.to_string(),
                stock: s.stock,
                buckets: s.buckets,
                per_user_limit: s.per_user_limit,
                max_per_order: Some(s.max_per_order),
                ..NewEvent::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!("creating the event: {e}"))?;
        *self.event.lock().expect("event slot") = Some(id);
        Ok(())
    }

    async fn attempt(&self, user: &str, qty: u32, request_id: &str) -> Outcome {
        let purchase = NewPurchase {
            user_id: user.to_owned(),
            quantity: qty,
            request_id: Some(request_id.to_owned()),
        };
        match self
            .client
            .purchase(self.current().as_str(), &purchase)
            .await
        {
            Ok(Bought { replayed: true, .. })
            | Err(ClientError::Problem { replayed: true, .. }) => Outcome::Replayed,
            Ok(Bought { order, .. }) => Outcome::Bought {
                units: order.quantity,
            },
            Err(e) => match e.slug() {
                Some("sold-out") => Outcome::SoldOut,
                Some("limit-exceeded") => Outcome::LimitExceeded,
                _ => Outcome::Error(e.to_string()),
            },
        }
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        let event = self.client.event(self.current().as_str()).await?;
        Ok(event.remaining as i64)
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        let event = self.event.lock().expect("event slot").clone();
        match event {
            Some(id) if self.close_after => self.close(&id).await,
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_service_binary_is_reported_with_the_command_that_builds_it() {
        let e = service_binary(Some(Path::new("/nowhere/release/shardstock")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cargo build --release -p shardstock"), "{e}");
        assert_eq!(
            build_command(Path::new("target/debug/shardstock")),
            "cargo build -p shardstock"
        );
        assert_eq!(
            build_command(Path::new("target/profiling/shardstock")),
            "cargo build --profile profiling -p shardstock"
        );
        assert_eq!(
            build_command(Path::new("/opt/tools/shardstock")),
            "cargo build --release -p shardstock"
        );
    }

    #[test]
    fn the_embedded_setup_starts_the_service_without_redis_on_a_scratch_sqlite_file() {
        let scratch = crate::cluster::scratch_dir("bench-http-args");
        let args = Setup::Embedded.serve_args(&scratch).unwrap();
        assert!(!args.iter().any(|a| a == "--redis"), "{args:?}");
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag).expect(flag);
            args[at + 1].clone()
        };
        let db = scratch.join("ledger.db");
        assert_eq!(
            after("--database-url"),
            format!("sqlite://{}", db.display())
        );
        // An explicit, empty configuration: the built-in defaults, not a
        // `config/shardstock.toml` the working directory may hold.
        let config = after("--config");
        assert_eq!(std::fs::read_to_string(&config).unwrap(), "");
        let settings = Setup::Embedded.settings(&scratch);
        assert_eq!(settings.store.redis_url, None);
        assert_eq!(settings.database.url, after("--database-url"));
        let redis = Setup::Redis {
            redis: "redis://127.0.0.1:6379".into(),
            database: "postgres://db".into(),
        };
        let args = redis.serve_args(&scratch).unwrap();
        assert!(
            args.windows(2)
                .any(|w| w == ["--redis", "redis://127.0.0.1:6379"])
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["--database-url", "postgres://db"])
        );
        let _ = std::fs::remove_dir_all(scratch);
    }
}
