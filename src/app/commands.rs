//! The operator commands that work on a deployment without serving it:
//! `shardstock audit EVENT` and `shardstock recover EVENT`. Both need the
//! shared store (Redis) and the database the service uses.

use anyhow::Context;

use super::options;
use crate::config::Settings;
use crate::control::audit::Audit;
use crate::control::lifecycle;
use crate::domain::ids::EventId;
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::store::{Events, RedisStore};

/// The store and ledger of the deployment the settings name.
async fn connect(settings: &Settings) -> anyhow::Result<(Engine<RedisStore>, Ledger)> {
    let opts = options::redis(settings)
        .context("this command needs the shared store: give --redis or store.redis_url")?;
    let store = RedisStore::connect(&opts)
        .await
        .with_context(|| format!("connecting to Redis at {}", opts.url))?;
    let ledger = Ledger::connect(&settings.database.url, 2).await?;
    Ok((Engine::new(store, options::engine(settings)), ledger))
}

/// `shardstock audit EVENT`.
pub async fn audit(settings: Settings, event: &str) -> anyhow::Result<Audit> {
    let event = EventId::parse(event)?;
    let (engine, ledger) = connect(&settings).await?;
    Ok(crate::control::audit::audit(&engine, &ledger, &event).await?)
}

/// `shardstock recover EVENT`: rebuild an event the store lost from the ledger.
pub async fn recover(settings: Settings, event: &str) -> anyhow::Result<()> {
    let event = EventId::parse(event)?;
    let (engine, ledger) = connect(&settings).await?;
    if engine.store().load_meta(&event).await?.is_some() {
        anyhow::bail!("the store has {event}: nothing to recover");
    }
    let db = ledger
        .event(&event)
        .await?
        .with_context(|| format!("the database does not know {event}"))?;
    anyhow::ensure!(!db.closed, "{event} is closed: nothing to recover");
    lifecycle::rebuild(&engine, &ledger, &db).await?;
    println!("rebuilt {event} from the database; running instances serve it from now on");
    Ok(())
}
