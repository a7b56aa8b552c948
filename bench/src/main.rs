//! The `shardstock-bench` binary: parse the command line, drive the load on
//! one thread.

use clap::Parser;
use shardstock_bench::cmd::{BenchArgs, command};

/// The service's allocator (mimalloc), so the engine strategy, which runs the
/// engine in this process, measures the same code the service runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let args = BenchArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    // The load generator runs its clients on one thread: on a small machine the
    // other cores belong to Redis, and cross-thread wakeups would only cost.
    // So does a peer of --http-cost unless asked for more (--peer-threads).
    let mut runtime = match (args.serve_peer, args.peer_threads) {
        (Some(_), n) if n > 1 => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.into());
            b
        }
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    runtime.enable_all().build()?.block_on(command(args))
}
