//! The processes that publish thread contexts ([`crate::trace_context`]):
//! where their threads keep them (for the BPF program's `TRACE_CONTEXTS`
//! map, found by [`tls`]) and the key names their records use (for their
//! samples' labels).
//!
//! Everything here runs at a sync of the maps, never in the drain of the
//! ring buffer: a process's file reads, memory reads and key map read are
//! each bounded in time, and after one key map read overruns its bound no
//! other is made (a hung read holds one of the few helper threads every
//! bounded call shares).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddprof_common::bpf_maps::{go_labels_layout, tls_access, TraceContextSlot, TraceContextSlots};
use ddprof_common::sample::TRACE_CONTEXT_OTEL;

pub mod go;
pub mod tls;

use crate::files::bounded;
use crate::process::Process;
use crate::trace_context::{RawContext, TraceLabels};
use crate::unwind::LoadSegment;
use go::GoLabels;
use tls::{FileTls, NotYet, TlsVariable};

/// Whether `process` runs musl's dynamic loader and C library (one file:
/// `ld-musl-ARCH.so.1`, which Debian's musl links to
/// `/usr/lib/ARCH-linux-musl/libc.so`).
fn runs_musl(process: &Process) -> bool {
    process.mappings.iter().any(|mapping| {
        let path = mapping.file.path.as_str();
        let name = path.rsplit('/').next().unwrap_or(path);
        name.starts_with("ld-musl-")
            || name.starts_with("libc.musl-")
            || (name == "libc.so" && path.contains("-linux-musl/"))
    })
}

/// Files whose variables are remembered (by device and inode); the cache
/// starts over when full.
const MAX_FILES: usize = 16_384;
/// A library mapped but not relocated yet is looked at again this often…
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// …at most this many times in the process's life.
const MAX_RETRIES: u32 = 100;
/// A process that publishes OTEP 4947 records without a key map (yet: an
/// SDK may publish its process context after its first requests, or a
/// moment after the program starts, when ddprof first looks) has it read
/// again after this, the wait doubled after each read…
const FIRST_KEYS_READ_AFTER: Duration = Duration::from_millis(50);
/// …up to this…
const KEYS_READ_EVERY: Duration = Duration::from_secs(1);
/// …at most this many times (about 25 s).
const MAX_KEY_READS: u32 = 30;
/// The longest the memory reads of one process's location may take.
const LOCATE_BOUND: Duration = Duration::from_millis(100);
/// The longest one file's search for the variables may take.
const FIND_BOUND: Duration = Duration::from_secs(2);

/// A process that publishes, as last found.
#[derive(Debug)]
struct Publisher {
    slots: TraceContextSlots,
    /// When to look again for a library's variable not relocated yet.
    retry_at: Option<Instant>,
    retries_left: u32,
    keys: Option<Arc<[Arc<str>]>>,
    keys_read: Option<Instant>,
    key_reads_left: u32,
}

impl Default for Publisher {
    fn default() -> Self {
        Self {
            slots: TraceContextSlots::default(),
            retry_at: None,
            retries_left: MAX_RETRIES,
            keys: None,
            keys_read: None,
            key_reads_left: MAX_KEY_READS,
        }
    }
}

impl Publisher {
    fn wants_keys(&self) -> bool {
        self.slots.otel.access != tls_access::NONE && self.keys.is_none() && self.key_reads_left > 0
    }

    /// Whether the key map is due another read: at once, then 50 ms after
    /// the first, 100 ms after the second, … up to a second apart (the
    /// samples drained before it is read keep their ids, their other
    /// attributes unnamed).
    fn keys_due(&self, now: Instant) -> bool {
        let reads = MAX_KEY_READS - self.key_reads_left;
        let wait = FIRST_KEYS_READ_AFTER
            .saturating_mul(1 << reads.saturating_sub(1).min(5))
            .min(KEYS_READ_EVERY);
        self.wants_keys()
            && self
                .keys_read
                .is_none_or(|read| now.duration_since(read) >= wait)
    }

    fn due(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| at <= now) || self.keys_due(now)
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    files: HashMap<(u64, u64), Arc<FileTls>>,
    publishers: HashMap<u32, Publisher>,
    /// A key map read overran its bound: none is read any more.
    keys_stopped: bool,
    /// Go programs (their paths) told about whose labels are not read: one
    /// line each, not one per process (short-lived Go tools come and go).
    unread_go_told: HashSet<Arc<str>>,
}

