//! The command line (clap): `serve`, and the operator commands.
//!
//! Flags override the configuration file; each flag can also come from its
//! environment variable (`SHARDSTOCK_LISTEN`, …), which is how containers and
//! the Kubernetes manifests in `deploy/` configure the service.
//!
//! `bench` only hands over to the `shardstock-bench` binary (the `bench/`
//! workspace member), which owns the load generator and its flags.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{ConfigError, ConfigSource, Settings};

/// Segmented hot-stock inventory for flash sales.
///
/// Each event's stock is split into buckets on Redis (standalone or Cluster) or
/// in process; purchases never oversell and never answer "sold out" while a
/// unit is left; every order reaches the database exactly once. Without
/// --redis it runs on the embedded store.
#[derive(Debug, Parser)]
#[command(name = "shardstock", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service.
    Serve(ServeArgs),
    /// Check conservation for an event: stock = remaining + in transfer + sold − released + leftover.
    /// Exits 1 when it does not balance.
    Audit(EventArgs),
    /// Rebuild an event the store lost (a Redis that restarted empty) from the database.
    Recover(EventArgs),
    /// Run a flash-sale load against a strategy, or compare them all (--compare
    /// writes BENCHMARKS.md): runs the shardstock-bench binary next to this one
    /// with the same arguments (`shardstock bench --help` lists them).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
    /// Check the configuration `serve` would run with (the file, then flags
    /// and environment) and print it, secrets masked, saying which file it
    /// read or that none was found.
    CheckConfig(ServeArgs),
}

/// Everything after `bench`, for `shardstock-bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Configuration file (TOML). Missing default file: built-in defaults.
    #[arg(
        long,
        short,
        env = "SHARDSTOCK_CONFIG",
        default_value = "config/shardstock.toml"
    )]
    pub config: PathBuf,
}

/// Where the store and the database are (file, then flags and environment).
#[derive(Debug, Args)]
pub struct BackendArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Redis URL: redis://host:port or redis-cluster://host:port?node=host:port&…
    /// (absent: the embedded memory store).
    #[arg(long, env = "SHARDSTOCK_REDIS")]
    pub redis: Option<String>,
    /// Database URL: postgres://… or sqlite://… (the order ledger).
    #[arg(long, env = "SHARDSTOCK_DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// The durability setting: acknowledge a purchase only once this many
    /// replicas have it (`store.min_replicas`; 0: off).
    #[arg(long, env = "SHARDSTOCK_MIN_REPLICAS")]
    pub min_replicas: Option<u32>,
    /// Order events on or off (`outbox.enabled`; off by default): the ledger's
    /// outbox, the changes endpoint and the relay.
    #[arg(long, env = "SHARDSTOCK_OUTBOX")]
    pub outbox: Option<bool>,
    /// NATS URL (nats://host:port): relay the order changes to JetStream
    /// (`outbox.nats_url`, which needs `--outbox true`; empty: no relay).
    #[arg(long, env = "SHARDSTOCK_NATS_URL")]
    pub nats_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub backends: BackendArgs,
    /// Address to listen on, e.g. 0.0.0.0:8080.
    #[arg(long, env = "SHARDSTOCK_LISTEN")]
    pub listen: Option<String>,
    /// Bearer token for the admin endpoints.
    #[arg(long, env = "SHARDSTOCK_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Log lines as `text` or `json` (one object per line).
    #[arg(long, env = "SHARDSTOCK_LOG_FORMAT", value_enum)]
    pub log_format: Option<crate::config::LogFormat>,
    /// The runtime's worker threads (0: one per core).
    #[arg(long, env = "SHARDSTOCK_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct EventArgs {
    /// The event id.
    pub event: String,
    #[command(flatten)]
    pub backends: BackendArgs,
}

/// Settings and where they came from.
#[derive(Debug)]
pub struct Resolved {
    pub settings: Settings,
    pub source: ConfigSource,
}

impl ConfigArgs {
    /// Loads the file; the default path may be absent (built-in defaults).
    pub fn load(&self) -> Result<Resolved, ConfigError> {
        if !self.config.exists() && self.config == *"config/shardstock.toml" {
            return Ok(Resolved {
                settings: Settings::default(),
                source: ConfigSource::defaults(&self.config),
            });
        }
        Ok(Resolved {
            settings: Settings::load(&self.config)?,
            source: ConfigSource::file(&self.config),
        })
    }
}

