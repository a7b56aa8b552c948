//! The binary as an operator meets it: `check-config` (which file it read,
//! the resolved settings, secrets masked), `audit` on the embedded store
//! (pointed at the running instance), and what `serve` says at start (which
//! file, or the built-in defaults; admin endpoints disabled; the embedded
//! store's rebuild at a restart, at INFO).
//!
//! Each run starts from a cleared environment in a scratch folder, so no
//! `SHARDSTOCK_*` variable or config file of the machine leaks in; logs are
//! JSON lines (`SHARDSTOCK_LOG_FORMAT=json`) read back as values.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{free_port, wait_until};

/// A fresh scratch folder for one test, removed when dropped (kept when the
/// test failed, for its logs).
fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("shardstock-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `shardstock` run in `dir` with nothing of this process's environment.
fn shardstock(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardstock"));
    command
        .current_dir(dir)
        .env_clear()
        .env("RUST_LOG", "info")
        .env("SHARDSTOCK_LOG_FORMAT", "json");
    command
}

/// A running `shardstock serve` whose log goes to a file (killed when dropped).
struct Serve {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Serve {
    /// Starts `serve` in `dir` on a free port, its ledger a SQLite file
    /// there, with `args`; waits until it listens.
    fn start(dir: &Path, args: &[&str]) -> Self {
        let port = free_port();
        let log = dir.join(format!("serve-{port}.log"));
        let child = shardstock(dir)
            .arg("serve")
            .args(args)
            .env("SHARDSTOCK_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "SHARDSTOCK_DATABASE_URL",
                format!("sqlite://{}/ledger.db", dir.display()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let serve = Self { child, port, log };
        wait_until("serve to listen", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        serve
    }

    /// The log lines so far, as JSON values.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The first log line whose message contains `text`.
    fn line(&self, text: &str) -> Option<Value> {
        self.lines().into_iter().find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(text))
        })
    }

    /// SIGTERM, and the exit awaited: a clean stop.
    fn stop(mut self) {
        let stopped = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "serve exited {status}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn check_config_without_a_file_says_so_and_prints_the_defaults() {
    let dir = scratch("check-none");
    let out = shardstock(&dir).arg("check-config").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let first = stdout.lines().next().unwrap();
    assert!(
        first.contains("no configuration file at config/shardstock.toml")
            && first.contains(&dir.display().to_string())
            && first.contains("built-in defaults"),
        "{first}"
    );
    assert!(
        stdout.contains("no admin token is configured: the admin endpoints are disabled"),
        "{stdout}"
    );
    // The settings themselves, as a file `serve --config` reads back.
    let back = shardstock::config::Settings::parse(&stdout, Path::new("stdout")).unwrap();
    let defaults = shardstock::config::Settings::default();
    assert_eq!(back.server.listen, defaults.server.listen);
    assert_eq!(back.database.url, defaults.database.url);
    assert_eq!(back.store.redis_url, None);
}

#[test]
fn check_config_names_its_file_and_masks_every_secret() {
    let dir = scratch("check-file");
    let file = dir.join("prod.toml");
    std::fs::write(
        &file,
        "[server]\nadmin_token = \"t0ken-in-file\"\n\
         [store]\nredis_url = \"redis://:redis-pa55@127.0.0.1:6379\"\n\
         [database]\nurl = \"postgres://app:db-pa55@127.0.0.1:5432/shop\"\n\
         [[events]]\nid = \"drop-1\"\nstock = 5000\nbuckets = 2\n",
    )
    .unwrap();
    let out = shardstock(&dir)
        .args(["check-config", "--config", "prod.toml"])
        // Flags and environment are part of what `serve` would run with.
        .env("SHARDSTOCK_LISTEN", "0.0.0.0:9999")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let read = format!(
        "read the configuration file {}",
        file.canonicalize().unwrap().display()
    );
    assert!(stdout.lines().next().unwrap().contains(&read), "{stdout}");
    for secret in ["t0ken-in-file", "redis-pa55", "db-pa55"] {
        assert!(!stdout.contains(secret), "{secret} printed:\n{stdout}");
    }
    for shown in [
        "listen = \"0.0.0.0:9999\"",
        "admin_token = \"********\"",
        "redis_url = \"redis://:********@127.0.0.1:6379\"",
        "url = \"postgres://app:********@127.0.0.1:5432/shop\"",
        "# event drop-1: 5000 units in 2 buckets",
    ] {
        assert!(stdout.contains(shown), "{shown} missing:\n{stdout}");
    }
    assert!(!stdout.contains("admin endpoints are disabled"), "{stdout}");
    // A file named but absent is an error, not the defaults.
    let out = shardstock(&dir)
        .args(["check-config", "--config", "absent.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn audit_and_recover_on_the_embedded_store_point_at_the_running_instance() {
    let dir = scratch("audit");
    std::fs::write(dir.join("s.toml"), "[server]\nlisten = \"0.0.0.0:18080\"\n").unwrap();
    let out = shardstock(&dir)
        .args(["audit", "sneaker-42", "--config", "s.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(
            "curl -sS -H \"Authorization: Bearer $SHARDSTOCK_ADMIN_TOKEN\" \
             http://127.0.0.1:18080/v1/events/sneaker-42/audit"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("embedded store"), "{stderr}");
    // `recover` too: nothing to run there (the instance rebuilds at start).
    let out = shardstock(&dir)
        .args(["recover", "sneaker-42", "--config", "s.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("needs no recovery command"), "{stderr}");
    assert!(
        stderr.contains("http://127.0.0.1:18080/v1/events/sneaker-42/audit"),
        "{stderr}"
    );
}

/// Started from a folder without its file, `serve` says it runs on the
/// defaults and that the admin endpoints are off, and an admin call says
/// why it is refused, not the 401 of a wrong token.
#[tokio::test]
async fn serve_on_the_defaults_says_so_and_admin_calls_say_why() {
    let dir = scratch("serve-defaults");
    let serve = Serve::start(&dir, &[]);
    let warned = |text: &str| {
        let line = serve
            .line(text)
            .unwrap_or_else(|| panic!("no line with {text:?}: {:?}", serve.lines()));
        assert_eq!(line["level"], "WARN", "{line}");
        line["fields"]["message"].as_str().unwrap().to_owned()
    };
    let defaults = warned("no configuration file at config/shardstock.toml");
    assert!(defaults.contains(&dir.display().to_string()), "{defaults}");
    warned("the admin endpoints are disabled");
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/events", serve.port))
        .bearer_auth("any-token")
        .json(&json!({"id": "e", "stock": 5, "buckets": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let body: Value = r.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("no admin token is configured"),
        "{body}"
    );
    // With a file, the start names it and says nothing of the defaults.
    drop(serve);
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(
        dir.join("config/shardstock.toml"),
        "[server]\nadmin_token = \"t\"\n",
    )
    .unwrap();
    let serve = Serve::start(&dir, &[]);
    let read = serve.line("read the configuration file").unwrap();
    assert_eq!(read["level"], "INFO", "{read}");
    assert!(serve.line("no configuration file").is_none());
    assert!(serve.line("admin endpoints are disabled").is_none());
}

/// The embedded store starts empty every time: rebuilding its events from
/// the database is a normal start, logged at INFO with the ids as written.
#[test]
fn an_embedded_restart_rebuilds_its_events_at_info() {
    let dir = scratch("restart");
    std::fs::write(
        dir.join("s.toml"),
        "[server]\nadmin_token = \"t\"\n[[events]]\nid = \"cli-rebuild\"\nstock = 5000\nbuckets = 2\n",
    )
    .unwrap();
    let first = Serve::start(&dir, &["--config", "s.toml"]);
    assert!(first.line("rebuilt").is_none(), "{:?}", first.lines());
    first.stop();
    let second = Serve::start(&dir, &["--config", "s.toml"]);
    let line = second
        .line("rebuilt the events on sale")
        .unwrap_or_else(|| panic!("no rebuild line: {:?}", second.lines()));
    assert_eq!(line["fields"]["events"], "cli-rebuild", "{line}");
    let rebuilt: Vec<Value> = second
        .lines()
        .into_iter()
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("rebuilt")
        })
        .collect();
    assert!(
        rebuilt.iter().all(|l| l["level"] == "INFO"),
        "a normal start is no alarm: {rebuilt:?}"
    );
    assert!(
        second.lines().iter().all(|l| l["level"] != "WARN"),
        "{:?}",
        second.lines()
    );
}

/// An event with too little stock per bucket is created as asked; its
/// `warnings` are in the answer and at WARN in the log, on the request's span.
#[tokio::test]
async fn a_small_stock_per_bucket_is_logged_at_warn() {
    let dir = scratch("small");
    std::fs::write(dir.join("s.toml"), "[server]\nadmin_token = \"t\"\n").unwrap();
    let serve = Serve::start(&dir, &["--config", "s.toml"]);
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/events", serve.port))
        .bearer_auth("t")
        .json(&json!({"id": "cli-small", "stock": 3, "buckets": 16}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let warning = created["warnings"][0].as_str().unwrap().to_owned();
    let line = serve
        .line(&warning)
        .unwrap_or_else(|| panic!("no line with {warning:?}: {:?}", serve.lines()));
    assert_eq!(line["level"], "WARN", "{line}");
    assert!(
        line["spans"].to_string().contains(r#""event":"cli-small""#),
        "{line}"
    );
}
