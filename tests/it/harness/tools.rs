//! The tools some tests drive besides the services (Chromium, Prometheus,
//! promtool): installed on first use by `.ci/tools.sh`, the script CI runs
//! too, so `cargo test` passes on a fresh machine with only Redis and
//! PostgreSQL running. One run a test process, under a file lock (two test
//! processes must not run `apt-get` at once).

use std::process::Command;
use std::sync::OnceLock;

/// Makes sure the tools are there, or fails saying what to run.
pub fn ensure_test_tools() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/tools.sh");
        let out = Command::new("flock")
            .args(["/tmp/shardstock-test-tools.lock", "bash", script])
            .output()
            .map_err(|e| format!("cannot run flock ({e}); install util-linux"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(why) = done {
        panic!(
            "the test tools are missing and could not be installed:\n{why}\ninstall them with (as root):\n  bash .ci/tools.sh"
        );
    }
}
