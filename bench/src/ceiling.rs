//! The raw Redis ceiling: how many single-key deductions per second one Redis
//! serves when the client costs nothing, measured with the system's
//! `redis-benchmark` (C, no Rust client, no harness) running EVALSHA of
//! `lua/bench_single_key.lua` — the same script as
//! [`RedisLuaSingleKey`](crate::RedisLuaSingleKey). Every strategy's row is
//! read against it, unpipelined and with `-P 16`.
//!
//! The script is loaded with `redis-cli SCRIPT LOAD`; the key gets 2^62 units
//! so it never runs out. Afterwards the key must have lost exactly `requests`
//! units: `redis-benchmark` counts error replies (NOSCRIPT, WRONGTYPE) as
//! requests served, and this check refuses such a number.
//!
//! Synchronous on purpose: it only runs two external programs. Call it from
//! async code with `tokio::task::spawn_blocking`.

use std::process::Command;

use crate::BenchError;
use crate::baselines::SINGLE_KEY_LUA;

/// Units the key starts with; far more than any run can take.
const HUGE_STOCK: i64 = 1 << 62;

/// Requests per second of `EVALSHA <sha> 1 <key> 1` by `redis-benchmark` with
/// `clients` connections, `requests` requests in total and `pipeline`
/// requests per round trip (1 = unpipelined).
pub fn redis_ceiling(
    host: &str,
    port: u16,
    clients: usize,
    requests: u64,
    pipeline: usize,
) -> anyhow::Result<f64> {
    if clients == 0 || requests == 0 || pipeline == 0 {
        return Err(BenchError::Ceiling(
            "clients, requests and pipeline must each be at least 1".to_string(),
        )
        .into());
    }
    let cli = RedisCli { host, port };
    let sha = cli.run(&["SCRIPT", "LOAD", SINGLE_KEY_LUA])?;
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BenchError::Ceiling(format!("SCRIPT LOAD answered {sha:?}")).into());
    }
    let key = format!("bench:{{ceiling-{:016x}}}:stock", rand::random::<u64>());
    let set = cli.run(&["SET", &key, &HUGE_STOCK.to_string()])?;
    if set != "OK" {
        return Err(BenchError::Ceiling(format!("SET answered {set:?}")).into());
    }
    let measured = benchmark(&cli, &sha, &key, clients, requests, pipeline);
    let left = cli.run(&["GET", &key]);
    let deleted = cli.run(&["DEL", &key]);
    let rps = measured?;
    let left: i64 = left?
        .parse()
        .map_err(|e| BenchError::Ceiling(format!("GET {key}: {e}")))?;
    deleted?;
    let taken = HUGE_STOCK - left;
    if u64::try_from(taken).ok() != Some(requests) {
        return Err(BenchError::Ceiling(format!(
            "the script ran {taken} times for {requests} requests: redis-benchmark counted failures"
        ))
        .into());
    }
    Ok(rps)
}

fn benchmark(
    cli: &RedisCli<'_>,
    sha: &str,
    key: &str,
    clients: usize,
    requests: u64,
    pipeline: usize,
) -> Result<f64, BenchError> {
    let out = Command::new("redis-benchmark")
        .args(["-h", cli.host, "-p", &cli.port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string(), "--csv"])
        .args(["EVALSHA", sha, "1", key, "1"])
        .output()
        .map_err(|e| BenchError::Ceiling(format!("cannot run redis-benchmark: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BenchError::Ceiling(format!(
            "redis-benchmark exited with {}: {}{}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_csv_rps(&stdout).ok_or_else(|| {
        BenchError::Ceiling(format!(
            "no requests/s in redis-benchmark's output: {stdout:?}"
        ))
    })
}

/// The `rps` column of `redis-benchmark --csv`: a header line
/// `"test","rps",…` then one line per test, every field quoted.
fn parse_csv_rps(csv: &str) -> Option<f64> {
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next()?.split(',').map(unquote).collect();
    let column = header.iter().position(|h| *h == "rps")?;
    // The test name (the command) holds no comma here: EVALSHA, a sha, a key.
    let row: Vec<&str> = lines.next()?.split(',').map(unquote).collect();
    row.get(column)?.parse().ok()
}

fn unquote(field: &str) -> &str {
    field.trim().trim_matches('"')
}

struct RedisCli<'a> {
    host: &'a str,
    port: u16,
}

impl RedisCli<'_> {
    /// Runs one command; its reply, trimmed. Error replies are failures
    /// (`redis-cli` prints them on stdout, prefixed `ERR`/`NOSCRIPT`/…).
    fn run(&self, args: &[&str]) -> Result<String, BenchError> {
        let out = Command::new("redis-cli")
            .args(["-h", self.host, "-p", &self.port.to_string()])
            .args(args)
            .output()
            .map_err(|e| BenchError::Ceiling(format!("cannot run redis-cli: {e}")))?;
        let reply = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let command = args.first().copied().unwrap_or_default();
        if !out.status.success() || reply.is_empty() && !stderr.trim().is_empty() {
            return Err(BenchError::Ceiling(format!(
                "redis-cli {command} on {}:{}: {} {}",
                self.host,
                self.port,
                reply,
                stderr.trim()
            )));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rps_column_is_read_from_redis_benchmark_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\"\n\
                   \"EVALSHA d68c 1 bench:{c}:stock 1\",\"62500.00\",\"0.052\",\"0.016\"\n";
        assert_eq!(parse_csv_rps(csv), Some(62_500.0));
        assert_eq!(parse_csv_rps("\"test\",\"rps\"\n"), None);
        assert_eq!(parse_csv_rps(""), None);
    }
}
