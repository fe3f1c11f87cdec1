//! The corpus's programs: each one's inputs, prepared once (generated
//! sources built by the machine's compilers, scripts, data).
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::big_program;
use crate::workloads::{build_workload, workloads_source_dir};

/// What one corpus entry runs.
pub struct Workload {
    /// The command line.
    pub command: Vec<OsString>,
    /// Files the command deletes while they run. perf record reads the
    /// files of the samples after the run, so it gets a copy of these in its
    /// build-id cache beforehand; ddprof must find them itself, while the
    /// process lives (`/proc/PID/map_files`).
    pub deleted_while_running: Vec<PathBuf>,
}

impl Workload {
    pub(super) fn new<S: AsRef<OsStr>>(command: impl IntoIterator<Item = S>) -> Workload {
        Workload {
            command: command
                .into_iter()
                .map(|a| a.as_ref().to_os_string())
                .collect(),
            deleted_while_running: Vec::new(),
        }
    }
}

pub(super) fn run_checked(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({command:?}): {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({command:?}): {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Writes `contents` to `path` unless the file already holds exactly that
/// (so that its modification time only moves when it changes).
pub(super) fn write_if_changed(path: &Path, contents: &[u8]) {
    if std::fs::read(path).is_ok_and(|old| old == contents) {
        return;
    }
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, contents)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", temporary.display()));
    std::fs::rename(&temporary, path)
        .unwrap_or_else(|e| panic!("cannot move {} in place: {e}", path.display()));
}

/// Runs `build(temporary output)` unless `output` is newer than every
/// input, then moves the result to `output`.
pub(super) fn build_if_stale(
    output: &Path,
    inputs: &[&Path],
    what: &str,
    build: impl FnOnce(&Path) -> Command,
) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let Some(built) = modified(output) {
        if inputs
            .iter()
            .all(|input| modified(input).is_some_and(|m| m <= built))
        {
            return;
        }
    }
    let temporary = output.with_extension(format!("tmp{}", std::process::id()));
    run_checked(&mut build(&temporary), what);
    std::fs::rename(&temporary, output)
        .unwrap_or_else(|e| panic!("cannot move {} in place: {e}", output.display()));
}

/// Whether an ELF file's `.comment` says LLD linked it.
pub(super) fn linked_by_lld(path: &Path) -> bool {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.section_by_name(".comment")
        .and_then(|section| section.data().ok())
        .is_some_and(|comment| {
            // `Linker: LLD 22.1.2 (…)`, `Linker: Debian LLD 14.0.6`.
            String::from_utf8_lossy(comment)
                .split('\0')
                .any(|note| note.starts_with("Linker:") && note.contains("LLD"))
        })
}

/// Deterministic text of `bytes` bytes: sentences of words drawn from a
/// fixed vocabulary by a xorshift generator, so that compressors find the
/// repetitions of real text.
pub(super) fn generated_text(bytes: usize, mut seed: u64) -> Vec<u8> {
    const SYLLABLES: &[&str] = &[
        "ka", "lo", "mi", "ren", "tu", "sha", "vor", "e", "il", "qua", "ny", "dex", "an", "sel",
        "ti", "or",
    ];
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let vocabulary: Vec<String> = (0..3000)
        .map(|_| {
            let syllables = 1 + next() % 4;
            (0..syllables)
                .map(|_| SYLLABLES[(next() % SYLLABLES.len() as u64) as usize])
                .collect()
        })
        .collect();
    let mut text = Vec::with_capacity(bytes + 64);
    let mut in_sentence = 0;
    while text.len() < bytes {
        // Zipf-like: small indices far more often.
        let rank = (next() % 3000) * (next() % 3000) / 3000;
        text.extend_from_slice(vocabulary[rank as usize].as_bytes());
        in_sentence += 1;
        if in_sentence > 6 && next() % 5 == 0 {
            text.extend_from_slice(if next() % 3 == 0 { b".\n" } else { b". " });
            in_sentence = 0;
        } else {
            text.push(b' ');
        }
    }
    text.truncate(bytes);
    text
}

pub(super) fn prepare_lld_c(dir: &Path) -> Workload {
    let source = workloads_source_dir().join("chain.c");
    let binary = dir.join("chain_lld");
    build_if_stale(&binary, &[&source], "gcc -fuse-ld=lld", |out| {
        let mut command = Command::new("cc");
        command
            .args(["-O2", "-fomit-frame-pointer", "-g", "-fuse-ld=lld", "-o"])
            .arg(out)
            .arg(&source);
        command
    });
    assert!(
        linked_by_lld(&binary),
        "{} was not linked by lld",
        binary.display()
    );
    Workload::new([binary.as_os_str(), OsStr::new("--work"), OsStr::new("2")])
}

/// A small real Rust program: counts words drawn by a xorshift generator in
/// a HashMap (SipHash), ranks them with a stable sort.
pub(super) const RUST_PROGRAM: &str = r#"use std::collections::HashMap;

fn main() {
    let rounds: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let vocabulary: Vec<String> = (0..5000u64)
        .map(|i| format!("w{:x}", i.wrapping_mul(2654435761) % 1_000_003))
        .collect();
    let mut seed = 88172645463325252u64;
    let mut total = 0usize;
    for _ in 0..rounds {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *counts.entry(&vocabulary[(seed % 5000) as usize]).or_default() += 1;
        }
        let mut ranked: Vec<(&str, usize)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        total += ranked[0].1;
    }
    println!("{total}");
}
"#;

