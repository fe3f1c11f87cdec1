//! JIT symbols from perf maps (`/tmp/perf-PID.map`), which runtimes (the
//! JVM with an agent, Node with `--perf-basic-prof`, LuaJIT) write for code
//! no ELF file describes.
use std::path::Path;
use std::sync::Arc;

/// Perf map of one process (`/tmp/perf-PID.map`), as last read.
#[derive(Debug, Default)]
pub(super) struct PerfMap {
    /// Length and modification time of the file read, to notice updates.
    pub(super) version: Option<(u64, std::time::SystemTime)>,
    /// (start, size, name), sorted by start.
    pub(super) entries: Vec<(u64, u64, Arc<str>)>,
    pub(super) last_period: u64,
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

/// Reads `path` again if it changed since `map` was read.
pub(super) fn reload_perf_map(map: &mut PerfMap, path: &Path) {
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    let version = Some((
        metadata.len(),
        metadata.modified().unwrap_or(std::time::UNIX_EPOCH),
    ));
    if version == map.version {
        return;
    }
    // JIT names are whatever bytes the runtime wrote: decode lossily
    // rather than lose the whole map to one non-UTF-8 name.
    if let Ok(bytes) = std::fs::read(path) {
        map.entries = parse_perf_map(&String::from_utf8_lossy(&bytes));
        map.version = version;
    }
}
