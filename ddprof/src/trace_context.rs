//! Whose work a sample is: the request context a thread publishes for
//! out-of-process readers, read by the BPF program at each sample and
//! turned here into the labels Datadog's backend links traces to
//! (`span id`, `local root span id`, `trace endpoint`) and further
//! attributes.
//!
//! Two ABIs are read:
//! - OpenTelemetry's thread context (OTEP 4947, as `libdd-otel-thread-ctx`
//!   publishes it): a TLS pointer `otel_thread_ctx_v1` to a record of a
//!   trace id, a span id and attributes keyed by an index into the key map
//!   the process context publishes (`threadlocal.attribute_key_map`);
//! - Polar Signals' `custom-labels` (ABI v1): a TLS pointer
//!   `custom_labels_current_set` to a set of (key, value) byte strings.
//!
//! The BPF engine finds the TLS variables and follows the processes that
//! publish (`crate::bpf::trace_contexts`); this module only turns what a
//! record carried into labels.
use std::sync::Arc;

/// Attributes other than the ids and the endpoint kept per sample.
pub const MAX_ATTRIBUTES: usize = 16;

/// What a sample's thread was serving, as labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TraceLabels {
    pub span_id: Option<u64>,
    pub local_root_span_id: Option<u64>,
    pub trace_endpoint: Option<Arc<str>>,
    /// Further published attributes, (key, value), at most
    /// [`MAX_ATTRIBUTES`], in the order published.
    pub attributes: Vec<(Arc<str>, Arc<str>)>,
}

/// Label keys the profile sets itself: an attribute of one of these names
/// is left out (a process cannot pass its samples for another's).
const RESERVED_KEYS: &[&str] = &[
    "process_id",
    "process_name",
    "thread id",
    "thread_name",
    "container_id",
    "end_timestamp_ns",
    "tracepoint_type",
];
/// The longest attribute key and value kept (longer ones are left out).
pub const MAX_KEY_BYTES: usize = 128;
pub const MAX_VALUE_BYTES: usize = 255;

impl TraceLabels {
    pub fn is_empty(&self) -> bool {
        self.span_id.is_none()
            && self.local_root_span_id.is_none()
            && self.trace_endpoint.is_none()
            && self.attributes.is_empty()
    }

    /// About the memory it holds (what a period's table of them is
    /// bounded by), its shared key names counted as if not.
    pub fn approximate_bytes(&self) -> usize {
        let strings: usize = self
            .attributes
            .iter()
            .map(|(key, value)| key.len() + value.len() + 32)
            .sum();
        std::mem::size_of::<Self>() + strings + self.trace_endpoint.as_ref().map_or(0, |e| e.len())
    }

    /// Takes one published attribute, by its key's name (`shared`: the
    /// key map's own copy of it, kept rather than copied).
    fn take(&mut self, key: &str, shared: Option<&Arc<str>>, value: &str) {
        let decimal = |value: &str| value.parse::<u64>().ok().filter(|&id| id != 0);
        if key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            return;
        }
        match key {
            // libdatadog's convention: key index 0, 16 hex digits.
            "datadog.local_root_span_id" | "dd.local_root_span_id" => {
                self.local_root_span_id = u64::from_str_radix(value, 16).ok().filter(|&id| id != 0);
            }
            // As dd-trace-go names its pprof labels (decimal).
            "local root span id" | "local_root_span_id" => self.local_root_span_id = decimal(value),
            "span id" | "span_id" => self.span_id = decimal(value),
            "trace endpoint" | "trace_endpoint" | "datadog.trace_endpoint" => {
                self.trace_endpoint = Some(value.into());
            }
            _ if RESERVED_KEYS.contains(&key) => {}
            _ if self.attributes.len() < MAX_ATTRIBUTES => {
                let key = shared.cloned().unwrap_or_else(|| key.into());
                self.attributes.push((key, value.into()));
            }
            _ => {}
        }
    }
}

/// The raw context a record carried ([`ddprof_common::sample::RawTraceContext`]'s
/// parts), before its keys are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawContext {
    pub kind: u8,
    pub span_id: [u8; 8],
    pub trace_id: [u8; 16],
    pub attrs: Vec<u8>,
}

