//! The newcomer's path: the README's quickstart, run as written.
//!
//! Reads the two shell blocks under "## Quickstart" in README.md: the run
//! command (`cargo run --release -- serve`, here the already-built binary with
//! the same arguments) and the curl lines, which run in bash with `set -e` and
//! `--fail-with-body`, so any line that fails fails the test. Only the port
//! (and a scratch database) differ, so the test can run beside a real server.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::wait_until;

const RUN: &str = "cargo run --release -- ";

fn quickstart_blocks() -> (String, String) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## Quickstart")
        .nth(1)
        .expect("README has a Quickstart section");
    let section = section.split("\n## ").next().unwrap();
    let blocks: Vec<String> = section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().trim().to_owned())
        .collect();
    assert!(
        blocks.len() >= 2,
        "Quickstart needs a run block and a curl block"
    );
    (blocks[0].clone(), blocks[1].clone())
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_readme_quickstart_works_as_written() {
    let (run, curls) = quickstart_blocks();
    let args = run
        .strip_prefix(RUN)
        .unwrap_or_else(|| panic!("the run command should start with `{RUN}`: {run}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let scratch =
        std::env::temp_dir().join(format!("shardstock-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_shardstock"))
            .args(args.split_whitespace())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("SHARDSTOCK_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "SHARDSTOCK_DATABASE_URL",
                format!("sqlite://{}/quickstart.db", scratch.display()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_until("the server to start", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let order_file = scratch.join("order.json");
    let script = format!(
        "set -euo pipefail\n{}",
        curls
            .replace("localhost:8080", &format!("localhost:{port}"))
            .replace("/tmp/order.json", &order_file.display().to_string())
            .replace("curl -s", "curl --fail-with-body -s")
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut server = server;
    if !out.status.success() {
        let _ = server.0.kill();
        let mut log = String::new();
        let _ = server.0.stderr.take().unwrap().read_to_string(&mut log);
        panic!(
            "the quickstart failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}\n--- server\n{log}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for expected in [
        "\"id\":\"sneaker-42\"",
        "\"order_id\":\"sneaker-42.",
        "\"status\":\"cancelled\"",
        "shardstock_purchases_total{event=\"sneaker-42\",outcome=\"ok\"} 1",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected} in:\n{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
