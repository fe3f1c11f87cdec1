//! JIT symbols from perf maps (`/tmp/perf-PID.map`), which runtimes (the
//! JVM with an agent, Node with `--perf-basic-prof`, LuaJIT) write for code
//! no ELF file describes. The aggregator opens each process's map while the
//! process runs ([`crate::files::target::open_perf_map`]: whose it may be,
//! where, how large); this reads and parses it, again only when it changed.
//!
//! Runtimes append to their map as they compile, so a live service's map
//! changes every period and grows to tens of MiB. Read whole each time, a
//! 16 MiB map cost ~60 ms of CPU a period and, with a name allocated per
//! entry, ~85 MiB of the worker's RSS. So a map that only grew is read from
//! where the last read stopped (the bytes before it checked unchanged), and
//! its names are kept in one string: the parsed map is about the size of
//! the file.
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use crate::files::target::{PerfMapRefused, MAX_PERF_MAP_BYTES};

/// Bytes just before the end of what was parsed, compared again before an
/// appended part is read: a map rewritten in place (an agent that dumps
/// all its symbols again) is read from its start.
const SEAM_BYTES: usize = 64;

/// Which file, how long and when last changed, to notice updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MapVersion {
    device: u64,
    inode: u64,
    length: u64,
    modified: (i64, i64),
}

impl MapVersion {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            length: metadata.len(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }

    fn same_file(&self, other: &Self) -> bool {
        (self.device, self.inode) == (other.device, other.inode)
    }
}

/// One function of a map: its code and where its name is in
/// [`PerfMap::names`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    size: u64,
    name_at: u32,
    name_len: u32,
}

/// Perf map of one process, as last read.
#[derive(Debug, Default)]
pub(super) struct PerfMap {
    /// The file as last read.
    version: Option<MapVersion>,
    /// Bytes of it parsed (whole lines).
    parsed: u64,
    /// Sorted by start; entries with the same start in the file's order.
    entries: Vec<Entry>,
    /// Every entry's name, one after the other.
    names: String,
    /// The last [`SEAM_BYTES`] parsed, as they were read.
    seam: Vec<u8>,
    pub(super) last_period: u64,
    /// A refused map was said already (once per process).
    pub(super) refusal_said: bool,
}

impl PerfMap {
    /// The map of `text` (tests).
    #[cfg(test)]
    pub(super) fn parsed(text: &str) -> Self {
        let mut map = Self::default();
        map.append(text);
        map
    }

    pub(super) fn lookup(&self, addr: u64) -> Option<&str> {
        let index = self.entries.partition_point(|entry| entry.start <= addr);
        // Entries can overlap when a JIT reuses memory: the latest start at or
        // below the address that still covers it wins (for the same start, the
        // line written last).
        self.entries[..index]
            .iter()
            .rev()
            .take(8)
            .find(|entry| addr < entry.start.saturating_add(entry.size))
            .map(|entry| {
                let at = entry.name_at as usize;
                &self.names[at..at + entry.name_len as usize]
            })
    }

    /// Functions in the map.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn clear(&mut self) {
        self.version = None;
        self.parsed = 0;
        self.entries = Vec::new();
        self.names = String::new();
        self.seam = Vec::new();
    }

    /// Parses `text`'s lines (`START SIZE NAME`, hexadecimal numbers) into
    /// the map; lines that do not parse are skipped.
    fn append(&mut self, text: &str) {
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let sorted_before = self.entries.len();
        for line in text.lines() {
            let mut fields = line.trim().splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (
                fields.next().and_then(hex),
                fields.next().and_then(hex),
                fields.next().map(str::trim),
            ) else {
                continue;
            };
            // The names stay below MAX_PERF_MAP_BYTES (4 GiB would not).
            let (Ok(name_at), Ok(name_len)) =
                (u32::try_from(self.names.len()), u32::try_from(name.len()))
            else {
                break;
            };
            if name.is_empty() {
                continue;
            }
            self.names.push_str(name);
            self.entries.push(Entry {
                start,
                size,
                name_at,
                name_len,
            });
        }
        let in_order = self.entries[sorted_before.saturating_sub(1)..]
            .windows(2)
            .all(|pair| pair[0].start <= pair[1].start);
        if !in_order {
            // Stable: the same start keeps the file's order. Two sorted
            // runs (before and appended) merge in linear time.
            self.entries.sort_by_key(|entry| entry.start);
        }
    }
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
    let version = MapVersion::of(&metadata);
    if Some(version) == map.version {
        return;
    }
    let grew = map.version.is_some_and(|last| {
        last.same_file(&version)
            && version.length >= map.parsed
            && seam_unchanged(file, map.parsed, &map.seam)
    });
    if !grew {
        map.clear();
    }
    let end = version.length.min(MAX_PERF_MAP_BYTES);
    let mut bytes = Vec::with_capacity(end.saturating_sub(map.parsed) as usize);
    let reader = FromOffset {
        file,
        offset: map.parsed,
    };
    if reader
        .take(end.saturating_sub(map.parsed))
        .read_to_end(&mut bytes)
        .is_err()
    {
        return;
    }
    // Whole lines only: a runtime may be writing the next one.
    let whole = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    // JIT names are whatever bytes the runtime wrote: decode lossily
    // rather than lose the whole map to one non-UTF-8 name.
    map.append(&String::from_utf8_lossy(&bytes[..whole]));
    map.parsed += whole as u64;
    // The seam: the last SEAM_BYTES parsed, old and new.
    map.seam
        .extend_from_slice(&bytes[whole.saturating_sub(SEAM_BYTES)..whole]);
    let excess = map.seam.len().saturating_sub(SEAM_BYTES);
    map.seam.drain(..excess);
    map.version = Some(version);
}

