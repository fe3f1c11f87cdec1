//! The upload request, as pure functions of the profile and the settings:
//! the same parts, event.json keys and headers as Datadog's exporter
//! (libdatadog's `libdd-profiling`, which the C++ ddprof uses), so that the
//! agent and the intake treat ddprof's profiles like any other.
//!
//! - multipart/form-data: a part `event` (file `event.json`,
//!   `application/json`), then a part `code-provenance.json` (same file
//!   name, zstd-compressed as libdatadog compresses the files it is given)
//!   when the profile has one, then a part `profile.pprof` (file
//!   `profile.pprof`): the pprof, zstd-compressed;
//! - event.json: `attachments`, `tags_profiler`, `start`, `end` (RFC 3339,
//!   UTC, nanoseconds), `family` (`native`), `version` (`4`),
//!   `endpoint_counts` (null), `process_tags`, `internal` (the profiler's own
//!   figures), `info`;
//! - headers: `DD-EVP-ORIGIN`, `DD-EVP-ORIGIN-VERSION`, `User-Agent`, and
//!   when known `Datadog-Container-ID`, `Datadog-Entity-ID`,
//!   `Datadog-External-Env`; `DD-API-KEY` for the intake.
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::entity::Entity;
use super::{ExportOptions, PeriodProfile, Tag};
use crate::identity::ServiceIdentity;

/// The profiler's name for the intake (`DD-EVP-ORIGIN`).
pub const ORIGIN: &str = "ddprof";
/// This profiler's version (`DD-EVP-ORIGIN-VERSION`, `profiler_version`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The profile family: native code.
pub const FAMILY: &str = "native";
/// The event format's version.
pub const EVENT_VERSION: &str = "4";
/// The multipart part names (also the file names).
pub const EVENT_PART: &str = "event";
pub const EVENT_FILE: &str = "event.json";
pub const PROFILE_PART: &str = "profile.pprof";
pub const CODE_PROVENANCE_PART: &str = "code-provenance.json";

/// The target this binary was built for, as `runtime_platform` says it.
pub fn runtime_platform() -> String {
    let libc = if cfg!(target_env = "musl") {
        "musl"
    } else {
        "gnu"
    };
    format!("{}-unknown-linux-{libc}", std::env::consts::ARCH)
}

/// What stays the same for every request of a run.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub options: ExportOptions,
    pub entity: Entity,
    /// The sampling engine in use (event.json `info`).
    pub engine: String,
    pub started: SystemTime,
    pub cpu_cores: usize,
}

