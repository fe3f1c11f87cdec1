//! Names from ELF files with blazesym: DWARF (functions, inlined
//! functions, lines) read from the file, its split debug file or the debug
//! cache's copy of it, and the symbol tables alone when the DWARF cannot be
//! read.
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::Input;

use super::names::{demangle, is_mangled};
use super::{sym_lines, DebugCopy, OwnedLine, SymbolLine, Symbolized, Symbolizer};

/// Where a file's names come from when its DWARF cannot be read.
#[derive(Debug, Default)]
pub(super) struct TableFallback {
    /// The file's split debug files (see `Symbolizer::known_debug_files`).
    pub debug_files: Vec<PathBuf>,
    /// The file's build id: only a debug file of the same build names it
    /// (a `.gnu_debuglink` name alone may find another build's).
    pub build_id: Option<Vec<u8>>,
    /// Known already: skip the DWARF.
    pub dwarf_unreadable: bool,
}

impl TableFallback {
    fn debug_file_of_this_build(&self) -> Option<&Path> {
        let build_id = self.build_id.as_deref()?;
        self.debug_files
            .iter()
            .find(|path| {
                path.to_str()
                    .and_then(crate::files::read_build_id)
                    .is_some_and(|id| id == build_id)
            })
            .map(PathBuf::as_path)
    }
}

/// What blazesym says of some offsets of a file.
#[derive(Debug, Default)]
pub(super) struct Resolved {
    /// The lines at each offset; `None` where nothing names it.
    pub lines: Vec<Option<Vec<SymbolLine>>>,
    /// The file offsets of the function at each offset, where the DWARF
    /// gives its extent (see `functions.rs`).
    pub functions: Vec<Option<Range<u64>>>,
    /// The file's DWARF could not be read: the names come from its symbol
    /// tables alone.
    pub dwarf_unreadable: bool,
}

impl Resolved {
    fn without_functions(lines: Vec<Option<Vec<SymbolLine>>>, dwarf_unreadable: bool) -> Self {
        Self {
            functions: vec![None; lines.len()],
            lines,
            dwarf_unreadable,
        }
    }
}

/// blazesym's answer for each offset, before its strings are interned.
#[derive(Debug)]
pub(super) struct RawLines {
    pub lines: Vec<Option<Vec<OwnedLine>>>,
    pub functions: Vec<Option<Range<u64>>>,
}

impl Symbolizer {
    /// Names the code at `offsets` (file offsets) of the ELF file at
    /// `open_path`, with blazesym: `None` where nothing names it. With
    /// `copy`, the names come from the decompressed copy of the file's split
    /// debug file, at the ELF addresses of the offsets; if the copy fails,
    /// from the file itself. A file whose DWARF (or whose debug file's)
    /// blazesym cannot read, though its symbol tables name something, is
    /// named from those tables (see [`TableFallback`]): a damaged debug
    /// package costs the lines and inlined functions, not the names
    /// ([`Resolved::dwarf_unreadable`] says so). A file that makes blazesym
    /// fail in any other way (a panic, a file truncated under us) names
    /// nothing; its data is dropped from blazesym's caches then, so that
    /// nothing half-read stays behind. Offsets in PLT stubs are named after
    /// the function the stub jumps to (`memcpy@plt`, see `plt.rs`).
    pub(super) fn resolve_elf_offsets(
        &mut self,
        open_path: &str,
        display_path: &str,
        offsets: &[u64],
        copy: Option<&DebugCopy>,
        fallback: &TableFallback,
    ) -> Resolved {
        let stubs = std::panic::catch_unwind(|| super::plt::stub_names(open_path, offsets))
            .unwrap_or_else(|_| vec![None; offsets.len()]);
        if stubs.iter().all(Option::is_none) {
            return self.resolve_with_blazesym(open_path, display_path, offsets, copy, fallback);
        }
        let others: Vec<u64> = offsets
            .iter()
            .zip(&stubs)
            .filter(|(_, stub)| stub.is_none())
            .map(|(&offset, _)| offset)
            .collect();
        let resolved = if others.is_empty() {
            Resolved::default()
        } else {
            self.resolve_with_blazesym(open_path, display_path, &others, copy, fallback)
        };
        let mut lines = resolved.lines.into_iter();
        let mut functions = resolved.functions.into_iter();
        let mut merged = Resolved {
            dwarf_unreadable: resolved.dwarf_unreadable,
            ..Resolved::default()
        };
        for stub in stubs {
            match stub {
                Some(name) => {
                    let function = match name.strip_suffix("@plt") {
                        Some(symbol) => format!("{}@plt", demangle(symbol)),
                        None => name.clone(),
                    };
                    let line = OwnedLine {
                        function,
                        system_name: name,
                        file: String::new(),
                        line: 0,
                    };
                    merged.lines.push(Some(self.intern_lines(vec![line])));
                    merged.functions.push(None);
                }
                None => {
                    merged.lines.push(lines.next().flatten());
                    merged.functions.push(functions.next().flatten());
                }
            }
        }
        merged
    }

