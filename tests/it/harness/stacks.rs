//! Large stacks for the suites whose futures nest deep: in a debug build a
//! `Faulty` store's retries under an engine's steps (an order's driver, its
//! walk, an on-demand consolidation, a reshard's settle) nest deeper than
//! a test thread's or a tokio worker's 2 MiB allow.
//!
//! - [`block_on_large_stacks`]: a `#[test]` runs its whole body there.
//! - [`on_large_stacks`]: an async test runs one future there, while the
//!   calling runtime keeps serving the store connections it made.

use std::future::Future;

/// The thread that runs the runtime, and each of its workers.
const THREAD_STACK: usize = 64 << 20;
const WORKER_STACK: usize = 32 << 20;

/// Runs `test` to its end on a fresh 4-worker runtime of large stacks, on a
/// thread of its own; a panic in it is the caller's.
pub fn block_on_large_stacks<F: Future<Output = ()>>(test: impl FnOnce() -> F + Send + 'static) {
    let thread = std::thread::Builder::new()
        .name("large-stacks".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .thread_stack_size(WORKER_STACK)
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(test())
        })
        .expect("a thread");
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// [`block_on_large_stacks`] from inside a runtime: the calling runtime's
/// workers stay free (the wait is on a blocking thread), so connections it
/// made go on being served.
pub async fn on_large_stacks<F: Future<Output = ()>>(test: impl FnOnce() -> F + Send + 'static) {
    tokio::task::spawn_blocking(move || block_on_large_stacks(test))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}
