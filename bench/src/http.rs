//! The whole shardstock service as a benchmark strategy: the HTTP API through
//! the service's own typed client (`shardstock::client`), every order also
//! written to PostgreSQL by the service's flusher.
//!
//! [`HttpStrategy::start`] runs the real `shardstock` binary in its own
//! process, as `--compare` and `--strategy http` do;
//! [`service_binary`](crate::http::service_binary) finds it next to
//! `shardstock-bench` (cargo puts every binary of the workspace in one
//! `target/<profile>/`). [`HttpStrategy::in_process`] serves the same
//! application from the caller's runtime instead, for the tests: a test of
//! this crate cannot ask cargo for another package's binary. Either way the
//! service gets the same settings: every default, no configured events, its
//! own key namespace and an admin token.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shardstock::app::Application;
use shardstock::client::{Bought, Client, ClientError, NewEvent, NewPurchase};
use shardstock::config::Settings;
use shardstock::domain::ids::EventId;
use tokio::sync::oneshot;

use crate::engine::{current, event, spec};
use crate::{BenchError, Outcome, Strategy, Workload};

/// The whole service over HTTP: the `shardstock` binary in its own process,
/// or the same application in process.
pub struct HttpStrategy {
    /// The typed client of the API (`shardstock::client`), with the admin token.
    client: Client,
    service: Mutex<Option<Service>>,
    buckets: u32,
    event: Mutex<Option<EventId>>,
}

/// What serves the API, stopped when the strategy is dropped.
enum Service {
    /// `shardstock serve`: killed.
    Process(Child),
    /// An `Application` on the caller's runtime: dropping `_stop` is its
    /// shutdown signal.
    InProcess { _stop: oneshot::Sender<()> },
}

const TOKEN: &str = "bench-admin-token";

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
    /// Starts `binary serve` on a free port against Redis and the database.
    pub async fn start(
        binary: &Path,
        redis: &str,
        database: &str,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let port = crate::cluster::free_port();
        let config = crate::cluster::scratch_dir("bench-http").join("bench.toml");
        let ns = format!("[store]\nnamespace = \"{}\"\n", namespace());
        std::fs::write(&config, ns).map_err(|e| BenchError::Unavailable(e.to_string()))?;
        let child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--redis",
                redis,
                "--database-url",
                database,
            ])
            .args(["--admin-token", TOKEN, "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                BenchError::Unavailable(format!("cannot start {}: {e}", binary.display()))
            })?;
        Self::ready(port, Service::Process(child), buckets, clients).await
    }

    /// Serves the application on the caller's runtime, on a free port, with
    /// the settings [`start`](Self::start) gives the binary.
    pub async fn in_process(
        redis: &str,
        database: &str,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let mut settings = Settings::default();
        settings.server.listen = "127.0.0.1:0".to_owned();
        settings.server.admin_token = TOKEN.to_owned();
        settings.store.redis_url = Some(redis.to_owned());
        settings.store.namespace = namespace();
        settings.database.url = database.to_owned();
        let unavailable = |e: anyhow::Error| BenchError::Unavailable(format!("{e:#}"));
        settings.validate().map_err(|e| unavailable(e.into()))?;
        let app = Application::build(settings).await.map_err(unavailable)?;
        let port = app.port();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let signal = async move {
                let _ = stopped.await;
            };
            if let Err(e) = app.run_until(signal).await {
                eprintln!("the in-process service failed: {e:#}");
            }
        });
        Self::ready(port, Service::InProcess { _stop: stop }, buckets, clients).await
    }

    /// Waits until the service on `port` answers `/readyz`.
    async fn ready(
        port: u16,
        service: Service,
        buckets: u32,
        clients: usize,
    ) -> Result<Self, BenchError> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(clients)
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BenchError::Unavailable(e.to_string()))?;
        let strategy = Self {
            client: Client::with_http(format!("http://127.0.0.1:{port}"), http).with_token(TOKEN),
            service: Mutex::new(Some(service)),
            buckets,
            event: Mutex::new(None),
        };
        let start = Instant::now();
        while !strategy.client.ready().await {
            if start.elapsed() > Duration::from_secs(30) {
                return Err(BenchError::Unavailable(
                    "the service did not become ready".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(strategy)
    }

    fn current(&self) -> EventId {
        current(&self.event)
    }
}

impl Drop for HttpStrategy {
    fn drop(&mut self) {
        let service = self.service.lock().ok().and_then(|mut s| s.take());
        if let Some(Service::Process(mut child)) = service {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Strategy for HttpStrategy {
    fn name(&self) -> String {
        format!("shardstock-http-n{}", self.buckets)
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
}
