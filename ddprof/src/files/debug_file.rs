//! Finds the split debug file of an ELF file (where `.debug_frame` lives
//! when the distribution strips it), the way gdb looks for it.
use std::fs::File;
use std::path::{Path, PathBuf};

use super::{build_id_debug_path, FileIdentity, TargetRoot};

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

/// Opens the first candidate that is a regular file and not the file
/// itself (`own`), each resolved under `root` (the root of the process that
/// maps the file: a container's debug files are its own), never blocking
/// and never out of that root ([`TargetRoot::open`]).
pub fn open(root: &TargetRoot, candidates: &[PathBuf], own: FileIdentity) -> Option<File> {
    candidates.iter().find_map(|candidate| {
        let opened = root.open(candidate).ok()?;
        (opened.identity != own).then_some(opened.file)
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
        let metadata = std::fs::metadata(&binary).unwrap();
        let own = FileIdentity {
            dev: std::os::unix::fs::MetadataExt::dev(&metadata),
            inode: std::os::unix::fs::MetadataExt::ino(&metadata),
        };
        let root = TargetRoot::own().unwrap();
        let binary_path = binary.to_str().unwrap();
        let list = candidates(
            Path::new("/nonexistent"),
            binary_path,
            None,
            Some(b"prog.debug"),
        );
        let mut found = open(&root, &list, own).expect("found in .debug/");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut found, &mut text).unwrap();
        assert_eq!(text, "debug");
        // A debuglink naming the file itself is skipped.
        let list = candidates(Path::new("/nonexistent"), binary_path, None, Some(b"prog"));
        assert!(open(&root, &list[..1], own).is_none());
        // Nor a FIFO, which would block an open.
        let fifo = dir.join("fifo.debug");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let list = candidates(
            Path::new("/nonexistent"),
            binary_path,
            None,
            Some(b"fifo.debug"),
        );
        assert!(open(&root, &list, own).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
