//! The single-key Redis baselines: the whole stock is one integer key.
//!
//! - [`RedisDecrRollback`]: `DECRBY key q`; a negative result is undone with
//!   `INCRBY key q` and answered `SoldOut` (seed 000, method 1). It never
//!   oversells in the end, but between a DECRBY and its INCRBY the key is
//!   below the truth, so a smaller buyer arriving then is refused while units
//!   exist (seed 003's "gate" left negative) — the report shows it.
//! - [`RedisLuaSingleKey`]: `lua/bench_single_key.lua` checks and decrements
//!   in one step (seed 002 §4), run with EVALSHA.
//!
//! The fred client pipelines every client's commands over one connection (no
//! pool: no gain measured on two cores), reconnects with exponential backoff,
//! gives each command a timeout, and never re-sends a command whose connection
//! died: a DECRBY or a script sent twice would take stock twice.

use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::{START_REDIS, run_id};
use crate::{BenchError, Outcome, Strategy, Workload};

/// The machine's Redis.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The single-key check-and-decrement script (also used by the ceiling).
pub const SINGLE_KEY_LUA: &str = include_str!("../../lua/bench_single_key.lua");

const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One instance's stock key and the client that reaches it.
struct RedisItem {
    client: Client,
    key: String,
}

impl RedisItem {
    async fn connect(url: &str, strategy: &str) -> Result<Self, BenchError> {
        Ok(Self {
            client: connect(url).await?,
            key: format!("bench:{{{}}}:stock", run_id(strategy)),
        })
    }

    async fn prepare(&self, stock: u64) -> Result<(), BenchError> {
        let stock = i64::try_from(stock)
            .map_err(|_| BenchError::Workload(format!("stock {stock} exceeds i64")))?;
        let () = self.client.set(&self.key, stock, None, None, false).await?;
        Ok(())
    }

    async fn remaining(&self) -> Result<i64, BenchError> {
        let left: Option<i64> = self.client.get(&self.key).await?;
        left.ok_or_else(|| BenchError::Protocol(format!("{} is missing", self.key)))
    }

    async fn cleanup(&self) -> Result<(), BenchError> {
        let _: i64 = self.client.del(&self.key).await?;
        Ok(())
    }
}

/// A client with a reconnect policy and a command timeout (fred has neither
/// by default: a command after a Redis restart would hang).
pub async fn connect(url: &str) -> Result<Client, BenchError> {
    let down = |e: &dyn std::fmt::Display| {
        BenchError::Unavailable(format!(
            "Redis is not answering at {url} ({e}); start it with:\n  {START_REDIS}"
        ))
    };
    let config = Config::from_url(url)
        .map_err(|e| BenchError::Unavailable(format!("bad Redis URL {url:?}: {e}")))?;
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
        .with_connection_config(|c| {
            c.connection_timeout = CONNECT_TIMEOUT;
            c.internal_command_timeout = CONNECT_TIMEOUT;
            c.max_command_attempts = 1;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
        .build()?;
    match tokio::time::timeout(CONNECT_TIMEOUT, client.init()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(down(&e)),
        Err(_) => Err(down(&format!("no answer within {CONNECT_TIMEOUT:?}"))),
    }
}

fn error(e: impl std::fmt::Display) -> Outcome {
    Outcome::Error(e.to_string())
}

/// `DECRBY` then, when the result is negative, `INCRBY` back (seed 000).
pub struct RedisDecrRollback {
    redis: RedisItem,
}

impl RedisDecrRollback {
    /// Connects to `url` (see [`DEFAULT_REDIS_URL`]); the key is
    /// `bench:{redis-decr-rollback-<run id>}:stock`.
    pub async fn connect(url: &str) -> Result<Self, BenchError> {
        Ok(Self {
            redis: RedisItem::connect(url, "redis-decr-rollback").await?,
        })
    }
}

impl Strategy for RedisDecrRollback {
    fn name(&self) -> String {
        "redis-decr-rollback".to_string()
    }

    /// True: every negative result is rolled back, so in the end no more
    /// than the stock is sold (a failed rollback leaks stock, never adds it).
    fn claims_no_oversell(&self) -> bool {
        true
    }

    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        Ok(self.redis.prepare(w.stock).await?)
    }

    async fn attempt(&self, _user: &str, qty: u32, _request_id: &str) -> Outcome {
        let (client, key, units) = (&self.redis.client, &self.redis.key, i64::from(qty));
        let left: i64 = match client.decr_by(key, units).await {
            Ok(left) => left,
            Err(e) => return error(e),
        };
        if left >= 0 {
            return Outcome::Bought { units: qty };
        }
        match client.incr_by::<i64, _>(key, units).await {
            Ok(_) => Outcome::SoldOut,
            Err(e) => error(format!("rollback of {qty} failed: {e}")),
        }
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.redis.remaining().await?)
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        Ok(self.redis.cleanup().await?)
    }
}

/// One Lua check-and-decrement on one key (`lua/bench_single_key.lua`).
pub struct RedisLuaSingleKey {
    redis: RedisItem,
    script: Script,
}

impl RedisLuaSingleKey {
    /// Connects to `url` (see [`DEFAULT_REDIS_URL`]) and loads the script; the
    /// key is `bench:{redis-lua-single-key-<run id>}:stock`.
    pub async fn connect(url: &str) -> Result<Self, BenchError> {
        let redis = RedisItem::connect(url, "redis-lua-single-key").await?;
        let script = Script::from_lua(SINGLE_KEY_LUA);
        script.load(&redis.client).await?;
        Ok(Self { redis, script })
    }
}

impl Strategy for RedisLuaSingleKey {
    fn name(&self) -> String {
        "redis-lua-single-key".to_string()
    }

    fn claims_no_oversell(&self) -> bool {
        true
    }

    async fn prepare(&self, w: &Workload) -> anyhow::Result<()> {
        Ok(self.redis.prepare(w.stock).await?)
    }

    async fn attempt(&self, _user: &str, qty: u32, _request_id: &str) -> Outcome {
        // NOSCRIPT means the script did not run, so reloading and running it
        // again cannot take stock twice.
        let taken = self
            .script
            .evalsha_with_reload::<i64, _, _>(&self.redis.client, &self.redis.key, qty)
            .await;
        match taken {
            Ok(1) => Outcome::Bought { units: qty },
            Ok(0) => Outcome::SoldOut,
            Ok(other) => error(format!("bench_single_key.lua returned {other}")),
            Err(e) => error(e),
        }
    }

    async fn remaining(&self) -> anyhow::Result<i64> {
        Ok(self.redis.remaining().await?)
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        Ok(self.redis.cleanup().await?)
    }
}
