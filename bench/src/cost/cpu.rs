//! CPU time of processes, read from `/proc/<pid>/stat`.
//!
//! The steadiest cost figure on a small shared machine: a process's user +
//! system time does not depend on how many cores were free, only on the work
//! it did. [`Cpu::of`] reads one process; [`Cpu::postgres`] sums every process
//! named `postgres` (the postmaster and its backends — a backend that exits
//! during a run takes its time with it, so the rows keep their connections).

use std::time::Duration;

/// User + system CPU time, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticks(pub u64);

impl Ticks {
    /// Ticks as time (Linux reports them at `USER_HZ`, 100 per second).
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0 * 1_000 / USER_HZ)
    }

    /// Microseconds per operation over `ops` operations.
    pub fn micros_per(self, ops: u64) -> f64 {
        if ops == 0 {
            return 0.0;
        }
        self.as_duration().as_secs_f64() * 1e6 / ops as f64
    }
}

impl std::ops::Sub for Ticks {
    type Output = Ticks;
    fn sub(self, rhs: Ticks) -> Ticks {
        Ticks(self.0.saturating_sub(rhs.0))
    }
}

/// `USER_HZ`: fixed at 100 on every Linux architecture that matters here.
const USER_HZ: u64 = 100;

/// Reading CPU time from `/proc`.
pub struct Cpu;

impl Cpu {
    /// The CPU time of one process (0 when it is gone).
    pub fn of(pid: u32) -> Ticks {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| parse_stat(&s).map(|(_, t)| t))
            .unwrap_or(Ticks(0))
    }

    /// The CPU time of every process named `postgres`.
    pub fn postgres() -> Ticks {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Ticks(0);
        };
        let mut total = 0;
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if let Some((comm, t)) = parse_stat(&stat)
                && (comm == "postgres" || comm.starts_with("postgres:"))
            {
                total += t.0;
            }
        }
        Ticks(total)
    }
}

/// `(comm, utime + stime)` from a `/proc/<pid>/stat` line. The command name
/// is in parentheses and may hold spaces, so fields count from the last `)`.
fn parse_stat(stat: &str) -> Option<(&str, Ticks)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = &stat[open + 1..close];
    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, Ticks(utime + stime)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_in_the_name_parses() {
        let line =
            "42 (postgres: wal writer) S 1 42 42 0 -1 4194368 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0";
        let (comm, t) = parse_stat(line).unwrap();
        assert_eq!(comm, "postgres: wal writer");
        assert_eq!(t, Ticks(12));
        assert_eq!(Ticks(250).as_duration(), Duration::from_millis(2_500));
        assert!((Ticks(100).micros_per(1_000) - 1_000.0).abs() < 1e-9);
    }

    #[test]
    fn this_process_has_spent_some_cpu() {
        // Burns CPU until the reading moves (a tick is 10 ms): a fixed loop
        // was optimised to almost nothing in a release build, and the test
        // then read 0 ticks.
        let before = Cpu::of(std::process::id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        while Cpu::of(std::process::id()) <= before && std::time::Instant::now() < deadline {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert!(
            Cpu::of(std::process::id()) > before,
            "no CPU time read for this process after 10 s of spinning"
        );
    }
}
