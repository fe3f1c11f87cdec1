//! The export settings, resolved from the command line and the environment
//! once, at start, into a typed [`ExportOptions`] (the export stage never
//! sees [`Cli`]). Each error is one line naming the setting to fix.
//!
//! Read only from the environment (never flags, never printed by
//! `--show-config`, `--print-config`): `DD_API_KEY`, `DD_PROFILING_RUNTIME_ID` (overrides the
//! run's random `runtime-id`), `DD_EXTERNAL_ENV` and `DD_HOSTNAME` (the
//! `host` tag; without it there is none).
use std::time::Duration;

use super::Cli;
use crate::export::endpoint::ApiKeyError;
use crate::export::{request, ApiKey, Endpoint, ExportOptions, QueueBounds, Tag};

/// The site of agentless uploads when `--site`/`DD_SITE` is not set.
pub const DEFAULT_SITE: &str = "datadoghq.com";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportConfigError {
    #[error(
        "--agentless (DD_PROFILING_AGENTLESS) needs an API key: set DD_API_KEY, or give an \
         agent with -U/DD_TRACE_AGENT_URL instead"
    )]
    MissingApiKey,
    #[error("DD_API_KEY: {0}")]
    BadApiKey(ApiKeyError),
    #[error(
        "--site (DD_SITE): `{0}` is not a Datadog site (expected a domain such as datadoghq.com \
         or datadoghq.eu)"
    )]
    BadSite(String),
    #[error(
        "DD_PROFILING_RUNTIME_ID: `{0}` is not usable in a tag (letters, digits, `-`, `_`, `.`)"
    )]
    BadRuntimeId(String),
    #[error("DD_HOSTNAME: `{0}` is not usable in a tag (no `,` or spaces)")]
    BadHostname(String),
}

/// The export settings, or `None` when there is nowhere to upload to.
/// `environment` reads a variable (empty counts as unset).
pub fn export_options(
    cli: &Cli,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ExportOptions>, ExportConfigError> {
    let variable = |name: &str| environment(name).filter(|value| !value.trim().is_empty());
    let endpoint = if cli.agentless {
        let site = cli.site.clone().unwrap_or_else(|| DEFAULT_SITE.to_string());
        let site_ok = site.contains('.')
            && site
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
        if !site_ok {
            return Err(ExportConfigError::BadSite(site));
        }
        let key = variable("DD_API_KEY").ok_or(ExportConfigError::MissingApiKey)?;
        let api_key = ApiKey::new(&key).map_err(ExportConfigError::BadApiKey)?;
        Endpoint::Agentless { site, api_key }
    } else {
        match cli.agent_url() {
            Some(url) => Endpoint::agent(&url),
            None => return Ok(None),
        }
    };
    let tag_safe = |text: &str| {
        text.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
    };
    let runtime_id = match variable("DD_PROFILING_RUNTIME_ID") {
        Some(id) if tag_safe(id.trim()) => id.trim().to_string(),
        Some(id) => return Err(ExportConfigError::BadRuntimeId(id)),
        None => request::new_runtime_id(),
    };
    let mut tags = vec![Tag::new("service", cli.service_name())];
    if let Some(env) = &cli.environment {
        tags.push(Tag::new("env", env.clone()));
    }
    if let Some(version) = &cli.service_version {
        tags.push(Tag::new("version", version.clone()));
    }
    if let Some(host) = variable("DD_HOSTNAME") {
        if !tag_safe(host.trim()) {
            return Err(ExportConfigError::BadHostname(host));
        }
        tags.push(Tag::new("host", host.trim()));
    }
    // `-T`/`DD_TAGS` were checked when read (`key:value`, comma-separated).
    if let Some(user_tags) = &cli.tags {
        for tag in user_tags.split(',').map(str::trim) {
            if let Some((key, value)) = tag.split_once(':') {
                tags.push(Tag::new(key.trim(), value.trim()));
            }
        }
    }
    let process_tags = cli
        .command
        .first()
        .and_then(|command| std::path::Path::new(command).file_name())
        .map(|name| vec![Tag::new("entrypoint.name", name.to_string_lossy())])
        .unwrap_or_default();
    Ok(Some(ExportOptions {
        endpoint,
        tags,
        runtime_id,
        process_tags,
        timeout: Duration::from_secs(cli.upload_timeout),
        queue: QueueBounds {
            profiles: cli.upload_queue_profiles as usize,
            bytes: (cli.upload_queue_mib as usize) << 20,
        },
        exit_grace: Duration::from_secs(cli.upload_exit_grace),
        include_kernel: super::resolve::kernel_stacks(cli),
        external_env: variable("DD_EXTERNAL_ENV"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn resolve(
        args: &[&str],
        environment: &[(&str, &str)],
    ) -> Result<Option<ExportOptions>, ExportConfigError> {
        let mut all = vec!["ddprof"];
        all.extend(args);
        let cli = Cli::parse_from(all);
        let environment: Vec<(String, String)> = environment
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        export_options(&cli, &move |name| {
            environment
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        })
    }

    #[test]
    fn no_agent_no_export() {
        assert_eq!(resolve(&["true"], &[]).map(|o| o.is_none()), Ok(true));
    }

    #[test]
    fn agent_tags_and_bounds_are_resolved() {
        let options = resolve(
            &[
                "-U",
                "/run/apm.sock",
                "-E",
                "prod",
                "-T",
                "team:core,region:eu",
                "--upload-queue-profiles",
                "3",
                "/usr/bin/chain",
            ],
            &[
                ("DD_PROFILING_RUNTIME_ID", "run-1"),
                ("DD_EXTERNAL_ENV", "it-false"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            options.endpoint,
            Endpoint::AgentSocket {
                path: "/run/apm.sock".into()
            }
        );
        let tags: Vec<String> = options.tags.iter().map(Tag::to_string).collect();
        assert_eq!(
            tags,
            ["service:chain", "env:prod", "team:core", "region:eu"]
        );
        assert_eq!(options.runtime_id, "run-1");
        assert_eq!(options.queue.profiles, 3);
        assert_eq!(options.queue.bytes, 32 << 20);
        assert_eq!(options.timeout, Duration::from_secs(10));
        assert_eq!(options.exit_grace, Duration::from_secs(5));
        assert_eq!(options.external_env.as_deref(), Some("it-false"));
        assert_eq!(
            options.process_tags,
            vec![Tag::new("entrypoint.name", "chain")]
        );
    }

    #[test]
    fn agentless_needs_a_well_formed_key() {
        assert_eq!(
            resolve(&["--agentless", "true"], &[]).unwrap_err(),
            ExportConfigError::MissingApiKey
        );
        let short = resolve(&["--agentless", "true"], &[("DD_API_KEY", "abc123")]).unwrap_err();
        let message = short.to_string();
        assert!(message.starts_with("DD_API_KEY: "), "{message}");
        assert!(!message.contains("abc123"), "{message}");
        let key = "0123456789abcdef0123456789abcdef";
        let options = resolve(
            &["--agentless", "--site", "datadoghq.eu", "true"],
            &[("DD_API_KEY", key)],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            options.endpoint.url(),
            "https://intake.profile.datadoghq.eu/api/v2/profile"
        );
        assert!(!format!("{options:?}").contains(key));
        assert!(matches!(
            resolve(
                &["--agentless", "--site", "no site", "true"],
                &[("DD_API_KEY", key)]
            ),
            Err(ExportConfigError::BadSite(_))
        ));
    }
}
