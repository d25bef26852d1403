//! template.yaml <-> code: what the template deploys is what the code needs, no less
//! (it would fail in AWS) and no more (least privilege, no dead config).
//!
//! The template is judged after AWS's own SAM transform (see `sam_expand.py`); the code
//! is judged from its source: the use cases each function runs (declared below, and
//! checked to appear in the function's crate), the ports those use cases call (read from
//! the domain), and the AWS SDK operations the adapters' implementations of those ports
//! reach (read from the adapters, through their helpers).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use flashsale_lambda::FromEnv as _;
use flashsale_template_checks::iam::{self, Effect, Statement};
use flashsale_template_checks::rust_source::{self, Code};
use flashsale_template_checks::stack::{self, Stack};
use flashsale_template_checks::workspace;
use serde_json::{Value, json};

/// A deployed function and what its code is: the crate, the env vars its `Config`
/// reads, and the use cases (domain service methods) its handler runs.
struct Function {
    logical_id: &'static str,
    package: &'static str,
    env_vars: Vec<&'static str>,
    use_cases: &'static [(&'static str, &'static str)],
}

fn functions() -> [Function; 5] {
    [
        Function {
            logical_id: "GrabFunction",
            package: "flashsale-grab",
            env_vars: flashsale_grab::Config::env_vars(),
            use_cases: &[("GrabService", "issue_pass"), ("GrabService", "grab")],
        },
        Function {
            logical_id: "ApiFunction",
            package: "flashsale-api",
            env_vars: flashsale_api::Config::env_vars(),
            use_cases: &[
                ("SaleService", "create"),
                ("SaleService", "list"),
                ("SaleService", "view"),
                ("SaleService", "stats"),
                ("OrderService", "get"),
                ("OrderService", "cancel"),
                ("PaymentService", "open"),
                ("PaymentService", "settle"),
                ("PaymentWebhook", "handle"),
                ("BlocklistService", "block_user"),
                ("BlocklistService", "unblock_user"),
                ("BlocklistService", "blocked_users"),
            ],
        },
        Function {
            logical_id: "OrderConsumerFunction",
            package: "flashsale-order-consumer",
            env_vars: flashsale_order_consumer::Config::env_vars(),
            use_cases: &[("OrderService", "receive")],
        },
        Function {
            logical_id: "ReleaseFunction",
            package: "flashsale-release",
            env_vars: flashsale_release::Config::env_vars(),
            use_cases: &[("ExpiryService", "expire")],
        },
        Function {
            logical_id: "ReconcilerFunction",
            package: "flashsale-reconciler",
            env_vars: flashsale_reconciler::Config::env_vars(),
            // stats: the stock gauges after each pass.
            use_cases: &[("Reconciler", "run"), ("SaleService", "stats")],
        },
    ]
}

/// The fields through which the domain's services hold their ports.
const PORT_FIELDS: [&str; 9] = [
    "catalog",
    "ledger",
    "orders",
    "queue",
    "scheduler",
    "inner",
    "blocklist",
    "provider",
    "payments",
];

/// Of [`PORT_FIELDS`], those that may hold a service of the domain instead of a port:
/// the reconciler's `payments` is the payment service (whose own `payments` is a port),
/// so a call on it that names a function of the domain's services is followed there.
const SERVICE_OR_PORT_FIELDS: [&str; 1] = ["payments"];

/// The fields through which the domain's services hold a domain cache in front of a
/// port: calls on them are followed into the cache's own methods in the domain.
const CACHE_FIELDS: [&str; 1] = ["blocked_users"];

/// Env vars every function gets for the platform, not for its `Config`: the log filter,
/// and the endpoint the SDK itself reads, set only under `sam local`.
const PLATFORM_ENV_VARS: [&str; 2] = ["RUST_LOG", "AWS_ENDPOINT_URL"];

fn stack() -> &'static Stack {
    stack::workspace_stack()
}

fn root_path(relative: &str) -> PathBuf {
    workspace::root().join(relative)
}

