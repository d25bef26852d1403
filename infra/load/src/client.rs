//! A thin client of the HTTP API: every call answers status and JSON body, so tests can
//! assert on both, including the error contract.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The price of the sales the tools and the end-to-end tests create, which the API
/// requires: 1,299.00 EUR, in minor units. What it is changes no measurement.
pub fn sale_price() -> Value {
    json!({"amount": 129_900, "currency": "EUR"})
}

/// A response: its status and its JSON body (`Value::Null` when the body is empty).
#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: StatusCode,
    pub body: Value,
    pub cache_control: Option<String>,
}

impl ApiResponse {
    /// The error code of an error response, e.g. `"sold_out"`.
    pub fn error_code(&self) -> Option<&str> {
        self.body.get("error").and_then(Value::as_str)
    }

    pub fn str_field(&self, field: &str) -> Option<&str> {
        self.body.get(field).and_then(Value::as_str)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request to {path} failed")]
    Http {
        path: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{path} answered {status} with a body that is not JSON: {body:?}")]
    NotJson {
        path: String,
        status: StatusCode,
        body: String,
    },
    #[error("{path} answered {status}: {body}")]
    Unexpected {
        path: String,
        status: StatusCode,
        body: Value,
    },
    #[error("the challenge route answered a challenge that does not solve: {challenge}")]
    Unsolvable { challenge: Value },
}

/// The header that marks a retry of the same grab path (`N` on the N-th retry), so the
/// grab spends a lookup of the order a lost answer may have made only on retries.
pub const RETRY_ATTEMPT_HEADER: &str = "X-Retry-Attempt";

#[derive(Debug, Clone)]
pub struct ApiClient {
    base_url: String,
    http: reqwest::Client,
}

impl ApiClient {
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::build(base_url, None)
    }

    /// A client whose connections leave from `local` (another loopback address, say),
    /// so the server sees another client IP, as buyers behind different addresses are.
    pub fn from_address(base_url: impl Into<String>, local: std::net::IpAddr) -> Self {
        Self::build(base_url, Some(local))
    }

    fn build(base_url: impl Into<String>, local: Option<std::net::IpAddr>) -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .local_address(local)
            .build()
            .expect("a client with default TLS settings builds");
        Self {
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            http,
        }
    }

