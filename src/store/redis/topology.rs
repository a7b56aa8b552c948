//! Following a Redis Cluster whose slots move (nodes added, slots resharded,
//! nodes removed) without errors or an outage: what fred does, and what this
//! store adds around it.
//!
//! fred 10.1 answers a `MOVED` by refreshing its slot table (`CLUSTER SLOTS`,
//! connecting to new nodes, dropping gone ones) and an `ASK` with `ASKING`,
//! and re-sends the command either way, which spends one of the command's
//! `max_command_attempts`. This store allows one attempt, so that a command
//! whose connection died (it may have run) is never sent twice. With one
//! attempt, fred's `ASK` path fails *inside its routing task* ("Max attempts
//! reached") and that ends the task: from then on every command waits for its
//! timeout, until the process restarts — the outage after a migration of
//! issue 15. Hence:
//! - fred follows no redirection itself (`max_redirections = 0`, set in
//!   `connect`). A `MOVED` still refreshes its slot table first; the command
//!   is then answered "Too many redirections": a refusal, it never ran.
//! - [`refusal`]s are retried here, the same call after a short backoff
//!   (1 ms doubling to 100 ms, jittered), for as long as the command timeout
//!   allows: `TRYAGAIN` (a script's keys are split between the two ends of a
//!   slot being migrated; every script here names keys that may not exist,
//!   such as `sealed`, so *any* script on a migrating slot gets it until the
//!   slot is handed over, a few milliseconds), `ASK`/`MOVED`, no owner known
//!   for a slot, `LOADING`, `READONLY`. Each is a refusal by the server or by
//!   the client before sending: the call never ran, so sending it again is
//!   safe. Past the budget the step fails [`StoreError::Moving`].
//! - `CLUSTERDOWN` is *not* retried: fred drops the connection on it and
//!   answers every command in flight on that connection with the same
//!   error, including commands that ran. It stays a plain `Unavailable`,
//!   which the engine resolves (outcome unknown, the request id decides).
//! - The slot table is also refreshed every `cluster_refresh`, so nodes are
//!   reached before the first redirection and removed nodes are dropped,
//!   and it is looked up from every node fred has seen, not only those in
//!   the URL (`ClusterDiscoveryPolicy::UseCache`): a service started with
//!   the original nodes' addresses keeps working after they are gone.
//! - A watchdog restarts fred's routing task should it end with an error
//!   anyway (a path not foreseen here), so that no fault leaves the client
//!   dead until a restart.
//!
//! The two tasks end when the last clone of the store is dropped.

use std::future::Future;
use std::time::Duration;

use fred::prelude::*;
use fred::types::ConnectHandle;
use fred::types::config::ClusterDiscoveryPolicy;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::unavailable;
use crate::metrics as m;
use crate::store::StoreError;

/// The first pause before a refused call is sent again.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two restarts of a dead routing task.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(5);

/// Why the server (or fred, before sending) refused a call that therefore
/// never ran, as a metric label; `None` when the call may have run or the
/// error is not about the topology.
pub(super) fn refusal(e: &Error) -> Option<&'static str> {
    let details = e.details();
    if details.starts_with("TRYAGAIN") {
        Some("tryagain")
    } else if details.starts_with("MOVED")
        || details.starts_with("ASK")
        || (*e.kind() == ErrorKind::Routing && details.contains("Too many redirections"))
    {
        Some("redirect")
    } else if details.starts_with("Failed to route command") {
        Some("unrouted")
    } else if details.starts_with("LOADING") {
        Some("loading")
    } else if details.starts_with("READONLY") {
        Some("readonly")
    } else {
        None
    }
}

