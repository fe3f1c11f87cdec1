//! A process's OpenTelemetry process context (OTEP 4719): the resource
//! attributes an SDK publishes in a mapping named `OTEL_CTX` (a memfd,
//! `/memfd:OTEL_CTX`, or a named anonymous mapping,
//! `[anon_shmem:OTEL_CTX]`): a header (`"OTEL_CTX"`, version 2, the
//! payload's size, the time it was published, a pointer to the payload)
//! and the payload, an OTLP `Resource` (protobuf).
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
    bounded::run(READ_BOUND, move || read(pid))
}

fn read(pid: u32) -> Option<ServiceIdentity> {
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
        let Some(range) = parse_range(&line) else {
            continue;
        };
        if is_context_mapping(&line) {
            context.get_or_insert(range);
        } else if is_private_anonymous(&line) {
            anonymous.push(range);
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
    identity(&payload)
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

/// The service in an OTLP `Resource`'s attributes (none when the SDK was
/// given no service: `unknown_service…`): `service.name`,
/// `deployment.environment.name` (or the older `deployment.environment`),
/// `service.version`, `service.instance.id` (string values only).
pub fn identity(resource: &[u8]) -> Option<ServiceIdentity> {
    let mut attributes: Vec<(String, String)> = Vec::new();
    for (field, value) in Fields(resource) {
        // Resource.attributes = 1 (KeyValue).
        if let (1, Value::Bytes(key_value)) = (field, value) {
            if let Some(pair) = key_value_of(key_value) {
                attributes.push(pair);
            }
        }
    }
    let attribute = |key: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, value)| tag_value(value))
    };
    Some(ServiceIdentity {
        service: attribute("service.name").filter(|name| !name.starts_with("unknown_service"))?,
        env: attribute("deployment.environment.name")
            .or_else(|| attribute("deployment.environment")),
        version: attribute("service.version"),
        instance_id: attribute("service.instance.id"),
    })
}

/// A `KeyValue` (key = 1, value = 2: an `AnyValue` whose `string_value` is
/// field 1) as its key and string value.
fn key_value_of(bytes: &[u8]) -> Option<(String, String)> {
    let (mut key, mut value) = (None, None);
    for (field, content) in Fields(bytes) {
        match (field, content) {
            (1, Value::Bytes(text)) => key = Some(std::str::from_utf8(text).ok()?.to_string()),
            (2, Value::Bytes(any)) => {
                for (field, content) in Fields(any) {
                    if let (1, Value::Bytes(text)) = (field, content) {
                        value = Some(std::str::from_utf8(text).ok()?.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    Some((key?, value?))
}

/// A protobuf field's content.
enum Value<'a> {
    Number,
    Bytes(&'a [u8]),
}

/// The fields of a protobuf message, until its end or the first malformed
/// one (the rest is ignored, never read past the bytes).
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let tag = varint(&mut self.0)?;
        let value = match tag & 7 {
            0 => {
                varint(&mut self.0)?;
                Value::Number
            }
            1 | 5 => {
                let width = if tag & 7 == 1 { 8 } else { 4 };
                self.0 = self.0.get(width..)?;
                Value::Number
            }
            2 => {
                let length = usize::try_from(varint(&mut self.0)?).ok()?;
                let bytes = self.0.get(..length)?;
                self.0 = &self.0[length..];
                Value::Bytes(bytes)
            }
            _ => {
                self.0 = &[];
                return None;
            }
        };
        Some((tag >> 3, value))
    }
}

fn varint<'b>(bytes: &mut &'b [u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let slice: &'b [u8] = bytes;
        let (&byte, rest) = slice.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A `maps` line of the context's mapping: shared, named exactly as a
/// memfd `OTEL_CTX` (always unlinked: ` (deleted)`) or a named shared
/// anonymous mapping; not a file a process named so, whose pages a hung
/// mount could keep from answering.
fn is_context_mapping(line: &str) -> bool {
    let fields: Vec<&str> = line.splitn(6, char::is_whitespace).collect();
    let (Some(perms), Some(name)) = (fields.get(1), fields.get(5)) else {
        return false;
    };
    let name = name.trim_start();
    perms.ends_with('s') && (name == "/memfd:OTEL_CTX (deleted)" || name == "[anon_shmem:OTEL_CTX]")
}

fn parse_range(line: &str) -> Option<(u64, u64)> {
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// A `maps` line of private anonymous memory (no file).
fn is_private_anonymous(line: &str) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let path = fields.get(5).copied().unwrap_or("");
    fields.get(4) == Some(&"0")
        && fields.get(1).is_some_and(|perms| perms.ends_with('p'))
        && (path.is_empty() || path.starts_with("[anon:") || path == "[heap]")
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
        assert_eq!(
            identity(&resource),
            Some(ServiceIdentity {
                service: "checkout".into(),
                env: Some("prod".into()),
                version: Some("1.2".into()),
                instance_id: Some("i-1".into()),
            })
        );
        assert_eq!(identity(&attribute("service.version", "1")), None);
        // An SDK given no service publishes `unknown_service[:exe]`: none.
        assert_eq!(
            identity(&attribute("service.name", "unknown_service:java")),
            None
        );
        // Every truncation of it is read without a panic.
        for end in 0..resource.len() {
            let _ = identity(&resource[..end]);
        }
        assert_eq!(identity(&[0xff; 16]), None);
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
        let line = |perms: &str, name: &str| {
            format!("7fc15b33b000-7fc15b33c000 {perms} 00000000 00:01 215                        {name}")
        };
        assert!(is_context_mapping(&line(
            "rw-s",
            "/memfd:OTEL_CTX (deleted)"
        )));
        assert!(is_context_mapping(&line("r--s", "[anon_shmem:OTEL_CTX]")));
        // A file a process named so (not unlinked, or private), or another
        // memfd whose name starts the same.
        assert!(!is_context_mapping(&line("rw-s", "/memfd:OTEL_CTX")));
        assert!(!is_context_mapping(&line(
            "rw-p",
            "/memfd:OTEL_CTX (deleted)"
        )));
        assert!(!is_context_mapping(&line(
            "rw-s",
            "/memfd:OTEL_CTX_other (deleted)"
        )));
        assert!(!is_context_mapping(&line("rw-s", "")));
    }
}
