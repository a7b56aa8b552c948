//! The operator commands that work on a deployment without serving it:
//! `shardstock audit EVENT` and `shardstock recover EVENT` (a lost event, or
//! a partial loss). Both need the
//! shared store (Redis) and the database the service uses. The embedded
//! store lives inside the serving process, so on it both say how to ask
//! that process instead (`GET /v1/events/{id}/audit`; the process rebuilds
//! lost events itself at start).

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
    if options::redis(&settings).is_none() {
        anyhow::bail!(
            "`shardstock audit` reads a shared store, and this configuration has none (no \
             --redis or store.redis_url): the embedded store lives inside the running \
             `shardstock serve`. Ask it over HTTP:\n  \
             curl -sS -H \"Authorization: Bearer $SHARDSTOCK_ADMIN_TOKEN\" {}/v1/events/{event}/audit\n\
             with SHARDSTOCK_ADMIN_TOKEN set to its admin token (`[server] admin_token`); \
             the answer's `balanced` is what this command checks.",
            instance_url(&settings.server.listen)
        );
    }
    let (engine, ledger) = connect(&settings).await?;
    Ok(crate::control::audit::audit(&engine, &ledger, &event).await?)
}

/// Where a local client reaches an instance listening on `listen`: an
/// unspecified address (`0.0.0.0`, `[::]`) is reached on the loopback.
fn instance_url(listen: &str) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    match listen.parse::<SocketAddr>() {
        Ok(mut addr) => {
            if addr.ip().is_unspecified() {
                addr.set_ip(match addr.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                });
            }
            format!("http://{addr}")
        }
        Err(_) => format!("http://{listen}"),
    }
}

/// `shardstock recover EVENT`: rebuild an event the store lost from the
/// ledger; or, when the store lost only some of its writes (a partial loss:
/// units held by orders in the ledger are on sale again), take those units
/// off sale (`control::reconcile`). Instances holding the event sell it again
/// once their next audit balances.
pub async fn recover(settings: Settings, event: &str) -> anyhow::Result<()> {
    let event = EventId::parse(event)?;
    if options::redis(&settings).is_none() {
        anyhow::bail!(
            "`shardstock recover` repairs a shared store, and this configuration has none (no \
             --redis or store.redis_url). The embedded store needs no recovery command: at \
             start, `shardstock serve` rebuilds every open event from the database \
             (`database.lost_state`, \"rebuild\" by default there), and a running instance's \
             audits repair a partial loss. To check {event}, ask the running instance:\n  \
             curl -sS -H \"Authorization: Bearer $SHARDSTOCK_ADMIN_TOKEN\" {}/v1/events/{event}/audit",
            instance_url(&settings.server.listen)
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_listening_everywhere_is_reached_on_the_loopback() {
        assert_eq!(instance_url("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(instance_url("0.0.0.0:9000"), "http://127.0.0.1:9000");
        assert_eq!(instance_url("[::]:8080"), "http://[::1]:8080");
        assert_eq!(instance_url("10.0.0.5:80"), "http://10.0.0.5:80");
    }
}
