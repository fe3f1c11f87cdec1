//! Where profiles go: the agent over HTTP(S) or a Unix socket, or the
//! intake directly with an API key.
use std::path::PathBuf;

/// The path the agent takes profiles on.
pub const AGENT_PROFILE_PATH: &str = "/profiling/v1/input";
/// The shortest API key accepted (Datadog's keys are 32 characters).
pub const MIN_API_KEY_LENGTH: usize = 32;

/// A Datadog API key. Its `Debug` and `Display` never show it: it must not
/// reach a log line or `--show-config`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Checks the key's shape (the intake would refuse it anyway).
    pub fn new(key: &str) -> Result<Self, ApiKeyError> {
        let key = key.trim();
        if key.is_empty() {
            return Err(ApiKeyError::Missing);
        }
        if key.len() < MIN_API_KEY_LENGTH || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(ApiKeyError::Malformed { length: key.len() });
        }
        Ok(Self(key.to_string()))
    }

    /// The key itself, for the `DD-API-KEY` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiKeyError {
    #[error("no key given")]
    Missing,
    #[error(
        "a {length}-character value is not an API key (expected {MIN_API_KEY_LENGTH} \
         letters and digits: copy it from Organization Settings > API Keys)"
    )]
    Malformed { length: usize },
}

/// Where the uploader sends profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The agent over HTTP(S): `base` is `http://host:port` or
    /// `https://host[:port]` with an optional path prefix.
    Agent { base: String },
    /// The agent on a Unix socket.
    AgentSocket { path: PathBuf },
    /// The intake, without an agent.
    Agentless { site: String, api_key: ApiKey },
}

impl Endpoint {
    /// The endpoint of an agent URL as `-U` accepts it (`unix:///PATH` or
    /// a bare `/PATH` is a Unix socket).
    pub fn agent(url: &str) -> Self {
        if let Some(path) = url.strip_prefix("unix://") {
            return Endpoint::AgentSocket { path: path.into() };
        }
        if url.starts_with('/') {
            return Endpoint::AgentSocket { path: url.into() };
        }
        Endpoint::Agent {
            base: url.trim_end_matches('/').to_string(),
        }
    }

    /// The URL requests are made to. For a Unix socket the host part is
    /// only the `Host` header's value (libdatadog's exporter sends
    /// `localhost` too).
    pub fn url(&self) -> String {
        match self {
            Endpoint::Agent { base } => format!("{base}{AGENT_PROFILE_PATH}"),
            Endpoint::AgentSocket { .. } => format!("http://localhost{AGENT_PROFILE_PATH}"),
            Endpoint::Agentless { site, .. } => {
                format!("https://intake.profile.{site}/api/v2/profile")
            }
        }
    }

    /// For log lines: the URL, or the socket path (never the key).
    pub fn describe(&self) -> String {
        match self {
            Endpoint::AgentSocket { path } => format!("unix://{}", path.display()),
            other => other.url(),
        }
    }

    pub fn api_key(&self) -> Option<&ApiKey> {
        match self {
            Endpoint::Agentless { api_key, .. } => Some(api_key),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_urls_become_endpoints() {
        assert_eq!(
            Endpoint::agent("http://localhost:8126/").url(),
            "http://localhost:8126/profiling/v1/input"
        );
        assert_eq!(
            Endpoint::agent("unix:///var/run/datadog/apm.socket"),
            Endpoint::AgentSocket {
                path: "/var/run/datadog/apm.socket".into()
            }
        );
        assert_eq!(
            Endpoint::agent("/run/apm.sock").describe(),
            "unix:///run/apm.sock"
        );
    }

    #[test]
    fn the_api_key_never_prints() {
        let key = ApiKey::new("0123456789abcdef0123456789abcdef").unwrap();
        let endpoint = Endpoint::Agentless {
            site: "datadoghq.eu".into(),
            api_key: key.clone(),
        };
        for shown in [
            format!("{key}"),
            format!("{key:?}"),
            format!("{endpoint:?}"),
            endpoint.describe(),
        ] {
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
        }
        assert_eq!(
            endpoint.url(),
            "https://intake.profile.datadoghq.eu/api/v2/profile"
        );
        assert_eq!(ApiKey::new(" "), Err(ApiKeyError::Missing));
        assert_eq!(
            ApiKey::new("short"),
            Err(ApiKeyError::Malformed { length: 5 })
        );
    }
}