/// The labels of an OTEP 4947 record, its attribute keys named by `keys`
/// (the process context's key map; without one, libdatadog's convention
/// that key 0 is the local root span id). An entry whose key index is not
/// in the map, whose value is not UTF-8, or that runs past the bytes read
/// is left out. `None` when nothing is left.
pub fn otel_labels(raw: &RawContext, keys: Option<&[Arc<str>]>) -> Option<TraceLabels> {
    let mut labels = TraceLabels::default();
    // An all-zero trace id means no trace (the span id is then zero too).
    if raw.trace_id != [0; 16] {
        labels.span_id = Some(u64::from_be_bytes(raw.span_id)).filter(|&id| id != 0);
    }
    let mut rest = raw.attrs.as_slice();
    while let [index, length, tail @ ..] = rest {
        let Some(value) = tail.get(..usize::from(*length)) else {
            break;
        };
        rest = &tail[usize::from(*length)..];
        let shared = keys.and_then(|keys| keys.get(usize::from(*index)));
        let key = match keys {
            Some(_) => shared.map(|key| &**key),
            None => (*index == 0).then_some("datadog.local_root_span_id"),
        };
        if let (Some(key), Ok(value)) = (key, std::str::from_utf8(value)) {
            labels.take(key, shared, value);
        }
    }
    (!labels.is_empty()).then_some(labels)
}

/// The labels of a `custom-labels` set as the program copied it: fixed
/// slots of (key length, value length, key, value)
/// ([`ddprof_common::sample::TRACE_CONTEXT_LABELS`]); keys named as
/// dd-trace-go's labels (`span id`, `local root span id`, decimal) give
/// the ids.
pub fn custom_labels(raw: &RawContext) -> Option<TraceLabels> {
    use ddprof_common::sample::{CUSTOM_LABEL_SLOT, MAX_CUSTOM_LABEL_KEY, MAX_CUSTOM_LABEL_VALUE};
    let mut labels = TraceLabels::default();
    let mut keys: Vec<&[u8]> = Vec::new();
    for slot in raw.attrs.chunks_exact(CUSTOM_LABEL_SLOT as usize) {
        let (key_length, value_length) = (usize::from(slot[0]), usize::from(slot[1]));
        if key_length == 0
            || key_length > MAX_CUSTOM_LABEL_KEY as usize
            || value_length > MAX_CUSTOM_LABEL_VALUE as usize
        {
            continue;
        }
        let key = &slot[2..2 + key_length];
        let value_at = 2 + MAX_CUSTOM_LABEL_KEY as usize;
        let value = &slot[value_at..value_at + value_length];
        // The first label of a key is the set's (the ABI's rule).
        if keys.contains(&key) {
            continue;
        }
        keys.push(key);
        if let (Ok(key), Ok(value)) = (std::str::from_utf8(key), std::str::from_utf8(value)) {
            labels.take(key, None, value);
        }
    }
    (!labels.is_empty()).then_some(labels)
}

/// A label's value, as pprof has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelValue<'a> {
    Num(i64),
    Str(&'a str),
}

