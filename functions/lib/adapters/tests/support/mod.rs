//! Test setup shared by the adapter tests: clients on the shared emulators, a fresh
//! table per test mirroring template.yaml's, and sales and reservations to work with.

#![allow(dead_code)] // each test file uses its own part of this module

pub mod conflicts;
pub mod old_items;
pub mod pages;
pub mod stripe;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use chrono::{Duration, Utc};
use flashsale_adapters::DynamoStore;
use flashsale_domain::ports::{OrderBook, ShardTakers};
use flashsale_domain::{
    OrderId, OrderStatus, Price, Reservation, ReservePath, Sale, SaleControl, SaleId, UserId,
};
use flashsale_emulators::proxy::Proxy;

use self::conflicts::{ConflictInjector, Pattern, Target};
use self::old_items::OldItems;
use self::pages::SmallPages;

pub async fn sdk_config() -> aws_config::SdkConfig {
    flashsale_emulators::shared().await.sdk_config().await
}

/// A fault proxy in front of the shared DynamoDB Local, and the SDK configuration that
/// sends DynamoDB's requests through it.
pub async fn proxied() -> (Proxy, aws_config::SdkConfig) {
    let emulators = flashsale_emulators::shared().await;
    let proxy = Proxy::start(&emulators.dynamodb_endpoint, 0)
        .await
        .expect("a proxy starts");
    let sdk = flashsale_emulators::sdk_config_for(flashsale_emulators::LocalEndpoints {
        dynamodb: proxy.url(),
        ..emulators.endpoints()
    })
    .await;
    (proxy, sdk)
}

/// The order's status, if it is held or settled.
pub async fn status_of(store: &DynamoStore, reservation: &Reservation) -> Option<OrderStatus> {
    store
        .find(&reservation.order_id, &reservation.user_id)
        .await
        .expect("find")
        .map(|(order, _)| order.status)
}

pub async fn dynamodb() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config().await)
}

fn key(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .expect("key schema element")
}

fn string_attribute(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("attribute definition")
}