pub(super) fn prepare_rust_release(dir: &Path) -> Workload {
    let source = dir.join("wordcount.rs");
    write_if_changed(&source, RUST_PROGRAM.as_bytes());
    let binary = dir.join("wordcount");
    build_if_stale(&binary, &[&source], "rustc -O", |out| {
        let mut command = Command::new("rustc");
        command
            .args(["-O", "--edition", "2021", "-o"])
            .arg(out)
            .arg(&source);
        command
    });
    assert!(
        linked_by_lld(&binary),
        "{} was not linked by (rust-)lld: is the stable rustc older than 1.90?",
        binary.display()
    );
    Workload::new([binary.as_os_str(), OsStr::new("450")])
}

/// A C file of `functions` small functions with loops and switches, for
/// cc1's optimizer.
pub(super) fn generated_c_file(functions: usize) -> String {
    let mut source = String::from("#include <string.h>\n");
    for i in 0..functions {
        write!(
            source,
            r#"
struct s{i} {{ int a[8]; double d; }};
static int helper{i}(struct s{i} *p, int n) {{
    int acc = {i};
    for (int k = 0; k < n; k++) {{
        switch ((k + acc) % 5) {{
        case 0: acc += p->a[k & 7] * {m}; break;
        case 1: acc ^= (int)(p->d * k); break;
        case 2: acc -= k << {s}; break;
        default: acc = acc * 31 + (int)strlen((const char *)p);
        }}
    }}
    return acc;
}}
int func{i}(int n) {{
    struct s{i} v;
    memset(&v, n, sizeof v);
    v.d = n * 0.5;
    return helper{i}(&v, n) + helper{i}(&v, n / 2);
}}
"#,
            m = i % 13 + 1,
            s = i % 5
        )
        .unwrap();
    }
    source
}

pub(super) fn prepare_cc1(dir: &Path) -> Workload {
    let source = dir.join("generated.c");
    write_if_changed(&source, generated_c_file(300).as_bytes());
    let mut command = vec![OsString::from("gcc")];
    command.extend(["-O2", "-c"].map(OsString::from));
    command.push(source.into_os_string());
    command.extend(["-o", "generated.o"].map(OsString::from));
    Workload::new(command)
}

pub(super) fn prepare_openssl(_: &Path) -> Workload {
    Workload::new(["openssl", "speed", "-seconds", "1", "rsa2048"])
}

pub(super) const PYTHON_SCRIPT: &str = r#"import collections
import json
import re


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def words(count):
    seed = 12345
    out = []
    for _ in range(count):
        seed = (seed * 1103515245 + 12345) % 2147483648
        out.append("w%x" % (seed % 5003))
    return out


text = " ".join(words(2500000))
counts = collections.Counter(re.findall(r"w[0-9a-f]+", text))
ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
print(fib(35), len(json.dumps(ranked)), ranked[0])
"#;

/// Debian's own python3 (not a version manager's shim, which is a shell
/// script that runs another python).
pub(super) fn python3() -> OsString {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3".into()
    } else {
        "python3".into()
    }
}

pub(super) fn prepare_python3(dir: &Path) -> Workload {
    let script = dir.join("script.py");
    write_if_changed(&script, PYTHON_SCRIPT.as_bytes());
    Workload::new([python3(), script.into_os_string()])
}

pub(super) const SQLITE_SCHEMA: &str =
    "CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT); \
     WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) \
     INSERT INTO t SELECT i, (i * 7919) % 10007, printf('row-%d-%d', i % 977, i) FROM n;";
pub(super) const SQLITE_QUERY: &str = "SELECT count(*), sum(length(x.b || y.b)) FROM t x \
     JOIN t y ON y.id BETWEEN x.id AND x.id + 120 WHERE x.b GLOB '*7*';";

