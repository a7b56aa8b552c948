//! The operator commands that work on a deployment without serving it:
//! `shardstock audit EVENT` and `shardstock recover EVENT` (a lost event, or
//! a partial loss). Both need the
//! shared store (Redis) and the database the service uses.

use anyhow::Context;

use super::options;
use crate::config::Settings;
use crate::control::audit::Audit;
use crate::control::lifecycle;
use crate::control::reconcile::{self, Reconciled};
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

/// `shardstock recover EVENT`: rebuild an event the store lost from the
/// ledger; or, when the store lost only some of its writes (a partial loss:
/// units held by orders in the ledger are on sale again), take those units
/// off sale (`control::reconcile`). Instances holding the event sell it again
/// once their next audit balances.
pub async fn recover(settings: Settings, event: &str) -> anyhow::Result<()> {
    let event = EventId::parse(event)?;
    let (engine, ledger) = connect(&settings).await?;
    if engine.store().load_meta(&event).await?.is_some() {
        return match reconcile::reconcile(&engine, &ledger, &event, true).await? {
            Reconciled::Clean(audit) if audit.discrepancy < 0 => anyhow::bail!(
                "the store has {event} and holds {} units fewer than the ledger accounts for \
                 (a lost cancel?): nothing to take off sale; see `shardstock audit {event}`",
                -audit.discrepancy
            ),
            Reconciled::Clean(_) => {
                anyhow::bail!("the store has {event} and it balances: nothing to recover")
            }
            Reconciled::Repaired { units, short } => {
                println!(
                    "{event}: the store had lost writes the database has; took {} of their {units} \
                     units off sale{}",
                    units - short,
                    if short > 0 {
                        format!(" ({short} had been sold again: oversold)")
                    } else {
                        String::new()
                    }
                );
                Ok(())
            }
            Reconciled::Found { units } => {
                anyhow::bail!("{units} units found and left: not repaired")
            }
        };
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
