//! Each tool's symbolized stacks read back (ddprof's pprof, `perf script`),
//! its names made comparable, and whether a stack reaches its thread's entry.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::perf_script::{last_parenthesized_group, read_script, ScriptRecord};
use crate::pprof;

/// The outermost frames that are a thread's entry: where the stack of a
/// thread begins, so that an unwinder cannot and need not go further.
/// - `_start`: the main thread of a C runtime program (executables and
///   `ld.so`, whose own `_start` runs before the program's, and goes on at
///   `_dl_start_user` to run the libraries' initializers);
/// - `clone`, `clone3`: glibc's new threads (and `posix_spawn` children);
/// - Go: `runtime.goexit` under every goroutine, `runtime.rt0_go` and
///   `runtime.mstart` (the runtime's `TOPFRAME`s: the main thread's and
///   the other threads' system stacks) and `runtime.clone`, which calls
///   `mstart` in a new thread; `runtime.systemstack`, `runtime.mcall` and
///   `runtime.morestack` switch onto the system stack, and their callers
///   are on another stack; so do `runtime.nanotime1` and
///   `runtime.walltime` around their vDSO calls.
pub const ENTRY_FUNCTIONS: &[&str] = &[
    "_start",
    "_dl_start_user",
    "clone",
    "clone3",
    "runtime.goexit",
    "runtime.rt0_go",
    "runtime.mstart",
    "runtime.clone",
    "runtime.systemstack",
    "runtime.mcall",
    "runtime.morestack",
    // Switch to the system stack to call the vDSO (sys_linux_amd64.s).
    "runtime.nanotime1",
    "runtime.walltime",
];

/// glibc's `__libc_start_main` (its internal name, and the exported one
/// without its symbol version). `_start` of a stripped executable has no
/// name: an unnamed frame of a file right outside it counts as `_start`.
pub(super) const LIBC_START_MAIN: &[&str] = &["__libc_start_main", "__libc_start_main_impl"];

/// Whether a stack (innermost first) reaches its thread's entry.
pub fn reaches_entry(frames: &[String]) -> bool {
    match frames {
        [.., outermost] if ENTRY_FUNCTIONS.contains(&outermost.as_str()) => true,
        // A sample in a stripped executable's `_start` itself (no name).
        [only] => is_unnamed_file_frame(only),
        [.., start_main, outermost] => {
            LIBC_START_MAIN.contains(&start_main.as_str()) && is_unnamed_file_frame(outermost)
        }
        _ => false,
    }
}

/// `[file name]`: a frame in a file that has no symbol for its address
/// (both tools' notation, see [`perf_frame_name`]); `[unknown]` (no file)
/// and ddprof's `[truncated]` marker are not.
pub(super) fn is_unnamed_file_frame(name: &str) -> bool {
    name.starts_with('[') && name.ends_with(']') && name != "[unknown]" && name != "[truncated]"
}

/// A function name as both tools can agree on it: without an ELF symbol
/// version (`__libc_start_main@@GLIBC_2.34`), the Go linker's suffix for
/// assembly functions (`crypto/sha256.block.abi0`, `block` in Go's own
/// tables) or a Rust legacy hash (`::h0123456789abcdef`).
pub fn canonical_function(name: &str) -> String {
    let name = match name.find('@') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    };
    let name = name.strip_suffix(".abi0").unwrap_or(name);
    let name = match name.rsplit_once("::h") {
        Some((path, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            path
        }
        _ => name,
    };
    name.to_string()
}

/// Function names both tools agree on. One function can have several ELF
/// names (glibc's `read`, `__read`, `__libc_read` and `__GI___libc_read`
/// are one address) and each tool picks its own, so every name is mapped,
/// per file, to the shortest name at its address in the file's symbol
/// tables and its debug file's (`/usr/lib/debug/.build-id`).
#[derive(Default)]
pub struct FunctionNames {
    pub(super) aliases_by_file: HashMap<String, HashMap<String, String>>,
}

impl FunctionNames {
    /// `name` (found in `file`, when known) as [`canonical_function`], then
    /// as the representative of its aliases.
    pub fn canonical(&mut self, name: &str, file: Option<&str>) -> String {
        let name = canonical_function(name);
        let Some(file) = file else { return name };
        let aliases = self
            .aliases_by_file
            .entry(file.to_string())
            .or_insert_with(|| aliases_in(Path::new(file)));
        aliases.get(&name).cloned().unwrap_or(name)
    }
}

/// Name → shortest name at the same address, for the functions of `path`
/// that have several names; empty when the file cannot be read.
pub(super) fn aliases_in(path: &Path) -> HashMap<String, String> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut names_by_address: HashMap<u64, HashSet<String>> = HashMap::new();
    let mut add_symbols = |data: &[u8]| -> Option<PathBuf> {
        let file = object::File::parse(data).ok()?;
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            if let Ok(name) = symbol.name() {
                if !name.is_empty() {
                    names_by_address
                        .entry(symbol.address())
                        .or_default()
                        .insert(canonical_function(name));
                }
            }
        }
        let build_id = file.build_id().ok().flatten().filter(|id| id.len() > 1)?;
        let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        Some(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        )))
    };
    let Ok(data) = std::fs::read(path) else {
        return HashMap::new();
    };
    if let Some(debug_file) = add_symbols(&data) {
        if let Ok(debug_data) = std::fs::read(debug_file) {
            add_symbols(&debug_data);
        }
    }
    let mut aliases = HashMap::new();
    for names in names_by_address
        .into_values()
        .filter(|names| names.len() > 1)
    {
        let shortest = names
            .iter()
            .min_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
            .expect("a non-empty set")
            .clone();
        for name in names {
            aliases.insert(name, shortest.clone());
        }
    }
    aliases
}

