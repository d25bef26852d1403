use std::time::Duration;

use flashsale_emulators::{EmulatorOptions, Emulators};

fn group_alive(pgid: u32) -> bool {
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(pgid).expect("pid fits"));
    nix::sys::signal::killpg(pgid, None).is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn started_emulators_serve_their_apis_and_leave_nothing_behind_when_dropped() {
    let emulators = tokio::task::spawn_blocking(|| {
        // Ignore any shared pair from the environment: this test is about starting one.
        Emulators::start(&EmulatorOptions::default())
    })
    .await
    .expect("start task")
    .expect("emulators start");
    let groups = if emulators.owns_processes() {
        emulators.process_groups()
    } else {
        Vec::new()
    };

    let config = emulators.sdk_config().await;
    let tables = aws_sdk_dynamodb::Client::new(&config)
        .list_tables()
        .send()
        .await
        .expect("DynamoDB Local answers ListTables");
    if emulators.owns_processes() {
        assert!(
            tables.table_names().is_empty(),
            "a fresh in-memory DynamoDB Local has no tables"
        );
    }
    aws_sdk_sqs::Client::new(&config)
        .list_queues()
        .send()
        .await
        .expect("the SQS emulator answers ListQueues");
    let sqs_address = emulators
        .sqs_endpoint
        .trim_start_matches("http://")
        .to_owned();
    let sqs_started_here = std::env::var_os("FLASHSALE_SQS_ENDPOINT").is_none();

    drop(emulators);
    if sqs_started_here {
        assert!(
            std::net::TcpStream::connect(&sqs_address).is_err(),
            "the SQS emulator stops with its Emulators"
        );
    }
    for pgid in groups {
        let mut alive = group_alive(pgid);
        for _ in 0..50 {
            if !alive {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            alive = group_alive(pgid);
        }
        assert!(!alive, "process group {pgid} outlived its Emulators");
    }
}
