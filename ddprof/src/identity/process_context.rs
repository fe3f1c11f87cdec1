//! A process's OpenTelemetry process context (OTEP 4719): the resource
//! attributes an SDK publishes in a mapping named `OTEL_CTX` (a memfd,
//! `/memfd:OTEL_CTX`, or a named anonymous mapping,
//! `[anon_shmem:OTEL_CTX]`): a header (`"OTEL_CTX"`, version 2, the
//! payload's size, the time it was published, a pointer to the payload)
//! and the payload, a `ProcessContext` (protobuf): an OTLP `Resource`
//! (field 1) and further attributes (field 2), among them the schema of
//! the threads' contexts (OTEP 4947: `threadlocal.schema_version`,
//! `threadlocal.attribute_key_map`).
//!
//! Everything here is the process's to choose: the mapping is found in its
//! `maps`, the header and payload are read through `/proc/PID/mem`, the
//! payload only from the context's own mapping or the process's private
//! anonymous memory (never a file's pages, which a hung mount could keep
//! from answering) and at most [`MAX_PAYLOAD_BYTES`], the whole read under
//! a time bound; the header is read again after the payload and a read
//! during an update (another publication time) is dropped, as the OTEP's
//! reading protocol says.
use std::os::unix::fs::FileExt;
use std::time::Duration;

use super::{tag_value, ServiceIdentity};
use crate::files::bounded;
use crate::process::MapsLine;

/// The longest one process's read may take.
pub const READ_BOUND: Duration = Duration::from_millis(250);
/// A payload is read up to this size.
pub const MAX_PAYLOAD_BYTES: u32 = 64 << 10;
/// `maps` lines looked at (a process with more has no context found).
const MAX_MAPS_LINES: usize = 100_000;
const HEADER_BYTES: usize = 32;
const SIGNATURE: &[u8; 8] = b"OTEL_CTX";
const VERSION: u32 = 2;

/// `pid`'s published service (`None`: it publishes none this reader
/// takes); `Err` when the read overran [`READ_BOUND`].
pub fn of_process(pid: u32) -> Result<Option<ServiceIdentity>, bounded::Unanswered> {
    bounded::run(READ_BOUND, move || identity(&read(pid)?))
}

/// The names of the attribute keys `pid`'s threads' contexts use, by key
/// index (`None`: it publishes no schema this reader takes); `Err` when
/// the read overran [`READ_BOUND`].
pub fn thread_context_keys(pid: u32) -> Result<Option<Vec<String>>, bounded::Unanswered> {
    bounded::run(READ_BOUND, move || thread_keys(&read(pid)?))
}

/// The payload `pid` publishes, read as the OTEP's protocol says.
fn read(pid: u32) -> Option<Vec<u8>> {
    use std::io::BufRead;
    let maps = std::fs::File::open(format!("/proc/{pid}/maps")).ok()?;
    let mut context = None;
    let mut anonymous = Vec::new();
    for line in std::io::BufReader::new(maps)
        .split(b'\n')
        .take(MAX_MAPS_LINES)
        .map_while(Result::ok)
    {
        let line = String::from_utf8_lossy(&line);
        let Some(line) = MapsLine::parse(&line) else {
            continue;
        };
        if is_context_mapping(&line) {
            context.get_or_insert((line.start, line.end));
        } else if is_private_anonymous(&line) {
            anonymous.push((line.start, line.end));
        }
    }
    let (start, end) = context?;
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let header = |memory: &std::fs::File| -> Option<Header> {
        let mut bytes = [0u8; HEADER_BYTES];
        (end - start >= HEADER_BYTES as u64).then_some(())?;
        memory.read_exact_at(&mut bytes, start).ok()?;
        Header::parse(&bytes)
    };
    let first = header(&memory)?;
    let payload_end = first.payload.checked_add(u64::from(first.size))?;
    let inside = |&(from, to): &(u64, u64)| from <= first.payload && payload_end <= to;
    if !inside(&(start, end)) && !anonymous.iter().any(inside) {
        return None;
    }
    let mut payload = vec![0u8; first.size as usize];
    memory.read_exact_at(&mut payload, first.payload).ok()?;
    // Published again while it was read: this read is not one state.
    if header(&memory)? != first {
        return None;
    }
    Some(payload)
}

/// The header, if it says a context is published (and not being updated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    size: u32,
    published_at_ns: u64,
    payload: u64,
}

impl Header {
    fn parse(bytes: &[u8; HEADER_BYTES]) -> Option<Self> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let header = Self {
            size: u32_at(12),
            published_at_ns: u64_at(16),
            payload: u64_at(24),
        };
        (&bytes[..8] == SIGNATURE
            && u32_at(8) == VERSION
            && header.published_at_ns != 0
            && header.size <= MAX_PAYLOAD_BYTES)
            .then_some(header)
    }
}

