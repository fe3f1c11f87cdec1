//! Functions named whole.
//!
//! The address of a stack's innermost frame is whichever instruction of its
//! function was running, so a program sampled again (in a later period, or
//! in a later run that reads the symbol store) keeps meeting addresses of
//! its hot functions that were never named, and each period that meets one
//! has blazesym parse the file again: ~8 ms and 10 MiB for libc's debug
//! file. At 999 Hz that parse came back in most runs of a libc-heavy or a
//! process-spawning workload, and was most of what the profiler spent per
//! sample beyond reading it.
//!
//! So when a period has blazesym parse a file anyway, the functions of its
//! new innermost addresses are named whole while the file is parsed (small
//! ones at once, larger ones when met again: see
//! [`Symbolizer::name_whole_functions`]): every byte of each, by the same
//! lookup as a sampled address (~0.5–0.8 µs a byte then), kept as runs of
//! consecutive offsets named alike. Any later address in them is found without blazesym, in this run
//! and through the store in later ones, and is named exactly as its own
//! lookup would have named it.
//!
//! Call sites qualify too, but only in small functions: a return address is
//! the same at every sample, yet a program's start-up and exit code (ld.so's
//! loader, libc's `exit`, `fork` and `execve` paths) has many call sites,
//! each sampled now and then while the kernel works for it. A
//! process-spawning workload met one or two new ones in most runs at 999
//! Hz, and each cost a parse of libc (2.2 ms) or ld.so (0.6–1.3 ms). A
//! large function's call sites are left to their own lookups: they are
//! fewer than its instructions, and naming 15 KiB of ld.so's `dl_main` cost
//! 13 ms.
use std::collections::HashSet;
use std::ops::Range;

use super::{DebugCopy, FrameSymbols, Symbolizer};
use crate::files::MappedFile;

/// Functions larger than this are not named whole: their bytes would cost
/// more than the parses they save. (ld.so's `_dl_relocate_object`, which
/// every new process runs, is 8.5 KiB.)
pub(super) const MAX_FUNCTION_BYTES: u64 = 16 << 10;
/// Functions up to this size are named whole the first time they are met;
/// larger ones when met again.
const MAX_FIRST_MEETING_BYTES: u64 = 2 << 10;
/// Bytes named whole per period, all files together: ~30 ms at most.
pub(super) const MAX_BYTES_PER_PERIOD: u64 = 48 << 10;

/// Bytes looked up at once.
const CHUNK_BYTES: usize = 1024;

/// Consecutive file offsets `start..end` named alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Span {
    pub start: u64,
    pub end: u64,
    pub symbols: FrameSymbols,
}

