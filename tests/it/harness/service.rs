//! `Service`: the `shardstock` binary as a child process, for tests that kill
//! it, signal it, or count what the process itself holds (its sockets).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{TOKEN, free_port, wait_until};

/// A running `shardstock serve` (killed when dropped).
pub struct Service {
    pub child: Child,
    pub port: u16,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Starts `shardstock serve --config config` and waits until `port` listens.
    pub fn start(config: &Path, port: u16) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_shardstock"))
            .args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let service = Self { child, port };
        wait_until("the service to listen", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        service
    }

    /// Writes a config file whose `[server]` section listens on a free port
    /// with the test token, followed by `rest` (more `[server]` keys first,
    /// then other sections), and starts the service on it.
    pub fn with_config(name: &str, rest: &str) -> Self {
        let port = free_port();
        let path = Self::config_path(name, port);
        std::fs::write(
            &path,
            format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_token = \"{TOKEN}\"\n{rest}"),
        )
        .unwrap();
        Self::start(&path, port)
    }

    /// A fresh path for a config file.
    pub fn config_path(name: &str, port: u16) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("shardstock-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("shardstock.toml")
    }

    /// Sockets the process holds open (its listener and client connections).
    pub fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|fds| {
                fds.filter_map(Result::ok)
                    .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                    .filter(|target| target.to_string_lossy().starts_with("socket:"))
                    .count()
            })
            .unwrap_or(0)
    }
}