/// The part of a `ProcessContext` read here (with prost, as the profile is
/// written: fields not declared are skipped): its resource's attributes
/// and its further attributes, each a `KeyValue` whose `AnyValue` is read
/// as a string or an array of strings. Strings are taken as bytes, so that
/// one attribute that is not UTF-8 costs only itself.
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessContext {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub extra_attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(bytes = "vec", optional, tag = "1")]
        pub string_value: Option<Vec<u8>>,
        #[prost(message, optional, tag = "5")]
        pub array_value: Option<ArrayValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ArrayValue {
        #[prost(message, repeated, tag = "1")]
        pub values: Vec<AnyValue>,
    }
}

/// The thread context schema this reader takes (the one libdatadog's and
/// the OpenTelemetry eBPF profiler's readers take).
const THREAD_CONTEXT_SCHEMA: &str = "tlsdesc_v1_dev";
/// Key names taken (a key index is one byte).
const MAX_THREAD_CONTEXT_KEYS: usize = 256;
/// The longest key name taken (a longer one refuses the whole map).
const MAX_THREAD_CONTEXT_KEY_BYTES: usize = crate::trace_context::MAX_KEY_BYTES;

/// The thread contexts' key names a payload publishes: `None` unless it
/// names the schema read here once, and its key map (if any) is an array
/// of non-empty strings of at most 128 bytes. A schema without a key map
/// has no keys.
pub fn thread_keys(payload: &[u8]) -> Option<Vec<String>> {
    let context = <otlp::ProcessContext as prost::Message>::decode(payload).ok()?;
    let extra = &context.extra_attributes;
    let named = |key: &'static str| extra.iter().filter(move |pair| pair.key == key.as_bytes());
    let mut schemas = named("threadlocal.schema_version");
    let schema = schemas.next()?.value.as_ref()?.string_value.as_deref()?;
    if schema != THREAD_CONTEXT_SCHEMA.as_bytes() || schemas.next().is_some() {
        return None;
    }
    let mut maps = named("threadlocal.attribute_key_map");
    let Some(map) = maps.next() else {
        return Some(Vec::new());
    };
    if maps.next().is_some() {
        return None;
    }
    map.value
        .as_ref()?
        .array_value
        .as_ref()?
        .values
        .iter()
        .take(MAX_THREAD_CONTEXT_KEYS)
        .map(|value| {
            let key = std::str::from_utf8(value.string_value.as_deref()?).ok()?;
            (!key.is_empty() && key.len() <= MAX_THREAD_CONTEXT_KEY_BYTES).then(|| key.to_string())
        })
        .collect()
}

/// The service in a `ProcessContext`'s resource attributes (none when the SDK was
/// given no service: `unknown_service…`, or the payload does not decode):
/// `service.name`, `deployment.environment.name` (or the older
/// `deployment.environment`), `service.version`, `service.instance.id`
/// (string values only).
pub fn identity(payload: &[u8]) -> Option<ServiceIdentity> {
    let context = <otlp::ProcessContext as prost::Message>::decode(payload).ok()?;
    let resource = context.resource?;
    let attribute = |key: &str| {
        resource
            .attributes
            .iter()
            .filter(|pair| pair.key == key.as_bytes())
            .find_map(|pair| std::str::from_utf8(pair.value.as_ref()?.string_value.as_ref()?).ok())
            .and_then(tag_value)
    };
    Some(ServiceIdentity {
        service: attribute("service.name").filter(|name| !name.starts_with("unknown_service"))?,
        env: attribute("deployment.environment.name")
            .or_else(|| attribute("deployment.environment")),
        version: attribute("service.version"),
        instance_id: attribute("service.instance.id"),
        container_id: None,
    })
}

/// A `maps` line of the context's mapping: shared, named exactly as a
/// memfd `OTEL_CTX` (always unlinked: ` (deleted)`) or a named shared
/// anonymous mapping; not a file a process named so, whose pages a hung
/// mount could keep from answering.
fn is_context_mapping(line: &MapsLine) -> bool {
    line.is_shared()
        && (line.path == "/memfd:OTEL_CTX (deleted)" || line.path == "[anon_shmem:OTEL_CTX]")
}