/// A request ready to send: headers (without `Content-Type` and
/// `Content-Length`, which go with the body) and the multipart body.
#[derive(Clone)]
pub struct Request {
    pub headers: Vec<(&'static str, String)>,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Request {
    // Headers may hold the API key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("content_type", &self.content_type)
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// The CPU architecture as Datadog's profilers and backend name it (Go's
/// names, `amd64` and `arm64`, as the C++ ddprof sends them), not as Rust
/// does (`x86_64`, `aarch64`).
pub fn cpu_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The tags of one profile: the user's (service, env, version, `-T`),
/// with a process's own `service`, `env` and `version` instead for a
/// service's profile, then the profiler's own.
pub fn profile_tags(
    context: &RequestContext,
    service: Option<&ServiceIdentity>,
    sequence: u64,
) -> Vec<Tag> {
    let mut tags = context.options.tags.clone();
    if let Some(identity) = service {
        tags.retain(|tag| !matches!(tag.key.as_str(), "service" | "env" | "version"));
        let own = [
            ("service", Some(&identity.service)),
            ("env", identity.env.as_ref()),
            ("version", identity.version.as_ref()),
        ];
        for (at, (key, value)) in own.into_iter().enumerate() {
            if let Some(value) = value {
                tags.insert(at.min(tags.len()), Tag::new(key, value.clone()));
            }
        }
    }
    tags.extend([
        Tag::new("language", "native"),
        Tag::new("profiler_version", VERSION),
        // A service's profile: its tracer's runtime id (`service.instance.id`).
        Tag::new(
            "runtime-id",
            service
                .and_then(|identity| identity.instance_id.clone())
                .unwrap_or_else(|| context.options.runtime_id.clone()),
        ),
        Tag::new("runtime_platform", runtime_platform()),
        Tag::new("cpu_arch", cpu_arch()),
        Tag::new("number_of_cpu_cores", context.cpu_cores.to_string()),
        Tag::new("profile_seq", sequence.to_string()),
        Tag::new("include_kernel", context.options.include_kernel.to_string()),
        // As the C++ ddprof: the samples' `container_id` label is a
        // context the backend may split the profile by.
        Tag::new("ddprof.custom_ctx", "container_id"),
    ]);
    tags
}

/// Tags joined as the intake reads them: `key:value,key:value`.
pub fn join_tags(tags: &[Tag]) -> String {
    tags.iter()
        .map(Tag::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// event.json for one profile. `dropped_profiles`: profiles dropped from
/// the queue since the previous one that went out.
pub fn event_json(
    context: &RequestContext,
    profile: &PeriodProfile,
    sequence: u64,
    dropped_profiles: u64,
) -> String {
    let figures = &profile.figures;
    let kernel = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
            .map(|text| text.trim().to_string())
            .unwrap_or_default()
    };
    // As libdatadog lists them: the other files, then the profile.
    let attachments: Vec<&str> = profile
        .code_provenance_json
        .as_ref()
        .map(|_| CODE_PROVENANCE_PART)
        .into_iter()
        .chain([PROFILE_PART])
        .collect();
    json!({
        "attachments": attachments,
        "tags_profiler": join_tags(&profile_tags(context, profile.service.as_ref(), sequence)),
        "start": crate::timestamp::rfc3339_nanos(profile.start),
        "end": crate::timestamp::rfc3339_nanos(profile.end),
        "family": FAMILY,
        "version": EVENT_VERSION,
        "endpoint_counts": null,
        "process_tags": join_tags(&context.options.process_tags),
        "internal": {
            "samples": figures.samples,
            "lost_samples": figures.lost,
            "truncated_samples": figures.truncated,
            "profiler_cpu_nanos": figures.profiler_cpu_nanos,
            "profiler_rss_kib": figures.rss_kib,
            "profiler_peak_rss_kib": figures.peak_rss_kib,
            "dropped_profiles": dropped_profiles,
            "profile_seq": sequence,
        },
        "info": {
            "application": {
                "start_time": crate::timestamp::rfc3339_nanos(context.started),
            },
            "platform": {
                "kernel": {
                    "name": kernel("ostype"),
                    "release": kernel("osrelease"),
                    "version": kernel("version"),
                },
            },
            "profiler": {
                "version": VERSION,
                "engine": context.engine,
            },
        },
    })
    .to_string()
}

/// The headers of a request (the body's own come with it): the entity
/// headers are the target's, or for a service's profile its processes'
/// container's (none when they run in none).
pub fn headers(context: &RequestContext, profile: &PeriodProfile) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("User-Agent", format!("ddprof/{VERSION}")),
        ("DD-EVP-ORIGIN", ORIGIN.to_string()),
        ("DD-EVP-ORIGIN-VERSION", VERSION.to_string()),
        // As libdatadog: one request per connection, none left half-open
        // with an agent that restarts.
        ("Connection", "close".to_string()),
    ];
    let (container_id, entity_id) = match &profile.service {
        Some(service) => (
            service.container_id.clone(),
            service.container_id.as_ref().map(|id| format!("ci-{id}")),
        ),
        None => (
            context.entity.container_id.clone(),
            context.entity.entity_id.clone(),
        ),
    };
    if let Some(id) = container_id {
        headers.push(("Datadog-Container-ID", id));
    }
    if let Some(id) = entity_id {
        headers.push(("Datadog-Entity-ID", id));
    }
    if let Some(env) = &context.options.external_env {
        headers.push(("Datadog-External-Env", env.clone()));
    }
    if let Some(key) = context.options.endpoint.api_key() {
        headers.push(("DD-API-KEY", key.expose().to_string()));
    }
    headers
}

/// The whole request for one profile.
pub fn build(
    context: &RequestContext,
    profile: &PeriodProfile,
    sequence: u64,
    dropped_profiles: u64,
) -> Request {
    let event = event_json(context, profile, sequence, dropped_profiles);
    let code_provenance = profile.code_provenance_json.as_ref().map(|json| {
        // Compressing a few KB of JSON into memory cannot fail; sent as it
        // is if it did.
        zstd::bulk::compress(json, crate::profile::UPLOAD_ZSTD_LEVEL)
            .unwrap_or_else(|_| json.clone())
    });
    let mut files: Vec<(&str, &[u8])> = Vec::with_capacity(2);
    if let Some(code_provenance) = &code_provenance {
        files.push((CODE_PROVENANCE_PART, code_provenance));
    }
    files.push((PROFILE_PART, &profile.pprof_zstd));
    let (content_type, body) = multipart_body(&event, &files);
    Request {
        headers: headers(context, profile),
        content_type,
        body,
    }
}

/// `multipart/form-data` with the event, then each file (its part named
/// as the file); returns the `Content-Type` (with its boundary) and the
/// body.
pub fn multipart_body(event_json: &str, files: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    // A random boundary that occurs in no part.
    let boundary = loop {
        let boundary = format!("ddprof-{}", random_hex(16));
        let needle = boundary.as_bytes();
        let occurs = |bytes: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
        if !occurs(event_json.as_bytes()) && !files.iter().any(|(_, bytes)| occurs(bytes)) {
            break boundary;
        }
    };
    let file_bytes: usize = files.iter().map(|(_, bytes)| bytes.len() + 256).sum();
    let mut body = Vec::with_capacity(event_json.len() + file_bytes + 256);
    let mut part = |name: &str, file: &str, content_type: &str, bytes: &[u8]| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{file}\"\r\nContent-Type: {content_type}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    };
    part(
        EVENT_PART,
        EVENT_FILE,
        "application/json",
        event_json.as_bytes(),
    );
    for (name, bytes) in files {
        part(name, name, "application/octet-stream", bytes);
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// `bytes` random bytes as hex (from the kernel's generator; the clock
/// and PID if it cannot be read).
pub fn random_hex(bytes: usize) -> String {
    random_bytes(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn random_bytes(count: usize) -> Vec<u8> {
    use std::io::Read;
    let mut bytes = vec![0u8; count];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut file| file.read_exact(&mut bytes));
    if read.is_err() {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64
            ^ ((std::process::id() as u64) << 32);
        let mut state = seed | 1;
        for byte in &mut bytes {
            // xorshift64: enough to tell runs apart.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
    }
    bytes
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`, e.g.
/// `0-3,6`): not this thread's affinity, which may be one CPU.
pub fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| count_cpu_list(text.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |cores| cores.get()))
}

/// The number of CPUs in a kernel CPU list (`0-3,6` → 5).
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for range in list.split(',').filter(|range| !range.is_empty()) {
        count += match range.split_once('-') {
            Some((first, last)) => {
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                last.checked_sub(first)? + 1
            }
            None => {
                range.parse::<usize>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// A random (version 4) UUID: a run's `runtime-id`.
pub fn new_runtime_id() -> String {
    let mut bytes = random_bytes(16);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Endpoint, PeriodFigures, QueueBounds};
    use std::time::Duration;

    fn context(endpoint: Endpoint) -> RequestContext {
        RequestContext {
            options: ExportOptions {
                endpoint,
                tags: vec![Tag::new("service", "svc"), Tag::new("team", "core")],
                runtime_id: "6f6d0b4a-2b7e-4a8d-9e0f-0123456789ab".into(),
                process_tags: vec![Tag::new("entrypoint.name", "chain")],
                timeout: Duration::from_secs(10),
                queue: QueueBounds::default(),
                exit_grace: Duration::from_secs(5),
                include_kernel: false,
                external_env: Some("it-false,cn-app".into()),
            },
            entity: Entity {
                container_id: None,
                entity_id: Some("in-1".into()),
            },
            engine: "perf".into(),
            started: UNIX_EPOCH,
            cpu_cores: 2,
        }
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-3,6"), Some(5));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("x"), None);
        assert!(online_cpus() >= 1);
    }

    #[test]
    fn runtime_ids_are_uuids() {
        let id = new_runtime_id();
        let lengths: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(lengths, [8, 4, 4, 4, 12], "{id}");
        assert_eq!(&id[14..15], "4", "{id}");
        assert_ne!(id, new_runtime_id());
    }

    #[test]
    fn a_services_profile_goes_out_under_its_own_tags() {
        let context = context(Endpoint::agent("http://127.0.0.1:1"));
        let identity = ServiceIdentity {
            service: "checkout".into(),
            env: Some("prod".into()),
            version: None,
            instance_id: None,
            container_id: None,
        };
        let tags = join_tags(&profile_tags(&context, Some(&identity), 1));
        assert!(
            tags.starts_with("service:checkout,env:prod,team:core,language:native,"),
            "{tags}"
        );
        let run = join_tags(&profile_tags(&context, None, 1));
        assert!(run.starts_with("service:svc,team:core,"), "{run}");
    }

    #[test]
    fn event_json_has_the_exporter_keys() {
        let profile = PeriodProfile {
            start: UNIX_EPOCH + Duration::from_secs(10),
            end: UNIX_EPOCH + Duration::from_secs(69),
            pprof_zstd: vec![0x28, 0xb5, 0x2f, 0xfd],
            code_provenance_json: None,
            service: None,
            figures: PeriodFigures {
                samples: 5,
                ..PeriodFigures::default()
            },
        };
        let context = context(Endpoint::agent("http://127.0.0.1:1"));
        let event: serde_json::Value =
            serde_json::from_str(&event_json(&context, &profile, 3, 2)).unwrap();
        let keys: Vec<&str> = event
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "attachments",
                "end",
                "endpoint_counts",
                "family",
                "info",
                "internal",
                "process_tags",
                "start",
                "tags_profiler",
                "version"
            ]
        );
        assert_eq!(event["start"], "1970-01-01T00:00:10.000000000Z");
        assert_eq!(event["internal"]["dropped_profiles"], 2);
        assert_eq!(event["internal"]["samples"], 5);
        let tags = event["tags_profiler"].as_str().unwrap();
        assert!(
            tags.starts_with("service:svc,team:core,language:native,"),
            "{tags}"
        );
        assert!(
            tags.ends_with(",profile_seq:3,include_kernel:false,ddprof.custom_ctx:container_id"),
            "{tags}"
        );
        assert!(tags.contains("runtime-id:6f6d0b4a-2b7e-4a8d-9e0f-0123456789ab"));
    }

    #[test]
    fn the_body_holds_both_parts_and_the_key_only_goes_in_a_header() {
        let key = "0123456789abcdef0123456789abcdef";
        let context = context(Endpoint::Agentless {
            site: "datadoghq.com".into(),
            api_key: crate::export::ApiKey::new(key).unwrap(),
        });
        let profile = PeriodProfile {
            start: UNIX_EPOCH,
            end: UNIX_EPOCH,
            pprof_zstd: b"\x28\xb5\x2f\xfdpprof".to_vec(),
            code_provenance_json: Some(br#"{"v1":[]}"#.to_vec()),
            service: None,
            figures: PeriodFigures::default(),
        };
        let request = build(&context, &profile, 0, 0);
        let boundary = request
            .content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        let body = String::from_utf8_lossy(&request.body);
        assert_eq!(body.matches(&format!("--{boundary}\r\n")).count(), 3);
        assert!(body.contains("name=\"code-provenance.json\"; filename=\"code-provenance.json\""));
        // The event lists the files as libdatadog does: the profile last.
        let event = event_json(&context, &profile, 0, 0);
        let event: serde_json::Value = serde_json::from_str(&event).unwrap();
        assert_eq!(
            event["attachments"],
            serde_json::json!(["code-provenance.json", "profile.pprof"])
        );
        assert!(body.ends_with(&format!("--{boundary}--\r\n")));
        assert!(body
            .contains("name=\"event\"; filename=\"event.json\"\r\nContent-Type: application/json"));
        assert!(body.contains("name=\"profile.pprof\"; filename=\"profile.pprof\""));
        assert!(!body.contains(key));
        assert!(request
            .headers
            .iter()
            .any(|(name, value)| *name == "DD-API-KEY" && value == key));
        assert!(!format!("{request:?}").contains(key));
    }
}
