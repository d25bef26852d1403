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
    /// The busy share of all cores (steal included: a neighbour's load slows the run
    /// just the same), over one window, below which the machine is quiet.
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

/// How a timed run started.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Settled {
    /// At once: no wait was asked for.
    NotWaited,
    /// Once one window's busy share was below [`Quiet::max_busy`].
    Quiet { waited: Duration, busy: f64 },
    /// After [`Quiet::timeout`], the last window still this busy.
    TimedOut { waited: Duration, busy: f64 },
    /// At once: `/proc/stat` could not be read.
    Unreadable,
}

impl Settled {
    /// Waits for `quiet`, if any; with none, the run starts at once.
    pub async fn after(quiet: Option<Quiet>) -> Self {
        match quiet {
            Some(quiet) => quiet.settle().await,
            None => Self::NotWaited,
        }
    }

    /// For the report: "7 % after 0.3 s", and what else happened.
    pub fn describe(&self) -> String {
        match self {
            Self::NotWaited => "not waited for".to_owned(),
            Self::Quiet { waited, busy } => {
                format!("{:.0} % after {:.1} s", busy * 100.0, waited.as_secs_f64())
            }
            Self::TimedOut { waited, busy } => format!(
                "still {:.0} % after {:.1} s (timed out)",
                busy * 100.0,
                waited.as_secs_f64()
            ),
            Self::Unreadable => "/proc/stat unreadable".to_owned(),
        }
    }
}

/// Busy and total jiffies of all cores since boot, from `/proc/stat`'s `cpu` line: its
/// first eight fields (user, nice, system, idle, iowait, irq, softirq, steal; guest
/// time is already counted in user and nice), busy being all but idle and iowait.
/// `None` where there is no such file.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied()? + fields.get(4).copied()?;
    Some((total.saturating_sub(idle), total))
}

impl Quiet {
    /// Waits until one window's busy share is below [`Quiet::max_busy`], or the timeout.
    pub async fn settle(&self) -> Settled {
        let started = Instant::now();
        let Some(mut last) = cpu_jiffies() else {
            return Settled::Unreadable;
        };
        loop {
            tokio::time::sleep(self.window).await;
            let Some(now) = cpu_jiffies() else {
                return Settled::Unreadable;
            };
            let busy = now.0.saturating_sub(last.0) as f64;
            let total = now.1.saturating_sub(last.1) as f64;
            let share = if total > 0.0 { busy / total } else { 0.0 };
            last = now;
            let waited = started.elapsed();
            if share < self.max_busy {
                return Settled::Quiet {
                    waited,
                    busy: share,
                };
            }
            if waited >= self.timeout {
                return Settled::TimedOut {
                    waited,
                    busy: share,
                };
            }
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