/// One sampled user stack: function names innermost first (one per code
/// address: inlined callers are folded into the function they are in, as
/// `perf script --no-inline` prints them), and how many samples had it.
#[derive(Debug, Clone)]
pub struct Stack {
    pub frames: Vec<String>,
    pub count: u64,
}

/// A C++ function's name without its parameter list (and `const`), as
/// perf names it: blazesym keeps `llvm::InstCombinePass::run(llvm::Function&, …)`
/// where perf says `llvm::InstCombinePass::run`, and a leaf must compare
/// equal under both.
pub fn without_parameters(name: &str) -> &str {
    let body = name.strip_suffix(" const").unwrap_or(name);
    match last_parenthesized_group(body) {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    }
}

/// Kernel addresses (the upper half of the x86-64 address space).
pub(super) const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// A `perf script` frame's name: its symbol, else `[file name]` for an
/// address in a file that has no symbol for it (as ddprof names them), else
/// `[unknown]`.
pub fn perf_frame_name(symbol: &str, dso: &str, names: &mut FunctionNames) -> String {
    if symbol != "[unknown]" {
        return names.canonical(symbol, Some(dso).filter(|d| d.starts_with('/')));
    }
    let dso = dso.trim_end_matches(" (deleted)");
    if dso.starts_with('[') {
        // `[unknown]`, `[vdso]`.
        return dso.to_string();
    }
    match Path::new(dso).file_name() {
        Some(name) => format!("[{}]", name.to_string_lossy()),
        None => "[unknown]".to_string(),
    }
}

/// Parses `perf script`'s output (`crate::perf_script::script_args`) into
/// (pid, user stack) per sample; kernel frames are left out (ddprof
/// attributes kernel time to the user stack that made the system call).
pub fn parse_perf_script(
    text: &str,
    names: &mut FunctionNames,
) -> Result<Vec<(u32, Stack)>, String> {
    let mut stacks = Vec::new();
    read_script(text.as_bytes(), |record| {
        if let ScriptRecord::Sample(sample) = record {
            let frames = sample
                .frames
                .iter()
                .filter(|frame| frame.address < KERNEL_START)
                .map(|frame| perf_frame_name(&frame.symbol, &frame.dso, names))
                .collect();
            stacks.push((sample.pid, Stack { frames, count: 1 }));
        }
    })?;
    Ok(stacks)
}

/// Reads a gzip'd pprof file into (process_id label, user stack) per sample
/// (counted by its `cpu-samples` value). Kernel frames (mapping
/// `[kernel.kallsyms]`) are left out, as in [`parse_perf_script`].
pub fn read_pprof(path: &Path, names: &mut FunctionNames) -> Result<Vec<(u32, Stack)>, String> {
    let profile = pprof::Profile::read_gzipped(path)?;
    let string = |index: i64| profile.string(index);
    let count_index = profile
        .sample_type
        .iter()
        .position(|t| matches!(string(t.r#type), "cpu-samples" | "samples"))
        .ok_or_else(|| format!("{}: no `cpu-samples` sample type", path.display()))?;
    let mapping_files: HashMap<u64, &str> = profile
        .mapping
        .iter()
        .map(|m| (m.id, string(m.filename)))
        .collect();
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, string(f.name)))
        .collect();
    let locations: HashMap<u64, &pprof::Location> =
        profile.location.iter().map(|l| (l.id, l)).collect();
    let mut stacks = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        let pid = sample
            .label
            .iter()
            .find(|l| string(l.key) == "process_id")
            .map(|l| l.num as u32)
            .ok_or_else(|| format!("{}: a sample without process_id", path.display()))?;
        let mut frames = Vec::with_capacity(sample.location_id.len());
        for id in &sample.location_id {
            let location = locations.get(id).ok_or_else(|| {
                format!("{}: a sample refers to no location {id}", path.display())
            })?;
            let file = mapping_files.get(&location.mapping_id).copied();
            if file.is_some_and(|f| f.starts_with("[kernel")) {
                continue;
            }
            // The last line is the function the address is in; the ones
            // before it were inlined into it.
            let name = match location
                .line
                .last()
                .and_then(|line| functions.get(&line.function_id))
            {
                Some(name) => names.canonical(name, file.filter(|f| f.starts_with('/'))),
                None => "[unknown]".to_string(),
            };
            frames.push(name);
        }
        let count = sample.value.get(count_index).copied().unwrap_or(0).max(0) as u64;
        stacks.push((pid, Stack { frames, count }));
    }
    Ok(stacks)
}