/// Whether the file still holds, just before `parsed`, the bytes `seam`
/// read there last time (a map rewritten in place is read again whole).
fn seam_unchanged(file: &std::fs::File, parsed: u64, seam: &[u8]) -> bool {
    let mut now = vec![0; seam.len()];
    let at = parsed.saturating_sub(seam.len() as u64);
    std::os::unix::fs::FileExt::read_exact_at(file, &mut now, at).is_ok() && now == seam
}

/// Reads a file from `offset` with `pread`, leaving its position alone.
struct FromOffset<'a> {
    file: &'a std::fs::File,
    offset: u64,
}

impl Read for FromOffset<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = std::os::unix::fs::FileExt::read_at(self.file, buffer, self.offset)?;
        self.offset += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A map file with `text` in a directory of its own, removed on drop.
    struct MapFile(std::path::PathBuf);

    impl Drop for MapFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
        }
    }

    fn map_file(test: &str, text: &str) -> MapFile {
        let dir =
            std::env::temp_dir().join(format!("ddprof-perf-map-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf-1.map");
        std::fs::write(&path, text).unwrap();
        MapFile(path)
    }

    fn reload(map: &mut PerfMap, path: &std::path::Path) {
        let file = Ok(Arc::new(std::fs::File::open(path).unwrap()));
        reload_perf_map(map, 1, &file);
    }

    #[test]
    fn an_appended_map_is_read_from_where_it_stopped() {
        let file = map_file("appended", "1000 100 first\n3000 10 third\n");
        let path = &file.0;
        let mut map = PerfMap::default();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x1050), Some("first"));
        let parsed = map.parsed;
        // Appended: one line out of order, one not finished yet.
        let mut appending = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        write!(
            appending,
            "2000 100 second\n1000 100 first_again\n4000 10 fou"
        )
        .unwrap();
        reload(&mut map, path);
        assert_eq!(map.parsed, std::fs::metadata(path).unwrap().len() - 11);
        assert!(map.parsed > parsed);
        assert_eq!(map.lookup(0x2010), Some("second"));
        // The same start: the line written last wins.
        assert_eq!(map.lookup(0x1050), Some("first_again"));
        assert_eq!(map.lookup(0x4000), None);
        writeln!(appending, "rth").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x4004), Some("fourth"));
        assert_eq!(map.len(), 5);
    }

    #[test]
    fn a_map_rewritten_in_place_is_read_again_whole() {
        let file = map_file("rewritten", "1000 100 old_a\n2000 100 old_b\n");
        let path = &file.0;
        let mut map = PerfMap::default();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x2000), Some("old_b"));
        // Longer, but not an append: the bytes before the seam changed.
        std::fs::write(path, "1000 100 new_a\n2000 100 new_bb\n5000 1 new_c\n").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x1000), Some("new_a"));
        assert_eq!(map.lookup(0x2000), Some("new_bb"));
        assert_eq!(map.len(), 3);
        // Shorter: read again whole.
        std::fs::write(path, "7000 10 only\n").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x1000), None);
        assert_eq!(map.lookup(0x7001), Some("only"));
        // Another file at the name (a new inode): read whole.
        std::fs::remove_file(path).unwrap();
        std::fs::write(path, "7000 10 only\n8000 10 other\n").unwrap();
        reload(&mut map, path);
        assert_eq!(map.len(), 2);
    }
}
