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

/// Functions kept of one map: 64 MiB of real lines name about a million;
/// 64 MiB of the shortest lines would be 11 million entries (260 MiB).
const MAX_PERF_MAP_ENTRIES: usize = 2_000_000;

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
    /// The line after the last newline, parsed until the next read (a
    /// runtime may still be writing it, or exited without ending it).
    unfinished: Option<(u64, u64, String)>,
    /// Lines past [`MAX_PERF_MAP_ENTRIES`] were said already.
    overflow_said: bool,
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
        let covers = |start: u64, size: u64| start <= addr && addr < start.saturating_add(size);
        let index = self.entries.partition_point(|entry| entry.start <= addr);
        // Entries can overlap when a JIT reuses memory: the latest start at or
        // below the address that still covers it wins (for the same start, the
        // line written last).
        let found = self.entries[..index]
            .iter()
            .rev()
            .take(8)
            .find(|entry| covers(entry.start, entry.size));
        match (&self.unfinished, found) {
            (Some((start, size, name)), found)
                if covers(*start, *size) && found.is_none_or(|entry| entry.start <= *start) =>
            {
                Some(name)
            }
            (_, found) => found.map(|entry| {
                let at = entry.name_at as usize;
                &self.names[at..at + entry.name_len as usize]
            }),
        }
    }

    /// Functions in the map.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Parses `text`'s lines (`START SIZE NAME`, hexadecimal numbers) into
    /// the map; lines that do not parse are skipped.
    fn append(&mut self, text: &str) {
        let sorted_before = self.entries.len();
        // Names are most of a map's bytes: one allocation, not a doubling.
        self.names.reserve(text.len());
        for line in text.lines() {
            let Some((start, size, name)) = parse_line(line) else {
                continue;
            };
            // The names stay below MAX_PERF_MAP_BYTES (4 GiB would not).
            let (Ok(name_at), Ok(name_len)) =
                (u32::try_from(self.names.len()), u32::try_from(name.len()))
            else {
                break;
            };
            if self.entries.len() >= MAX_PERF_MAP_ENTRIES {
                if !self.overflow_said {
                    self.overflow_said = true;
                    log::warn!(
                        "a perf map names more than {MAX_PERF_MAP_ENTRIES} functions: the \
                         rest stay unnamed"
                    );
                }
                break;
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
    let end = version.length.min(MAX_PERF_MAP_BYTES);
    // An append: the bytes read last just before where the read stopped
    // are still there (read again with the new ones, in one go).
    let appended = map
        .version
        .is_some_and(|last| last.same_file(&version) && end >= map.parsed)
        .then(|| {
            let from = map.parsed - map.seam.len() as u64;
            read_range(file, from, end)
        })
        .flatten()
        .filter(|bytes| bytes.starts_with(&map.seam));
    let complete = match appended {
        Some(bytes) => {
            let seam = map.seam.len();
            let from = map.parsed - seam as u64;
            let complete = bytes.len() as u64 == end - from;
            map.take_lines(&bytes[seam..]);
            complete
        }
        None => {
            // Anything else: read whole (the last map stays if it cannot be
            // read; it is dropped before the new one is parsed).
            let Some(bytes) = read_range(file, 0, end) else {
                return;
            };
            *map = PerfMap {
                last_period: map.last_period,
                refusal_said: map.refusal_said,
                overflow_said: map.overflow_said,
                ..PerfMap::default()
            };
            let complete = bytes.len() as u64 == end;
            map.take_lines(&bytes);
            complete
        }
    };
    // Rewritten while it was read (a runtime that writes it whole again):
    // what was read may mix two versions, so it is read whole next time.
    // Appends meanwhile are fine: they are read next time.
    let still_there = file.metadata().is_ok_and(|after| {
        let after = MapVersion::of(&after);
        after.same_file(&version)
            && after.length >= map.parsed
            && read_range(file, map.parsed - map.seam.len() as u64, map.parsed)
                .is_some_and(|seam| seam == map.seam)
    });
    map.version = (complete && still_there).then_some(version);
}

impl PerfMap {
    /// Takes `bytes`, read from where the last read stopped: its whole
    /// lines for good, the line after its last newline until the next read.
    fn take_lines(&mut self, bytes: &[u8]) {
        let whole = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        // JIT names are whatever bytes the runtime wrote: decode lossily
        // rather than lose the whole map to one non-UTF-8 name.
        self.append(&String::from_utf8_lossy(&bytes[..whole]));
        self.parsed += whole as u64;
        // The seam: the last SEAM_BYTES parsed, old and new.
        self.seam
            .extend_from_slice(&bytes[whole.saturating_sub(SEAM_BYTES)..whole]);
        let excess = self.seam.len().saturating_sub(SEAM_BYTES);
        self.seam.drain(..excess);
        self.unfinished = parse_line(&String::from_utf8_lossy(&bytes[whole..]))
            .map(|(start, size, name)| (start, size, name.to_string()));
    }
}

/// One line of a perf map: `START SIZE NAME`, hexadecimal numbers (`0x`
/// or not), a name that is not empty.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut fields = line.trim().splitn(3, ' ');
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let name = fields.next()?.trim();
    (!name.is_empty()).then_some((start, size, name))
}

/// The bytes of `file` from `from` to `end` (`pread`, leaving the file's
/// position alone), or `None` when it cannot be read.
fn read_range(file: &std::fs::File, from: u64, end: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(end.saturating_sub(from) as usize);
    FromOffset { file, offset: from }
        .take(end.saturating_sub(from))
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
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
        // The unfinished line names what it can until it is finished.
        assert_eq!(map.lookup(0x4000), Some("fou"));
        writeln!(appending, "rth").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x4004), Some("fourth"));
        assert_eq!(map.len(), 5);
        // A last line without its newline (a runtime that exited) names
        // its function too.
        write!(appending, "5000 10 fifth").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x5001), Some("fifth"));
        assert_eq!(map.lookup(0x4004), Some("fourth"));
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