/// A `maps` line of private anonymous memory (no file).
fn is_private_anonymous(line: &MapsLine) -> bool {
    line.is_private_unbacked()
        && (line.path.is_empty() || line.path.starts_with("[anon:") || line.path == "[heap]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn attribute(key: &str, value: &str) -> Vec<u8> {
        let any = field(1, value.as_bytes());
        let mut key_value = field(1, key.as_bytes());
        key_value.extend(field(2, &any));
        field(1, &key_value)
    }

    #[test]
    fn the_service_is_read_from_a_resource_and_garbage_is_refused() {
        let mut resource = attribute("service.name", "checkout");
        resource.extend(attribute("deployment.environment.name", "prod"));
        resource.extend(attribute("service.instance.id", "i-1"));
        // dropped_attributes_count = 2, a number field between them.
        resource.extend([2 << 3, 5]);
        resource.extend(attribute("service.version", "1.2"));
        let payload = field(1, &resource);
        assert_eq!(
            identity(&payload),
            Some(ServiceIdentity {
                service: "checkout".into(),
                env: Some("prod".into()),
                version: Some("1.2".into()),
                instance_id: Some("i-1".into()),
                container_id: None,
            })
        );
        assert_eq!(
            identity(&field(1, &attribute("service.version", "1"))),
            None
        );
        // An SDK given no service publishes `unknown_service[:exe]`: none.
        assert_eq!(
            identity(&field(
                1,
                &attribute("service.name", "unknown_service:java")
            )),
            None
        );
        // A bare resource (not in a ProcessContext) is not this version's.
        assert_eq!(identity(&resource), None);
        // Every truncation of it is read without a panic.
        for end in 0..payload.len() {
            let _ = identity(&payload[..end]);
        }
        assert_eq!(identity(&[0xff; 16]), None);
    }

    /// An extra attribute (`ProcessContext` field 2) with a string value,
    /// or with an array of strings.
    fn extra(key: &str, value: &str) -> Vec<u8> {
        let mut key_value = field(1, key.as_bytes());
        key_value.extend(field(2, &field(1, value.as_bytes())));
        field(2, &key_value)
    }

    fn extra_array(key: &str, values: &[&str]) -> Vec<u8> {
        let array: Vec<u8> = values
            .iter()
            .flat_map(|value| field(1, &field(1, value.as_bytes())))
            .collect();
        let mut key_value = field(1, key.as_bytes());
        key_value.extend(field(2, &field(5, &array)));
        field(2, &key_value)
    }

    #[test]
    fn the_thread_context_schema_and_keys_are_read_beside_the_resource() {
        // As dd-trace-rb appends them to libdatadog's payload.
        let mut payload = field(1, &attribute("service.name", "checkout"));
        payload.extend(extra("threadlocal.schema_version", "tlsdesc_v1_dev"));
        payload.extend(extra_array(
            "threadlocal.attribute_key_map",
            &["datadog.local_root_span_id", "http.route"],
        ));
        assert_eq!(
            thread_keys(&payload),
            Some(vec![
                "datadog.local_root_span_id".into(),
                "http.route".into()
            ])
        );
        assert_eq!(
            identity(&payload).map(|found| found.service),
            Some("checkout".into())
        );
        // A schema without a key map: no keys; no schema, another schema, or
        // a key map that is not strings: nothing.
        let schema_only = extra("threadlocal.schema_version", "tlsdesc_v1_dev");
        assert_eq!(thread_keys(&schema_only), Some(Vec::new()));
        assert_eq!(
            thread_keys(&field(1, &attribute("service.name", "a"))),
            None
        );
        assert_eq!(
            thread_keys(&extra("threadlocal.schema_version", "v9")),
            None
        );
        let mut empty_key = schema_only.clone();
        empty_key.extend(extra_array("threadlocal.attribute_key_map", &["a", ""]));
        assert_eq!(thread_keys(&empty_key), None);
        let mut twice = schema_only.clone();
        twice.extend(schema_only.clone());
        assert_eq!(thread_keys(&twice), None);
        for end in 0..payload.len() {
            let _ = thread_keys(&payload[..end]);
        }
    }

    #[test]
    fn a_header_is_taken_only_when_published_in_this_version() {
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(SIGNATURE);
        header[8..12].copy_from_slice(&2u32.to_le_bytes());
        header[12..16].copy_from_slice(&100u32.to_le_bytes());
        header[16..24].copy_from_slice(&7u64.to_le_bytes());
        header[24..32].copy_from_slice(&0x1000u64.to_le_bytes());
        assert_eq!(
            Header::parse(&header),
            Some(Header {
                size: 100,
                published_at_ns: 7,
                payload: 0x1000
            })
        );
        let mut updating = header;
        updating[16..24].fill(0);
        assert_eq!(Header::parse(&updating), None);
        let mut other_version = header;
        other_version[8] = 3;
        assert_eq!(Header::parse(&other_version), None);
        let mut too_big = header;
        too_big[12..16].copy_from_slice(&(MAX_PAYLOAD_BYTES + 1).to_le_bytes());
        assert_eq!(Header::parse(&too_big), None);
    }

    #[test]
    fn a_process_without_a_context_has_none() {
        assert_eq!(of_process(std::process::id()), Ok(None));
        assert_eq!(of_process(u32::MAX), Ok(None));
    }

    #[test]
    fn only_a_shared_mapping_named_as_the_otep_says_is_the_context() {
        let context = |perms: &str, name: &str| {
            let line = format!(
                "7fc15b33b000-7fc15b33c000 {perms} 00000000 00:01 215                        {name}"
            );
            is_context_mapping(&MapsLine::parse(&line).unwrap())
        };
        assert!(context("rw-s", "/memfd:OTEL_CTX (deleted)"));
        assert!(context("r--s", "[anon_shmem:OTEL_CTX]"));
        // A file a process named so (not unlinked, or private), or another
        // memfd whose name starts the same.
        assert!(!context("rw-s", "/memfd:OTEL_CTX"));
        assert!(!context("rw-p", "/memfd:OTEL_CTX (deleted)"));
        assert!(!context("rw-s", "/memfd:OTEL_CTX_other (deleted)"));
        assert!(!context("rw-s", ""));
    }
}
