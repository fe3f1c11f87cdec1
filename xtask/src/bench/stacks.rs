//! Reading each tool's output back into sample counts, with one rule for
//! what reaches the root.
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{Context, Result};

use super::perf_script::{self, ScriptRecord};

/// Outermost frames of a stack that reached its thread's root: the
/// executable's entry and libc's, and the functions a new thread starts in.
/// Names are compared without a symbol version (`@@GLIBC_2.34`) or offset.
pub(super) const ROOT_FRAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "clone",
    "clone3",
    "start_thread",
];

/// Whether `name` (as a tool printed it) is a root frame of a workload
/// whose threads start in `thread_entries`.
pub(super) fn is_root_frame(name: &str, thread_entries: &[&str]) -> bool {
    let name = name.trim();
    let name = name.split('@').next().unwrap_or(name);
    let name = name.split("+0x").next().unwrap_or(name);
    // samply names ELF symbols without their first underscore (`start`,
    // `_libc_start_main_impl`): leading underscores are not compared.
    let bare = |s: &str| s.trim_start_matches('_').to_string();
    let name = bare(name);
    ROOT_FRAMES.iter().any(|root| bare(root) == name)
        || thread_entries.iter().any(|entry| bare(entry) == name)
}

/// Stacks read back from a tool's output.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct StackCounts {
    pub(super) samples: u64,
    pub(super) rooted: u64,
    pub(super) lost: Option<u64>,
}

/// ddprof's `stacks.folded`: `process;root;…;leaf COUNT` lines.
pub(super) fn read_folded(path: &Path, thread_entries: &[&str]) -> Result<StackCounts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut counts = StackCounts::default();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        counts.samples += count;
        // The first name is the process's.
        if stack
            .split(';')
            .nth(1)
            .is_some_and(|root| is_root_frame(root, thread_entries))
        {
            counts.rooted += count;
        }
    }
    Ok(counts)
}

/// The command line of `perf script` that prints `perf.data`'s samples
/// and losses as [`parse_perf_script`] reads them.
pub(super) fn perf_script_args(perf_data: &Path) -> Vec<String> {
    let mut args = vec!["perf".to_string()];
    args.extend(perf_script::script_args(perf_data));
    args
}

/// Parses `perf script`'s output (see [`perf_script_args`]) as it comes:
/// a sample is rooted if its outermost frame is a root frame.
pub(super) fn parse_perf_script(output: impl Read, thread_entries: &[&str]) -> Result<StackCounts> {
    let mut counts = StackCounts::default();
    let mut lost = 0;
    perf_script::read_script(BufReader::new(output), |record| match record {
        ScriptRecord::Sample(sample) => {
            counts.samples += 1;
            if sample
                .frames
                .last()
                .is_some_and(|outermost| is_root_frame(&outermost.symbol, thread_entries))
            {
                counts.rooted += 1;
            }
        }
        ScriptRecord::Lost(count) => lost += count,
    })
    .map_err(anyhow::Error::msg)?;
    counts.lost = Some(lost);
    Ok(counts)
}

