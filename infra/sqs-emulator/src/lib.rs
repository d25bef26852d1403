//! An SQS emulator the project owns, for the local stack and the tests.
//!
//! It speaks the protocol aws-sdk-sqs sends (AWS JSON 1.0: `POST /`,
//! `X-Amz-Target: AmazonSQS.<Operation>`, errors as `__type` plus the
//! `x-amzn-query-error` code the SDK matches its typed errors on) and keeps AWS's
//! semantics, the unpleasant ones included: FIFO order per message group with a group
//! held while one of its messages is in flight, deduplication for five minutes
//! (explicit or content-based), visibility timeouts with a new receipt handle per
//! receive, long polling that returns as soon as a message arrives, and the redrive
//! policy (a message received `maxReceiveCount` times moves to the dead-letter queue on
//! the next receive).
//!
//! It replaces moto's SQS, whose cost per `SendMessage` grows with the number of
//! messages waiting in a FIFO queue (29/s at 500 waiting, 5/s at 1,500): here every
//! operation costs the same whatever the depth.

mod attributes;
mod error;
mod queue;
mod service;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

pub use error::SqsError;
pub use service::Sqs;

/// The account every queue URL and ARN carries.
pub const ACCOUNT_ID: &str = "123456789012";
/// The region of every ARN.
pub const REGION: &str = "us-east-1";

/// An emulator serving on a loopback port from a thread and runtime of its own, so it
/// outlives any one test's runtime; dropping it stops it.
#[derive(Debug)]
pub struct SqsEmulator {
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SqsEmulator {
    /// Listens on `127.0.0.1:port` (0: a free port) and serves until dropped. The port
    /// is bound before this returns, so the endpoint accepts connections at once.
    pub fn start(port: u16) -> io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
        listener.set_nonblocking(true)?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let sqs = Arc::new(Sqs::new(&endpoint));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sqs-emulator".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            tracing::error!(%error, "the SQS emulator cannot listen");
                            return;
                        }
                    };
                    tokio::select! {
                        served = axum::serve(listener, service::router(sqs)) => {
                            if let Err(error) = served {
                                tracing::error!(%error, "the SQS emulator stopped");
                            }
                        }
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime cancels the connections still open (long polls).
            })?;
        Ok(Self {
            endpoint,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:{port}`, the endpoint and the prefix of every queue URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for SqsEmulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
