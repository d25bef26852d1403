//! The sale page and the admin console (`web/`), served by the local gateway on the same
//! origin as the API, as the CloudFront distribution serves them deployed: a GET or HEAD
//! that names a file under the pages' folder gets the file; anything else goes on to
//! the API routes.
//!
//! Each page carries the headers the template's CloudFront response headers policy adds
//! to the pages (the Content-Security-Policy among them), so the pages are tried locally
//! under the policy they are deployed with.
//!
//! The pages are a small, closed set of file types that this repository writes, so a
//! table of content types does what a MIME crate would, without one more dependency.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};

/// The pages' folder and the headers every page answer carries.
#[derive(Debug, Clone)]
pub struct Pages {
    root: PathBuf,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Values the local stack adds to `config.json`, as a deployment writes its own
    /// (the local Stripe's Stripe.js, say).
    config: serde_json::Map<String, serde_json::Value>,
}

/// A page header the template names that is not a valid HTTP header.
#[derive(Debug, thiserror::Error)]
#[error("the pages' header {name:?}: {value:?} is not a valid HTTP header")]
pub struct InvalidPageHeader {
    pub name: String,
    pub value: String,
}

impl Pages {
    /// The pages in `root`, each answered with `headers` (the template's, as
    /// `StackModel::page_headers` reads them).
    pub fn new(root: PathBuf, headers: &[(String, String)]) -> Result<Self, InvalidPageHeader> {
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let invalid = || InvalidPageHeader {
                    name: name.clone(),
                    value: value.clone(),
                };
                Ok((
                    HeaderName::try_from(name.as_str()).map_err(|_| invalid())?,
                    HeaderValue::try_from(value.as_str()).map_err(|_| invalid())?,
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            root,
            headers,
            config: serde_json::Map::new(),
        })
    }

    /// These pages with `key` set to `value` in the `config.json` they serve.
    pub fn with_config(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.config.insert(key.to_owned(), value.into());
        self
    }

    /// `config.json` as read, with the local values over it; other files as read.
    fn configured(&self, path: &Path, bytes: Vec<u8>) -> Vec<u8> {
        if self.config.is_empty() || path != self.root.join(CONFIG) {
            return bytes;
        }
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(serde_json::Value::Object(mut config)) => {
                config.extend(self.config.clone());
                serde_json::to_vec(&config).unwrap_or(bytes)
            }
            // Not an object: served as it is, for the page to report.
            _ => bytes,
        }
    }
}

/// The pages' configuration file.
const CONFIG: &str = "config.json";

/// The folder of the pages next to a template: `web/`.
pub fn pages_dir_for(template: &Path) -> PathBuf {
    template
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("web")
}

/// The content type of a page file, by its extension; `None` for files that are not
/// part of the pages (they are not served).
fn content_type(path: &Path) -> Option<&'static str> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match extension.as_str() {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        _ => return None,
    })
}

/// The file a URL path names under `root`: `/` is `index.html`; a path with `..`, a
/// root or a prefix component names nothing, so nothing outside `root` is reachable.
fn file_for(root: &Path, url_path: &str) -> Option<PathBuf> {
    let relative = url_path.trim_start_matches('/');
    let relative = if relative.is_empty() {
        "index.html"
    } else {
        relative
    };
    let relative = Path::new(relative);
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    Some(root.join(relative))
}

/// Middleware: answers a GET or HEAD for a page file; passes every other request on.
pub async fn serve_pages(
    State(pages): State<Arc<Pages>>,
    request: Request,
    next: Next,
) -> Response {
    let is_read = matches!(*request.method(), Method::GET | Method::HEAD);
    let found = is_read
        .then(|| file_for(&pages.root, request.uri().path()))
        .flatten()
        .and_then(|path| content_type(&path).map(|kind| (path, kind)));
    let Some((path, kind)) = found else {
        return next.run(request).await;
    };
    // Not a file (or unreadable): the API's own 404 answers, as it would without pages.
    let Ok(bytes) = tokio::fs::read(&path).await else {
        return next.run(request).await;
    };
    let bytes = pages.configured(&path, bytes);
    let length = bytes.len();
    let body = if request.method() == Method::HEAD {
        Body::empty()
    } else {
        Body::from(bytes)
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    // Edited pages show on the next reload while developing.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    for (name, value) in &pages.headers {
        headers.insert(name.clone(), value.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_the_index_and_nothing_escapes_the_folder() {
        let root = Path::new("/srv/web");
        assert_eq!(
            file_for(root, "/"),
            Some(PathBuf::from("/srv/web/index.html"))
        );
        assert_eq!(
            file_for(root, "/assets/buyer.js"),
            Some(PathBuf::from("/srv/web/assets/buyer.js"))
        );
        assert_eq!(file_for(root, "/../secret.html"), None);
        assert_eq!(file_for(root, "/assets/../../x.html"), None);
    }

    #[test]
    fn only_page_file_types_have_a_content_type() {
        assert_eq!(
            content_type(Path::new("a/index.html")),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            content_type(Path::new("a/app.JS")),
            Some("text/javascript; charset=utf-8")
        );
        assert_eq!(
            content_type(Path::new("config.json")),
            Some("application/json")
        );
        assert_eq!(content_type(Path::new("Makefile")), None);
        assert_eq!(content_type(Path::new("key.pem")), None);
    }

    #[test]
    fn the_pages_sit_next_to_the_template() {
        assert_eq!(
            pages_dir_for(Path::new("/repo/template.yaml")),
            PathBuf::from("/repo/web")
        );
        assert_eq!(
            pages_dir_for(Path::new("template.yaml")),
            PathBuf::from("./web")
        );
    }
}