pub(super) fn prepare_sqlite3(dir: &Path) -> Workload {
    let schema = dir.join("schema.sql");
    write_if_changed(&schema, SQLITE_SCHEMA.as_bytes());
    let database = dir.join("corpus.sqlite");
    build_if_stale(
        &database,
        &[&schema],
        "sqlite3 (creating the database)",
        |out| {
            let _ = std::fs::remove_file(out);
            let mut command = Command::new("sqlite3");
            command.arg(out).arg(SQLITE_SCHEMA);
            command
        },
    );
    Workload::new([
        OsString::from("sqlite3"),
        OsString::from("-readonly"),
        database.into_os_string(),
        OsString::from(SQLITE_QUERY),
    ])
}

pub(super) fn prepare_xz(dir: &Path) -> Workload {
    let data = dir.join("text.txt");
    write_if_changed(&data, &generated_text(3 << 20, 0x9E37_79B9_7F4A_7C15));
    Workload::new([
        OsString::from("xz"),
        OsString::from("-9"),
        OsString::from("-T1"),
        OsString::from("-c"),
        data.into_os_string(),
    ])
}

/// A small real Go program: SHA-256 chains in two goroutines while the
/// main goroutine fills maps and sorts their keys.
pub(super) const GO_PROGRAM: &str = r#"package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
)

func digestRounds(seed int, rounds int) [32]byte {
	sum := sha256.Sum256([]byte(strconv.Itoa(seed)))
	for i := 0; i < rounds; i++ {
		sum = sha256.Sum256(sum[:])
	}
	return sum
}

func sortedKeys(n int) []string {
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		counts[strconv.Itoa(i*7919%100003)]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func main() {
	rounds, _ := strconv.Atoi(os.Args[1])
	var wg sync.WaitGroup
	results := make([][32]byte, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			results[w] = digestRounds(w, rounds)
		}(w)
	}
	keys := 0
	for i := 0; i < rounds/100000; i++ {
		keys += len(sortedKeys(200000))
	}
	wg.Wait()
	fmt.Printf("%x %x %d\n", results[0][:4], results[1][:4], keys)
}
"#;

pub(super) fn prepare_go(dir: &Path) -> Workload {
    let source = dir.join("main.go");
    write_if_changed(&source, GO_PROGRAM.as_bytes());
    let binary = dir.join("corpus-go");
    build_if_stale(&binary, &[&source], "go build", |out| {
        let mut command = Command::new("go");
        command
            .args(["build", "-o"])
            .arg(out)
            .arg(&source)
            .current_dir(dir)
            // Offline, module-less, cgo-free, caches beside the binary.
            .env("GOCACHE", dir.join("go-cache"))
            .env("GOPATH", dir.join("go-path"))
            .env("GOPROXY", "off")
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0");
        command
    });
    Workload::new([binary.as_os_str(), OsStr::new("3000000")])
}