fn env_of(logical_id: &str) -> BTreeMap<String, Value> {
    stack().expanded_resource(logical_id)["Properties"]["Environment"]["Variables"]
        .as_object()
        .map(|vars| vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

fn package_of(name: &str) -> workspace::Package {
    workspace::packages()
        .expect("cargo metadata")
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("{name} is not a workspace package"))
}

fn code_of(paths: &[&str]) -> Code {
    let paths: Vec<PathBuf> = paths.iter().map(|p| root_path(p)).collect();
    Code::read(&paths).expect("readable sources")
}

// ------------------------------------------------------------------ functions and bins

#[test]
fn every_template_function_is_built_by_cargo_lambda_from_its_crates_bin() {
    let stack = stack();
    let deployed: BTreeSet<String> = stack
        .raw_resources_of("AWS::Serverless::Function")
        .into_iter()
        .collect();
    let declared: BTreeSet<String> = functions()
        .iter()
        .map(|f| f.logical_id.to_owned())
        .collect();
    assert_eq!(
        deployed, declared,
        "the template's functions are the ones this test knows"
    );

    for f in functions() {
        let raw = stack.raw_resource(f.logical_id);
        assert_eq!(
            raw["Metadata"]["BuildMethod"], "rust-cargolambda",
            "{}",
            f.logical_id
        );
        let code_uri = raw["Properties"]["CodeUri"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: CodeUri is a local path", f.logical_id));
        let package = package_of(f.package);
        assert_eq!(
            workspace::canonical(&root_path(code_uri)).expect("CodeUri exists"),
            package.dir,
            "{}: CodeUri points at {}",
            f.logical_id,
            f.package
        );
        let binary = raw["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: BuildProperties.Binary names the bin", f.logical_id));
        let (_, src) = package
            .bins
            .iter()
            .find(|(name, _)| name == binary)
            .unwrap_or_else(|| panic!("{}: {} has no [[bin]] {binary}", f.logical_id, f.package));
        assert!(
            src.ends_with("src/main.rs"),
            "{binary} is the crate's main.rs"
        );

        let deployed = &stack.expanded_resource(f.logical_id)["Properties"];
        assert_eq!(deployed["Handler"], "bootstrap", "{}", f.logical_id);
        assert_eq!(deployed["Runtime"], "provided.al2023", "{}", f.logical_id);
        assert_eq!(
            deployed["Architectures"],
            json!(["arm64"]),
            "{}",
            f.logical_id
        );
    }
}

#[test]
fn every_function_crate_with_a_binary_is_deployed_by_the_template() {
    let functions_dir = workspace::canonical(&root_path("functions")).expect("functions/");
    let code_uris: BTreeSet<PathBuf> = stack()
        .raw_resources_of("AWS::Serverless::Function")
        .iter()
        .filter_map(|id| {
            stack().raw_resource(id)["Properties"]["CodeUri"]
                .as_str()
                .map(root_path)
        })
        .map(|path| workspace::canonical(&path).expect("CodeUri exists"))
        .collect();
    for package in workspace::packages().expect("cargo metadata") {
        if package.dir.starts_with(&functions_dir) && !package.bins.is_empty() {
            assert!(
                code_uris.contains(&package.dir),
                "{} builds a binary but no template function deploys it",
                package.name
            );
        }
    }
}

// ------------------------------------------------------------------ environment

#[test]
fn every_env_var_a_function_reads_is_set_for_it_in_the_template() {
    for f in functions() {
        let env = env_of(f.logical_id);
        for var in &f.env_vars {
            assert!(
                env.contains_key(*var),
                "{} reads {var} but the template (Globals + function) does not set it; it sets {:?}",
                f.logical_id,
                env.keys().collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn the_template_sets_no_env_var_that_the_function_does_not_read() {
    for f in functions() {
        for var in env_of(f.logical_id).keys() {
            assert!(
                f.env_vars.contains(&var.as_str()) || PLATFORM_ENV_VARS.contains(&var.as_str()),
                "{} is given {var}, which its Config never reads",
                f.logical_id
            );
        }
    }
}

#[test]
fn env_vars_carry_the_resources_and_parameters_their_names_promise() {
    let expected: BTreeMap<&str, Value> = [
        ("TABLE_NAME", json!({"Ref": "Table"})),
        ("ORDERS_QUEUE_URL", json!({"Ref": "OrdersQueue"})),
        ("ORDERS_DLQ_URL", json!({"Ref": "OrdersDLQ"})),
        (
            "SCHEDULE_GROUP_NAME",
            json!({"Ref": "ReleaseScheduleGroup"}),
        ),
        (
            "RELEASE_FUNCTION_ARN",
            json!({"Ref": "ReleaseFunctionAliaslive"}),
        ),
        (
            "SCHEDULER_ROLE_ARN",
            json!({"Fn::GetAtt": ["SchedulerRole", "Arn"]}),
        ),
        (
            "RELEASE_SCHEDULE_DLQ_ARN",
            json!({"Fn::GetAtt": ["ReleaseSchedulesDLQ", "Arn"]}),
        ),
        ("GRAB_TOKEN_SECRET_ARN", json!({"Ref": "GrabTokenSecret"})),
        ("ADMIN_CLAIM", json!({"Ref": "AdminClaim"})),
        ("ADMIN_GROUP", json!({"Ref": "AdminGroup"})),
        ("BREAKER_FAILURES", json!({"Ref": "BreakerFailures"})),
        ("BREAKER_WINDOW_MS", json!({"Ref": "BreakerWindowMs"})),
        ("BREAKER_COOL_OFF_MS", json!({"Ref": "BreakerCoolOffMs"})),
        // Deployed with the parameter's empty default, no function has an endpoint.
        (
            "AWS_ENDPOINT_URL",
            json!({"Fn::If": ["UsesLocalAwsEndpoint", {"Ref": "LocalAwsEndpoint"}, {"Ref": "AWS::NoValue"}]}),
        ),
    ]
    .into();
    for f in functions() {
        for (var, value) in env_of(f.logical_id) {
            if let Some(want) = expected.get(var.as_str()) {
                assert_eq!(&value, want, "{}: {var}", f.logical_id);
            }
        }
    }
}

// ------------------------------------------------------------------ the grab-token secret

#[test]
fn the_grab_token_key_is_a_generated_secret_no_deployer_supplies() {
    let parameters = stack().raw["Parameters"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (name, parameter) in &parameters {
        assert!(
            !name.to_lowercase().contains("secret") && parameter["NoEcho"] != json!(true),
            "parameter {name} asks the deployer for a secret; the stack generates it"
        );
    }
    let secret = stack().expanded_resource("GrabTokenSecret");
    assert_eq!(secret["Type"], "AWS::SecretsManager::Secret");
    let generate = &secret["Properties"]["GenerateSecretString"];
    let length = generate["PasswordLength"].as_u64().unwrap_or(32);
    // Letters and digits alone carry log2(62) ~ 5.95 bits a character.
    assert!(
        length as f64 * 62f64.log2() >= 256.0 && length >= 32,
        "{length} characters carry less than 32 bytes of entropy"
    );
    assert!(
        secret["Properties"].get("SecretString").is_none(),
        "the value is generated, never written into the template"
    );
    for policy in ["UpdateReplacePolicy", "DeletionPolicy"] {
        assert!(
            secret.get(policy).is_some(),
            "GrabTokenSecret: {policy} is chosen on purpose, not left to the default"
        );
    }
}

/// Each secret a function may read: the env var that names it, and the stack's secret.
const SECRETS: [(&str, &str); 2] = [
    ("GRAB_TOKEN_SECRET_ARN", "GrabTokenSecret"),
    ("STRIPE_SECRET_ARN", "StripeKeysSecret"),
];

#[test]
fn only_the_functions_that_read_a_secret_may_read_it_and_only_that_one() {
    for f in functions() {
        let (_, own, generated, _) = role_of(f.logical_id);
        let readers: Vec<&Statement> = own
            .iter()
            .chain(&generated)
            .filter(|s| s.actions.iter().any(|a| a.starts_with("secretsmanager:")))
            .collect();
        let (vars, secrets): (Vec<&str>, BTreeSet<String>) = SECRETS
            .iter()
            .filter(|(var, _)| f.env_vars.contains(var))
            .map(|(var, secret)| (*var, (*secret).to_owned()))
            .unzip();
        if vars.is_empty() {
            assert!(
                readers.is_empty(),
                "{} may read secrets it never asks for",
                f.logical_id
            );
            continue;
        }
        let [statement] = readers.as_slice() else {
            panic!(
                "{}: one statement reads its secrets: {readers:?}",
                f.logical_id
            );
        };
        assert_eq!(statement.effect, Effect::Allow);
        assert_eq!(statement.actions, ["secretsmanager:GetSecretValue"]);
        let named: BTreeSet<String> = statement
            .resources
            .iter()
            .flat_map(stack::references)
            .collect();
        assert_eq!(
            named, secrets,
            "{}: exactly the secrets its environment may name",
            f.logical_id
        );
        assert_eq!(
            referenced_by_env(f.logical_id, &vars),
            named,
            "{}: the secret it may read is the one its environment names",
            f.logical_id
        );
    }
}

// ------------------------------------------------------------------ IAM from the code

/// IAM actions an SDK operation needs. TransactWriteItems is not an IAM action: each
/// item is authorised as its own Put/Update/Delete/ConditionCheck, so it contributes
/// nothing by itself (see `transaction_item_actions`). CreateSchedule with a target role
/// also needs iam:PassRole of that role.
fn iam_actions_of(service: &str, operation: &str) -> BTreeSet<String> {
    let api = workspace::api_name(operation);
    match (service, operation) {
        ("dynamodb", "transact_write_items") => BTreeSet::new(),
        ("dynamodb", "transact_get_items") => ["dynamodb:GetItem".to_owned()].into(),
        ("scheduler", "create_schedule") => [
            "scheduler:CreateSchedule".to_owned(),
            "iam:PassRole".to_owned(),
        ]
        .into(),
        _ => [format!("{service}:{api}")].into(),
    }
}

/// The IAM actions of the items `TransactWriteItem::builder().<kind>(..)` in `code`'s
/// functions `reached`.
fn transaction_item_actions(code: &Code, reached: &BTreeSet<String>) -> BTreeSet<String> {
    [
        ("put", "dynamodb:PutItem"),
        ("update", "dynamodb:UpdateItem"),
        ("delete", "dynamodb:DeleteItem"),
        ("condition_check", "dynamodb:ConditionCheckItem"),
    ]
    .into_iter()
    .filter(|(kind, _)| code.mentions(reached, &format!("TransactWriteItem::builder().{kind}(")))
    .map(|(_, action)| action.to_owned())
    .collect()
}

struct Sdk {
    /// (IAM service prefix, every operation of its SDK crate)
    services: Vec<(&'static str, BTreeSet<String>)>,
}

fn sdk() -> &'static Sdk {
    static SDK: OnceLock<Sdk> = OnceLock::new();
    SDK.get_or_init(|| Sdk {
        services: [
            ("dynamodb", "aws-sdk-dynamodb"),
            ("sqs", "aws-sdk-sqs"),
            ("scheduler", "aws-sdk-scheduler"),
            ("secretsmanager", "aws-sdk-secretsmanager"),
        ]
        .into_iter()
        .map(|(prefix, krate)| {
            (
                prefix,
                workspace::sdk_operations(krate)
                    .unwrap_or_else(|e| panic!("{krate} operations: {e}")),
            )
        })
        .collect(),
    })
}

/// (service prefix, operation) for every SDK call in `reached` functions of `code`.
fn sdk_calls(code: &Code, reached: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    sdk()
        .services
        .iter()
        .flat_map(|(prefix, operations)| {
            code.operations_in(reached, operations)
                .into_iter()
                .map(|op| ((*prefix).to_owned(), op))
        })
        .collect()
}

fn actions_of_calls(calls: &BTreeSet<(String, String)>) -> BTreeSet<String> {
    calls
        .iter()
        .flat_map(|(service, op)| iam_actions_of(service, op))
        .collect()
}

/// The port methods a function's use cases call, read from the domain's services.
fn port_methods_of(f: &Function) -> BTreeSet<String> {
    let domain = code_of(&[
        "functions/lib/domain/src/service",
        "functions/lib/domain/src/grab.rs",
    ]);
    let mut ports = BTreeSet::new();
    let mut roots: Vec<String> = Vec::new();
    for (service, method) in f.use_cases {
        assert!(
            domain.functions.contains_key(*method),
            "{service}::{method} is not a function of the domain's services"
        );
        roots.push((*method).to_owned());
    }
    let mut followed = BTreeSet::new();
    while let Some(root) = roots.pop() {
        if !followed.insert(root.clone()) {
            continue;
        }
        for name in domain.reachable(&root) {
            for body in domain.functions.get(&name).into_iter().flatten() {
                for field in PORT_FIELDS {
                    for method in rust_source::field_calls(&body.body, field) {
                        if SERVICE_OR_PORT_FIELDS.contains(&field)
                            && domain.functions.contains_key(&method)
                        {
                            roots.push(method);
                        } else {
                            ports.insert(method);
                        }
                    }
                }
                for field in CACHE_FIELDS {
                    for method in rust_source::field_calls(&body.body, field) {
                        assert!(
                            domain.functions.contains_key(&method),
                            "the cache's {method} is not a function of the domain's services"
                        );
                        roots.push(method);
                    }
                }
            }
        }
    }
    ports
}

/// Every IAM action `f`'s code path reaches: its use cases' ports as the adapters
/// implement them, plus any SDK call made directly in the function's own crate.
fn actions_reached_by(f: &Function) -> BTreeSet<String> {
    let adapters = code_of(&["functions/lib/adapters/src"]);
    let mut actions = BTreeSet::new();
    for port_method in port_methods_of(f) {
        assert!(
            adapters.functions.contains_key(&port_method),
            "the adapters implement no {port_method} (a port method {} reaches)",
            f.logical_id
        );
        let reached = adapters.reachable(&port_method);
        actions.extend(actions_of_calls(&sdk_calls(&adapters, &reached)));
        actions.extend(transaction_item_actions(&adapters, &reached));
    }
    let own = code_of(&[&format!("{}/src", package_dir_relative(f.package))]);
    let all: BTreeSet<String> = own.functions.keys().cloned().collect();
    actions.extend(actions_of_calls(&sdk_calls(&own, &all)));
    // The cold start's shared secret reader, used directly or to read the Stripe keys:
    // a function that uses it makes its calls.
    if ["SecretsManagerSecret::new(", "stripe_keys::read_if_on("]
        .iter()
        .any(|use_of_it| own.mentions_anywhere(use_of_it))
    {
        let reader = code_of(&["functions/lib/lambda/src/secret.rs"]);
        let all: BTreeSet<String> = reader.functions.keys().cloned().collect();
        actions.extend(actions_of_calls(&sdk_calls(&reader, &all)));
    }
    actions
}

fn package_dir_relative(package: &str) -> String {
    let dir = package_of(package).dir;
    let root = workspace::canonical(&workspace::root()).expect("workspace root");
    dir.strip_prefix(&root)
        .expect("a package inside the workspace")
        .display()
        .to_string()
}

/// The role a function runs as, and the policies SAM generated into it from the
/// function's own `Policies` (named `<Function>RolePolicy<N>`), split from the rest.
fn role_of(logical_id: &str) -> (String, Vec<Statement>, Vec<Statement>, Vec<String>) {
    let role_ref = &stack().expanded_resource(logical_id)["Properties"]["Role"]["Fn::GetAtt"][0];
    let role_id = role_ref
        .as_str()
        .unwrap_or_else(|| panic!("{logical_id}: Role is a GetAtt of a role in the stack"))
        .to_owned();
    let policies = iam::role_policies(&role_id, stack().expanded_resource(&role_id))
        .unwrap_or_else(|e| panic!("{role_id}: {e}"));
    let own_prefix = format!("{logical_id}RolePolicy");
    let (own, generated): (Vec<Statement>, Vec<Statement>) = policies
        .statements
        .into_iter()
        .partition(|s| s.policy.starts_with(&own_prefix));
    (role_id, own, generated, policies.managed_policy_arns)
}

/// How the adapters' code performs a DynamoDB action: the SDK's own call, or an item of
/// a transaction.
fn item_action_spellings(action: &str) -> Option<&'static [&'static str]> {
    match action {
        "dynamodb:DeleteItem" => Some(&[".delete_item()", "TransactWriteItem::builder().delete("]),
        "dynamodb:PutItem" => Some(&[".put_item()", "TransactWriteItem::builder().put("]),
        "dynamodb:UpdateItem" => Some(&[".update_item()", "TransactWriteItem::builder().update("]),
        "dynamodb:Query" => Some(&[".query()"]),
        _ => None,
    }
}

/// A statement confined by `dynamodb:LeadingKeys` allows its actions only on items of
/// those partitions, which matching action names cannot see: a sale's creation once
/// deleted its claim item under a role that deletes only in the blocklist's partition,
/// and AWS would have refused it. So an action a role allows only under that condition
/// is reached only from the adapter module of that partition.
#[test]
fn actions_confined_to_a_partition_are_reached_only_from_its_adapter() {
    let adapters = code_of(&["functions/lib/adapters/src"]);
    let partition_module = |keys: &Value| -> String {
        match keys.as_array().map(Vec::as_slice) {
            Some([Value::String(key)]) if key == "BLOCKLIST" => "dynamo/blocklist.rs".to_owned(),
            Some([Value::String(key)]) if key == "MONEY" => "dynamo/payments.rs".to_owned(),
            _ => panic!("a LeadingKeys condition this test does not map to a module: {keys}"),
        }
    };
    let mut confined_seen = 0;
    for f in functions() {
        let (_, own, _, _) = role_of(f.logical_id);
        let reached: BTreeSet<String> = port_methods_of(&f)
            .iter()
            .flat_map(|method| adapters.reachable(method))
            .collect();
        for action in actions_reached_by(&f) {
            let leading_keys: Vec<&Value> = own
                .iter()
                .filter(|s| {
                    s.effect == Effect::Allow
                        && s.actions.iter().any(|p| iam::action_matches(p, &action))
                })
                .map(|s| {
                    &s.condition.as_ref().unwrap_or(&Value::Null)["ForAllValues:StringEquals"]
                        ["dynamodb:LeadingKeys"]
                })
                .collect();
            if leading_keys.is_empty() || leading_keys.iter().any(|keys| keys.is_null()) {
                continue; // not allowed at all (the test above says so), or not confined
            }
            confined_seen += 1;
            let spellings = item_action_spellings(&action)
                .unwrap_or_else(|| panic!("{}: {action} is confined to a partition; teach this test how the code spells it", f.logical_id));
            let modules: BTreeSet<String> =
                leading_keys.into_iter().map(partition_module).collect();
            for spelling in spellings {
                for file in adapters.files_mentioning(&reached, spelling) {
                    assert!(
                        modules.iter().any(|module| file.ends_with(module)),
                        "{}: {} performs {action} (`{spelling}`), but its role allows {action} only within the partitions of {modules:?}",
                        f.logical_id,
                        file.display()
                    );
                }
            }
        }
    }
    assert!(
        confined_seen > 0,
        "no confined action was checked: the test no longer sees the blocklist's statement"
    );
}

#[test]
fn each_function_may_call_exactly_the_aws_actions_its_code_reaches() {
    for f in functions() {
        let needed = actions_reached_by(&f);
        let (_, own, _, _) = role_of(f.logical_id);
        let allowed: Vec<&String> = own
            .iter()
            .filter(|s| s.effect == Effect::Allow)
            .flat_map(|s| &s.actions)
            .collect();
        for action in &needed {
            assert!(
                allowed
                    .iter()
                    .any(|pattern| iam::action_matches(pattern, action)),
                "{}: its code calls {action}, which its policies do not allow (allowed: {allowed:?})",
                f.logical_id
            );
        }
        for pattern in &allowed {
            assert!(
                needed
                    .iter()
                    .any(|action| iam::action_matches(pattern, action)),
                "{}: its policies allow {pattern}, which its code never calls (needed: {needed:?})",
                f.logical_id
            );
        }
    }
}

#[test]
fn each_function_runs_the_use_cases_it_is_checked_for() {
    for f in functions() {
        let own = code_of(&[&format!("{}/src", package_dir_relative(f.package))]);
        for (service, method) in f.use_cases {
            assert!(
                own.mentions_anywhere(&format!(".{method}(")),
                "{} is checked for {service}::{method} but its crate never calls .{method}(",
                f.logical_id
            );
        }
    }
}

#[test]
fn every_aws_operation_in_the_adapters_is_reached_by_some_function() {
    let adapters = code_of(&["functions/lib/adapters/src"]);
    let everything: BTreeSet<String> = adapters.functions.keys().cloned().collect();
    let in_source = actions_of_calls(&sdk_calls(&adapters, &everything))
        .union(&transaction_item_actions(&adapters, &everything))
        .cloned()
        .collect::<BTreeSet<_>>();
    let reached: BTreeSet<String> = functions().iter().flat_map(actions_reached_by).collect();
    let unreached: Vec<&String> = in_source.difference(&reached).collect();
    assert!(
        unreached.is_empty(),
        "the adapters call {unreached:?}, which no function's declared use cases reach: \
         declare the use case here (and its permission in the template) or drop the call"
    );
    assert!(
        reached.contains("dynamodb:UpdateItem") && reached.contains("sqs:SendMessage"),
        "the source reading found the grab path's calls: {reached:?}"
    );
}

/// The stack resources a function's env var values name.
fn referenced_by_env(logical_id: &str, vars: &[&str]) -> BTreeSet<String> {
    let env = env_of(logical_id);
    vars.iter()
        .filter_map(|var| env.get(*var))
        .flat_map(stack::references)
        .collect()
}

#[test]
fn each_permission_names_only_the_resources_the_function_is_configured_with() {
    for f in functions() {
        let (_, own, _, _) = role_of(f.logical_id);
        for statement in own.iter().filter(|s| s.effect == Effect::Allow) {
            let what = format!(
                "{} {:?} {:?}",
                f.logical_id, statement.sid, statement.actions
            );
            assert!(
                statement.not_resources.is_empty(),
                "{what}: Allow with NotResource"
            );
            assert!(
                !statement.resources.iter().any(|r| r == "*"),
                "{what}: Resource \"*\""
            );
            let services: BTreeSet<&str> = statement
                .actions
                .iter()
                .filter_map(|a| a.split(':').next())
                .collect();
            assert_eq!(services.len(), 1, "{what}: one service per statement");
            let expected = match services.first().copied() {
                Some("dynamodb") => referenced_by_env(f.logical_id, &["TABLE_NAME"]),
                Some("sqs") => {
                    referenced_by_env(f.logical_id, &["ORDERS_QUEUE_URL", "ORDERS_DLQ_URL"])
                }
                Some("scheduler") => referenced_by_env(f.logical_id, &["SCHEDULE_GROUP_NAME"]),
                Some("secretsmanager") => {
                    referenced_by_env(f.logical_id, &SECRETS.map(|(var, _)| var))
                }
                Some("iam") => {
                    assert_eq!(
                        statement.condition,
                        Some(
                            json!({"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}})
                        ),
                        "{what}: the role is passed to EventBridge Scheduler only"
                    );
                    referenced_by_env(f.logical_id, &["SCHEDULER_ROLE_ARN"])
                }
                other => panic!("{what}: unexpected service {other:?}"),
            };
            let named: BTreeSet<String> = statement
                .resources
                .iter()
                .flat_map(stack::references)
                .collect();
            assert!(
                !expected.is_empty(),
                "{what}: the function has no env var for this service"
            );
            assert_eq!(named, expected, "{what}: resources");
            if statement.actions.iter().any(|a| a == "dynamodb:Query") {
                let on_the_index = statement.resources.iter().all(|r| {
                    ["/index/gsi1", "/index/gsi2"]
                        .iter()
                        .any(|index| r.to_string().contains(index))
                });
                assert!(
                    on_the_index
                        || confined_to_the_blocklist(statement)
                        || confined_to_followed_money(statement)
                        || confined_to_audit_trails(statement),
                    "{what}: queries only the gsi1 and gsi2 indexes, or the base table's \
                     blocklist, followed-money or audit-trail partitions"
                );
            }
            if statement.actions.iter().any(|a| a == "dynamodb:DeleteItem") {
                assert!(
                    confined_to_the_blocklist(statement) || confined_to_followed_money(statement),
                    "{what}: deletes only blocklist and followed-money items; everything else \
                     ends by TTL or stays"
                );
            }
        }
    }
}

/// Whether the statement's `dynamodb:LeadingKeys` condition confines it to the
/// blocklist's one partition (`pk = BLOCKLIST`), the only base-table partition a
/// function may query or delete from.
fn confined_to_the_blocklist(statement: &Statement) -> bool {
    statement.condition
        == Some(json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["BLOCKLIST"]}}))
}

/// Whether the statement's `dynamodb:LeadingKeys` condition confines it to the one
/// partition of the followed money (`pk = MONEY`): the orders whose money a settlement
/// left unsettled, each deleted once settled.
fn confined_to_followed_money(statement: &Statement) -> bool {
    statement.condition
        == Some(json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["MONEY"]}}))
}

/// Whether the statement's `dynamodb:LeadingKeys` condition confines it to the sales'
/// audit trails (`pk = AUDIT#<sale_id>`), partitions of their own.
fn confined_to_audit_trails(statement: &Statement) -> bool {
    statement.condition
        == Some(json!({"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["AUDIT#*"]}}))
}

#[test]
fn sam_adds_only_logging_tracing_and_the_declared_event_permissions() {
    const BASIC: &str = "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole";
    const XRAY: &str = "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess";
    const SQS_POLLER: &str = "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole";
    for f in functions() {
        let (role_id, own, generated, managed) = role_of(f.logical_id);
        let mut expected_managed = vec![BASIC, XRAY];
        if f.logical_id == "OrderConsumerFunction" {
            expected_managed.push(SQS_POLLER);
        }
        let managed: BTreeSet<&str> = managed.iter().map(String::as_str).collect();
        assert_eq!(
            managed,
            expected_managed.into_iter().collect(),
            "{role_id} managed policies"
        );

        match f.logical_id {
            "ReleaseFunction" => {
                assert_eq!(
                    generated.len(),
                    1,
                    "{role_id}: only the on-failure destination"
                );
                let s = &generated[0];
                assert_eq!(s.actions, ["sqs:SendMessage"]);
                let named: BTreeSet<String> =
                    s.resources.iter().flat_map(stack::references).collect();
                assert_eq!(named, ["ReleaseFailuresQueue".to_owned()].into());
            }
            _ => assert!(generated.is_empty(), "{role_id}: unexpected {generated:?}"),
        }

        let denies: Vec<&Statement> = own.iter().filter(|s| s.effect == Effect::Deny).collect();
        if f.logical_id == "OrderConsumerFunction" {
            // The managed SQS poller policy allows every queue; the deny narrows it.
            assert_eq!(denies.len(), 1, "{role_id}: one deny");
            let deny = denies[0];
            for action in [
                "ReceiveMessage",
                "DeleteMessage",
                "ChangeMessageVisibility",
                "GetQueueAttributes",
            ] {
                assert!(
                    deny.actions
                        .iter()
                        .any(|a| iam::action_matches(a, &format!("sqs:{action}"))),
                    "{role_id}: deny covers sqs:{action}"
                );
            }
            let spared: BTreeSet<String> = deny
                .not_resources
                .iter()
                .flat_map(stack::references)
                .collect();
            assert_eq!(
                spared,
                ["OrdersQueue".to_owned()].into(),
                "{role_id}: consumes only the orders queue"
            );
            assert!(deny.resources.is_empty());
        } else {
            assert!(denies.is_empty(), "{role_id}: no deny expected");
        }
    }
}

#[test]
fn the_scheduler_role_is_assumable_only_by_scheduler_and_may_only_invoke_release_or_park_it() {
    let role = stack().expanded_resource("SchedulerRole");
    let trust = iam::document_statements("trust", &role["Properties"]["AssumeRolePolicyDocument"])
        .expect("trust policy");
    assert_eq!(trust.len(), 1);
    let raw_trust = &role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0];
    assert_eq!(
        raw_trust["Principal"],
        json!({"Service": "scheduler.amazonaws.com"})
    );
    assert_eq!(trust[0].actions, ["sts:AssumeRole"]);
    assert_eq!(trust[0].effect, Effect::Allow);

    let policies = iam::role_policies("SchedulerRole", role).expect("policies");
    assert!(policies.managed_policy_arns.is_empty());
    assert_eq!(policies.statements.len(), 2);
    let invoke = &policies.statements[0];
    assert_eq!(invoke.actions, ["lambda:InvokeFunction"]);
    assert_eq!(
        invoke.resources,
        [json!({"Ref": "ReleaseFunctionAliaslive"})]
    );
    // The schedules' dead-letter queue, which the consumer's targets name.
    let park = &policies.statements[1];
    assert_eq!(park.actions, ["sqs:SendMessage"]);
    assert_eq!(
        park.resources,
        [json!({"Fn::GetAtt": ["ReleaseSchedulesDLQ", "Arn"]})]
    );
}

// ------------------------------------------------------------------ aliases and deploys

/// The `live` alias SAM made for each function (`AutoPublishAlias`), by function.
fn live_aliases() -> BTreeMap<String, String> {
    let stack = stack();
    stack
        .expanded_resources_of("AWS::Lambda::Alias")
        .into_iter()
        .filter_map(|alias| {
            let properties = &stack.expanded_resource(&alias)["Properties"];
            let function = properties["FunctionName"]["Ref"].as_str()?.to_owned();
            (properties["Name"] == "live").then_some((function, alias))
        })
        .collect()
}

#[test]
fn every_invocation_goes_through_a_functions_live_alias_never_latest() {
    let aliases = live_aliases();
    let functions: BTreeSet<String> = functions()
        .iter()
        .map(|f| f.logical_id.to_owned())
        .collect();
    assert_eq!(
        aliases.keys().cloned().collect::<BTreeSet<_>>(),
        functions,
        "every function, and only those, has a live alias"
    );
    let alias_ids: BTreeSet<String> = aliases.values().cloned().collect();
    let stack = stack();
    // Whatever invokes a function names its alias; naming the function itself would
    // invoke $LATEST, which CodeDeploy neither shifts nor rolls back.
    let invokers = [
        "AWS::Lambda::Permission",
        "AWS::Lambda::EventSourceMapping",
        "AWS::Events::Rule",
        "AWS::ApiGatewayV2::Api",
        "AWS::ApiGatewayV2::Integration",
    ];
    let mut invoked = BTreeSet::new();
    for kind in invokers {
        for id in stack.expanded_resources_of(kind) {
            let named = stack::references(&stack.expanded_resource(&id)["Properties"]);
            let latest: Vec<&String> = named.intersection(&functions).collect();
            assert!(
                latest.is_empty(),
                "{id} ({kind}) invokes {latest:?} at $LATEST"
            );
            invoked.extend(named.intersection(&alias_ids).cloned());
        }
    }
    // The release timers: the consumer names the alias as their target, and the role
    // Scheduler assumes may invoke only it.
    let release_alias = aliases["ReleaseFunction"].clone();
    let consumer_env =
        &stack.expanded_resource("OrderConsumerFunction")["Properties"]["Environment"]["Variables"];
    assert_eq!(
        stack::references(&consumer_env["RELEASE_FUNCTION_ARN"]),
        BTreeSet::from([release_alias.clone()])
    );
    invoked.insert(release_alias);
    assert_eq!(invoked, alias_ids, "every alias is what something invokes");
}

#[test]
fn every_function_deploys_gradually_and_rolls_back_on_its_own_alarms() {
    let stack = stack();
    let alarms: BTreeSet<String> = stack
        .expanded_resources_of("AWS::CloudWatch::Alarm")
        .into_iter()
        .collect();
    for f in functions() {
        let preference = &stack.raw_resource(f.logical_id)["Properties"]["DeploymentPreference"];
        let kind = preference["Type"].as_str().unwrap_or_default();
        assert!(
            kind.starts_with("Canary") || kind.starts_with("Linear"),
            "{}: a gradual deployment, not {kind:?}",
            f.logical_id
        );
        let triggers = stack::references(&preference["Alarms"]);
        assert!(!triggers.is_empty(), "{}: rollback alarms", f.logical_id);
        assert!(
            triggers.is_subset(&alarms),
            "{}: {triggers:?} are alarms of this stack",
            f.logical_id
        );
        // A rollback trigger about the function itself (its errors, at least), not only
        // about the API as a whole.
        assert!(
            triggers
                .iter()
                .any(|alarm| stack::references(stack.raw_resource(alarm)).contains(f.logical_id)),
            "{}: no alarm of its own among {triggers:?}",
            f.logical_id
        );
        // An alarm on what a queue holds stays in ALARM for what was parked before the
        // deploy: as a trigger it would roll back every deploy until someone redrove it.
        for alarm in &triggers {
            assert_ne!(
                stack.raw_resource(alarm)["Properties"]["MetricName"],
                "ApproximateNumberOfMessagesVisible",
                "{}: {alarm} counts a standing backlog, not this version's failures",
                f.logical_id
            );
        }
        let group = format!("{}DeploymentGroup", f.logical_id);
        assert_eq!(
            stack.expanded_resource(&group)["Type"],
            "AWS::CodeDeploy::DeploymentGroup",
            "{group}"
        );
    }
}

// ------------------------------------------------------------------ API and event source

#[test]
fn every_route_except_the_public_sale_page_and_stripes_webhook_requires_the_jwt_authorizer() {
    let body = &stack().expanded_resource("HttpApi")["Properties"]["Body"];
    let paths = body["paths"].as_object().expect("routes in the API body");
    let mut seen = 0;
    for (path, methods) in paths {
        for (method, operation) in methods.as_object().expect("methods") {
            seen += 1;
            let route = format!("{} {path}", method.to_uppercase());
            // The webhook's Stripe-Signature is checked by the function instead.
            let expected = if ["GET /sales/{sale_id}", "POST /payments/stripe/webhook"]
                .contains(&route.as_str())
            {
                json!([{"NONE": []}])
            } else {
                json!([{"JwtAuthorizer": []}])
            };
            assert_eq!(operation["security"], expected, "{route}");
        }
    }
    assert_eq!(seen, 22, "the twenty-two routes of the HTTP API contract");
    let jwt =
        &body["components"]["securitySchemes"]["JwtAuthorizer"]["x-amazon-apigateway-authorizer"];
    assert_eq!(jwt["type"], "jwt");
    assert_eq!(jwt["identitySource"], "$request.header.Authorization");
}

#[test]
fn grab_and_token_routes_are_throttled_tighter_than_the_rest() {
    let stage_id = stack()
        .expanded_resources_of("AWS::ApiGatewayV2::Stage")
        .into_iter()
        .next()
        .expect("a stage");
    let stage = &stack().expanded_resource(&stage_id)["Properties"];
    let default = &stage["DefaultRouteSettings"];
    let default_rate = param_default_of(&default["ThrottlingRateLimit"]);
    let default_burst = param_default_of(&default["ThrottlingBurstLimit"]);
    for route in [
        "POST /sales/{sale_id}/token",
        "POST /sales/{sale_id}/grab/{token}",
    ] {
        let settings = &stage["RouteSettings"][route];
        assert!(
            param_default_of(&settings["ThrottlingRateLimit"]) < default_rate,
            "{route} rate"
        );
        assert!(
            param_default_of(&settings["ThrottlingBurstLimit"]) < default_burst,
            "{route} burst"
        );
    }
    assert!(
        stage["AccessLogSettings"]["DestinationArn"].is_object(),
        "access logs"
    );
}

fn param_default_of(value: &Value) -> f64 {
    let name = value["Ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{value} is a parameter"));
    stack()
        .parameter_default_number(name)
        .unwrap_or_else(|| panic!("{name} has a numeric default"))
}

#[test]
fn the_grab_answers_before_its_lambda_timeout_would_end_it() {
    let raw = stack();
    let timeout = raw.raw_resource("GrabFunction")["Properties"]["Timeout"]
        .as_f64()
        .or_else(|| raw.raw["Globals"]["Function"]["Timeout"].as_f64())
        .expect("a grab timeout");
    let deadline = flashsale_grab::REQUEST_DEADLINE.as_secs_f64();
    // Room for the response to leave and for the runtime's own overhead.
    assert!(
        deadline + 0.5 <= timeout,
        "the grab's deadline {deadline} s leaves no room under its {timeout} s timeout"
    );
}

#[test]
fn the_release_can_wait_for_its_deadline_and_still_release_within_its_timeout() {
    let raw = stack();
    let timeout = raw.raw_resource("ReleaseFunction")["Properties"]["Timeout"]
        .as_f64()
        .or_else(|| raw.raw["Globals"]["Function"]["Timeout"].as_f64())
        .expect("a release timeout");
    let wait = flashsale_release::MAX_WAIT.as_secs_f64();
    // After the wait: the release transaction and, when it is refused, one read.
    let work = 2.0 * flashsale_release::SDK_BUDGET.operation.as_secs_f64();
    assert!(
        wait + work + 1.0 <= timeout,
        "waiting {wait} s then {work} s of calls does not fit the release's {timeout} s timeout"
    );
}

#[test]
fn the_orders_queue_hides_a_message_for_at_least_six_consumer_timeouts() {
    let raw = stack();
    let consumer_timeout = raw.raw_resource("OrderConsumerFunction")["Properties"]["Timeout"]
        .as_f64()
        .or_else(|| raw.raw["Globals"]["Function"]["Timeout"].as_f64())
        .expect("a consumer timeout");
    assert_eq!(
        raw.raw_resource("OrdersQueue")["Properties"]["VisibilityTimeout"],
        json!({"Ref": "OrdersVisibilityTimeout"})
    );
    let default = raw
        .parameter_default_number("OrdersVisibilityTimeout")
        .expect("a default visibility timeout");
    assert!(
        default >= 6.0 * consumer_timeout,
        "{default} < 6 x {consumer_timeout}"
    );

    let samconfig_path = root_path("samconfig.toml");
    let samconfig = std::fs::read_to_string(&samconfig_path).expect("samconfig.toml");
    for (at, _) in samconfig.match_indices("OrdersVisibilityTimeout=") {
        let value: f64 = samconfig[at + "OrdersVisibilityTimeout=".len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("a number");
        assert!(
            value >= 6.0 * consumer_timeout,
            "samconfig overrides it to {value}"
        );
    }
}

#[test]
fn the_consumer_reports_partial_batch_failures_with_bounded_concurrency() {
    let mapping_id = stack()
        .expanded_resources_of("AWS::Lambda::EventSourceMapping")
        .into_iter()
        .next()
        .expect("the consumer's event source mapping");
    let mapping = &stack().expanded_resource(&mapping_id)["Properties"];
    assert_eq!(
        mapping["FunctionName"],
        json!({"Ref": "OrderConsumerFunctionAliaslive"})
    );
    assert_eq!(
        mapping["EventSourceArn"],
        json!({"Fn::GetAtt": ["OrdersQueue", "Arn"]})
    );
    assert_eq!(
        mapping["FunctionResponseTypes"],
        json!(["ReportBatchItemFailures"])
    );
    let batch = mapping["BatchSize"].as_u64().expect("a literal batch size");
    assert!(
        (1..=10).contains(&batch),
        "FIFO queues deliver at most 10 per batch"
    );
    assert_eq!(
        mapping["ScalingConfig"]["MaximumConcurrency"],
        json!({"Ref": "ConsumerMaxConcurrency"})
    );
}

#[test]
fn grab_reserves_its_concurrency_from_a_parameter() {
    assert_eq!(
        stack().expanded_resource("GrabFunction")["Properties"]["ReservedConcurrentExecutions"],
        json!({"Fn::If": ["HasGrabReservedConcurrency", {"Ref": "GrabReservedConcurrency"}, {"Ref": "AWS::NoValue"}]})
    );
}

#[test]
fn release_retries_then_parks_failed_events_and_every_queue_is_alarmed() {
    let invoke_config_id = stack()
        .expanded_resources_of("AWS::Lambda::EventInvokeConfig")
        .into_iter()
        .find(|id| {
            stack().expanded_resource(id)["Properties"]["FunctionName"]
                == json!({"Ref": "ReleaseFunction"})
        })
        .expect("release's async invoke config");
    let config = &stack().expanded_resource(&invoke_config_id)["Properties"];
    assert!(
        config["MaximumRetryAttempts"]
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    assert_eq!(
        config["DestinationConfig"]["OnFailure"]["Destination"],
        json!({"Fn::GetAtt": ["ReleaseFailuresQueue", "Arn"]})
    );

    let alarms = stack().raw_resources_of("AWS::CloudWatch::Alarm");
    let watched: BTreeSet<String> = alarms
        .iter()
        .map(|id| &stack().raw_resource(id)["Properties"])
        .filter(|p| p["MetricName"] == "ApproximateNumberOfMessagesVisible")
        .flat_map(|p| stack::references(&p["Dimensions"]))
        .collect();
    assert_eq!(
        watched,
        [
            "OrdersDLQ".to_owned(),
            "ReleaseFailuresQueue".to_owned(),
            "ReleaseSchedulesDLQ".to_owned()
        ]
        .into(),
        "every parking queue raises an alarm when not empty"
    );
    for f in functions() {
        for metric in ["Errors", "Throttles"] {
            assert!(
                alarms.iter().any(|id| {
                    let p = &stack().raw_resource(id)["Properties"];
                    p["MetricName"] == metric
                        && stack::references(&p["Dimensions"]).contains(f.logical_id)
                }),
                "{} has a {metric} alarm",
                f.logical_id
            );
        }
    }
    assert!(alarms.iter().any(|id| {
        let p = &stack().raw_resource(id)["Properties"];
        p["MetricName"] == "Duration"
            && p["ExtendedStatistic"] == "p99"
            && stack::references(&p["Dimensions"]).contains("GrabFunction")
    }));
}

#[test]
fn the_reconciler_runs_on_a_schedule_one_pass_at_a_time() {
    let rules: Vec<String> = stack().expanded_resources_of("AWS::Events::Rule");
    assert!(
        rules.iter().any(|id| {
            let rule = &stack().expanded_resource(id)["Properties"];
            rule["ScheduleExpression"] == json!({"Ref": "ReconcileSchedule"})
                && stack::references(&rule["Targets"]).contains("ReconcilerFunctionAliaslive")
        }),
        "a schedule rule targets the reconciler: {rules:?}"
    );
    assert_eq!(
        stack().expanded_resource("ReconcilerFunction")["Properties"]["ReservedConcurrentExecutions"],
        json!({"Fn::If": ["HasGrabReservedConcurrency", 1, {"Ref": "AWS::NoValue"}]})
    );
}

#[test]
fn the_grab_routes_burst_no_further_than_the_grab_functions_reserved_concurrency() {
    let stack = stack();
    // Every route the grab function serves has a burst of its own and shares the
    // function's concurrency, so their bursts together must fit in it.
    let burst_parameter = |route: &str| match route {
        "Challenge" => "ChallengeThrottleBurstLimit",
        "Token" => "TokenThrottleBurstLimit",
        "Grab" => "GrabThrottleBurstLimit",
        other => panic!("the grab function serves a route {other} with no burst parameter"),
    };
    let events = stack.raw_resource("GrabFunction")["Properties"]["Events"]
        .as_object()
        .expect("the grab's events");
    let mut parameters = Vec::new();
    for (name, event) in events {
        let parameter = burst_parameter(name);
        assert_eq!(
            event["Properties"]["RouteSettings"]["ThrottlingBurstLimit"],
            json!({"Ref": parameter}),
            "the grab's {name} route takes its own burst"
        );
        parameters.push(parameter);
    }
    assert_eq!(
        parameters.len(),
        3,
        "the challenge, token and grab routes: {parameters:?}"
    );
    let default = |name: &str| {
        stack
            .parameter_default_number(name)
            .unwrap_or_else(|| panic!("a default {name}"))
    };
    let reserved = default("GrabReservedConcurrency");
    let bursts: f64 = parameters.iter().map(|name| default(name)).sum();
    assert!(
        bursts <= reserved,
        "bursts {parameters:?} sum to {bursts} > reserved concurrency {reserved}"
    );

    let samconfig = std::fs::read_to_string(root_path("samconfig.toml")).expect("samconfig.toml");
    let overridden = |name: &str| -> Option<f64> {
        let key = format!("\"{name}=");
        let at = samconfig.find(&key)? + key.len();
        samconfig[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    let bursts: f64 = parameters
        .iter()
        .map(|name| overridden(name).unwrap_or_else(|| default(name)))
        .sum();
    let reserved = overridden("GrabReservedConcurrency").unwrap_or(reserved);
    assert!(
        bursts <= reserved,
        "samconfig.toml: bursts {parameters:?} sum to {bursts} > reserved concurrency {reserved}"
    );
}