    /// [`Self::resolve_elf_offsets`] for offsets in no PLT stub.
    fn resolve_with_blazesym(
        &mut self,
        open_path: &str,
        display_path: &str,
        offsets: &[u64],
        copy: Option<&DebugCopy>,
        fallback: &TableFallback,
    ) -> Resolved {
        if fallback.dwarf_unreadable {
            let names = self.names_from_symbol_tables(open_path, offsets, fallback);
            return Resolved::without_functions(names, true);
        }
        // Parsers of hostile input are the likeliest place for a bug; one
        // must cost this file's names, not the profile.
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.blazesym_lines(open_path, offsets, copy, true)
        }));
        match (attempt, copy) {
            (Ok(Ok(raw)), _) => Resolved {
                lines: self.intern_each(raw.lines),
                functions: raw.functions,
                dwarf_unreadable: false,
            },
            (Ok(Err(error)), Some(copy)) => {
                log::debug!(
                    "cannot symbolize {display_path} from {}: {error}",
                    copy.path.display()
                );
                self.resolve_with_blazesym(open_path, display_path, offsets, None, fallback)
            }
            (Err(_), Some(copy)) => {
                self.evict_from_blazesym(&copy.path.to_string_lossy());
                self.resolve_with_blazesym(open_path, display_path, offsets, None, fallback)
            }
            (Ok(Err(error)), None) => {
                log::debug!("cannot symbolize {display_path}: {error}");
                self.evict_from_blazesym(open_path);
                let names = self.names_from_symbol_tables(open_path, offsets, fallback);
                let named = names.iter().any(Option::is_some);
                Resolved::without_functions(names, named)
            }
            (Err(_), None) => {
                log::warn!(
                    "reading the symbols of {display_path} failed (corrupt file?); \
                     its frames are named after the file"
                );
                self.evict_from_blazesym(open_path);
                Resolved::without_functions(vec![None; offsets.len()], false)
            }
        }
    }

    /// Names from the ELF symbol tables alone, without DWARF: the split
    /// debug file's `.symtab` (a stripped file's only full table), else the
    /// file's own `.symtab` or `.dynsym`.
    fn names_from_symbol_tables(
        &mut self,
        open_path: &str,
        offsets: &[u64],
        fallback: &TableFallback,
    ) -> Vec<Option<Vec<SymbolLine>>> {
        let debug_file = fallback
            .debug_file_of_this_build()
            .and_then(|path| DebugCopy::of_original(path, open_path).ok());
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let from_debug_file = debug_file
                .as_ref()
                .map(|debug_file| self.blazesym_lines(open_path, offsets, Some(debug_file), false));
            match from_debug_file {
                Some(Ok(raw)) if raw.lines.iter().any(Option::is_some) => Ok(raw),
                _ => self.blazesym_lines(open_path, offsets, None, false),
            }
        }));
        if let Some(debug_file) = &debug_file {
            self.evict_from_blazesym(&debug_file.path.to_string_lossy());
        }
        match attempt {
            Ok(Ok(raw)) => self.intern_each(raw.lines),
            Ok(Err(_)) => vec![None; offsets.len()],
            Err(_) => {
                self.evict_from_blazesym(open_path);
                vec![None; offsets.len()]
            }
        }
    }

    fn intern_each(&mut self, lines: Vec<Option<Vec<OwnedLine>>>) -> Vec<Option<Vec<SymbolLine>>> {
        lines
            .into_iter()
            .map(|lines| lines.map(|lines| self.intern_lines(lines)))
            .collect()
    }

    /// blazesym's lines for each of `offsets` (see
    /// [`Self::resolve_elf_offsets`]); from DWARF (`dwarf`), qualified with
    /// the ELF symbols, else from the symbol tables alone, which name
    /// functions as the ELF symbols do already. With the file offsets of
    /// each one's function, where its size is known.
    pub(super) fn blazesym_lines(
        &mut self,
        open_path: &str,
        offsets: &[u64],
        copy: Option<&DebugCopy>,
        dwarf: bool,
    ) -> Result<RawLines, blazesym::Error> {
        if copy.is_none() {
            if let Some(raw) = self.lines_from_symbol_index(open_path, offsets) {
                return Ok(raw);
            }
        }
        self.lines_from_blazesym_copy(open_path, offsets, copy, dwarf)
    }

    /// [`Self::blazesym_lines`] asked of blazesym.
    pub(super) fn lines_from_blazesym_copy(
        &mut self,
        open_path: &str,
        offsets: &[u64],
        copy: Option<&DebugCopy>,
        dwarf: bool,
    ) -> Result<RawLines, blazesym::Error> {
        let elf = |path: &Path| {
            Source::Elf(Elf {
                debug_syms: dwarf,
                ..Elf::new(path)
            })
        };
        let inlined_functions = self.inlined_functions;
        let mut lines: Vec<Option<Vec<OwnedLine>>> = Vec::with_capacity(offsets.len());
        let mut starts: Vec<Option<u64>> = Vec::with_capacity(offsets.len());
        let mut extents: Vec<Option<(usize, usize)>> = Vec::with_capacity(offsets.len());
        let mut push = |result: Option<&Symbolized<'_>>| {
            lines.push(result.and_then(|r| sym_lines(r, inlined_functions)));
            let sym = result.and_then(Symbolized::as_sym);
            starts.push(sym.map(|sym| sym.addr));
            extents.push(sym.and_then(|sym| Some((sym.offset, sym.size?))));
        };
        match copy {
            None => {
                let source = elf(Path::new(open_path));
                let results = self
                    .blazesym
                    .symbolize(&source, Input::FileOffset(offsets))?;
                results.iter().for_each(|result| push(Some(result)));
            }
            Some(copy) => {
                let addresses: Vec<Option<u64>> = offsets
                    .iter()
                    .map(|&offset| copy.address_of(offset))
                    .collect();
                let wanted: Vec<u64> = addresses.iter().flatten().copied().collect();
                let source = elf(&copy.path);
                let results = self
                    .blazesym
                    .symbolize(&source, Input::VirtOffset(&wanted))?;
                let mut results = results.iter();
                for address in &addresses {
                    push(address.and_then(|_| results.next()));
                }
            }
        }
        if dwarf {
            self.qualify_with_elf_symbols(open_path, offsets, &starts, &mut lines);
        }
        let functions = offsets
            .iter()
            .zip(extents)
            .map(|(&offset, extent)| {
                let (into, size) = extent?;
                function_extent(offset, u64::try_from(into).ok()?, u64::try_from(size).ok()?)
            })
            .collect();
        Ok(RawLines { lines, functions })
    }

    /// What blazesym would say of `offsets` of a file that it names from
    /// its symbol tables alone (see `symbol_index.rs`), without blazesym;
    /// `None` for any other file, or when a name cannot be read. No symbol
    /// of such a file is qualified with its ELF symbol (it is one already).
    pub(super) fn lines_from_symbol_index(
        &mut self,
        open_path: &str,
        offsets: &[u64],
    ) -> Option<RawLines> {
        // The descriptor ddprof opened the file by (a regular file), opened
        // again: never blocks, whatever is there.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(open_path)
            .ok()
            .filter(|file| file.metadata().is_ok_and(|metadata| metadata.is_file()))?;
        let index = self.symbol_indexes.of(&file, open_path)?;
        let mut lines = Vec::with_capacity(offsets.len());
        let mut functions = Vec::with_capacity(offsets.len());
        for &offset in offsets {
            let found = match index.address_of(offset) {
                Some(address) => index
                    .lookup(&file, address)
                    .ok()?
                    .map(|symbol| (address, symbol)),
                None => None,
            };
            let Some((address, symbol)) = found else {
                lines.push(None);
                functions.push(None);
                continue;
            };
            functions.push(
                symbol
                    .size
                    .and_then(|size| function_extent(offset, address - symbol.address, size)),
            );
            lines.push(Some(vec![OwnedLine {
                function: demangle(&symbol.name),
                system_name: symbol.name,
                file: String::new(),
                line: 0,
            }]));
        }
        Some(RawLines { lines, functions })
    }

    /// Debug info built with line tables only (Rust's release default)
    /// names functions without their path (`parse` for
    /// `serde_json::de::parse`, `fmt<u32>`, `{closure#0}`). Where DWARF gave
    /// such an unqualified name, the ELF symbol table's mangled name of the
    /// same function is used: the symbol that starts where the DWARF
    /// function starts, or (for functions split in parts) whose demangled
    /// path ends in the DWARF name.
    fn qualify_with_elf_symbols(
        &mut self,
        path: &str,
        offsets: &[u64],
        starts: &[Option<u64>],
        lines: &mut [Option<Vec<OwnedLine>>],
    ) {
        let unqualified: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter_map(|(index, lines)| {
                let outermost = lines.as_ref()?.last()?;
                (!is_mangled(&outermost.system_name) && !outermost.function.contains("::"))
                    .then_some(index)
            })
            .collect();
        if unqualified.is_empty() {
            return;
        }
        let wanted: Vec<u64> = unqualified.iter().map(|&index| offsets[index]).collect();
        let source = Source::Elf(Elf {
            debug_syms: false,
            ..Elf::new(path)
        });
        let Ok(results) = self.blazesym.symbolize(&source, Input::FileOffset(&wanted)) else {
            return;
        };
        for (index, result) in unqualified.into_iter().zip(results.iter()) {
            let Some(sym) = result.as_sym() else { continue };
            let Some(outermost) = lines[index].as_mut().and_then(|l| l.last_mut()) else {
                continue;
            };
            if !is_mangled(&sym.name) {
                continue;
            }
            let qualified = demangle(&sym.name);
            let same_function = starts[index] == Some(sym.addr)
                || qualified.ends_with(&format!("::{}", outermost.function));
            if same_function && qualified != *sym.name {
                outermost.function = qualified;
                outermost.system_name = sym.name.to_string();
            }
        }
    }
}

