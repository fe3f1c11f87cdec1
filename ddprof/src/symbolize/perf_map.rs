//! JIT symbols from perf maps (`/tmp/perf-PID.map`), which runtimes (the
//! JVM with an agent, Node with `--perf-basic-prof`, LuaJIT) write for code
//! no ELF file describes. The aggregator opens each process's map while the
//! process runs ([`crate::files::target::open_perf_map`]: whose it may be,
//! where, how large); this reads and parses it, again only when it changed.
use std::io::Read;
use std::sync::Arc;

use crate::files::target::{PerfMapRefused, MAX_PERF_MAP_BYTES};

/// Perf map of one process, as last read.
#[derive(Debug, Default)]
pub(super) struct PerfMap {
    /// Length and modification time of the file read, to notice updates.
    pub(super) version: Option<(u64, std::time::SystemTime)>,
    /// (start, size, name), sorted by start.
    pub(super) entries: Vec<(u64, u64, Arc<str>)>,
    pub(super) last_period: u64,
    /// A refused map was said already (once per process).
    pub(super) refusal_said: bool,
}

impl PerfMap {
    pub(super) fn lookup(&self, addr: u64) -> Option<&Arc<str>> {
        let index = self.entries.partition_point(|(start, _, _)| *start <= addr);
        // Entries can overlap when a JIT reuses memory: the latest start at or
        // below the address that still covers it wins.
        self.entries[..index]
            .iter()
            .rev()
            .take(8)
            .find(|(start, size, _)| addr < start.saturating_add(*size))
            .map(|(_, _, name)| name)
    }
}

/// Parses perf map text: `START SIZE NAME` per line, hexadecimal numbers.
pub(super) fn parse_perf_map(text: &str) -> Vec<(u64, u64, Arc<str>)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut entries: Vec<(u64, u64, Arc<str>)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().splitn(3, ' ');
            let start = hex(fields.next()?)?;
            let size = hex(fields.next()?)?;
            let name = fields.next()?.trim();
            (!name.is_empty()).then(|| (start, size, Arc::from(name)))
        })
        .collect();
    entries.sort_by_key(|(start, _, _)| *start);
    entries
}

/// Reads process `pid`'s perf map, opened as `opened`, again if it changed
/// since `map` was read; a refused one is said once per process.
pub(super) fn reload_perf_map(
    map: &mut PerfMap,
    pid: u32,
    opened: &Result<Arc<std::fs::File>, PerfMapRefused>,
) {
    let file = match opened {
        Ok(file) => file,
        Err(refused) => {
            if !map.refusal_said {
                map.refusal_said = true;
                log::warn!("process {pid}: {refused}; its JIT frames stay unnamed");
            }
            return;
        }
    };
    let Ok(metadata) = file.metadata() else {
        return;
    };
    let version = Some((
        metadata.len(),
        metadata.modified().unwrap_or(std::time::UNIX_EPOCH),
    ));
    if version == map.version {
        return;
    }
    let mut bytes = Vec::with_capacity(metadata.len().min(MAX_PERF_MAP_BYTES) as usize);
    // From the start, whatever an earlier read left the position at.
    let reader = FromStart { file, offset: 0 };
    if reader
        .take(MAX_PERF_MAP_BYTES)
        .read_to_end(&mut bytes)
        .is_ok()
    {
        // JIT names are whatever bytes the runtime wrote: decode lossily
        // rather than lose the whole map to one non-UTF-8 name.
        map.entries = parse_perf_map(&String::from_utf8_lossy(&bytes));
        map.version = version;
    }
}

/// Reads a file from its start with `pread`, leaving its position alone.
struct FromStart<'a> {
    file: &'a std::fs::File,
    offset: u64,
}

impl Read for FromStart<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = std::os::unix::fs::FileExt::read_at(self.file, buffer, self.offset)?;
        self.offset += read as u64;
        Ok(read)
    }
}
