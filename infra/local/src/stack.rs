//! A whole local stack in-process: emulators, provisioned resources, the HTTP API, the
//! event source mappings and scheduler delivery; stopped as a unit.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use flashsale_emulators::{EmulatorError, EmulatorOptions, Emulators, LocalEndpoints};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::apigw::Gateway;
use crate::auth::{LocalJwt, TokenError};
use crate::dispatch::{self, DispatchError};
use crate::esm::{self, PollerSettings};
use crate::lambda::{AsyncRetryTiming, LambdaFunction, LambdaService};
use crate::local_stripe;
use crate::model::{ModelError, RouteAuth, StackModel};
use crate::provision::{self, Clients, ProvisionError, ProvisionReport};
use crate::resolve::{ParamValue, StackContext};
use crate::rules;
use crate::scheduler::{self, SchedulerSettings};
use crate::static_files;
use crate::template::{Template, TemplateError};

/// The region and account every local ARN uses.
pub const REGION: &str = flashsale_emulators::REGION;
pub const ACCOUNT_ID: &str = flashsale_emulators::ACCOUNT_ID;

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("could not start the emulators")]
    Emulators(#[source] EmulatorError),
    #[error("the shared emulators are unavailable")]
    SharedEmulators(#[source] &'static EmulatorError),
    #[error("the emulator start-up task failed")]
    EmulatorTask(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("the template cannot be evaluated locally")]
    Model(#[from] ModelError),
    #[error("the pages cannot be served with the template's headers")]
    PageHeader(#[from] crate::static_files::InvalidPageHeader),
    #[error("provisioning failed")]
    Provision(#[from] ProvisionError),
    #[error("a function cannot be loaded")]
    Dispatch(#[from] DispatchError),
    #[error("function override {0} is not a function of the template")]
    UnknownOverride(String),
    #[error("the local Stripe could not be wired to the stack")]
    LocalStripe(#[from] local_stripe::LocalStripeError),
    #[error("could not listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Where the emulators come from.
#[derive(Debug, Clone)]
pub enum EmulatorSource {
    /// The pair shared by the whole test process (`flashsale_emulators::shared`), or the
    /// running pair `FLASHSALE_DYNAMODB_ENDPOINT`/`FLASHSALE_MOTO_ENDPOINT` name (SQS:
    /// `FLASHSALE_SQS_ENDPOINT`, or an SQS emulator of its own).
    Shared,
    /// A pair owned by this stack and stopped with it (`make run`); ports 0 = free.
    Own(EmulatorOptions),
    /// Running emulators at these endpoints, neither started nor stopped here: the
    /// fault drills put a fault-injecting proxy in front of each and name the proxies.
    Endpoints(LocalEndpoints),
}

/// How to start a stack.
#[derive(Clone)]
pub struct StackOptions {
    /// Prefix of every physical name; unique per concurrent stack.
    pub stack_name: String,
    pub template: PathBuf,
    pub api_host: IpAddr,
    /// 0 picks a free port.
    pub api_port: u16,
    /// Like `sam deploy --parameter-overrides`.
    pub parameter_overrides: BTreeMap<String, String>,
    pub emulators: EmulatorSource,
    /// The local Stripe, when `emulators` names endpoints (shared or owned emulators
    /// bring their own): the stack then takes card payments through it.
    pub stripe_endpoint: Option<String>,
    /// HS256 key of local tokens; random when `None`.
    pub jwt_secret: Option<Vec<u8>>,
    /// Implementations replacing the template's functions, by logical id (tests inject
    /// targets that record their events).
    pub function_overrides: BTreeMap<String, Arc<dyn LambdaFunction>>,
    pub async_retry: AsyncRetryTiming,
    pub scheduler: SchedulerSettings,
    pub poller: PollerSettings,
}

impl std::fmt::Debug for StackOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackOptions")
            .field("stack_name", &self.stack_name)
            .field("template", &self.template)
            .field("api_host", &self.api_host)
            .field("api_port", &self.api_port)
            .field(
                "parameter_overrides",
                &self.parameter_overrides.keys().collect::<Vec<_>>(),
            )
            .field("emulators", &self.emulators)
            .field(
                "function_overrides",
                &self.function_overrides.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl StackOptions {
    /// Defaults for tests: the workspace's template, shared emulators, a free API port.
    pub fn new(stack_name: impl Into<String>) -> Self {
        Self {
            stack_name: stack_name.into(),
            template: default_template_path(),
            api_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            api_port: 0,
            parameter_overrides: BTreeMap::new(),
            emulators: EmulatorSource::Shared,
            stripe_endpoint: None,
            jwt_secret: None,
            function_overrides: BTreeMap::new(),
            async_retry: AsyncRetryTiming::default(),
            scheduler: SchedulerSettings::default(),
            poller: PollerSettings::default(),
        }
    }

    pub fn parameter(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.parameter_overrides.insert(name.into(), value.into());
        self
    }

    pub fn function(
        mut self,
        logical_id: impl Into<String>,
        code: Arc<dyn LambdaFunction>,
    ) -> Self {
        self.function_overrides.insert(logical_id.into(), code);
        self
    }
}

/// `template.yaml` of the nearest folder (from the current directory up) that has one,
/// else the workspace's.
pub fn default_template_path() -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            cwd.ancestors()
                .map(|dir| dir.join("template.yaml"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
}

/// A running local stack. Dropping it stops its tasks; [`LocalStack::shutdown`] also
/// waits for them. Emulators it started are stopped with it.
pub struct LocalStack {
    /// `http://127.0.0.1:{port}`, no trailing slash.
    pub api_url: String,
    pub model: Arc<StackModel>,
    pub provisioned: ProvisionReport,
    /// Clients built from it reach the emulators.
    pub sdk_config: SdkConfig,
    pub dynamodb_endpoint: String,
    pub moto_endpoint: String,
    pub sqs_endpoint: String,
    /// The local Stripe the stack's card payments go through, if it takes them.
    pub stripe_endpoint: Option<String>,
    /// The signing secret of the stack's webhook at that local Stripe, which it put in
    /// the stack's Stripe secret: what a test signs Stripe's events with.
    pub stripe_webhook_secret: Option<String>,
    lambda: LambdaService,
    jwt: LocalJwt,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    emulators: Option<Emulators>,
    emulator_groups: Vec<u32>,
}

impl std::fmt::Debug for LocalStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStack")
            .field("api_url", &self.api_url)
            .field("stack_name", &self.model.stack_name)
            .field("dynamodb_endpoint", &self.dynamodb_endpoint)
            .field("moto_endpoint", &self.moto_endpoint)
            .field("sqs_endpoint", &self.sqs_endpoint)
            .finish_non_exhaustive()
    }
}

fn random_secret() -> Vec<u8> {
    use rand::Rng;
    rand::rng()
        .sample_iter(&rand::distr::Alphanumeric)
        .take(48)
        .collect()
}

impl LocalStack {
    /// Starts (or reuses) the emulators, provisions the template, loads the functions
    /// and starts serving.
    pub async fn start(options: StackOptions) -> Result<Self, StackError> {
        // Before any function runs, so their first metric lands in it.
        crate::metrics::LocalMetrics::install();
        let (emulators, shared) = match &options.emulators {
            EmulatorSource::Endpoints(_) => (None, None),
            EmulatorSource::Shared => {
                let shared = tokio::task::spawn_blocking(flashsale_emulators::try_shared_blocking)
                    .await
                    .map_err(StackError::EmulatorTask)?
                    .map_err(StackError::SharedEmulators)?;
                (None, Some(shared))
            }
            EmulatorSource::Own(emulator_options) => {
                let emulator_options = emulator_options.clone();
                let owned =
                    tokio::task::spawn_blocking(move || Emulators::start(&emulator_options))
                        .await
                        .map_err(StackError::EmulatorTask)?
                        .map_err(StackError::Emulators)?;
                (Some(owned), None)
            }
        };
        let endpoints = match (&options.emulators, emulators.as_ref().or(shared)) {
            (EmulatorSource::Endpoints(given), _) => given.clone(),
            (_, Some(running)) => running.endpoints(),
            (_, None) => unreachable!("a shared or owned set was started above"),
        };
        // The local Stripe of emulators this stack started or shares, or the one named
        // beside endpoints (which name only the AWS emulators).
        let stripe_endpoint = match (&options.emulators, emulators.as_ref().or(shared)) {
            (EmulatorSource::Endpoints(_), _) | (_, None) => options.stripe_endpoint.clone(),
            (_, Some(running)) => Some(running.stripe_endpoint.clone()),
        };
        let dynamodb_endpoint = endpoints.dynamodb.clone();
        let moto_endpoint = endpoints.moto.clone();
        let sqs_endpoint = endpoints.sqs.clone();
        let emulator_groups = emulators
            .as_ref()
            .map(Emulators::process_groups)
            .unwrap_or_default();
        let sdk_config = flashsale_emulators::sdk_config_for(endpoints).await;

        let template = Template::expand(&options.template, &options.parameter_overrides)?;
        // Card payments through the local Stripe: parameters SAM does not read (they
        // reach the functions through `Ref` and `Fn::If`), so the expansion stands.
        let parameter_overrides = match &stripe_endpoint {
            Some(endpoint) => local_stripe::with_card_payments(
                &options.parameter_overrides,
                |name| template.parameters.contains_key(name),
                endpoint,
            ),
            None => options.parameter_overrides.clone(),
        };
        let context = StackContext {
            stack_name: options.stack_name.clone(),
            region: REGION.to_owned(),
            account_id: ACCOUNT_ID.to_owned(),
            sqs_endpoint: sqs_endpoint.clone(),
        };
        let model = Arc::new(StackModel::build(&template, context, &parameter_overrides)?);
        let clients = Clients::new(&sdk_config);
        let provisioned = provision::provision(&model, &clients).await?;
        // Before any function's cold start reads the keys.
        let webhook_secret = match &stripe_endpoint {
            Some(_) if local_stripe::takes_card_payments(&model) => {
                let secret = local_stripe::new_webhook_secret();
                local_stripe::put_keys(&clients.secretsmanager, &model, &secret).await?;
                Some(secret)
            }
            _ => None,
        };

        if let Some(unknown) = options
            .function_overrides
            .keys()
            .find(|id| model.function(id).is_none())
        {
            return Err(StackError::UnknownOverride(unknown.clone()));
        }
        let mut code: BTreeMap<String, Arc<dyn LambdaFunction>> = BTreeMap::new();
        for spec in &model.functions {
            let implementation = match options.function_overrides.get(&spec.logical_id) {
                Some(injected) => injected.clone(),
                None => dispatch::builtin(spec, &sdk_config).await?,
            };
            code.insert(spec.logical_id.clone(), implementation);
        }

        let (shutdown, shutdown_rx) = watch::channel(false);
        let lambda = LambdaService::new(
            model.clone(),
            code,
            clients.sqs.clone(),
            options.async_retry.clone(),
            shutdown_rx.clone(),
        );
        let jwt = local_jwt(
            &model,
            options.jwt_secret.clone().unwrap_or_else(random_secret),
        );

        let addr = SocketAddr::new(options.api_host, options.api_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StackError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| StackError::Bind { addr, source })?;
        let api_url = format!("http://{local_addr}");
        if let (Some(stripe), Some(secret)) = (&stripe_endpoint, &webhook_secret) {
            local_stripe::register_webhook(stripe, &model.stack_name, &api_url, secret).await?;
        }

        let mut pages = static_files::Pages::new(
            static_files::pages_dir_for(&options.template),
            &model.page_headers,
        )?;
        if let (Some(stripe), Some(_)) = (&stripe_endpoint, &webhook_secret) {
            pages = pages.with_config("stripe_js", local_stripe::stripe_js(stripe));
        }
        let mut tasks = Vec::new();
        let router = Arc::new(Gateway::new(lambda.clone(), jwt.clone()))
            .router()
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(pages),
                static_files::serve_pages,
            ));
        let mut server_shutdown = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let served = axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move {
                let _ = server_shutdown.wait_for(|stop| *stop).await;
            })
            .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the HTTP API stopped");
            }
        }));
        for function in &model.functions {
            for source in function.sqs_sources.iter().filter(|s| s.enabled) {
                tasks.push(tokio::spawn(esm::run(
                    lambda.clone(),
                    function.logical_id.clone(),
                    source.clone(),
                    clients.sqs.clone(),
                    options.poller.clone(),
                    shutdown_rx.clone(),
                )));
            }
        }
        for function in &model.functions {
            for rule in function.schedules.iter().filter(|r| r.enabled) {
                tasks.push(tokio::spawn(rules::run(
                    lambda.clone(),
                    function.logical_id.clone(),
                    rule.clone(),
                    shutdown_rx.clone(),
                )));
            }
        }
        if !model.schedule_groups.is_empty() {
            tasks.push(tokio::spawn(scheduler::run(
                lambda.clone(),
                model
                    .schedule_groups
                    .iter()
                    .map(|g| g.name.clone())
                    .collect(),
                clients.scheduler.clone(),
                clients.sqs.clone(),
                options.scheduler.clone(),
                shutdown_rx.clone(),
            )));
        }
        Ok(Self {
            api_url,
            model,
            provisioned,
            sdk_config,
            dynamodb_endpoint,
            moto_endpoint,
            sqs_endpoint,
            stripe_endpoint: webhook_secret.as_ref().and(stripe_endpoint),
            stripe_webhook_secret: webhook_secret,
            lambda,
            jwt,
            shutdown,
            tasks,
            emulators,
            emulator_groups,
        })
    }

    /// Local tokens: issue, sign custom claims, read the secret.
    pub fn jwt(&self) -> &LocalJwt {
        &self.jwt
    }

    /// A token for `user_id` (with the admin group when `admin`), as `POST /local/token`.
    pub fn token(&self, user_id: &str, admin: bool) -> Result<String, TokenError> {
        self.jwt.issue(user_id, admin)
    }

    /// The functions, to invoke one directly.
    pub fn lambda(&self) -> &LambdaService {
        &self.lambda
    }

    /// Physical name of the table with this logical id.
    pub fn table_name(&self, logical_id: &str) -> Option<&str> {
        self.model.table(logical_id).map(|t| t.name.as_str())
    }

    /// URL of the queue with this logical id.
    pub fn queue_url(&self, logical_id: &str) -> Option<&str> {
        self.model.queue(logical_id).map(|q| q.url.as_str())
    }

    /// ARN of the secret with this logical id, as the functions' environments name it.
    pub fn secret_arn(&self, logical_id: &str) -> Option<&str> {
        self.model.secret(logical_id).map(|s| s.arn.as_str())
    }

    /// Name of the schedule group with this logical id.
    pub fn schedule_group_name(&self, logical_id: &str) -> Option<&str> {
        self.model
            .schedule_group(logical_id)
            .map(|g| g.name.as_str())
    }

    /// Process groups of the emulators this stack started (empty when shared).
    pub fn emulator_process_groups(&self) -> &[u32] {
        &self.emulator_groups
    }

    /// Stops serving and polling, waits for in-flight work (bounded), then stops the
    /// emulators this stack started.
    /// The stack's webhook off the local Stripe, once.
    fn unregister_webhook(&mut self) {
        if let Some(stripe) = self.stripe_endpoint.take() {
            local_stripe::unregister_webhook(&stripe, &self.model.stack_name);
        }
    }

    pub async fn shutdown(mut self) {
        self.unregister_webhook();
        let _ = self.shutdown.send(true);
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        drop(self.emulators.take());
    }
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        self.unregister_webhook();
        let _ = self.shutdown.send(true);
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

/// Local tokens for the stack: issued for the authorizer of its protected routes, with
/// the admin group in the claim the template's `AdminClaim` parameter names.
fn local_jwt(model: &StackModel, secret: Vec<u8>) -> LocalJwt {
    let authorizer = model
        .routes()
        .find_map(|(_, route)| match &route.auth {
            RouteAuth::Jwt { authorizer, .. } => Some(authorizer.clone()),
            RouteAuth::Public => None,
        })
        .or_else(|| {
            model
                .apis
                .iter()
                .find_map(|api| api.authorizers.values().next().cloned())
        });
    let parameter = |name: &str, default: &str| match model.parameters.get(name) {
        Some(ParamValue::String(value)) => value.clone(),
        _ => default.to_owned(),
    };
    LocalJwt::new(
        secret,
        authorizer,
        parameter("AdminClaim", "cognito:groups"),
        parameter("AdminGroup", "admin"),
    )
}
