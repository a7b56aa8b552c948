//! The `shardstock` binary: parse the command line, load the settings, run.

use clap::Parser;
use shardstock::app::{self, Application};
use shardstock::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Serve(args) => {
            Application::build(args.settings()?)
                .await?
                .run_until_stopped()
                .await
        }
        Command::Audit(args) => {
            let audit = app::audit(args.backends.settings()?, &args.event).await?;
            println!("{}", serde_json::to_string_pretty(&audit)?);
            if !audit.balanced {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Bench(args) => shardstock::bench::cmd::command(args).await,
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
