//! The `shardstock` binary: parse the command line, load the settings, run.

use anyhow::Context;
use clap::Parser;
use shardstock::app::{self, Application};
use shardstock::cli::{Cli, Command, Resolved};
use shardstock::config::LogFormat;

/// mimalloc: the hot path allocates small, short-lived buffers at a high rate,
/// and glibc's allocator showed up in profiles.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `serve` reads its log format from its settings; the other commands log text.
    let serve = match &cli.command {
        Command::Serve(args) => Some(args.resolve()?),
        _ => None,
    };
    let format = serve
        .as_ref()
        .map_or(LogFormat::Text, |r| r.settings.server.log_format);
    // Held to the end: dropping it flushes the last spans to the exporter.
    let _telemetry = shardstock::telemetry::init(format)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    let workers = serve
        .as_ref()
        .map_or(0, |r| r.settings.server.worker_threads);
    if workers > 0 {
        runtime.worker_threads(workers);
    }
    runtime
        .enable_all()
        .build()?
        .block_on(run(cli.command, serve))
}

async fn run(command: Command, serve: Option<Resolved>) -> anyhow::Result<()> {
    match command {
        Command::Serve(_) => {
            let Resolved { settings, source } =
                serve.context("serve's settings are read before the runtime starts")?;
            source.log();
            Application::build(settings)
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
            let Resolved { settings, source } = args.resolve()?;
            print!("{}", shardstock::config::show(&settings, &source)?);
            Ok(())
        }
    }
}