impl Registry {
    /// Looks for the variables in `process`'s files and where its threads
    /// hold them: the slots to write for it, `None` when it publishes
    /// nothing this reader can read (yet: a library not relocated is
    /// looked at again, see [`Registry::take_due`]).
    pub fn discover(&mut self, pid: u32, process: &Process) -> Option<TraceContextSlots> {
        let (found, go) = self.variables(pid, process);
        let go_slot = match go {
            Some((
                GoLabels::Read {
                    version,
                    slot,
                    from_dwarf,
                },
                path,
            )) => Some((version, slot, from_dwarf, path)),
            Some((GoLabels::Unread(why), path)) => {
                if self.unread_go_told.len() >= MAX_FILES {
                    self.unread_go_told.clear();
                }
                if self.unread_go_told.insert(path.clone()) {
                    log::info!(
                        "trace context: process {pid} ({path}) is {why}: its goroutines' pprof \
                         labels are not on its samples"
                    );
                }
                None
            }
            None => None,
        };
        if found.is_empty() && go_slot.is_none() {
            self.publishers.remove(&pid);
            return None;
        }
        // The program's own need no memory read; a library's GOT entry does.
        let wanted: Vec<(TlsVariable, u64)> = found
            .iter()
            .map(|(_, variable, bias, _)| (*variable, *bias))
            .collect();
        let located = if wanted.is_empty() {
            Ok(Vec::new())
        } else {
            bounded::run(LOCATE_BOUND, move || {
                use std::os::unix::fs::FileExt;
                let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok();
                wanted
                    .into_iter()
                    .map(|(variable, bias)| match &memory {
                        Some(memory) => tls::locate(variable, bias, |address, out| {
                            memory.read_exact_at(out, address).is_ok()
                        }),
                        None => tls::locate(variable, bias, |_, _| false),
                    })
                    .collect::<Vec<_>>()
            })
        }
        .unwrap_or_else(|_| {
            found
                .iter()
                .map(|(_, variable, bias, _)| tls::locate(*variable, *bias, |_, _| false))
                .collect()
        });
        let musl = runs_musl(process);
        let mut slots = TraceContextSlots::default();
        if let Some((_, slot, _, _)) = &go_slot {
            slots.go = *slot;
        }
        let mut unrelocated = false;
        for ((abi, _, _, path), location) in found.iter().zip(&located) {
            let slot = match location {
                // musl finds a module's block in a DTV of its own layout.
                Ok(slot) if musl && slot.access == tls_access::DTV => TraceContextSlot {
                    access: tls_access::DTV_MUSL,
                    ..*slot
                },
                Ok(slot) => *slot,
                Err(NotYet::Unrelocated) => {
                    unrelocated = true;
                    continue;
                }
                Err(NotYet::Unreadable) => {
                    log::info!(
                        "trace context: process {pid} defines {abi} in {path}, in a TLS layout \
                         this ddprof does not read (neither glibc's nor musl's x86-64 one?): its \
                         samples carry no span ids"
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
            if let Some((version, slot, from_dwarf, path)) = &go_slot {
                let layout = if slot.layout == go_labels_layout::SLICE {
                    "slice"
                } else {
                    "map"
                };
                let source = if *from_dwarf {
                    "its DWARF"
                } else {
                    "the release's known layout"
                };
                log::info!(
                    "trace context: process {pid} publishes Go pprof labels ({path}, {version}: \
                     the goroutine at thread pointer -{:#x}, g.labels at +{} (a {layout}), \
                     offsets from {source})",
                    slot.g_offset.unsigned_abs(),
                    slot.labels
                );
            }
        }
        publisher.slots = slots;
        publisher.retry_at = None;
        if unrelocated && publisher.retries_left > 0 {
            publisher.retries_left -= 1;
            publisher.retry_at = Some(Instant::now() + RETRY_EVERY);
        }
        if !self.keys_stopped {
            let now = Instant::now();
            if publisher.keys_due(now) {
                publisher.keys_read = Some(now);
                publisher.key_reads_left -= 1;
                match crate::identity::process_context::thread_context_keys(pid) {
                    Ok(keys) => {
                        publisher.keys = keys.map(|keys| keys.into_iter().map(Arc::from).collect());
                    }
                    Err(unanswered) => {
                        self.keys_stopped = true;
                        log::warn!(
                            "trace context: reading process {pid}'s key map did not end in \
                             {:?} ({unanswered}); no other process's is read in this worker \
                             (their attributes stay unnamed, their ids are kept)",
                            crate::identity::process_context::READ_BOUND
                        );
                    }
                }
            }
        }
        let any = slots.otel.access != tls_access::NONE
            || slots.labels.access != tls_access::NONE
            || slots.go.g_offset != 0;
        any.then_some(slots)
    }

    /// The variables `process`'s files define: (ABI, variable, the file's
    /// load bias, its path), the first file of each ABI; and, for a Go
    /// program, what is made of its labels (and its path).
    #[allow(clippy::type_complexity)]
    fn variables(
        &mut self,
        pid: u32,
        process: &Process,
    ) -> (
        Vec<(&'static str, TlsVariable, u64, Arc<str>)>,
        Option<(GoLabels, Arc<str>)>,
    ) {
        let mut found: Vec<(&'static str, TlsVariable, u64, Arc<str>)> = Vec::new();
        let mut go: Option<(GoLabels, Arc<str>)> = None;
        for mapping in &process.mappings {
            let key = (mapping.file.dev, mapping.file.inode);
            let file_tls = match self.files.get(&key) {
                Some(known) => known.clone(),
                None => {
                    let opened = crate::files::open_mapped(
                        pid,
                        &mapping.file,
                        Some((mapping.start, mapping.end)),
                    );
                    // A file not opened, or whose search overran, is looked
                    // at again at the next sync (not remembered).
                    let Ok(opened) = opened else {
                        continue;
                    };
                    let Ok(read) = bounded::run(FIND_BOUND, move || tls::find(&opened.file)) else {
                        continue;
                    };
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
            if let (None, Some(labels)) = (&go, &file_tls.go) {
                go = Some((labels.clone(), mapping.file.path.as_str().into()));
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
        (found, go)
    }

    /// Whether a process is due another look (a library's variable not
    /// relocated yet, or a key map not read yet).
    pub fn retry_due(&self) -> bool {
        let now = Instant::now();
        self.publishers.values().any(|publisher| publisher.due(now))
    }

    /// The processes due another look ([`Registry::discover`] again).
    pub fn take_due(&mut self) -> Vec<u32> {
        let now = Instant::now();
        let due: Vec<u32> = self
            .publishers
            .iter()
            .filter(|(_, publisher)| publisher.due(now))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in &due {
            if let Some(publisher) = self.publishers.get_mut(pid) {
                publisher.retry_at = None;
            }
        }
        due
    }

    /// `pid`'s slots as written (for the caller's map).
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
        self.unread_go_told.clear();
    }

    /// The labels of a context a sample of `pid` carried (its key map as
    /// last read; nothing is read here: this runs in the ring buffer's
    /// drain).
    pub fn labels(&self, pid: u32, raw: &RawContext) -> Option<Arc<TraceLabels>> {
        if raw.kind != TRACE_CONTEXT_OTEL {
            return crate::trace_context::custom_labels(raw).map(Arc::new);
        }
        let keys = self
            .publishers
            .get(&pid)
            .and_then(|publisher| publisher.keys.as_deref());
        crate::trace_context::otel_labels(raw, keys).map(Arc::new)
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
        tls_access::DTV_MUSL => format!(
            "module {} of the DTV (musl's), {}",
            slot.module,
            signed(slot.offset)
        ),
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_map_not_found_is_read_again_sooner_at_first() {
        let start = Instant::now();
        let mut publisher = Publisher::default();
        publisher.slots.otel.access = tls_access::STATIC;
        assert!(publisher.keys_due(start), "never read: at once");
        // After the k-th read, the next after 50 ms × 2^(k-1), at most 1 s.
        for (reads, wait_ms) in [(1, 50), (2, 100), (3, 200), (5, 800), (6, 1000), (20, 1000)] {
            publisher.key_reads_left = MAX_KEY_READS - reads;
            publisher.keys_read = Some(start);
            let wait = Duration::from_millis(wait_ms);
            assert!(!publisher.keys_due(start + wait - Duration::from_millis(1)));
            assert!(publisher.keys_due(start + wait), "{reads} reads");
        }
        // Found, or read as often as allowed: never again.
        publisher.key_reads_left = 0;
        assert!(!publisher.keys_due(start + Duration::from_secs(60)));
        publisher.key_reads_left = 3;
        publisher.keys = Some(Arc::from(Vec::<Arc<str>>::new()));
        assert!(!publisher.keys_due(start + Duration::from_secs(60)));
    }
}
