//! Waiting for a condition, never for a fixed time: a test that sleeps "long
//! enough" is slow on a fast machine and flaky on a slow one.

use std::time::Duration;

/// The first pause between two checks; it doubles up to `MAX_PAUSE`, so a
/// quick condition is seen at once and a slow one is not asked in a loop.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Polls `probe` until it returns `Some`, and returns that; fails the test
/// naming `what` when `timeout` passes first.
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Blocks until `ok` holds (processes, ports); fails the test naming `what`
/// when `timeout` passes first.
pub fn wait_until(what: &str, timeout: Duration, ok: impl FnMut() -> bool) {
    shardstock_bench::cluster::wait_until(what, timeout, ok).unwrap();
}