/// samply's profile (the Firefox profiler's processed format, optionally
/// gzip'd) and the `.syms.json` that `--unstable-presymbolicate` writes
/// beside it: threads → samples → stack → frame → func → name, frames named
/// from the symbols file by (library, address) when it has them.
pub(super) fn read_samply_profile(profile: &Path, thread_entries: &[&str]) -> Result<StackCounts> {
    let bytes =
        std::fs::read(profile).with_context(|| format!("cannot read {}", profile.display()))?;
    let json: serde_json::Value = if bytes.starts_with(&[0x1f, 0x8b]) {
        serde_json::from_reader(flate2::read::GzDecoder::new(&bytes[..]))?
    } else {
        serde_json::from_slice(&bytes)?
    };
    let symbols = read_samply_symbols(&profile.with_extension("syms.json"));
    let libs: Vec<String> = json["libs"]
        .as_array()
        .map(|libs| {
            libs.iter()
                .map(|lib| lib["debugName"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    let index = |value: &serde_json::Value| value.as_u64().map(|v| v as usize);
    let mut counts = StackCounts::default();
    for thread in json["threads"].as_array().into_iter().flatten() {
        let strings = &thread["stringArray"];
        let stack_prefix = &thread["stackTable"]["prefix"];
        let stack_frame = &thread["stackTable"]["frame"];
        let frame_func = &thread["frameTable"]["func"];
        let frame_address = &thread["frameTable"]["address"];
        let func_name = &thread["funcTable"]["name"];
        let func_resource = &thread["funcTable"]["resource"];
        let resource_lib = &thread["resourceTable"]["lib"];
        // The outermost frame's name of each stack, memoized.
        let mut root_of: HashMap<usize, bool> = HashMap::new();
        let mut is_rooted = |mut stack: usize| -> bool {
            let start = stack;
            if let Some(&known) = root_of.get(&start) {
                return known;
            }
            while let Some(prefix) = index(&stack_prefix[stack]) {
                stack = prefix;
            }
            let rooted = index(&stack_frame[stack]).is_some_and(|frame| {
                let func = index(&frame_func[frame]);
                let from_symbols = func
                    .and_then(|func| index(&func_resource[func]))
                    .and_then(|resource| index(&resource_lib[resource]))
                    .and_then(|lib| libs.get(lib))
                    .zip(frame_address[frame].as_u64())
                    .and_then(|(lib, address)| symbols.get(&(lib.clone(), address)));
                let name = match from_symbols {
                    Some(name) => name.as_str(),
                    None => func
                        .and_then(|func| index(&func_name[func]))
                        .and_then(|s| strings[s].as_str())
                        .unwrap_or(""),
                };
                is_root_frame(name, thread_entries)
            });
            root_of.insert(start, rooted);
            rooted
        };
        let samples = &thread["samples"];
        let weights = samples["weight"].as_array();
        for (i, stack) in samples["stack"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let weight = weights.and_then(|w| w.get(i)?.as_u64()).unwrap_or(1);
            counts.samples += weight;
            if index(stack).is_some_and(&mut is_rooted) {
                counts.rooted += weight;
            }
        }
    }
    Ok(counts)
}

/// (library debug name, address) → symbol name, from samply's `.syms.json`.
pub(super) fn read_samply_symbols(path: &Path) -> HashMap<(String, u64), String> {
    let mut names = HashMap::new();
    let Ok(text) = std::fs::read(path) else {
        return names;
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return names;
    };
    let strings = &json["string_table"];
    for lib in json["data"].as_array().into_iter().flatten() {
        let debug_name = lib["debug_name"].as_str().unwrap_or("").to_string();
        let table = &lib["symbol_table"];
        for known in lib["known_addresses"].as_array().into_iter().flatten() {
            let (Some(address), Some(symbol)) = (known[0].as_u64(), known[1].as_u64()) else {
                continue;
            };
            if let Some(name) = table[symbol as usize]["symbol"]
                .as_u64()
                .and_then(|s| strings[s as usize].as_str())
            {
                names.insert((debug_name.clone(), address), name.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_frames_ignore_versions_and_offsets() {
        assert!(is_root_frame("__libc_start_main@@GLIBC_2.34", &[]));
        assert!(is_root_frame("_start+0x25", &[]));
        assert!(is_root_frame("clone3", &[]));
        assert!(!is_root_frame("main", &[]));
        assert!(!is_root_frame("[unknown]", &[]));
        assert!(is_root_frame("thread_a_work", &["thread_a_work"]));
        // As samply writes them.
        assert!(is_root_frame("start", &[]));
        assert!(is_root_frame("_libc_start_main_impl", &[]));
    }

    #[test]
    fn perf_script_samples_are_counted_by_their_outermost_frame() {
        let output = "5711/5711 \n\
                      \t           16e09 chain_leaf_70 (/b/chain)\n\
                      \t           27304 __libc_start_main@@GLIBC_2.34 (/lib/libc.so.6)\n\
                      \t           16a90 _start (/b/chain)\n\
                      \n\
                      5711/5711 \n\
                      \t           16e09 chain_leaf_70 (/b/chain)\n\
                      \t           16e34 [unknown] (/b/chain)\n\
                      \n\
                      perf 0 [000] 0.0: PERF_RECORD_LOST lost 7\n\
                      5711/5712 \n\
                      \t           16e09 thread_a_leaf (/b/chain)\n\
                      \t           16e34 thread_a_work (/b/chain)\n";
        let counts = parse_perf_script(output.as_bytes(), &["thread_a_work"]).unwrap();
        assert_eq!(
            (counts.samples, counts.rooted, counts.lost),
            (3, 2, Some(7))
        );
    }

    #[test]
    fn folded_stacks_skip_the_process_name() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stacks.folded");
        std::fs::write(
            &path,
            "chain;_start;__libc_start_main;main;leaf 30\n\
             chain;[truncated];leaf 5\n\
             _start;leaf 1\n",
        )
        .unwrap();
        let counts = read_folded(&path, &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((counts.samples, counts.rooted), (36, 30));
    }
}
