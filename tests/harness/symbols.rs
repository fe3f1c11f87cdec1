//! Just enough symbolization for tests: function symbols of ELF files
//! (`.symtab` and `.dynsym`), looked up by file offset, so that tests can
//! check stacks by function name without depending on the profiler's own
//! symbolizer.
use std::collections::HashMap;
use std::path::Path;

use ddprof::process::ProcessTable;
use ddprof::sample::Sample;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

struct Function {
    start: u64,
    end: u64,
    name: String,
}

/// The functions of one ELF file and its loadable segments.
pub struct ElfSymbols {
    /// Sorted by start.
    functions: Vec<Function>,
    /// (file offset, virtual address, file size) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl ElfSymbols {
    pub fn load(path: &Path) -> Result<Self, String> {
        let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut functions: Vec<Function> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.address() != 0)
            .filter_map(|symbol| {
                Some(Function {
                    start: symbol.address(),
                    end: symbol.address() + symbol.size().max(1),
                    name: symbol.name().ok()?.to_string(),
                })
            })
            .collect();
        functions.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
        functions.dedup_by_key(|f| f.start);
        let segments = file
            .segments()
            .map(|segment| {
                let (offset, size) = segment.file_range();
                (offset, segment.address(), size)
            })
            .collect();
        Ok(Self {
            functions,
            segments,
        })
    }

    pub fn function_at_address(&self, address: u64) -> Option<&str> {
        let index = self.functions.partition_point(|f| f.start <= address);
        let function = &self.functions[index.checked_sub(1)?];
        (address < function.end).then_some(function.name.as_str())
    }

    pub fn function_at_file_offset(&self, offset: u64) -> Option<&str> {
        let &(file_offset, address, _) = self
            .segments
            .iter()
            .find(|&&(start, _, size)| offset >= start && offset < start + size)?;
        self.function_at_address(offset - file_offset + address)
    }
}

/// Names the frames of samples through the mappings of a [`ProcessTable`].
#[derive(Default)]
pub struct Symbolizer {
    files: HashMap<String, Option<ElfSymbols>>,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The function containing `address` in process `pid`, if its mapping
    /// and symbol are known.
    pub fn function(&mut self, table: &ProcessTable, pid: u32, address: u64) -> Option<String> {
        let mapping = table.find_mapping(pid, address)?;
        let offset = mapping.file_offset_of(address);
        let symbols = self
            .files
            .entry(mapping.file.path.clone())
            .or_insert_with(|| ElfSymbols::load(Path::new(&mapping.file.path)).ok());
        symbols
            .as_ref()?
            .function_at_file_offset(offset)
            .map(str::to_string)
    }

    /// One name per frame, innermost first; `?` where unknown. Return
    /// addresses are looked up one byte back, inside their call instruction.
    pub fn frame_names(&mut self, table: &ProcessTable, sample: &Sample) -> Vec<String> {
        sample
            .frames
            .iter()
            .enumerate()
            .map(|(index, &pc)| {
                let address = if index == 0 { pc } else { pc.saturating_sub(1) };
                self.function(table, sample.pid, address)
                    .unwrap_or_else(|| "?".to_string())
            })
            .collect()
    }
}

/// Whether a (possibly C++/Rust-mangled) symbol is the function `wanted`:
/// equal, or a legacy-mangled name with a `<len>wanted` path segment
/// (`_ZN12workload_cpp11ChainRunner9stage_oneEm` is `stage_one`).
pub fn is_function(symbol: &str, wanted: &str) -> bool {
    symbol == wanted
        || (symbol.starts_with("_ZN") && symbol.contains(&format!("{}{wanted}", wanted.len())))
}

/// Whether `wanted` appears in `names` in order (not necessarily adjacent).
pub fn contains_in_order(names: &[String], wanted: &[&str]) -> bool {
    let mut rest = names.iter();
    wanted
        .iter()
        .all(|want| rest.by_ref().any(|name| is_function(name, want)))
}

/// Whether `names` starts with `wanted` exactly, frame for frame.
pub fn starts_with_frames(names: &[String], wanted: &[&str]) -> bool {
    names.len() >= wanted.len()
        && names
            .iter()
            .zip(wanted)
            .all(|(name, want)| is_function(name, want))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_plain_and_mangled_names() {
        assert!(is_function("chain_a", "chain_a"));
        assert!(!is_function("__libc_start_call_main", "main"));
        assert!(is_function(
            "_ZN12workload_cpp11ChainRunner9stage_oneEm",
            "stage_one"
        ));
        assert!(is_function(
            "_ZN5chain15rust_chain_leaf17ha3b1ac45f91b8969E",
            "rust_chain_leaf"
        ));
        let names: Vec<String> = ["leaf", "?", "b", "main"].map(String::from).into();
        assert!(contains_in_order(&names, &["leaf", "b", "main"]));
        assert!(!contains_in_order(&names, &["b", "leaf"]));
        assert!(starts_with_frames(&names, &["leaf", "?"]));
        assert!(!starts_with_frames(&names, &["leaf", "b"]));
    }

    #[test]
    fn finds_this_function_in_this_binary() {
        let exe = std::env::current_exe().unwrap();
        let symbols = ElfSymbols::load(&exe).unwrap();
        let here = finds_this_function_in_this_binary as *const () as u64;
        // Position-independent: find our own load bias through /proc.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mapping = maps
            .lines()
            .filter_map(|line| ddprof::process::parse_maps_line(0, line))
            .find(|m| here >= m.start && here < m.start + m.len)
            .unwrap();
        let name = symbols
            .function_at_file_offset(here - mapping.start + mapping.file_offset)
            .unwrap();
        assert!(
            name.contains("finds_this_function_in_this_binary"),
            "{name}"
        );
    }
}