/// Runs `call` until it is not refused, within `budget`: see the module doc.
pub(super) async fn retrying<T, F, Fut>(budget: Duration, mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = FIRST_PAUSE;
    loop {
        let e = match call().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(reason) = refusal(&e) else {
            return Err(unavailable(e));
        };
        let wait = pause.mul_f64(rand::random_range(0.5..1.5));
        if Instant::now() + wait >= deadline {
            return Err(StoreError::moving(format!(
                "still refused after {budget:?} ({reason}): {e}"
            )));
        }
        metrics::counter!(m::STORE_RETRIES, "reason" => reason).increment(1);
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// The client options that keep fred's routing task alive through slot
/// moves: no redirection followed inside fred (this module retries), and the
/// slot table looked up from every node seen.
pub(super) fn configure(config: &mut Config, connection: &mut ConnectionConfig) {
    connection.max_redirections = 0;
    if let ServerConfig::Clustered { policy, .. } = &mut config.server {
        *policy = ClusterDiscoveryPolicy::UseCache;
    }
}

/// Starts the watchdog of fred's routing task and, on a Cluster, the
/// periodic refresh of the slot table; both stop with `stop`.
pub(super) fn watch(
    client: Client,
    router: ConnectHandle,
    refresh: Duration,
    connect_timeout: Duration,
    stop: CancellationToken,
) {
    if client.is_clustered() && !refresh.is_zero() {
        tokio::spawn(refresh_slots(
            client.clone(),
            refresh,
            connect_timeout,
            stop.clone(),
        ));
    }
    tokio::spawn(keep_router(client, router, connect_timeout, stop));
}

/// `CLUSTER SLOTS` every `every`: connections to new nodes, none to gone ones.
async fn refresh_slots(
    client: Client,
    every: Duration,
    timeout: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match tokio::time::timeout(timeout, client.sync_cluster()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "refreshing the Cluster's slot table failed"),
            Err(_) => tracing::warn!("refreshing the Cluster's slot table took over {timeout:?}"),
        }
    }
}

/// Waits on fred's routing task; if it ends with an error (not a `QUIT`),
/// starts a new one, with backoff until it connects.
async fn keep_router(
    client: Client,
    mut router: ConnectHandle,
    timeout: Duration,
    stop: CancellationToken,
) {
    loop {
        let ended = tokio::select! {
            _ = stop.cancelled() => return,
            ended = &mut router => ended,
        };
        match ended {
            Ok(Ok(())) => return,
            Ok(Err(e)) if e.is_canceled() => return,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the Redis client's routing task ended; restarting it")
            }
            Err(e) => {
                tracing::error!(error = %e, "the Redis client's routing task failed; restarting it")
            }
        }
        metrics::counter!(m::STORE_ROUTER_RESTARTS).increment(1);
        let mut pause = Duration::from_millis(50);
        router = loop {
            match tokio::time::timeout(timeout, client.init()).await {
                Ok(Ok(router)) => break router,
                Ok(Err(e)) => tracing::warn!(error = %e, "restarting the Redis client failed"),
                Err(_) => tracing::warn!("restarting the Redis client took over {timeout:?}"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_RESTART_PAUSE);
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_the_errors_of_calls_that_never_ran() {
        let e = |kind, s: &str| Error::new(kind, s.to_owned());
        assert_eq!(
            refusal(&e(
                ErrorKind::Unknown,
                "TRYAGAIN Multiple keys request during rehashing of slot"
            )),
            Some("tryagain")
        );
        assert_eq!(
            refusal(&e(ErrorKind::Routing, "Too many redirections.")),
            Some("redirect")
        );
        assert_eq!(
            refusal(&e(ErrorKind::Cluster, "ASK 3999 127.0.0.1:6381")),
            Some("redirect")
        );
        assert_eq!(
            refusal(&e(ErrorKind::Unknown, "Failed to route command.")),
            Some("unrouted")
        );
        // May have run: fred fails every command in flight with these.
        assert_eq!(
            refusal(&e(ErrorKind::Cluster, "CLUSTERDOWN The cluster is down")),
            None
        );
        assert_eq!(
            refusal(&e(ErrorKind::Unknown, "Too many failed write attempts.")),
            None
        );
        assert_eq!(refusal(&e(ErrorKind::IO, "Connection closed.")), None);
        assert_eq!(refusal(&e(ErrorKind::Timeout, "Request timed out.")), None);
    }

    #[tokio::test]
    async fn a_refusal_past_the_budget_is_moving() {
        let mut calls = 0;
        let r: Result<(), _> = retrying(Duration::from_millis(30), || {
            calls += 1;
            async { Err(Error::new(ErrorKind::Unknown, "TRYAGAIN rehashing")) }
        })
        .await;
        let e = r.unwrap_err();
        assert!(matches!(e, StoreError::Moving(_)), "{e}");
        assert!(
            e.to_string()
                .starts_with("store unavailable: slots moving: "),
            "{e}"
        );
        assert!(calls > 2, "tried {calls} times");
        let mut calls = 0;
        let r: Result<(), _> = retrying(Duration::from_secs(1), || {
            calls += 1;
            async { Err(Error::new(ErrorKind::IO, "Connection closed.")) }
        })
        .await;
        assert!(!r.unwrap_err().is_moving());
        assert_eq!(calls, 1, "a call that may have run is never sent again");
    }
}
