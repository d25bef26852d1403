//! Where the load tool gets its bearer tokens: the local stack's stand-in identity
//! provider (`POST /local/token`), or, against a deployed API that has none, a file of
//! tokens minted beforehand or a command that prints one per user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Deserialize;

use crate::client::{ApiClient, ClientError};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the local token endpoint failed")]
    Local(#[from] ClientError),
    #[error("cannot read the tokens file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: expected `user_id<TAB>jwt`")]
    BadLine { path: PathBuf, line: usize },
    #[error("{path} is neither `user_id<TAB>jwt` lines nor JSON tokens: {source}")]
    BadJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the tokens file has no token for {0:?}")]
    Missing(String),
    #[error("the tokens file holds {have} buyer tokens; the run needs {want}")]
    TooFewBuyers { have: usize, want: usize },
    #[error("the token command for {user}: {detail}")]
    Command { user: String, detail: String },
}

/// How tokens are obtained.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// `POST /local/token` on the API itself (the local stack only).
    Local,
    /// A file of `user_id<TAB>jwt` lines, or JSON: `{"user_id": "jwt", ...}` or
    /// `[{"user_id": ..., "token": ...}, ...]`. Buyers are the users other than the admin,
    /// in the file's order.
    File(TokenFile),
    /// A shell command with `{user_id}` in it, printing the user's JWT on stdout
    /// (e.g. `./mint-token {user_id}` against the deployment's identity provider).
    Command(String),
}

/// The tokens of a file, in its order.
#[derive(Debug, Clone, Default)]
pub struct TokenFile {
    pub tokens: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonTokens {
    Map(serde_json::Map<String, serde_json::Value>),
    List(Vec<JsonToken>),
}

#[derive(Deserialize)]
struct JsonToken {
    user_id: String,
    token: String,
}

impl TokenFile {
    pub fn read(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of a tokens file; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, TokenError> {
        let trimmed = text.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            let parsed: JsonTokens =
                serde_json::from_str(text).map_err(|source| TokenError::BadJson {
                    path: path.to_owned(),
                    source,
                })?;
            let tokens = match parsed {
                JsonTokens::Map(map) => map
                    .into_iter()
                    .map(|(user, token)| match token {
                        serde_json::Value::String(token) => Ok((user, token)),
                        other => Err(TokenError::BadJson {
                            path: path.to_owned(),
                            source: serde::de::Error::custom(format!(
                                "the token of {user} is not a string: {other}"
                            )),
                        }),
                    })
                    .collect::<Result<_, _>>()?,
                JsonTokens::List(list) => list.into_iter().map(|t| (t.user_id, t.token)).collect(),
            };
            return Ok(Self { tokens });
        }
        let mut tokens = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, token)) = line.split_once('\t') else {
                return Err(TokenError::BadLine {
                    path: path.to_owned(),
                    line: index + 1,
                });
            };
            tokens.push((user.trim().to_owned(), token.trim().to_owned()));
        }
        Ok(Self { tokens })
    }

    fn get(&self, user: &str) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(id, _)| id == user)
            .map(|(_, token)| token.as_str())
    }
}

/// Who takes part in a run, with their tokens.
#[derive(Debug, Clone)]
pub struct Participants {
    pub admin: String,
    /// Buyers and their tokens, in a stable order.
    pub buyers: Vec<(String, String)>,
}

impl TokenSource {
    /// The admin's token and `buyers` buyers' tokens. Generated buyer names are
    /// `{prefix}-{n}`; a file supplies its own names.
    pub async fn participants(
        &self,
        client: &ApiClient,
        admin_user: &str,
        buyers: usize,
        prefix: &str,
        concurrency: usize,
    ) -> Result<Participants, TokenError> {
        match self {
            Self::File(file) => {
                let admin = file
                    .get(admin_user)
                    .ok_or_else(|| TokenError::Missing(admin_user.to_owned()))?
                    .to_owned();
                let unique: BTreeMap<&str, &str> = file
                    .tokens
                    .iter()
                    .filter(|(user, _)| user != admin_user)
                    .map(|(user, token)| (user.as_str(), token.as_str()))
                    .collect();
                let in_order: Vec<(String, String)> = file
                    .tokens
                    .iter()
                    .filter(|(user, _)| unique.contains_key(user.as_str()))
                    .take(buyers)
                    .cloned()
                    .collect();
                if in_order.len() < buyers {
                    return Err(TokenError::TooFewBuyers {
                        have: in_order.len(),
                        want: buyers,
                    });
                }
                Ok(Participants {
                    admin,
                    buyers: in_order,
                })
            }
            Self::Local | Self::Command(_) => {
                let admin = self.token_for(client, admin_user, true).await?;
                let buyers = stream::iter(0..buyers)
                    .map(|n| async move {
                        let buyer = format!("{prefix}-{n}");
                        let token = self.token_for(client, &buyer, false).await?;
                        Ok::<_, TokenError>((buyer, token))
                    })
                    .buffered(concurrency.max(1))
                    .try_collect()
                    .await?;
                Ok(Participants { admin, buyers })
            }
        }
    }

