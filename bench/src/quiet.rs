//! Waiting for the machine to go quiet before a timed run.
//!
//! Every emulator shares this machine's cores with the run being timed, and a run leaves
//! work behind it: the local stack's scheduler fetching the timers a surge created from
//! moto, the JVM of DynamoDB Local collecting. Measured on 2 cores, a textbook run
//! started right after a gateway surge sold out in 760 to 1,130 ms, and 500 to 730 ms
//! when it ran first: whichever client ran second paid for the other's tail. So each
//! timed run starts once the whole machine is idle, read from `/proc/stat`.

use std::time::{Duration, Instant};

/// When the machine counts as quiet, and how long to wait for it at most.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Quiet {
    /// The busy share of all cores, over one window, below which the machine is quiet.
    pub max_busy: f64,
    pub window: Duration,
    /// The wait gives up after this and the run starts anyway (the report says so).
    pub timeout: Duration,
}

pub const QUIET: Quiet = Quiet {
    // The local stack polls moto for schedules twice a second; that alone stays below.
    max_busy: 0.15,
    window: Duration::from_millis(300),
    timeout: Duration::from_secs(15),
};

/// What one wait found.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Settled {
    pub waited: Duration,
    /// The busy share of the last window.
    pub busy: f64,
    /// Whether the machine was quiet, or the wait timed out.
    pub quiet: bool,
}

impl Settled {
    /// Waits for `quiet`, if any; with none, the run starts at once.
    pub async fn after(quiet: Option<Quiet>) -> Self {
        match quiet {
            Some(quiet) => quiet.settle().await,
            None => Self {
                waited: Duration::ZERO,
                busy: 0.0,
                quiet: false,
            },
        }
    }
}

/// Busy and total jiffies of all cores since boot, from `/proc/stat`'s `cpu` line
/// (busy: everything but `idle` and `iowait`). `None` where there is no such file.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

impl Quiet {
    /// Waits until one window's busy share is below [`Quiet::max_busy`], or the timeout.
    pub async fn settle(&self) -> Settled {
        let started = Instant::now();
        let Some(mut last) = cpu_jiffies() else {
            return Settled {
                waited: Duration::ZERO,
                busy: 0.0,
                quiet: false,
            };
        };
        loop {
            tokio::time::sleep(self.window).await;
            let Some(now) = cpu_jiffies() else {
                break;
            };
            let busy = now.0.saturating_sub(last.0) as f64;
            let total = now.1.saturating_sub(last.1) as f64;
            let share = if total > 0.0 { busy / total } else { 0.0 };
            last = now;
            let quiet = share < self.max_busy;
            if quiet || started.elapsed() >= self.timeout {
                return Settled {
                    waited: started.elapsed(),
                    busy: share,
                    quiet,
                };
            }
        }
        Settled {
            waited: started.elapsed(),
            busy: 0.0,
            quiet: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_reports_busy_below_total() {
        let (busy, total) = cpu_jiffies().expect("/proc/stat");
        assert!(total > 0);
        assert!(busy <= total);
    }
}
