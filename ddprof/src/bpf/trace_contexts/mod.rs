//! The processes that publish thread contexts ([`crate::trace_context`]):
//! where their threads keep them (for the BPF program's `TRACE_CONTEXTS`
//! map, found by [`tls`]) and the key names their records use (for their
//! samples' labels).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddprof_common::bpf_maps::{tls_access, TraceContextSlot, TraceContextSlots};
use ddprof_common::sample::TRACE_CONTEXT_OTEL;

pub mod tls;

use crate::files::bounded;
use crate::process::Process;
use crate::trace_context::{RawContext, TraceLabels};
use crate::unwind::LoadSegment;
use tls::{FileTls, NotYet, TlsVariable};

/// Files whose variables are remembered (by device and inode); the cache
/// starts over when full.
const MAX_FILES: usize = 16_384;
/// A library mapped but not relocated yet is looked at again this often…
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// …this many times.
const MAX_RETRIES: u32 = 100;
/// How often a process's key map is read again (an SDK may publish its
/// process context after its first requests, or publish it anew).
const KEYS_READ_EVERY: Duration = Duration::from_secs(10);
/// The longest the memory reads of one process's location may take.
const LOCATE_BOUND: Duration = Duration::from_millis(100);

/// A process that publishes, as last found.
#[derive(Debug, Default)]
struct Publisher {
    slots: TraceContextSlots,
    /// When to look again for a library's variable not relocated yet, and
    /// how many looks are left.
    retry: Option<(Instant, u32)>,
    keys: Option<Arc<[Arc<str>]>>,
    keys_read: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct Registry {
    files: HashMap<(u64, u64), Arc<FileTls>>,
    publishers: HashMap<u32, Publisher>,
}

impl Registry {
    /// Looks for the variables in `process`'s files and where its threads
    /// hold them: the slots to write for it, `None` when it publishes
    /// nothing this reader can read (yet: a library not relocated is
    /// looked at again, see [`Registry::take_due`]).
    pub fn discover(&mut self, pid: u32, process: &Process) -> Option<TraceContextSlots> {
        let mut found: Vec<(&'static str, TlsVariable, u64, Arc<str>)> = Vec::new();
        for mapping in &process.mappings {
            let key = (mapping.file.dev, mapping.file.inode);
            let file_tls = match self.files.get(&key) {
                Some(known) => known.clone(),
                None => {
                    let read = crate::files::open_mapped(
                        pid,
                        &mapping.file,
                        Some((mapping.start, mapping.end)),
                    )
                    .map(|opened| tls::find(&opened.file))
                    .unwrap_or_default();
                    if self.files.len() >= MAX_FILES {
                        self.files.clear();
                    }
                    let read = Arc::new(read);
                    self.files.insert(key, read.clone());
                    read
                }
            };
            if !file_tls.defines_any() {
                continue;
            }
            let Some(bias) = LoadSegment::bias_for_mapping(
                &file_tls.segments,
                mapping.start,
                mapping.file_offset,
            ) else {
                continue;
            };
            for (abi, variable) in [
                (tls::OTEL_SYMBOL, file_tls.otel),
                (tls::LABELS_SYMBOL, file_tls.labels),
            ] {
                if let Some(variable) = variable {
                    if !found.iter().any(|(seen, ..)| *seen == abi) {
                        found.push((abi, variable, bias, mapping.file.path.as_str().into()));
                    }
                }
            }
        }
        if found.is_empty() {
            self.publishers.remove(&pid);
            return None;
        }
        let wanted: Vec<(&'static str, TlsVariable, u64)> = found
            .iter()
            .map(|(abi, variable, bias, _)| (*abi, *variable, *bias))
            .collect();
        let located = bounded::run(LOCATE_BOUND, move || {
            use std::os::unix::fs::FileExt;
            let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok();
            wanted
                .into_iter()
                .map(|(abi, variable, bias)| {
                    let read = |address: u64, out: &mut [u8]| {
                        memory
                            .as_ref()
                            .is_some_and(|memory| memory.read_exact_at(out, address).is_ok())
                    };
                    (abi, tls::locate(variable, bias, read))
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
        let mut slots = TraceContextSlots::default();
        let mut unrelocated = false;
        for ((abi, _, _, path), (_, location)) in found.iter().zip(&located) {
            let slot = match location {
                Ok(slot) => *slot,
                Err(NotYet::Unrelocated) => {
                    unrelocated = true;
                    continue;
                }
                Err(NotYet::Unreadable) => {
                    log::info!(
                        "trace context: process {pid} defines {abi} in {path}, in a TLS layout \
                         this ddprof does not read (not glibc's x86-64 one?): its samples carry \
                         no span ids"
                    );
                    continue;
                }
            };
            if *abi == tls::OTEL_SYMBOL {
                slots.otel = slot;
            } else {
                slots.labels = slot;
            }
        }
        let publisher = self.publishers.entry(pid).or_default();
        if publisher.slots == TraceContextSlots::default() && slots != publisher.slots {
            for (abi, _, _, path) in &found {
                let slot = if *abi == tls::OTEL_SYMBOL {
                    slots.otel
                } else {
                    slots.labels
                };
                if slot.access != tls_access::NONE {
                    log::info!(
                        "trace context: process {pid} publishes {abi} (in {path}, at {})",
                        describe(&slot)
                    );
                }
            }
        }
        publisher.slots = slots;
        publisher.retry = match (unrelocated, publisher.retry) {
            (false, _) => None,
            (true, Some((_, 0))) => None,
            (true, Some((_, left))) => Some((Instant::now() + RETRY_EVERY, left - 1)),
            (true, None) => Some((Instant::now() + RETRY_EVERY, MAX_RETRIES)),
        };
        let any = slots.otel.access != tls_access::NONE || slots.labels.access != tls_access::NONE;
        any.then_some(slots)
    }

    /// Whether a process's library variable is due another look.
    pub fn retry_due(&self) -> bool {
        let now = Instant::now();
        self.publishers
            .values()
            .any(|publisher| publisher.retry.is_some_and(|(at, _)| at <= now))
    }

    /// The processes due another look ([`Registry::discover`] again).
    pub fn take_due(&mut self) -> Vec<u32> {
        let now = Instant::now();
        self.publishers
            .iter()
            .filter(|(_, publisher)| publisher.retry.is_some_and(|(at, _)| at <= now))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Whether `pid` has slots written (for the caller's map).
    pub fn slots(&self, pid: u32) -> Option<TraceContextSlots> {
        self.publishers
            .get(&pid)
            .map(|publisher| publisher.slots)
            .filter(|slots| *slots != TraceContextSlots::default())
    }

    pub fn forget(&mut self, pid: u32) {
        self.publishers.remove(&pid);
    }

    pub fn clear(&mut self) {
        self.publishers.clear();
    }

    /// The labels of a context a sample of `pid` carried.
    pub fn labels(&mut self, pid: u32, raw: &RawContext) -> Option<Arc<TraceLabels>> {
        if raw.kind != TRACE_CONTEXT_OTEL {
            return crate::trace_context::custom_labels(raw).map(Arc::new);
        }
        let publisher = self.publishers.entry(pid).or_default();
        let now = Instant::now();
        if publisher
            .keys_read
            .is_none_or(|read| now.duration_since(read) >= KEYS_READ_EVERY)
        {
            publisher.keys_read = Some(now);
            if let Ok(Some(keys)) = crate::identity::process_context::thread_context_keys(pid) {
                publisher.keys = Some(keys.into_iter().map(Arc::from).collect());
            }
        }
        crate::trace_context::otel_labels(raw, publisher.keys.as_deref()).map(Arc::new)
    }
}

/// A slot as the program reads it, for logs.
pub fn describe(slot: &TraceContextSlot) -> String {
    let signed = |offset: i64| {
        let sign = if offset < 0 { '-' } else { '+' };
        format!("{sign}{:#x}", offset.unsigned_abs())
    };
    match slot.access {
        tls_access::STATIC => format!("thread pointer {}", signed(slot.offset)),
        tls_access::DTV => format!("module {} of the DTV, {}", slot.module, signed(slot.offset)),
        _ => "none".into(),
    }
}
