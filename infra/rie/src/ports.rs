//! Loopback ports for the RIE that no other process on the machine is given.
//!
//! The RIE binds its invoke endpoint as it starts but its Runtime API only at the first
//! invocation, so a port that was merely free when picked can be taken in between: by
//! another RIE of a test running beside this one, or by any process's `bind(0)` or
//! outgoing connection. A [`PortLease`] avoids both. It is a port below the kernel's
//! ephemeral range, which `bind(0)` and `connect` never hand out, with an exclusive lock
//! on a file named after it, which every process using this crate honours and the
//! kernel drops when the process ends.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// Below Linux's default ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999)
/// and above the ports of well-known services.
const LEASED: std::ops::Range<u16> = 20_000..32_768;

/// One port, held for this process until dropped.
#[derive(Debug)]
pub(crate) struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// A port no other lease holds and nothing listens on now. The search starts at an
    /// offset of this process and moment, so concurrent processes rarely probe the same
    /// ports.
    pub(crate) fn take() -> io::Result<Self> {
        let directory = std::env::temp_dir().join("flashsale-rie-ports");
        std::fs::create_dir_all(&directory)?;
        let span = u32::from(LEASED.end - LEASED.start);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let start = (std::process::id().wrapping_mul(7_919) ^ nanos) % span;
        for step in 0..span {
            let offset = u16::try_from((start + step) % span).unwrap_or_default();
            let port = LEASED.start + offset;
            if let Some(lease) = Self::try_port(directory.join(format!("{port}.lock")), port)? {
                return Ok(lease);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("every port in {LEASED:?} is leased or in use"),
        ))
    }

    fn try_port(lock_path: PathBuf, port: u16) -> io::Result<Option<Self>> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(error)) => return Err(error),
        }
        // Something outside the leases (a service, a test's fixed port) may listen there.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            return Ok(None);
        }
        Ok(Some(Self { port, _lock: lock }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leased_port_is_not_leased_again_until_it_is_dropped() {
        let first = PortLease::take().expect("a lease");
        let others: Vec<_> = (0..20)
            .map(|_| PortLease::take().expect("a lease"))
            .collect();
        assert!(others.iter().all(|other| other.port() != first.port()));
        assert!(LEASED.contains(&first.port()));
        let port = first.port();
        drop(first);
        let directory = std::env::temp_dir().join("flashsale-rie-ports");
        let again = PortLease::try_port(directory.join(format!("{port}.lock")), port)
            .expect("no error")
            .expect("free again once dropped");
        assert_eq!(again.port(), port);
    }
}