impl BackendArgs {
    /// The file with the store and database overrides applied (not validated yet).
    fn apply(&self) -> Result<Resolved, ConfigError> {
        let mut resolved = self.config.load()?;
        let s = &mut resolved.settings;
        if let Some(url) = &self.redis {
            s.store.redis_url = Some(url.clone()).filter(|u| !u.is_empty());
        }
        if let Some(url) = &self.database_url {
            s.database.url = url.clone();
        }
        if let Some(n) = self.min_replicas {
            s.store.min_replicas = n;
        }
        if let Some(on) = self.outbox {
            s.outbox.enabled = on;
        }
        if let Some(url) = &self.nats_url {
            s.outbox.nats_url = Some(url.clone()).filter(|u| !u.is_empty());
        }
        Ok(resolved)
    }

    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let s = self.apply()?.settings;
        s.validate()?;
        Ok(s)
    }
}

impl BenchArgs {
    /// Runs `shardstock-bench` from this binary's directory (where cargo puts
    /// both) with the same arguments; when it is not there, fails with the
    /// command that builds and runs it.
    pub fn forward(&self) -> anyhow::Result<()> {
        let bench = std::env::current_exe()
            .context("finding this binary")?
            .with_file_name(format!("shardstock-bench{}", std::env::consts::EXE_SUFFIX));
        if !bench.is_file() {
            let args: Vec<_> = self.args.iter().map(|a| a.to_string_lossy()).collect();
            anyhow::bail!(
                "the benchmark is its own binary, shardstock-bench, and there is none at {}. \
                 Build and run it with:\n  cargo run --release -p shardstock-bench -- {}",
                bench.display(),
                args.join(" ")
            );
        }
        let mut command = std::process::Command::new(&bench);
        command.args(&self.args);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // `exec` only returns on failure.
            Err(command.exec()).with_context(|| format!("running {}", bench.display()))
        }
        #[cfg(not(unix))]
        {
            let status = command
                .status()
                .with_context(|| format!("running {}", bench.display()))?;
            std::process::exit(status.code().unwrap_or(1))
        }
    }
}

impl ServeArgs {
    /// The file, with flags and environment on top, validated again.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        self.resolve().map(|r| r.settings)
    }

    /// [`ServeArgs::settings`], and where they came from.
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        let mut resolved = self.backends.apply()?;
        let s = &mut resolved.settings;
        if let Some(listen) = &self.listen {
            s.server.listen = listen.clone();
        }
        if let Some(token) = &self.admin_token {
            s.server.admin_token = token.clone();
        }
        if let Some(format) = self.log_format {
            s.server.log_format = format;
        }
        if let Some(n) = self.worker_threads {
            s.server.worker_threads = n;
        }
        s.validate()?;
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let cli = Cli::parse_from([
            "shardstock",
            "serve",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/shardstock.toml"),
            "--listen",
            "0.0.0.0:9999",
            "--redis",
            "redis://10.0.0.1:6379",
            "--min-replicas",
            "1",
            "--worker-threads",
            "1",
            "--outbox",
            "true",
            "--nats-url",
            "nats://127.0.0.1:4222",
        ]);
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        let s = args.settings().unwrap();
        assert_eq!(s.outbox.nats_url.as_deref(), Some("nats://127.0.0.1:4222"));
        assert!(s.outbox.enabled);
        assert_eq!(s.server.listen, "0.0.0.0:9999");
        assert_eq!(s.store.redis_url.as_deref(), Some("redis://10.0.0.1:6379"));
        assert_eq!(s.store.min_replicas, 1);
        assert_eq!(s.server.worker_threads, 1);
    }

    #[test]
    fn too_many_worker_threads_are_refused() {
        let cli = Cli::parse_from(["shardstock", "serve", "--worker-threads", "5000"]);
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        let err = args.settings().unwrap_err().to_string();
        assert!(err.contains("server.worker_threads"), "{err}");
    }

    #[test]
    fn bench_passes_every_argument_through() {
        let cli = Cli::parse_from([
            "shardstock",
            "bench",
            "--compare",
            "--zipf",
            "1.1",
            "--help",
        ]);
        let Command::Bench(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.args, ["--compare", "--zipf", "1.1", "--help"]);
    }

    #[test]
    fn a_bad_override_names_its_field() {
        let cli = Cli::parse_from(["shardstock", "serve", "--listen", "nowhere"]);
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        let err = args.settings().unwrap_err().to_string();
        assert!(err.contains("server.listen"), "{err}");
    }
}
