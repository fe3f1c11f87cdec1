//! The shape of `ddprof/src`, checked: its modules follow the data flow
//! without import cycles (launch above the profiler, the profiler above the
//! sampler and engines, `config` the only one that knows the command line),
//! and no module grows past what a reader takes in at once.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ddprof/src")
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The top-level module a file belongs to (`bpf/rows.rs` → `bpf`).
fn module_of(file: &Path) -> String {
    let relative = file.strip_prefix(source_dir()).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The code of a file without its unit tests and comments.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &text[..tests],
        None => text,
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Which top-level modules each one names through `crate::` paths.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<PathBuf> = rust_files(&source_dir())
        .into_iter()
        .filter(|file| !["lib", "main"].contains(&module_of(file).as_str()))
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|file| module_of(file)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        if file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let from = module_of(file);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let mut named = BTreeSet::new();
        for (index, _) in code.match_indices("crate::") {
            let rest = &code[index + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                named.extend(group.split(',').map(|part| {
                    part.trim()
                        .split("::")
                        .next()
                        .unwrap_or_default()
                        .to_string()
                }));
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                named.insert(name);
            }
        }
        let edges = graph.entry(from.clone()).or_default();
        edges.extend(
            named
                .into_iter()
                .filter(|name| modules.contains(name) && *name != from),
        );
    }
    graph
}

/// A path `from` → … → `to` in `graph`, if any.
fn path_between(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap().clone();
        for next in graph.get(&last).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next.clone());
            if next == to {
                return Some(longer);
            }
            if seen.insert(next.clone()) {
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn the_modules_of_ddprof_src_import_each_other_without_cycles() {
    let graph = module_graph();
    // The checker sees the edges it must (it is not vacuous).
    assert!(graph["launch"].contains("profiler"), "{graph:?}");
    assert!(graph["profiler"].contains("sampler"), "{graph:?}");
    assert!(graph["sampler"].contains("bpf") && graph["sampler"].contains("perf"));
    for (module, edges) in &graph {
        for next in edges {
            if let Some(back) = path_between(&graph, next, module) {
                panic!("import cycle: {module} -> {}", back.join(" -> "));
            }
        }
    }
    // Only the configuration (and main) know the command line.
    for (module, edges) in &graph {
        if module != "config" {
            assert!(!edges.contains("config"), "{module} imports config");
        }
    }
}

#[test]
fn no_module_of_ddprof_src_is_longer_than_800_lines_outside_its_tests() {
    const LIMIT: usize = 800;
    let mut too_long = Vec::new();
    for file in rust_files(&source_dir()) {
        let name = file
            .strip_prefix(source_dir())
            .unwrap()
            .to_string_lossy()
            .to_string();
        if name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = match text.find("#[cfg(test)]\nmod tests") {
            Some(tests) => text[..tests].lines().count(),
            None => text.lines().count(),
        };
        if lines > LIMIT {
            too_long.push(format!("{name}: {lines} lines"));
        }
    }
    assert!(too_long.is_empty(), "split these by job: {too_long:?}");
}
