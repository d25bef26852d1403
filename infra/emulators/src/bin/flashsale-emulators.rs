//! `make unit`: one set of emulators for every test process. cargo-nextest runs each test
//! in a process of its own, and each process would otherwise start its own DynamoDB
//! Local (a JVM), moto, localstripe and SQS emulator.
//!
//! Starts them on free ports, writes the variables that make [`Emulators::start`] reuse
//! them (`FLASHSALE_*_ENDPOINT=...`, one per line, for `sh`'s `.`) to the file it is given,
//! and serves until SIGTERM or SIGINT, then stops them. If this process is killed outright,
//! the emulators' guards stop them all the same.
//!
//!   flashsale-emulators <env file>

use std::path::PathBuf;
use std::process::ExitCode;

use flashsale_emulators::{EmulatorOptions, Emulators};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let Some(env_file) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: flashsale-emulators <env file>");
        return ExitCode::from(2);
    };
    let emulators = match Emulators::start(&EmulatorOptions::default()) {
        Ok(emulators) => emulators,
        Err(error) => {
            eprintln!("flashsale-emulators: {error}");
            return ExitCode::FAILURE;
        }
    };
    let variables = format!(
        "FLASHSALE_DYNAMODB_ENDPOINT={}\nFLASHSALE_MOTO_ENDPOINT={}\nFLASHSALE_SQS_ENDPOINT={}\nFLASHSALE_STRIPE_ENDPOINT={}\n",
        emulators.dynamodb_endpoint,
        emulators.moto_endpoint,
        emulators.sqs_endpoint,
        emulators.stripe_endpoint
    );
    // Written whole under another name, then renamed: a reader never sees half of it.
    let partial = env_file.with_extension("partial");
    if let Err(error) =
        std::fs::write(&partial, variables).and_then(|()| std::fs::rename(&partial, &env_file))
    {
        eprintln!("flashsale-emulators: {}: {error}", env_file.display());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "flashsale-emulators: DynamoDB Local {}, moto {}, SQS {}, localstripe {}",
        emulators.dynamodb_endpoint,
        emulators.moto_endpoint,
        emulators.sqs_endpoint,
        emulators.stripe_endpoint
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flashsale-emulators: {error}");
            return ExitCode::FAILURE;
        }
    };
    let stopped = runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        std::io::Result::Ok(())
    });
    drop(emulators);
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flashsale-emulators: waiting for a signal: {error}");
            ExitCode::FAILURE
        }
    }
}
