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
//! the file, and it is read a chunk at a time, never held whole as bytes.
//!
//! An agent that dumps its map again truncates it and writes it anew; a
//! read in between finds a few bytes or none, and a period named from that
//! would lose its JIT frames. So a map that comes out shorter than the one
//! read before keeps the longer one to answer what it does not name, until
//! the file is as long again or stays unchanged for a period (then it was
//! a map that really shrank).
use std::sync::Arc;

use super::jitdump;
use crate::files::target::{JitFormat, JitSymbols, PerfMapRefused, MAX_PERF_MAP_BYTES};
use crate::files::FileStamp;

/// Bytes just before the end of what was parsed, compared again before an
/// appended part is read: a map rewritten in place (an agent that dumps
/// all its symbols again) is read from its start.
const SEAM_BYTES: usize = 64;

/// Bytes of a map read at a time.
const READ_CHUNK: usize = 1 << 20;

/// Functions kept of one map: 64 MiB of real lines name about a million;
/// 64 MiB of the shortest lines would be 11 million entries (260 MiB).
const MAX_PERF_MAP_ENTRIES: usize = 2_000_000;

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
    version: Option<FileStamp>,
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
    /// The longer map read before this one, while the file is shorter (a
    /// runtime may be writing it again): it names what this one does not.
    earlier: Option<Box<PerfMap>>,
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
        self.lookup_here(addr)
            .or_else(|| self.earlier.as_ref()?.lookup_here(addr))
    }

    /// [`Self::lookup`] in what was read last only.
    fn lookup_here(&self, addr: u64) -> Option<&str> {
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
        self.extend(text.lines().filter_map(parse_line));
    }

    /// Adds functions (start, size, name) to the map.
    fn extend<'a>(&mut self, functions: impl Iterator<Item = (u64, u64, &'a str)>) {
        let sorted_before = self.entries.len();
        for (start, size, name) in functions {
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

/// Reads process `pid`'s perf map (or jitdump), opened as `opened`, again
/// if it changed since `map` was read; a refused one is said once per
/// process.
pub(super) fn reload_perf_map(
    map: &mut PerfMap,
    pid: u32,
    opened: &Result<Arc<JitSymbols>, PerfMapRefused>,
) {
    let file = match opened {
        Ok(symbols) if symbols.format == JitFormat::JitDump => {
            return reload_jitdump(map, pid, &symbols.file)
        }
        Ok(symbols) => &symbols.file,
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
    let version = FileStamp::of(&metadata);
    if Some(version) == map.version {
        // Unchanged for a period: no runtime is writing it, a shorter map
        // is the whole map now.
        map.earlier = None;
        return;
    }
    let end = version.size.min(MAX_PERF_MAP_BYTES);
    // An append: the bytes read last just before where the read stopped
    // are still there.
    let appended = map.version.is_some_and(|last| {
        last.same_file(&version) && end >= map.parsed && seam_still_there(file, map)
    });
    // Anything else is read whole, into a fresh map.
    let from = if appended { map.parsed } else { 0 };
    let Some(complete) = read_into(map, file, from, end, !appended) else {
        return;
    };
    // Rewritten while it was read (a runtime that writes it whole again):
    // what was read may mix two versions, so it is read whole next time.
    // Appends meanwhile are fine: they are read next time.
    let still_there = file.metadata().is_ok_and(|after| {
        let after = FileStamp::of(&after);
        after.same_file(&version) && after.size >= map.parsed && seam_still_there(file, map)
    });
    map.version = (complete && still_there).then_some(version);
    if map
        .earlier
        .as_ref()
        .is_some_and(|earlier| map.parsed >= earlier.parsed)
    {
        map.earlier = None;
    }
}

/// Whether the file holds, just before where `map` stopped reading, the
/// bytes it read there.
fn seam_still_there(file: &std::fs::File, map: &PerfMap) -> bool {
    let mut now = vec![0; map.seam.len()];
    let at = map.parsed - map.seam.len() as u64;
    std::os::unix::fs::FileExt::read_exact_at(file, &mut now, at).is_ok() && now == map.seam
}

/// Reads `file` from `from` (where `map` stopped, or 0 with `fresh`) to
/// `end` into `map`, [`READ_CHUNK`] bytes at a time (a map is never held
/// whole as bytes beside its parsed form); with `fresh`, `map` starts over
/// once the first read succeeded (until then the last one stays). Whether
/// it read to `end`; `None`: nothing could be read.
fn read_into(
    map: &mut PerfMap,
    file: &std::fs::File,
    from: u64,
    end: u64,
    fresh: bool,
) -> Option<bool> {
    let mut chunk = vec![0; READ_CHUNK];
    let mut offset = from;
    // The bytes after the last newline read so far.
    let mut carried = Vec::new();
    let mut first = true;
    while offset < end {
        let want = (end - offset).min(READ_CHUNK as u64) as usize;
        let read = match std::os::unix::fs::FileExt::read_at(file, &mut chunk[..want], offset) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) if first => return None,
            Err(_) => break,
        };
        if first {
            first = false;
            if fresh {
                map.start_over(end);
            }
            // Names are most of a map's bytes: one allocation, not a
            // doubling.
            map.names.reserve((end - offset) as usize);
        }
        offset += read as u64;
        carried.extend_from_slice(&chunk[..read]);
        // (Looked for in the new bytes only: a map without newlines is
        // not scanned again at each chunk.)
        if chunk[..read].contains(&b'\n') {
            let taken = map.take_whole_lines(&carried);
            carried.drain(..taken);
        }
    }
    if first && fresh {
        // An empty file (or one emptied since its length was taken).
        map.start_over(0);
    }
    map.unfinished = parse_line(&String::from_utf8_lossy(&carried))
        .map(|(start, size, name)| (start, size, name.to_string()));
    Some(offset == end)
}

impl PerfMap {
    /// Forgets what was read, to read a file of `length` bytes from its
    /// start (what was said about the process stays). The longest map read
    /// before stays as [`Self::earlier`] if it is longer than that.
    fn start_over(&mut self, length: u64) {
        let fresh = PerfMap {
            last_period: self.last_period,
            refusal_said: self.refusal_said,
            overflow_said: self.overflow_said,
            ..PerfMap::default()
        };
        let mut last = std::mem::replace(self, fresh);
        let longest = match last.earlier.take() {
            Some(earlier) if earlier.parsed >= last.parsed => earlier,
            _ => Box::new(last),
        };
        self.earlier = (longest.parsed > length).then_some(longest);
    }

    /// Takes the whole lines of `bytes` (read from where the last read
    /// stopped); returns how many bytes they are.
    fn take_whole_lines(&mut self, bytes: &[u8]) -> usize {
        let whole = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        if whole == 0 {
            return 0;
        }
        // JIT names are whatever bytes the runtime wrote: decode lossily
        // rather than lose the whole map to one non-UTF-8 name.
        self.append(&String::from_utf8_lossy(&bytes[..whole]));
        self.parsed += whole as u64;
        // The seam: the last SEAM_BYTES parsed, old and new.
        self.seam
            .extend_from_slice(&bytes[whole.saturating_sub(SEAM_BYTES)..whole]);
        let excess = self.seam.len().saturating_sub(SEAM_BYTES);
        self.seam.drain(..excess);
        whole
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

/// Reads process `pid`'s jitdump into `map` if it changed: from where the
/// last read stopped when it only grew (a runtime appends its records), or
/// from its start. A record not all there yet is read next time.
fn reload_jitdump(map: &mut PerfMap, pid: u32, file: &std::fs::File) {
    use std::os::unix::fs::FileExt;
    let Ok(metadata) = file.metadata() else {
        return;
    };
    let version = FileStamp::of(&metadata);
    if Some(version) == map.version {
        return;
    }
    let appended = map.parsed > 0
        && map
            .version
            .is_some_and(|last| last.same_file(&version) && version.size >= map.parsed);
    if !appended {
        *map = PerfMap {
            last_period: map.last_period,
            refusal_said: map.refusal_said,
            overflow_said: map.overflow_said,
            ..PerfMap::default()
        };
        let mut header = [0; 64];
        let read = file.read_at(&mut header, 0).unwrap_or(0);
        match jitdump::records_start(&header[..read]) {
            Some(start) => map.parsed = start,
            // Not written yet, or not a jitdump: looked at again when it changes.
            None => return,
        }
    }
    let end = version.size.min(MAX_PERF_MAP_BYTES);
    let mut chunk = vec![0; READ_CHUNK];
    let mut carried: Vec<u8> = Vec::new();
    let mut offset = map.parsed;
    while offset < end {
        let want = (end - offset).min(READ_CHUNK as u64) as usize;
        let read = match file.read_at(&mut chunk[..want], offset) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        offset += read as u64;
        carried.extend_from_slice(&chunk[..read]);
        let found = jitdump::records(&carried);
        map.extend(found.loads.iter().copied());
        map.parsed += found.consumed as u64;
        if found.corrupt {
            if !map.refusal_said {
                map.refusal_said = true;
                log::warn!(
                    "process {pid}: its jitdump has a record of an impossible size at byte {}; \
                     the functions after it stay unnamed",
                    map.parsed
                );
            }
            break;
        }
        carried.drain(..found.consumed);
        if carried.len() > jitdump::MAX_RECORD {
            break;
        }
    }
    map.version = Some(version);
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
        reload_as(map, path, JitFormat::PerfMap);
    }

    fn reload_as(map: &mut PerfMap, path: &std::path::Path, format: JitFormat) {
        let file = Ok(Arc::new(JitSymbols {
            file: std::fs::File::open(path).unwrap(),
            format,
        }));
        reload_perf_map(map, 1, &file);
    }

    #[test]
    fn a_jitdump_is_read_as_its_runtime_appends_records() {
        let first = jitdump::write(&[(0x1000, 0x40, "JS:*hot"), (0x2000, 0x40, "JS:cold")]);
        let file = map_file("jitdump", "");
        let path = &file.0;
        // Half of the second record written: the first named, the second
        // read once it is whole.
        let cut = first.len() - 30;
        std::fs::write(path, &first[..cut]).unwrap();
        let mut map = PerfMap::default();
        reload_as(&mut map, path, JitFormat::JitDump);
        assert_eq!(map.lookup(0x1010), Some("JS:*hot"));
        assert_eq!(map.lookup(0x2010), None);
        let mut appending = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        appending.write_all(&first[cut..]).unwrap();
        reload_as(&mut map, path, JitFormat::JitDump);
        assert_eq!(map.lookup(0x2010), Some("JS:cold"));
        assert_eq!(map.len(), 2);
        // A new file in its place (a runtime that started again): read whole.
        std::fs::remove_file(path).unwrap();
        std::fs::write(path, jitdump::write(&[(0x3000, 0x40, "JS:new")])).unwrap();
        reload_as(&mut map, path, JitFormat::JitDump);
        assert_eq!(map.lookup(0x3010), Some("JS:new"));
        assert_eq!(map.lookup(0x1010), None);
        // Not a jitdump: nothing named, nothing trusted.
        std::fs::write(path, "1000 100 not_a_jitdump\n").unwrap();
        let mut map = PerfMap::default();
        reload_as(&mut map, path, JitFormat::JitDump);
        assert_eq!(map.len(), 0);
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
    fn a_map_longer_than_a_read_is_parsed_across_its_reads() {
        let mut text = String::new();
        let mut lines = 0u64;
        while text.len() < 2 * READ_CHUNK + READ_CHUNK / 2 {
            text.push_str(&format!(
                "{:x} 10 function_{lines}\n",
                0x10_0000 + lines * 16
            ));
            lines += 1;
        }
        let file = map_file("chunks", &text);
        let mut map = PerfMap::default();
        reload(&mut map, &file.0);
        assert_eq!(map.len() as u64, lines);
        assert_eq!(map.parsed, text.len() as u64);
        for line in [0, lines / 3, lines / 2, lines - 1] {
            let name = format!("function_{line}");
            assert_eq!(map.lookup(0x10_0000 + line * 16 + 3), Some(name.as_str()));
        }
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
        // Shorter: read again whole. The longer map names what it does
        // not until the file stays unchanged for a period.
        std::fs::write(path, "7000 10 only\n").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x7001), Some("only"));
        assert_eq!(map.lookup(0x1000), Some("new_a"));
        reload(&mut map, path);
        assert_eq!(map.lookup(0x1000), None);
        assert_eq!(map.lookup(0x7001), Some("only"));
        // Another file at the name (a new inode): read whole.
        std::fs::remove_file(path).unwrap();
        std::fs::write(path, "7000 10 only\n8000 10 other\n").unwrap();
        reload(&mut map, path);
        assert_eq!(map.len(), 2);
    }

    /// An agent that dumps its map again truncates it and writes it anew;
    /// the reads in between find nothing, then part of it.
    #[test]
    fn a_map_read_while_it_is_written_again_keeps_naming_its_functions() {
        let whole = "1000 100 jit_a\n2000 100 jit_b\n3000 100 jit_c\n";
        let file = map_file("dumped", whole);
        let path = &file.0;
        let mut map = PerfMap::default();
        reload(&mut map, path);
        // Truncated: nothing to read yet.
        std::fs::write(path, "").unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x1010), Some("jit_a"));
        assert_eq!(map.lookup(0x3010), Some("jit_c"));
        // Part of the new map (a function moved, its line not written
        // yet): the earlier map names it, and what is past the new part.
        let dumped = "1000 100 jit_a\n2000 100 jit_b2\n3000 100 jit_c\n4000 10 jit_d\n";
        std::fs::write(path, &dumped[..20]).unwrap();
        reload(&mut map, path);
        assert_eq!(map.lookup(0x2010), Some("jit_b"));
        assert_eq!(map.lookup(0x3010), Some("jit_c"));
        // Written again to the end (an append now): the earlier map goes.
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap()
            .write_all(&dumped.as_bytes()[20..])
            .unwrap();
        reload(&mut map, path);
        assert!(map.earlier.is_none());
        assert_eq!(map.lookup(0x2010), Some("jit_b2"));
        assert_eq!(map.lookup(0x4001), Some("jit_d"));
        assert_eq!(map.len(), 4);
    }
}