/// An endpoint where nothing listens: a port the OS just handed out and took back.
pub fn closed_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// A new table shaped like template.yaml's `Table` (pk/sk, GSIs `gsi1` and `gsi2` projecting
/// everything, TTL on `ttl`, on-demand), under a name no other test uses.
pub async fn create_table(client: &aws_sdk_dynamodb::Client) -> String {
    let name = format!("adapters-{}", flashsale_emulators::unique_suffix());
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .set_attribute_definitions(Some(
            ["pk", "sk", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk"]
                .into_iter()
                .map(string_attribute)
                .collect(),
        ))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .set_global_secondary_indexes(Some(
            ["gsi1", "gsi2"]
                .into_iter()
                .map(|index| {
                    GlobalSecondaryIndex::builder()
                        .index_name(index)
                        .key_schema(key(&format!("{index}pk"), KeyType::Hash))
                        .key_schema(key(&format!("{index}sk"), KeyType::Range))
                        .projection(
                            Projection::builder()
                                .projection_type(ProjectionType::All)
                                .build(),
                        )
                        .build()
                        .expect("gsi")
                })
                .collect(),
        ))
        .send()
        .await
        .expect("create the table");
    client
        .update_time_to_live()
        .table_name(&name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("ttl")
                .enabled(true)
                .build()
                .expect("ttl specification"),
        )
        .send()
        .await
        .expect("enable ttl");
    name
}

/// A store on a fresh table, plus the raw client and the table name for inspection.
pub async fn store() -> (DynamoStore, aws_sdk_dynamodb::Client, String) {
    let client = dynamodb().await;
    let table = create_table(&client).await;
    (DynamoStore::new(client.clone(), &table), client, table)
}

/// A store on a fresh table whose client counts its reads and, if `withhold` says
/// so, never asks for the old item of a failed condition; and the interceptor.
pub async fn old_items_store(withhold: bool) -> (DynamoStore, OldItems) {
    let old_items = OldItems::new(withhold);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .interceptor(old_items.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let table = create_table(&client).await;
    (DynamoStore::new(client, table), old_items)
}

/// A store on a fresh table whose queries return at most `limit` items a page, and
/// the interceptor that counts the pages.
pub async fn small_pages_store(limit: i32) -> (DynamoStore, SmallPages) {
    let pages = SmallPages::new(limit);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .interceptor(pages.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let table = create_table(&client).await;
    (DynamoStore::new(client, table), pages)
}

/// A DynamoDB client whose `TransactWriteItems` calls conflict as `pattern` says;
/// the injector counts what it did.
pub async fn conflicting_client(pattern: Pattern) -> (aws_sdk_dynamodb::Client, ConflictInjector) {
    injecting_client(Target::Transactions, pattern).await
}

/// A DynamoDB client whose plain `UpdateItem` calls conflict as `pattern` says, as
/// they do on AWS while a transaction holds their item.
pub async fn conflicting_writes_client(
    pattern: Pattern,
) -> (aws_sdk_dynamodb::Client, ConflictInjector) {
    injecting_client(Target::PlainWrites, pattern).await
}

/// A DynamoDB client whose plain `UpdateItem` calls fail as `pattern` says, even when
/// retried: `FromCall(n)` is a process that died after its first `n` writes.
pub async fn failing_writes_client(
    pattern: Pattern,
) -> (aws_sdk_dynamodb::Client, ConflictInjector) {
    injecting_client(Target::FailingPlainWrites, pattern).await
}

/// A DynamoDB client whose plain `UpdateItem` calls apply but lose their answer as
/// `pattern` says: the SDK resends them, as it does after a timeout.
pub async fn lossy_writes_client(pattern: Pattern) -> (aws_sdk_dynamodb::Client, ConflictInjector) {
    injecting_client(Target::LostPlainWrites, pattern).await
}

async fn injecting_client(
    target: Target,
    pattern: Pattern,
) -> (aws_sdk_dynamodb::Client, ConflictInjector) {
    let transport = flashsale_adapters::https_client();
    let injector = ConflictInjector::new(transport, target, pattern);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .http_client(injector.clone())
        .build();
    (aws_sdk_dynamodb::Client::from_conf(config), injector)
}

/// A new FIFO queue shaped like template.yaml's `OrdersQueue` (explicit dedup ids,
/// no content-based deduplication); returns its URL.
pub async fn create_fifo_queue(client: &aws_sdk_sqs::Client) -> String {
    use aws_sdk_sqs::types::QueueAttributeName;
    client
        .create_queue()
        .queue_name(format!(
            "orders-{}.fifo",
            flashsale_emulators::unique_suffix()
        ))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "false")
        .send()
        .await
        .expect("create the queue")
        .queue_url
        .expect("a queue url")
}

/// An active sale: started a minute ago, ends in an hour.
pub fn sale(stock: u32, shards: u16, per_user_limit: u32) -> Sale {
    let now = Utc::now();
    Sale {
        sale_id: SaleId::generate(),
        name: "Test sale".to_owned(),
        price: Some(Price::new(2_500, "EUR").expect("a valid price")),
        stock_total: stock,
        starts_at: now - Duration::minutes(1),
        ends_at: now + Duration::hours(1),
        per_user_limit,
        payment_timeout_secs: 900,
        shards,
        challenge_work: None,
        reserve: ReservePath::Adaptive,
        control: SaleControl::Open,
    }
}

pub fn user(name: &str) -> UserId {
    UserId::parse(name).expect("a valid user id")
}

/// Whether a shard's takers are exactly these reservations' orders. Their times are
/// not compared: a take records when it was written, which a test knows only to within
/// its own calls.
pub fn names_exactly(takers: &ShardTakers, reservations: &[&Reservation]) -> bool {
    takers.len() == reservations.len()
        && reservations
            .iter()
            .all(|held| takers.include(&held.order_id))
}

/// A reservation as the grab makes it: payable until the sale's payment deadline.
pub fn reservation(sale: &Sale, user: &UserId, shard: u16) -> Reservation {
    let now = Utc::now();
    Reservation {
        order_id: OrderId::new(sale.sale_id.clone()),
        sale_id: sale.sale_id.clone(),
        user_id: user.clone(),
        shard,
        created_at: now,
        expires_at: sale.payment_deadline(now),
        price: sale.price,
    }
}
