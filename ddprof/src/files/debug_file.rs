//! Finds the split debug file of an ELF file (where `.debug_frame` lives
//! when the distribution strips it), the way gdb looks for it.
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::build_id_debug_path;

/// The global debug directory distributions install `-dbg`/`-dbgsym` files in.
pub const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Candidate paths of the debug file, most specific first:
/// `<root>/.build-id/xx/rest.debug`, then for a `.gnu_debuglink` name
/// `dir/name`, `dir/.debug/name` and `<root>/dir/name`, where `dir` is the
/// directory of the file as the process sees it (`original_path`).
pub fn candidates(
    debug_root: &Path,
    original_path: &str,
    build_id: Option<&[u8]>,
    debuglink: Option<&[u8]>,
) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(relative) = build_id.and_then(build_id_debug_path) {
        paths.push(debug_root.join(relative));
    }
    let name = debuglink
        .and_then(|l| std::str::from_utf8(l).ok())
        .filter(|n| !n.is_empty() && !n.contains('/'));
    if let (Some(name), Some(dir)) = (name, Path::new(original_path).parent()) {
        paths.push(dir.join(name));
        paths.push(dir.join(".debug").join(name));
        let relative = dir.strip_prefix("/").unwrap_or(dir);
        paths.push(debug_root.join(relative).join(name));
    }
    paths
}

/// Opens the first candidate that exists and is not the file itself
/// (`own_inode`). `root` prefixes every path (a process's `/proc/PID/root`
/// when it lives in another mount namespace; empty otherwise).
pub fn open(root: &Path, candidates: &[PathBuf], own_inode: u64) -> Option<File> {
    candidates.iter().find_map(|candidate| {
        let path = if root.as_os_str().is_empty() {
            candidate.clone()
        } else {
            root.join(candidate.strip_prefix("/").unwrap_or(candidate))
        };
        let file = File::open(path).ok()?;
        let metadata = file.metadata().ok()?;
        (metadata.is_file() && metadata.ino() != own_inode).then_some(file)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_build_id_and_debuglink_paths() {
        let paths = candidates(
            Path::new("/usr/lib/debug"),
            "/usr/lib/x86_64-linux-gnu/libfoo.so.1",
            Some(&[0xab, 0xcd, 0x01]),
            Some(b"libfoo.so.1.debug"),
        );
        let expected: Vec<PathBuf> = [
            "/usr/lib/debug/.build-id/ab/cd01.debug",
            "/usr/lib/x86_64-linux-gnu/libfoo.so.1.debug",
            "/usr/lib/x86_64-linux-gnu/.debug/libfoo.so.1.debug",
            "/usr/lib/debug/usr/lib/x86_64-linux-gnu/libfoo.so.1.debug",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(paths, expected);
        // A debuglink with a slash is not a file name: ignored.
        assert!(candidates(Path::new("/d"), "/x/y", None, Some(b"../etc/passwd")).is_empty());
    }

    #[test]
    fn opens_debuglink_next_to_file_but_never_the_file_itself() {
        let dir = std::env::temp_dir().join(format!("ddprof-debugfile-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(".debug")).unwrap();
        let binary = dir.join("prog");
        std::fs::write(&binary, b"binary").unwrap();
        std::fs::write(dir.join(".debug/prog.debug"), b"debug").unwrap();
        let own_inode = std::fs::metadata(&binary).unwrap().ino();
        let binary_path = binary.to_str().unwrap();
        let list = candidates(
            Path::new("/nonexistent"),
            binary_path,
            None,
            Some(b"prog.debug"),
        );
        let mut found = open(Path::new(""), &list, own_inode).expect("found in .debug/");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut found, &mut text).unwrap();
        assert_eq!(text, "debug");
        // A debuglink naming the file itself is skipped.
        let list = candidates(Path::new("/nonexistent"), binary_path, None, Some(b"prog"));
        assert!(open(Path::new(""), &list[..1], own_inode).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