impl TraceLabels {
    /// The labels as a profile carries them: the ids as numbers (their 64
    /// bits, as libdatadog writes them) under the keys Datadog's backend
    /// links traces by, the endpoint and the attributes as strings.
    pub fn labels(&self) -> impl Iterator<Item = (&str, LabelValue<'_>)> {
        let ids = [
            ("span id", self.span_id),
            ("local root span id", self.local_root_span_id),
        ]
        .into_iter()
        .filter_map(|(key, id)| Some((key, LabelValue::Num(id? as i64))));
        let endpoint = self
            .trace_endpoint
            .as_deref()
            .map(|endpoint| ("trace endpoint", LabelValue::Str(endpoint)));
        let attributes = self
            .attributes
            .iter()
            .map(|(key, value)| (&**key, LabelValue::Str(value)));
        ids.chain(endpoint).chain(attributes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otel(span: u64, attrs: &[(u8, &str)]) -> RawContext {
        let mut bytes = Vec::new();
        for (index, value) in attrs {
            bytes.push(*index);
            bytes.push(value.len() as u8);
            bytes.extend_from_slice(value.as_bytes());
        }
        RawContext {
            kind: ddprof_common::sample::TRACE_CONTEXT_OTEL,
            span_id: span.to_be_bytes(),
            trace_id: [7; 16],
            attrs: bytes,
        }
    }

    #[test]
    fn an_otel_record_gives_the_ids_and_its_named_attributes() {
        let keys: Vec<Arc<str>> = vec![
            "datadog.local_root_span_id".into(),
            "http.route".into(),
            "trace endpoint".into(),
        ];
        let raw = otel(
            0xfedc_ba98_7654_3210,
            &[
                (0, "00000000000004d2"),
                (1, "/users"),
                (2, "GET /users"),
                (9, "x"),
            ],
        );
        let labels = otel_labels(&raw, Some(&keys)).unwrap();
        assert_eq!(labels.span_id, Some(0xfedc_ba98_7654_3210));
        assert_eq!(labels.local_root_span_id, Some(1234));
        assert_eq!(labels.trace_endpoint.as_deref(), Some("GET /users"));
        // Key 9 is not in the map: left out.
        assert_eq!(
            labels.attributes,
            vec![("http.route".into(), "/users".into())]
        );
        // Without a key map, key 0 is the local root span id (libdatadog's
        // convention) and the others are unnamed.
        let labels = otel_labels(&raw, None).unwrap();
        assert_eq!(labels.local_root_span_id, Some(1234));
        assert!(labels.attributes.is_empty() && labels.trace_endpoint.is_none());
        // No trace: no span id; nothing at all: no labels.
        let mut untraced = otel(5, &[]);
        untraced.trace_id = [0; 16];
        assert_eq!(otel_labels(&untraced, Some(&keys)), None);
        // Truncated and garbage attribute bytes are read without a panic.
        for end in 0..raw.attrs.len() {
            let cut = RawContext {
                attrs: raw.attrs[..end].to_vec(),
                ..raw.clone()
            };
            let _ = otel_labels(&cut, Some(&keys));
        }
        let garbage = RawContext {
            attrs: vec![0xff; 256],
            ..raw
        };
        let _ = otel_labels(&garbage, Some(&keys));
    }

    #[test]
    fn a_custom_label_set_gives_its_labels_and_dd_trace_gos_ids() {
        use ddprof_common::sample::{CUSTOM_LABEL_SLOT, MAX_CUSTOM_LABEL_KEY};
        let mut attrs = vec![0u8; ddprof_common::sample::TRACE_CONTEXT_ATTR_BYTES];
        let slots = [
            ("span id", "77"),
            ("local root span id", "76"),
            ("customer", "acme"),
            ("customer", "second"),
        ];
        for (index, (key, value)) in slots.iter().enumerate() {
            let slot = &mut attrs[index * CUSTOM_LABEL_SLOT as usize..];
            slot[0] = key.len() as u8;
            slot[1] = value.len() as u8;
            slot[2..2 + key.len()].copy_from_slice(key.as_bytes());
            let value_at = 2 + MAX_CUSTOM_LABEL_KEY as usize;
            slot[value_at..value_at + value.len()].copy_from_slice(value.as_bytes());
        }
        let raw = RawContext {
            kind: ddprof_common::sample::TRACE_CONTEXT_LABELS,
            span_id: [0; 8],
            trace_id: [0; 16],
            attrs,
        };
        let labels = custom_labels(&raw).unwrap();
        assert_eq!(
            (labels.span_id, labels.local_root_span_id),
            (Some(77), Some(76))
        );
        assert_eq!(labels.attributes, vec![("customer".into(), "acme".into())]);
        // Garbage lengths and cut arrays are read without a panic.
        let garbage = RawContext {
            attrs: vec![0xff; 300],
            ..raw.clone()
        };
        assert_eq!(custom_labels(&garbage), None);
        let cut = RawContext {
            attrs: raw.attrs[..100].to_vec(),
            ..raw
        };
        assert_eq!(
            custom_labels(&cut).and_then(|labels| labels.span_id),
            Some(77)
        );
    }
}