    /// Sends a request and answers its `Retry-After` header too.
    pub async fn send_for_retry_after(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
    ) -> Result<(ApiResponse, Option<String>), ClientError> {
        let http_error = |source| ClientError::Http {
            path: path.to_owned(),
            source,
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(http_error)?;
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let bytes = response.bytes().await.map_err(http_error)?;
        let body = serde_json::from_slice(&bytes).map_err(|_| ClientError::NotJson {
            path: path.to_owned(),
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })?;
        Ok((
            ApiResponse {
                status,
                body,
                cache_control: None,
            },
            retry_after,
        ))
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Sends a request with an optional bearer token and a raw body.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Result<ApiResponse, ClientError> {
        self.send_marked(method, path, token, body, 0).await
    }

    /// [`ApiClient::send_raw`], marked with [`RETRY_ATTEMPT_HEADER`] when `retry > 0`.
    async fn send_marked(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        retry: u32,
    ) -> Result<ApiResponse, ClientError> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        if retry > 0 {
            request = request.header(RETRY_ATTEMPT_HEADER, retry);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let http_error = |source| ClientError::Http {
            path: path.to_owned(),
            source,
        };
        let response = request.send().await.map_err(http_error)?;
        let status = response.status();
        let cache_control = response
            .headers()
            .get("cache-control")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let bytes = response.bytes().await.map_err(http_error)?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|_| ClientError::NotJson {
                path: path.to_owned(),
                status,
                body: String::from_utf8_lossy(&bytes).into_owned(),
            })?
        };
        Ok(ApiResponse {
            status,
            body,
            cache_control,
        })
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Result<ApiResponse, ClientError> {
        let body = body.map(|value| serde_json::to_vec(value).expect("JSON values serialize"));
        self.send_raw(method, path, token, body).await
    }

    /// A token from the local stack's stand-in identity provider.
    pub async fn local_token(&self, user_id: &str, admin: bool) -> Result<String, ClientError> {
        let body = json!({ "user_id": user_id, "admin": admin });
        let response = self
            .send(Method::POST, "/local/token", None, Some(&body))
            .await?;
        expect_status(&response, StatusCode::OK, "/local/token")?;
        Ok(response
            .str_field("token")
            .expect("the token endpoint answers a token")
            .to_owned())
    }

    pub async fn create_sale(&self, admin: &str, sale: &Value) -> Result<ApiResponse, ClientError> {
        self.send(Method::POST, "/admin/sales", Some(admin), Some(sale))
            .await
    }

    pub async fn sale(&self, sale_id: &str) -> Result<ApiResponse, ClientError> {
        self.send(Method::GET, &format!("/sales/{sale_id}"), None, None)
            .await
    }

    /// Reads the stats, retrying a busy answer (a read is safe to repeat).
    pub async fn stats(&self, admin: &str, sale_id: &str) -> Result<ApiResponse, ClientError> {
        let path = format!("/admin/sales/{sale_id}/stats");
        self.retrying(|_| self.send(Method::GET, &path, Some(admin), None))
            .await
    }

    pub async fn grab_pass(&self, user: &str, sale_id: &str) -> Result<ApiResponse, ClientError> {
        let path = format!("/sales/{sale_id}/token");
        self.send(Method::POST, &path, Some(user), None).await
    }

    /// A grab path as a buyer's page fetches one: a throttled (429) or busy (503) answer
    /// is retried after a jittered pause (a grab path is safe to ask for again).
    pub async fn grab_pass_retrying(
        &self,
        user: &str,
        sale_id: &str,
    ) -> Result<ApiResponse, ClientError> {
        self.retrying(|_| self.grab_pass(user, sale_id)).await
    }

    /// Fetches a grab path and grabs through it, as a buyer's page does: a throttled
    /// (429) or busy (503) answer is retried after a jittered pause, on the same path,
    /// which names one order, so a retry can never buy a second unit. Retries carry
    /// `X-Retry-Attempt`, so one whose first answer was lost gets its order back even
    /// after the sale sold out.
    pub async fn grab(&self, user: &str, sale_id: &str) -> Result<ApiResponse, ClientError> {
        let pass = self.grab_pass_retrying(user, sale_id).await?;
        let Some(grab_path) = pass.str_field("grab_path") else {
            return Ok(pass);
        };
        let grab_path = grab_path.to_owned();
        self.retrying(|retry| self.send_marked(Method::POST, &grab_path, Some(user), None, retry))
            .await
    }

    /// Calls `call(retry)` (0 first, then 1, 2, ...) until the answer is not transient.
    async fn retrying<F, Fut>(&self, mut call: F) -> Result<ApiResponse, ClientError>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<ApiResponse, ClientError>>,
    {
        // A time, not a count: a loaded machine (DynamoDB Local behind a dozen builds)
        // can stay busy for minutes, and every call retried here is safe to repeat.
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);
        let started = std::time::Instant::now();
        let mut retry = 0;
        loop {
            let patient = started.elapsed() < PATIENCE;
            let response = match call(retry).await {
                Ok(response) => response,
                // Every call retried here is idempotent, so a request lost with its
                // connection can be sent again.
                Err(ClientError::Http { .. }) if patient => {
                    tokio::time::sleep(crate::surge::backoff(retry)).await;
                    retry += 1;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let transient = matches!(
                response.status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            );
            if !transient || !patient {
                return Ok(response);
            }
            tokio::time::sleep(crate::surge::backoff(retry)).await;
            retry += 1;
        }
    }

    /// Reads an order, retrying a busy answer (a read is safe to repeat).
    pub async fn order(&self, user: &str, order_id: &str) -> Result<ApiResponse, ClientError> {
        let path = format!("/orders/{order_id}");
        self.retrying(|_| self.send(Method::GET, &path, Some(user), None))
            .await
    }

    /// A page of the caller's own orders (`GET /orders`), retrying a busy answer.
    pub async fn my_orders(
        &self,
        user: &str,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<ApiResponse, ClientError> {
        // A cursor is plain ASCII of `[0-9A-Za-z._-]`: nothing to escape.
        let mut query = Vec::new();
        query.extend(limit.map(|limit| format!("limit={limit}")));
        query.extend(cursor.map(|cursor| format!("cursor={cursor}")));
        let path = format!("/orders?{}", query.join("&"));
        self.retrying(|_| self.send(Method::GET, &path, Some(user), None))
            .await
    }

    /// Pays the order by card as a buyer's page does: opens its payment, confirms it at
    /// Stripe (`stripe_api`) with the publishable key and client secret the API
    /// answered and Stripe's test card `pm_card_visa` (so a test-mode deployment only),
    /// then asks the API to settle. Answers the settlement's answer, or the opening's
    /// when it refused (`order_expired`: paid too late).
    pub async fn pay_by_card(
        &self,
        user: &str,
        order_id: &str,
        stripe_api: &str,
    ) -> Result<ApiResponse, ClientError> {
        let opened = self.open_payment(user, order_id).await?;
        if opened.status != StatusCode::OK {
            return Ok(opened);
        }
        let field = |name: &str| opened.str_field(name).unwrap_or_default();
        let path = format!(
            "{stripe_api}/v1/payment_intents/{}/confirm",
            field("payment_id")
        );
        let http_error = |source| ClientError::Http {
            path: path.clone(),
            source,
        };
        let confirmed = self
            .http
            .post(&path)
            .form(&[
                ("key", field("publishable_key")),
                ("client_secret", field("client_secret")),
                ("payment_method", "pm_card_visa"),
            ])
            .send()
            .await
            .map_err(http_error)?;
        let status = confirmed.status();
        if status != StatusCode::OK {
            let body = confirmed.json().await.unwrap_or_default();
            return Err(ClientError::Unexpected { path, status, body });
        }
        self.confirm_payment(user, order_id).await
    }

    /// Opens (or gets again) the order's card payment, retrying a busy answer: the
    /// order has one payment however often it is asked.
    pub async fn open_payment(
        &self,
        user: &str,
        order_id: &str,
    ) -> Result<ApiResponse, ClientError> {
        let path = format!("/orders/{order_id}/payment");
        self.retrying(|_| self.send(Method::POST, &path, Some(user), None))
            .await
    }

    /// Settles the order from its payment at Stripe, retrying a busy answer (a
    /// settlement moves money at most once however often it runs).
    pub async fn confirm_payment(
        &self,
        user: &str,
        order_id: &str,
    ) -> Result<ApiResponse, ClientError> {
        let path = format!("/orders/{order_id}/payment/confirm");
        self.retrying(|_| self.send(Method::POST, &path, Some(user), None))
            .await
    }

    /// Cancels, retrying a busy answer (cancelling is idempotent too).
    pub async fn cancel(&self, user: &str, order_id: &str) -> Result<ApiResponse, ClientError> {
        let path = format!("/orders/{order_id}/cancel");
        self.retrying(|_| self.send(Method::POST, &path, Some(user), None))
            .await
    }
}

/// Fails with the whole response when the status is not the expected one.
pub fn expect_status(
    response: &ApiResponse,
    expected: StatusCode,
    path: &str,
) -> Result<(), ClientError> {
    if response.status == expected {
        Ok(())
    } else {
        Err(ClientError::Unexpected {
            path: path.to_owned(),
            status: response.status,
            body: response.body.clone(),
        })
    }
}