pub(super) fn prepare_shell_loop(dir: &Path) -> Workload {
    let data = dir.join("small.txt");
    write_if_changed(&data, &generated_text(100 << 10, 0x2545_F491_4F6C_DD1D));
    Workload::new([
        OsString::from("sh"),
        OsString::from("-c"),
        OsString::from(r#"for i in $(seq 200); do xz -3 -T1 -c "$0" > /dev/null; done"#),
        data.into_os_string(),
    ])
}

pub(super) fn prepare_dd(_: &Path) -> Workload {
    Workload::new([
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=64",
        "count=5000000",
    ])
}

/// Copies the program given as `$0` to the run's directory, starts the
/// copy, waits until it runs (its `/proc/PID/exe` names the copy), deletes
/// it and waits for it.
pub(super) const DELETED_SCRIPT: &str = r#"cp "$0" ./deleted-copy || exit 1
./deleted-copy --work 2 &
pid=$!
while kill -0 "$pid" 2> /dev/null && [ "$(readlink /proc/$pid/exe)" != "$PWD/deleted-copy" ]; do
    sleep 0.01
done
rm ./deleted-copy
wait "$pid""#;

pub(super) fn prepare_deleted(_: &Path) -> Workload {
    let chain = build_workload("chain.c");
    Workload {
        command: vec![
            OsString::from("sh"),
            OsString::from("-c"),
            OsString::from(DELETED_SCRIPT),
            chain.as_os_str().to_os_string(),
        ],
        deleted_while_running: vec![chain],
    }
}

/// A C++ file of `functions` functions that instantiate standard
/// containers and algorithms, for clang's front end and LLVM's optimizer.
pub(super) fn generated_cpp_file(functions: usize) -> String {
    let mut source = String::from(
        "#include <algorithm>\n#include <map>\n#include <string>\n#include <unordered_map>\n\
         #include <vector>\n#include <functional>\n#include <memory>\n#include <sstream>\n",
    );
    for i in 0..functions {
        write!(
            source,
            r#"
template <typename T> struct Box{i} {{
    std::vector<T> items;
    std::map<std::string, T> named;
    T total() const {{
        T sum{{}};
        for (const auto &item : items) sum += item;
        for (const auto &[name, value] : named) sum += value * static_cast<T>(name.size());
        return sum;
    }}
}};
long func{i}(int n) {{
    Box{i}<long> box;
    std::unordered_map<int, std::string> names;
    for (int k = 0; k < n; k++) {{
        box.items.push_back(k * {m});
        std::ostringstream out;
        out << "item" << k;
        box.named[out.str()] = k;
        names.emplace(k, out.str());
    }}
    std::sort(box.items.begin(), box.items.end(), [](long a, long b) {{ return a % {m} < b % {m}; }});
    std::function<long(long)> twice = [&](long x) {{ return x * 2 + static_cast<long>(names.size()); }};
    auto shared = std::make_shared<Box{i}<double>>();
    shared->items.assign(box.items.begin(), box.items.end());
    return twice(box.total()) + static_cast<long>(shared->total());
}}
"#,
            m = i % 13 + 2
        )
        .unwrap();
    }
    source
}

pub(super) fn prepare_clang(dir: &Path) -> Workload {
    let source = dir.join("generated.cpp");
    write_if_changed(&source, generated_cpp_file(40).as_bytes());
    let mut command = vec![OsString::from("clang++")];
    command.extend(["-O2", "-std=c++17", "-c"].map(OsString::from));
    command.push(source.into_os_string());
    command.extend(["-o", "generated.o"].map(OsString::from));
    Workload::new(command)
}

/// A Rust library of `functions` functions (generics, iterators, closures,
/// collections), for rustc's front end and LLVM.
pub(super) fn generated_rust_file(functions: usize) -> String {
    let mut source = String::from("use std::collections::{BTreeMap, HashMap};\n");
    for i in 0..functions {
        write!(
            source,
            r#"
pub fn func{i}(words: &[&str], n: usize) -> (usize, u64) {{
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for word in words.iter().cycle().take(n) {{
        *counts.entry(word).or_default() += {m};
    }}
    let ordered: BTreeMap<usize, Vec<&str>> = counts.iter().fold(BTreeMap::new(), |mut map, (w, c)| {{
        map.entry(*c).or_insert_with(Vec::new).push(*w);
        map
    }});
    let total = ordered.values().flatten().map(|w| w.len() as u64 * {m}).sum::<u64>();
    (ordered.len(), total.wrapping_mul({i} + 1))
}}
"#,
            m = i % 11 + 1
        )
        .unwrap();
    }
    source
}

pub(super) fn prepare_rustc(dir: &Path) -> Workload {
    let source = dir.join("generated.rs");
    write_if_changed(&source, generated_rust_file(150).as_bytes());
    let mut command = vec![OsString::from("rustc")];
    command.extend(
        [
            "-O",
            "--edition",
            "2021",
            "--crate-type",
            "lib",
            "--crate-name",
            "generated",
            "--emit",
            "obj",
            "-o",
            "generated.o",
        ]
        .map(OsString::from),
    );
    command.push(source.into_os_string());
    Workload::new(command)
}

pub(super) fn prepare_big_static(dir: &Path) -> Workload {
    let assembly = dir.join("big.s");
    write_if_changed(&assembly, big_program::assembly().as_bytes());
    let main = dir.join("main.cpp");
    write_if_changed(&main, big_program::MAIN_CPP.as_bytes());
    let binary = dir.join("big-static");
    build_if_stale(
        &binary,
        &[&assembly, &main],
        "g++ -static (big program)",
        |out| big_program::build_command(out, &main, &assembly),
    );
    Workload::new([binary.as_os_str(), OsStr::new("6")])
}

pub(super) fn prepare_lazy_binding(_: &Path) -> Workload {
    let binary = build_workload("lazy_binding.c");
    let plugin = build_workload("lazy_binding_plugin.c");
    Workload::new([binary.as_os_str(), OsStr::new("3"), plugin.as_os_str()])
}

pub(super) fn prepare_throw(_: &Path) -> Workload {
    let binary = build_workload("throw.cpp");
    Workload::new([binary.as_os_str(), OsStr::new("3")])
}