    async fn token_for(
        &self,
        client: &ApiClient,
        user: &str,
        admin: bool,
    ) -> Result<String, TokenError> {
        match self {
            Self::Local => Ok(client.local_token(user, admin).await?),
            Self::Command(template) => run_token_command(template, user).await,
            Self::File(file) => file
                .get(user)
                .map(str::to_owned)
                .ok_or_else(|| TokenError::Missing(user.to_owned())),
        }
    }
}

/// Runs the token command for one user: `{user_id}` is replaced by the user's id,
/// single-quoted for the shell, and the first line of stdout is the token.
async fn run_token_command(template: &str, user: &str) -> Result<String, TokenError> {
    let quoted = format!("'{}'", user.replace('\'', r"'\''"));
    let command = template.replace("{user_id}", &quoted);
    let failed = |detail: String| TokenError::Command {
        user: user.to_owned(),
        detail,
    };
    let output = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .output()
        .await
        .map_err(|error| failed(format!("cannot run `{command}`: {error}")))?;
    if !output.status.success() {
        return Err(failed(format!(
            "`{command}` exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| failed(format!("`{command}` printed no token")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> &'static Path {
        Path::new("tokens")
    }

    #[test]
    fn tab_separated_lines_skip_blanks_and_comments() {
        let file = TokenFile::parse(path(), "# minted today\nops\tA.B.C\n\nbob\tD.E.F\n").unwrap();
        assert_eq!(
            file.tokens,
            vec![
                ("ops".to_owned(), "A.B.C".to_owned()),
                ("bob".to_owned(), "D.E.F".to_owned())
            ]
        );
    }

    #[test]
    fn a_line_without_a_tab_is_named() {
        let error = TokenFile::parse(path(), "ops\tA\nbob D\n").unwrap_err();
        assert!(
            matches!(error, TokenError::BadLine { line: 2, .. }),
            "{error}"
        );
    }

    #[test]
    fn json_map_and_list_are_both_read() {
        let map = TokenFile::parse(path(), r#"{"ops": "A", "bob": "B"}"#).unwrap();
        assert_eq!(map.get("bob"), Some("B"));
        let list = TokenFile::parse(path(), r#"[{"user_id": "ops", "token": "A"}]"#).unwrap();
        assert_eq!(list.get("ops"), Some("A"));
        assert!(TokenFile::parse(path(), r#"{"ops": 3}"#).is_err());
    }

    #[tokio::test]
    async fn a_file_gives_the_admin_and_the_other_users_as_buyers() {
        let file = TokenFile::parse(path(), "b1\tT1\nops\tA\nb2\tT2\nb3\tT3\n").unwrap();
        let source = TokenSource::File(file);
        let client = ApiClient::new("http://127.0.0.1:9");
        let found = source
            .participants(&client, "ops", 2, "unused", 4)
            .await
            .unwrap();
        assert_eq!(found.admin, "A");
        assert_eq!(
            found.buyers,
            vec![("b1".into(), "T1".into()), ("b2".into(), "T2".into())]
        );
        let short = source.participants(&client, "ops", 4, "unused", 4).await;
        assert!(matches!(
            short,
            Err(TokenError::TooFewBuyers { have: 3, want: 4 })
        ));
    }

    #[tokio::test]
    async fn a_command_prints_each_users_token() {
        let source = TokenSource::Command("echo token-for-{user_id}".to_owned());
        let client = ApiClient::new("http://127.0.0.1:9");
        let found = source
            .participants(&client, "o'ps", 2, "load", 2)
            .await
            .unwrap();
        assert_eq!(found.admin, "token-for-o'ps");
        assert_eq!(
            found.buyers[1],
            ("load-1".into(), "token-for-load-1".into())
        );
        let failing = TokenSource::Command("exit 3".to_owned())
            .participants(&client, "ops", 1, "load", 1)
            .await;
        assert!(matches!(failing, Err(TokenError::Command { .. })));
    }
}