impl Symbolizer {
    /// Names whole, among the `functions` (file offsets, and whether met at
    /// an innermost address rather than a call site; one per new address,
    /// so a function comes once per address) of the file under `key`, which
    /// blazesym holds parsed (`open_path`, or `copy` of its split debug
    /// file): those of [`MAX_FIRST_MEETING_BYTES`] at most, and larger ones
    /// met again at innermost addresses (at two or more this period, or at
    /// one beside an address the file's cache knew already, from an earlier
    /// period or the store). A large function's call sites keep their own
    /// lookups (see the module's comment). A parse costs about what naming 10 KiB
    /// does: a small function pays off if it comes back one time in ten,
    /// but a large one met once may never come back (ld.so's `dl_main`, 15
    /// KiB that every new process runs once, cost 13 ms each time a
    /// process-spawning workload happened to sample it). Within the
    /// period's budget, smallest first; each at most once per run. Adds the
    /// spans to the file's cache.
    pub(super) fn name_whole_functions(
        &mut self,
        key: &MappedFile,
        open_path: &str,
        display_path: &str,
        copy: Option<&DebugCopy>,
        functions: Vec<(Range<u64>, bool)>,
    ) {
        let functions =
            self.name_symbol_only_functions(key, open_path, display_path, copy, functions);
        let Some(cache) = self.files.get_mut(key) else {
            return;
        };
        let mut functions: Vec<Range<u64>> = functions
            .into_iter()
            .filter(|(function, innermost)| {
                *innermost || function.end - function.start <= MAX_FIRST_MEETING_BYTES
            })
            .map(|(function, _)| function)
            .collect();
        functions.sort_by_key(|function| (function.start, function.end));
        let mut met: Vec<(Range<u64>, usize)> = Vec::new();
        for function in functions {
            match met.last_mut() {
                Some((last, count)) if *last == function => *count += 1,
                _ => met.push((function, 1)),
            }
        }
        // A scan of the file's addresses (up to 200,000) for the few large
        // functions met once; sorting them all for it cost more.
        let known_in = |function: &Range<u64>| {
            cache
                .addresses
                .keys()
                .any(|offset| function.contains(offset))
        };
        let mut functions: Vec<Range<u64>> = met
            .into_iter()
            .filter(|(function, count)| {
                function.end - function.start <= MAX_FIRST_MEETING_BYTES
                    || *count >= 2
                    || known_in(function)
            })
            .map(|(function, _)| function)
            .collect();
        functions.sort_by_key(|function| (function.end - function.start, function.start));
        let mut offsets: Vec<u64> = Vec::new();
        for function in functions {
            let size = function.end - function.start;
            if size > MAX_FUNCTION_BYTES
                || self.whole_function_bytes + size > MAX_BYTES_PER_PERIOD
                || !cache.named_whole.insert(function.start)
            {
                continue;
            }
            self.whole_function_bytes += size;
            offsets.extend(function);
        }
        if offsets.is_empty() {
            return;
        }
        offsets.sort_unstable();
        offsets.dedup();
        let started = std::time::Instant::now();
        let mut spans: Vec<Span> = Vec::new();
        // A chunk at a time: blazesym's answer for one byte (names, lines,
        // inlined functions) takes a few hundred bytes before it is folded
        // into a span, and all of a 16 KiB function at once was +10 MiB.
        for chunk in offsets.chunks(CHUNK_BYTES) {
            // As for the sampled addresses: a parser's bug costs this, not
            // the run.
            let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.blazesym_lines(open_path, chunk, copy, true)
            }));
            let Ok(Ok(raw)) = attempt else {
                log::debug!("cannot name the functions of {display_path} whole");
                return;
            };
            for span in self.spans_of(chunk, raw.lines) {
                match spans.last_mut() {
                    // A run cut by the chunk's end.
                    Some(last) if last.end == span.start && last.symbols == span.symbols => {
                        last.end = span.end
                    }
                    _ => spans.push(span),
                }
            }
        }
        log::debug!(
            "named {} bytes of {display_path} whole in {:?}: {} spans",
            offsets.len(),
            started.elapsed(),
            spans.len()
        );
        self.add_spans(key, spans);
    }

    /// Adds `spans` to the cache of the file under `key` (and to what its
    /// store entry is to gain).
    fn add_spans(&mut self, key: &MappedFile, spans: Vec<Span>) {
        let Some(cache) = self.files.get_mut(key) else {
            return;
        };
        let stored = matches!(cache.store_key, Some(Some(_)));
        let mut added = 0;
        for span in spans {
            if stored {
                cache.unsaved_spans.push(span.start);
            }
            if cache
                .spans
                .insert(span.start, (span.end, span.symbols))
                .is_none()
            {
                added += 1;
            }
        }
        self.cached_addresses += added;
    }

    /// Names whole, for two lookups each, the `functions` that a symbol
    /// table alone names (no lines, no inlined functions: a file without
    /// DWARF, as the Rust toolchain's libraries and many a package are),
    /// whatever their size and wherever they were met; returns the others.
    /// Every byte of such a function is named as its first is when its
    /// last is named alike too: the symbol covers the whole range (a symbol
    /// nested inside it would name the bytes after its start, the last
    /// among them). A file named so needs blazesym again only for a
    /// function never met before: at a warm `rustc -O` of a 1,000-function
    /// file, naming the functions of librustc_driver byte by byte was ~50
    /// ms a run, within the period's budget, and each run met new ones.
    fn name_symbol_only_functions(
        &mut self,
        key: &MappedFile,
        open_path: &str,
        display_path: &str,
        copy: Option<&DebugCopy>,
        functions: Vec<(Range<u64>, bool)>,
    ) -> Vec<(Range<u64>, bool)> {
        // A split debug file is DWARF: its names have lines.
        let Some(cache) = self.files.get(key).filter(|_| copy.is_none()) else {
            return functions;
        };
        let mut candidates: Vec<Range<u64>> = functions
            .iter()
            .map(|(function, _)| function.clone())
            .filter(|function| {
                function.end - function.start >= 2 && !cache.named_whole.contains(&function.start)
            })
            .collect();
        candidates.sort_by_key(|function| (function.start, function.end));
        candidates.dedup();
        if candidates.is_empty() {
            return functions;
        }
        let ends: Vec<u64> = candidates
            .iter()
            .flat_map(|function| [function.start, function.end - 1])
            .collect();
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.blazesym_lines(open_path, &ends, copy, true)
        }));
        let Ok(Ok(raw)) = attempt else {
            log::debug!("cannot look up the functions of {display_path}");
            return functions;
        };
        let symbol_only = |lines: &Option<Vec<super::OwnedLine>>| match lines.as_deref() {
            Some([line]) if line.line == 0 && line.file.is_empty() => Some(line.clone()),
            _ => None,
        };
        let mut spans: Vec<(Range<u64>, super::OwnedLine)> = Vec::new();
        for (function, ends) in candidates.iter().zip(raw.lines.chunks(2)) {
            if let [first, last] = ends {
                if let (Some(first), Some(last)) = (symbol_only(first), symbol_only(last)) {
                    if first == last {
                        spans.push((function.clone(), first));
                    }
                }
            }
        }
        if spans.is_empty() {
            return functions;
        }
        let spanned: HashSet<u64> = spans.iter().map(|(function, _)| function.start).collect();
        let spans: Vec<Span> = spans
            .into_iter()
            .map(|(function, line)| Span {
                start: function.start,
                end: function.end,
                symbols: FrameSymbols::from(self.intern_lines(vec![line])),
            })
            .collect();
        self.add_spans(key, spans);
        if let Some(cache) = self.files.get_mut(key) {
            cache.named_whole.extend(spanned.iter().copied());
        }
        functions
            .into_iter()
            .filter(|(function, _)| !spanned.contains(&function.start))
            .collect()
    }

    /// Runs of consecutive `offsets` whose `lines` are equal (offsets that
    /// nothing names end a run).
    fn spans_of(
        &mut self,
        offsets: &[u64],
        lines: Vec<Option<Vec<super::OwnedLine>>>,
    ) -> Vec<Span> {
        let mut spans: Vec<Span> = Vec::new();
        // The lines of the last span, before interning.
        let mut last_lines: Vec<super::OwnedLine> = Vec::new();
        for (&offset, lines) in offsets.iter().zip(lines) {
            let Some(lines) = lines.filter(|lines| !lines.is_empty()) else {
                continue;
            };
            match spans.last_mut() {
                // An offset that nothing names leaves a gap: no span ends
                // where the next one starts.
                Some(span) if span.end == offset && last_lines == lines => span.end = offset + 1,
                _ => {
                    let symbols = FrameSymbols::from(self.intern_lines(lines.clone()));
                    spans.push(Span {
                        start: offset,
                        end: offset + 1,
                        symbols,
                    });
                    last_lines = lines;
                }
            }
        }
        spans
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FileCache, SymbolLine, SymbolizerOptions};
    use super::*;
    use crate::aggregate::{Aggregator, AggregatorOptions, PeriodProfile};
    use crate::process::ProcessTable;
    use crate::sample::{Sample, StackEnd};

    fn line(function: &str, number: u32) -> super::super::OwnedLine {
        super::super::OwnedLine {
            function: function.to_string(),
            system_name: function.to_string(),
            file: "f.c".to_string(),
            line: number,
        }
    }

    #[test]
    fn spans_are_runs_of_consecutive_offsets_named_alike() {
        let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
        let a = vec![line("f", 1)];
        let b = vec![line("f", 2)];
        let spans = symbolizer.spans_of(
            &[10, 11, 12, 14, 15, 16, 17],
            vec![
                Some(a.clone()),
                Some(a.clone()),
                Some(b.clone()),
                // Not consecutive: a run of its own.
                Some(b.clone()),
                None,
                Some(a.clone()),
                Some(vec![]),
            ],
        );
        let bounds: Vec<(u64, u64, u32)> = spans
            .iter()
            .map(|span| (span.start, span.end, span.symbols[0].line))
            .collect();
        assert_eq!(bounds, [(10, 12, 1), (12, 13, 2), (14, 15, 2), (16, 17, 1)]);
    }

    /// A period of this process with a one-frame stack for each of `leaves`.
    fn period_with_leaves(table: &ProcessTable, leaves: &[u64]) -> PeriodProfile {
        let stacks: Vec<Vec<u64>> = leaves.iter().map(|&leaf| vec![leaf]).collect();
        period_with_stacks(table, &stacks)
    }

    /// A period of this process with these stacks (innermost first).
    fn period_with_stacks(table: &ProcessTable, stacks: &[Vec<u64>]) -> PeriodProfile {
        let pid = std::process::id();
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        for frames in stacks {
            aggregator.add(
                table,
                &Sample {
                    pid,
                    tid: pid,
                    time: 0,
                    cpu: 0,
                    event: 0,
                    weight: 1,
                    scaled_count: crate::events::COUNT_UNIT,
                    frames: frames.clone(),
                    kernel_frames: vec![],
                    heap: None,
                    off_cpu: None,
                    trace: None,
                    end: StackEnd::Complete,
                },
            );
        }
        let now = std::time::SystemTime::now();
        aggregator.take_period(now, now)
    }

    fn libc_cache(symbolizer: &Symbolizer) -> (&crate::files::MappedFile, &FileCache) {
        symbolizer
            .files
            .iter()
            .find(|(file, _)| file.path.contains("libc.so"))
            .expect("libc was symbolized")
    }

    /// libc's `malloc` (a program nobody wrote for us, with its debug file
    /// when the machine has it): every byte of the function named whole is
    /// named as its own lookup names it, and a later run that reads the
    /// store finds another address of it without parsing libc.
    #[test]
    fn a_function_named_whole_names_each_byte_as_its_own_lookup_would() {
        let dir = std::env::temp_dir().join(format!("ddprof-whole-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let options = SymbolizerOptions {
            symbol_store: Some(dir.clone()),
            ..SymbolizerOptions::default()
        };
        let mut table = ProcessTable::new();
        table.load_from_proc(std::process::id()).unwrap();
        let sampled = libc::malloc as *const () as usize as u64 + 1;

        let mut first = Symbolizer::new(options.clone());
        // Met at two addresses: named whole.
        let named = first.symbolize(period_with_leaves(&table, &[sampled, sampled + 8]));
        let Some(crate::aggregate::Frame::File { offset, .. }) = named.period.frames.first() else {
            panic!("malloc is not in a file: {:?}", named.period.frames);
        };
        let sampled_offset = *offset;
        let (file, cache) = libc_cache(&first);
        let path = file.path.clone();
        let spans: Vec<(u64, u64)> = cache
            .spans
            .iter()
            .map(|(start, (end, _))| (*start, *end))
            .collect();
        let whole = spans.first().unwrap().0..spans.last().unwrap().1;
        assert!(
            whole.contains(&sampled_offset) && whole.end - whole.start >= 8,
            "malloc at {sampled_offset:#x} named whole as {spans:x?}"
        );
        let every_offset: Vec<u64> = whole.clone().collect();
        let one_by_one = Symbolizer::new(SymbolizerOptions::default())
            .symbolize_file_offsets(&path, &every_offset);
        let mut named_by_spans = 0;
        for (offset, own_lookup) in every_offset.iter().zip(&one_by_one) {
            match cache.lookup(*offset) {
                Some(symbols) => {
                    assert_eq!(symbols, own_lookup, "at {offset:#x}");
                    named_by_spans += 1;
                }
                // Only where nothing names the byte (padding).
                None => assert!(own_lookup[0].function.starts_with('['), "at {offset:#x}"),
            }
        }
        assert!(named_by_spans >= 8, "{named_by_spans} bytes");
        assert!(one_by_one[(sampled_offset - whole.start) as usize]
            .iter()
            .any(|line: &SymbolLine| line.function.contains("malloc")));

        // A later run: another byte of malloc comes from the store.
        let other = whole.end - 1;
        let mut second = Symbolizer::new(options);
        let named = second.symbolize(period_with_leaves(
            &table,
            &[sampled + (other - sampled_offset)],
        ));
        assert_eq!(
            named.frames[0],
            one_by_one[(other - whole.start) as usize],
            "at {other:#x}"
        );
        let (_, cache) = libc_cache(&second);
        assert!(
            cache.named_whole.is_empty(),
            "libc was parsed again for {other:#x}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// This process's table, and the addresses of libc's `getenv` (204
    /// bytes in this machine's libc) and `getaddrinfo` (8,624 bytes): a
    /// small and a large function.
    fn this_process_with_getenv_and_getaddrinfo() -> (ProcessTable, u64, u64) {
        let mut table = ProcessTable::new();
        table.load_from_proc(std::process::id()).unwrap();
        let getenv = libc::getenv as *const () as usize as u64;
        let getaddrinfo = libc::getaddrinfo as *const () as usize as u64;
        (table, getenv, getaddrinfo)
    }

    /// A small function is named whole at once; a large one met once is
    /// not (it may never come back), but is once met again in a later
    /// period.
    #[test]
    fn a_large_function_is_named_whole_once_met_again() {
        let (table, getenv, getaddrinfo) = this_process_with_getenv_and_getaddrinfo();
        let offset_of = |named: &super::super::SymbolizedProfile, index: usize| match named
            .period
            .frames
            .get(index)
        {
            Some(crate::aggregate::Frame::File { offset, .. }) => *offset,
            other => panic!("not in a file: {other:?}"),
        };
        let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
        let named =
            symbolizer.symbolize(period_with_leaves(&table, &[getenv + 1, getaddrinfo + 1]));
        let (getenv_at, getaddrinfo_at) = (offset_of(&named, 0), offset_of(&named, 1));
        let (_, cache) = libc_cache(&symbolizer);
        assert!(
            cache.spans.contains_key(&(getenv_at - 1)),
            "getenv at {getenv_at:#x} is small: named whole at once; spans {:x?}",
            cache.spans.keys()
        );
        assert!(
            cache.lookup(getaddrinfo_at + 3).is_none(),
            "getaddrinfo at {getaddrinfo_at:#x} named whole when met once"
        );
        symbolizer.symbolize(period_with_leaves(&table, &[getaddrinfo + 4]));
        let (_, cache) = libc_cache(&symbolizer);
        assert!(
            cache.spans.contains_key(&(getaddrinfo_at - 1))
                && cache.lookup(getaddrinfo_at + 2000).is_some(),
            "getaddrinfo at {getaddrinfo_at:#x} not named whole when met again: {:x?}",
            cache.spans.keys()
        );
    }

    /// A call site names its function whole when the function is small
    /// (start-up and exit code has many call sites, each sampled now and
    /// then), and not when it is large, even met at two call sites.
    #[test]
    fn a_call_site_names_its_function_whole_only_if_small() {
        let (table, getenv, getaddrinfo) = this_process_with_getenv_and_getaddrinfo();
        let leaf = libc::getpid as *const () as usize as u64 + 1;
        let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
        let named = symbolizer.symbolize(period_with_stacks(
            &table,
            // getaddrinfo at two call sites: an innermost address would
            // have it named whole.
            &[
                vec![leaf, getenv + 10, getaddrinfo + 10],
                vec![leaf, getenv + 10, getaddrinfo + 20],
            ],
        ));
        // Return addresses are looked up one byte back.
        let call_site = |index: usize| match named.period.frames.get(index) {
            Some(crate::aggregate::Frame::File { offset, .. }) => *offset,
            other => panic!("not in a file: {other:?}"),
        };
        let (getenv_at, getaddrinfo_at) = (call_site(1) - 9, call_site(2) - 9);
        let (_, cache) = libc_cache(&symbolizer);
        assert!(
            cache.spans.contains_key(&getenv_at) && cache.lookup(getenv_at + 100).is_some(),
            "getenv at {getenv_at:#x}, a call site in a small function, not named whole: {:x?}",
            cache.spans.keys()
        );
        assert!(
            cache.lookup(getaddrinfo_at + 2000).is_none(),
            "getaddrinfo at {getaddrinfo_at:#x}, a call site in a large function, named whole"
        );
    }

    /// libgcc_s's `_Unwind_RaiseException`, which a symbol table alone
    /// names (Debian ships the library without DWARF; no debug file here):
    /// the file offset of its first byte, its size, and where this process
    /// maps that byte.
    fn symbol_only_function() -> (u64, u64, u64) {
        use object::{Object, ObjectSegment, ObjectSymbol};
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (line, path) = maps
            .lines()
            .find_map(|line| {
                let path = line.split_whitespace().nth(5)?;
                (path.contains("libgcc_s.so") && line.contains(" r-xp ")).then_some((line, path))
            })
            .expect("this test links libgcc_s");
        let mut fields = line.split_whitespace();
        let start = u64::from_str_radix(fields.next().unwrap().split('-').next().unwrap(), 16);
        let map_offset = u64::from_str_radix(fields.nth(1).unwrap(), 16).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        assert!(
            elf.section_by_name(".debug_info").is_none(),
            "{path} has DWARF"
        );
        let symbol = elf
            .dynamic_symbols()
            .find(|symbol| symbol.name() == Ok("_Unwind_RaiseException"))
            .expect("libgcc_s exports _Unwind_RaiseException");
        let segment = elf
            .segments()
            .find(|segment| {
                (segment.address()..segment.address() + segment.size()).contains(&symbol.address())
            })
            .unwrap();
        let offset = symbol.address() - segment.address() + segment.file_range().0;
        (offset, symbol.size(), start.unwrap() + offset - map_offset)
    }

    /// A function that a symbol table alone names is named whole for two
    /// lookups, whatever its size and though met once: every byte of it
    /// as its own lookup names it, one span, no byte-by-byte lookups.
    #[test]
    fn a_function_named_by_its_symbol_alone_is_named_whole_at_once() {
        let (offset, size, address) = symbol_only_function();
        assert!(size > 16, "{size} bytes");
        let mut table = ProcessTable::new();
        table.load_from_proc(std::process::id()).unwrap();
        let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
        symbolizer.symbolize(period_with_leaves(&table, &[address + 5]));
        let (file, cache) = symbolizer
            .files
            .iter()
            .find(|(file, _)| file.path.contains("libgcc_s"))
            .expect("libgcc_s was symbolized");
        let spans: Vec<(u64, u64)> = cache
            .spans
            .iter()
            .map(|(start, (end, _))| (*start, *end))
            .collect();
        assert_eq!(
            spans,
            [(offset, offset + size)],
            "one span for the whole function"
        );
        assert!(cache.named_whole.contains(&offset));
        assert_eq!(
            symbolizer.whole_function_bytes, 0,
            "no byte-by-byte lookups"
        );
        let every_offset: Vec<u64> = (offset..offset + size).collect();
        let one_by_one = Symbolizer::new(SymbolizerOptions::default())
            .symbolize_file_offsets(&file.path, &every_offset);
        for (byte, own_lookup) in every_offset.iter().zip(&one_by_one) {
            assert_eq!(cache.lookup(*byte), Some(own_lookup), "at {byte:#x}");
        }
        assert!(one_by_one[0][0].function.contains("_Unwind_RaiseException"));
    }
}
