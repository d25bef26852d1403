//! One endpoint for every emulated service, as one `AWS_ENDPOINT_URL` names one (and as
//! LocalStack serves all of its services on one port).
//!
//! A Lambda container that `sam local` runs is handed only the variables its template
//! declares, so it can be given one endpoint, not one per service. Each request the SDK
//! sends carries the service it is meant for in its SigV4 credential scope
//! (`Credential=AKID/20261204/us-east-1/dynamodb/aws4_request`); this forwards it, as it
//! is, to that service's emulator: DynamoDB Local, the SQS emulator, or moto (which serves
//! Scheduler and Secrets Manager on one port, telling them apart by the same scope).
//! It listens on an address of its caller's choosing, such as the Docker bridge's
//! gateway, which containers reach and which is still this machine.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::Emulators;

#[derive(Debug, thiserror::Error)]
pub enum OneEndpointError {
    #[error("could not listen on {address}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0:?} is not an http://host:port endpoint")]
    Upstream(String),
}

/// Where each service's requests go.
struct Upstreams {
    dynamodb: Uri,
    sqs: Uri,
    /// Every other service: moto.
    moto: Uri,
}

impl Upstreams {
    fn of(emulators: &Emulators) -> Result<Self, OneEndpointError> {
        let parse = |endpoint: &str| -> Result<Uri, OneEndpointError> {
            let uri: Uri = endpoint
                .parse()
                .map_err(|_| OneEndpointError::Upstream(endpoint.to_owned()))?;
            if uri.scheme_str() == Some("http") && uri.authority().is_some() {
                Ok(uri)
            } else {
                Err(OneEndpointError::Upstream(endpoint.to_owned()))
            }
        };
        Ok(Self {
            dynamodb: parse(&emulators.dynamodb_endpoint)?,
            sqs: parse(&emulators.sqs_endpoint)?,
            moto: parse(&emulators.moto_endpoint)?,
        })
    }

    fn for_service(&self, service: &str) -> &Uri {
        match service {
            "dynamodb" => &self.dynamodb,
            "sqs" => &self.sqs,
            _ => &self.moto,
        }
    }
}

/// A running endpoint. Stops, with its connections, when dropped.
pub struct OneEndpoint {
    address: SocketAddr,
    server: JoinHandle<()>,
}

impl Drop for OneEndpoint {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl OneEndpoint {
    /// Listens on `host` (a free port) in front of `emulators`.
    pub async fn start(host: IpAddr, emulators: &Emulators) -> Result<Self, OneEndpointError> {
        let upstreams = Upstreams::of(emulators)?;
        let wanted = SocketAddr::new(host, 0);
        let listener =
            TcpListener::bind(wanted)
                .await
                .map_err(|source| OneEndpointError::Bind {
                    address: wanted,
                    source,
                })?;
        let address = listener
            .local_addr()
            .map_err(|source| OneEndpointError::Bind {
                address: wanted,
                source,
            })?;
        let shared = Arc::new(Shared {
            upstreams,
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        });
        let server = tokio::spawn(serve(listener, shared));
        Ok(Self { address, server })
    }

    /// `http://host:port`: the `AWS_ENDPOINT_URL` to give the functions.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

struct Shared {
    upstreams: Upstreams,
    client: Client<HttpConnector, Incoming>,
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Dropping the set (when the server's task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = service_fn(move |request| forward(Arc::clone(&shared), request));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

type Answer = Response<BoxBody<Bytes, hyper::Error>>;

/// The service a SigV4-signed request is scoped to: the fourth part of its credential.
fn signed_service(headers: &http::HeaderMap) -> Option<&str> {
    let authorization = headers.get(http::header::AUTHORIZATION)?;
    let credential = authorization.to_str().ok()?.split("Credential=").nth(1)?;
    credential.split([',', ' ']).next()?.split('/').nth(3)
}

async fn forward(
    shared: Arc<Shared>,
    mut request: Request<Incoming>,
) -> Result<Answer, std::convert::Infallible> {
    let Some(service) = signed_service(request.headers()).map(str::to_owned) else {
        return Ok(refusal(
            StatusCode::BAD_REQUEST,
            "not a SigV4-signed AWS request: no service to route it to",
        ));
    };
    let upstream = shared.upstreams.for_service(&service).clone();
    let mut parts = upstream.into_parts();
    parts.path_and_query = request.uri().path_and_query().cloned();
    let Ok(uri) = Uri::from_parts(parts) else {
        return Ok(refusal(
            StatusCode::BAD_REQUEST,
            "the path cannot be forwarded",
        ));
    };
    *request.uri_mut() = uri;
    match shared.client.request(request).await {
        Ok(answer) => Ok(answer.map(BodyExt::boxed)),
        Err(error) => Ok(refusal(
            StatusCode::BAD_GATEWAY,
            &format!("the {service} emulator did not answer: {error}"),
        )),
    }
}

fn refusal(status: StatusCode, message: &str) -> Answer {
    let body = serde_json::json!({"__type": "OneEndpoint", "message": message}).to_string();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(authorization: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            authorization.parse().expect("a header value"),
        );
        headers
    }

    #[test]
    fn the_service_is_the_fourth_part_of_the_credential_scope() {
        let dynamodb = signed(
            "AWS4-HMAC-SHA256 Credential=test/20261204/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc",
        );
        assert_eq!(signed_service(&dynamodb), Some("dynamodb"));
        let scheduler = signed(
            "AWS4-HMAC-SHA256 Credential=AKID/20261204/eu-west-1/scheduler/aws4_request,SignedHeaders=host,Signature=abc",
        );
        assert_eq!(signed_service(&scheduler), Some("scheduler"));
        assert_eq!(signed_service(&signed("Bearer abc")), None);
        assert_eq!(signed_service(&http::HeaderMap::new()), None);
    }
}