/// The file offsets of the function of `size` bytes that holds `offset`,
/// `into` bytes from its start: the address's distance into its function is
/// the same in the file as in memory (a function lies in one segment).
fn function_extent(offset: u64, into: u64, size: u64) -> Option<Range<u64>> {
    let start = offset.checked_sub(into)?;
    let end = start.checked_add(size)?;
    (end > offset).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_debug_file_of_the_same_build_names_a_file() {
        // Two programs of this machine stand for debug files: one of this
        // build, one of another (a `.gnu_debuglink` name can find either).
        let this_build = PathBuf::from("/usr/bin/ls");
        let other_build = PathBuf::from("/usr/bin/cp");
        let build_id = crate::files::read_build_id("/usr/bin/ls").expect("ls has a build id");
        let fallback = TableFallback {
            debug_files: vec![other_build.clone(), this_build.clone()],
            build_id: Some(build_id.clone()),
            dwarf_unreadable: true,
        };
        assert_eq!(
            fallback.debug_file_of_this_build(),
            Some(this_build.as_path())
        );
        let fallback = TableFallback {
            debug_files: vec![other_build],
            build_id: Some(build_id),
            dwarf_unreadable: true,
        };
        assert_eq!(fallback.debug_file_of_this_build(), None);
        // A file without a build id: no debug file can be shown to be its.
        let fallback = TableFallback {
            debug_files: vec![this_build],
            build_id: None,
            dwarf_unreadable: true,
        };
        assert_eq!(fallback.debug_file_of_this_build(), None);
    }
}
