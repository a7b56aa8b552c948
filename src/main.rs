//! The `shardstock` binary: parse the command line, load the settings, run.

use clap::Parser;
use shardstock::app::{self, Application};
use shardstock::cli::{Cli, Command};

/// mimalloc: the hot path allocates small, short-lived buffers at a high rate,
/// and glibc's allocator showed up in profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cli.command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            Application::build(args.settings()?)
                .await?
                .run_until_stopped()
                .await
        }
        Command::Bench(args) => args.forward(),
        Command::Audit(args) => {
            let audit = app::audit(args.backends.settings()?, &args.event).await?;
            println!("{}", serde_json::to_string_pretty(&audit)?);
            if !audit.balanced {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Recover(args) => app::recover(args.backends.settings()?, &args.event).await,
        Command::CheckConfig(args) => {
            let settings = args.load()?;
            for spec in settings.event_specs()? {
                println!(
                    "{}: {} units in {} buckets",
                    spec.id, spec.stock, spec.buckets
                );
            }
            Ok(())
        }
    }
}
