//! Names of code addresses kept on disk by content, so that a later run
//! (or the next worker of this one) names the addresses an earlier one
//! resolved without parsing the file's DWARF again.
//!
//! blazesym reads a file's unit headers, names and line programs before it
//! can name one address in it: 7-8 ms for a small Rust binary and libc's
//! debug file, the largest step of a short run's profiler CPU after the BPF
//! verifier, paid again by every run and every restarted worker, whose
//! in-memory caches start empty. A file's names are written to
//! `DIR/xx/rest.syms`, named by the digest of their key, when a period
//! resolved new addresses in it, merged with what the file held; a run
//! reads them the first time it meets the file and asks blazesym only for
//! the others.
//!
//! The key is what the names depend on: the file's bytes (their digest: a
//! build id is chosen by whoever builds the file, and a library built with
//! another's would have given it its names), every split debug file that
//! could be found for it (a debug package installed later gives lines and
//! inlined functions that the symbol table alone did not), whether inlined
//! functions are frames of their own (`-I`) and the ddprof build that
//! resolved them ([`own_build_id`]: its symbolizer). Names are written only
//! while those files are still the bytes hashed. Each file is checked
//! before use (a regular file, CRC-32, its key, counts against its length,
//! string indices, UTF-8), so that a truncated, corrupt or foreign file
//! costs a parse, never a wrong name. The directory is ddprof's own
//! ([`crate::files::disk::PrivateDir`]), files are written under a fresh
//! name and renamed into place, and the least recently used go once the
//! directory holds more than [`STORE_MAX_BYTES`] (checked at most every
//! [`EVICTION_INTERVAL`]). An entry names one address, or a run of
//! consecutive ones that name the same (a function named whole, see
//! `functions.rs`).
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::{FrameSymbols, SymbolLine, Symbolizer};
use crate::files::cache_dir::CacheDir;
use crate::files::digest::{self, FileDigest};
use crate::files::{
    debug_file, own_build_id, read_debuglink, Digest, Fields, MappedFile, ObjectFile, TargetRoot,
};

/// Total size of the stored names; the least recently used files go first.
pub const STORE_MAX_BYTES: u64 = 64 << 20;
/// The least time between two evictions (see [`SymbolStore::evict`]).
const EVICTION_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);
/// The file whose mtime is the time of the last eviction.
const EVICTION_MARK: &str = ".evicted";
/// Addresses kept per file: a long run of a large program resolves more,
/// but the hot ones are met first.
const MAX_ENTRIES_PER_FILE: usize = 200_000;
const MAGIC: &[u8; 8] = b"DDPRSYM\0";
const FORMAT_VERSION: u32 = 4;
/// Bytes of a line in the file: three string indices and the line number.
const LINE_BYTES: usize = 16;
/// Bytes of an entry with one line: offset, length, line count, the line.
const MIN_ENTRY_BYTES: usize = 8 + 4 + 4 + LINE_BYTES;

/// The names of `length` consecutive file offsets from `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredNames {
    pub offset: u64,
    pub length: u32,
    pub symbols: FrameSymbols,
}

/// What a file's names were resolved from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymbolKey {
    /// The file's bytes.
    pub file: Digest,
    /// The split debug files found for it (empty: none).
    pub debug_files: Vec<Digest>,
    /// `-I`: inlined functions reported as frames of their own.
    pub inlined_functions: bool,
}

impl SymbolKey {
    /// One digest for the key and the ddprof build `own`: the store file's
    /// name and the first thing it holds.
    fn digest(&self, own: &[u8]) -> Digest {
        let mut parts: Vec<&[u8]> = vec![own, &self.file.0];
        parts.extend(self.debug_files.iter().map(|digest| &digest.0[..]));
        let inlined = [u8::from(self.inlined_functions)];
        parts.push(&inlined);
        Digest::of_parts(&parts)
    }
}

/// The directory of stored names.
#[derive(Debug, Clone)]
pub struct SymbolStore {
    dir: CacheDir,
}

impl SymbolStore {
    /// The store in `dir` (made, `0700`, at first use).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir: CacheDir::new(dir),
        }
    }

    /// `xx` and `rest.syms` for the key's digest.
    fn place_of(digest: &Digest) -> (String, String) {
        let hex = digest.hex();
        (hex[..2].to_string(), format!("{}.syms", &hex[2..]))
    }

    /// The stored names of `key`'s file, their strings made by `intern`
    /// (empty when none were stored, or the file is stale or damaged).
    pub(super) fn load(
        &self,
        key: &SymbolKey,
        intern: &mut dyn FnMut(&str) -> Arc<str>,
    ) -> Vec<StoredNames> {
        let Some(own) = own_build_id() else {
            return Vec::new();
        };
        let digest = key.digest(own);
        let (prefix, name) = Self::place_of(&digest);
        let Some(entries) = self.read(&prefix, &name, &digest, intern) else {
            return Vec::new();
        };
        // Marks it recently used for the eviction order.
        self.dir.touch(&prefix, &name);
        entries
    }

    /// Adds `names` ((file offset, length) → lines) to what the store holds
    /// for `key`'s file; writes nothing when they add nothing.
    pub(super) fn save<'a>(
        &self,
        key: &SymbolKey,
        names: impl IntoIterator<Item = ((u64, u32), &'a FrameSymbols)>,
    ) -> std::io::Result<()> {
        let Some(own) = own_build_id() else {
            return Ok(());
        };
        let digest = key.digest(own);
        let (prefix, name) = Self::place_of(&digest);
        // Another run may have added names since this one read the file.
        // (ahash: SipHash over these keys and the strings below was a
        // quarter of a warm `rustc -O` run's symbolization.)
        let mut entries: HashMap<(u64, u32), FrameSymbols, ahash::RandomState> = self
            .read(&prefix, &name, &digest, &mut |text: &str| Arc::from(text))
            .unwrap_or_default()
            .into_iter()
            .map(|named| ((named.offset, named.length), named.symbols))
            .collect();
        let mut added = 0usize;
        for (span, symbols) in names {
            if entries.len() >= MAX_ENTRIES_PER_FILE {
                break;
            }
            if span.1 == 0 {
                continue;
            }
            entries.entry(span).or_insert_with(|| {
                added += 1;
                symbols.clone()
            });
        }
        if added == 0 {
            return Ok(());
        }
        let bytes = encode(&digest, &entries);
        self.dir.write(&prefix, &name, |out| out.write_all(&bytes))
    }

    /// Removes the least recently used files until the store holds at most
    /// [`STORE_MAX_BYTES`], at most once per [`EVICTION_INTERVAL`] for all
    /// the runs that share the store (the time of the last is the mtime of
    /// [`EVICTION_MARK`]). Listing the store is a `stat` per file: with
    /// ~600 files, 2–3 ms, five times the cost of the period's writes, paid
    /// by every short run that named anything new. Between two evictions
    /// the store can exceed its size by what the runs wrote meanwhile.
    pub fn evict(&self) {
        self.dir.trim(
            "symbol store",
            STORE_MAX_BYTES,
            None,
            Some((EVICTION_MARK, EVICTION_INTERVAL)),
        );
    }

    fn read(
        &self,
        prefix: &str,
        name: &str,
        digest: &Digest,
        intern: &mut dyn FnMut(&str) -> Arc<str>,
    ) -> Option<Vec<StoredNames>> {
        let bytes = self.dir.read(prefix, name, STORE_MAX_BYTES)?;
        let entries = decode(&bytes, digest, intern);
        if entries.is_none() {
            log::debug!(
                "symbol store: {} is stale or corrupt",
                self.dir.path().join(prefix).join(name).display()
            );
        }
        entries
    }
}

/// The file's bytes: magic, version, the key, the strings, the entries, and
/// the CRC-32 of everything before it.
fn encode<S>(key: &Digest, entries: &HashMap<(u64, u32), FrameSymbols, S>) -> Vec<u8> {
    let mut strings: Vec<&str> = Vec::new();
    let mut string_ids: HashMap<&str, u32, ahash::RandomState> = HashMap::default();
    for line in entries.values().flat_map(|lines| lines.iter()) {
        for text in [&line.function, &line.system_name, &line.file] {
            string_ids.entry(text).or_insert_with(|| {
                strings.push(text);
                strings.len() as u32 - 1
            });
        }
    }
    let mut sorted: Vec<(&(u64, u32), &FrameSymbols)> = entries.iter().collect();
    sorted.sort_by_key(|(span, _)| **span);
    let mut body = Vec::new();
    for ((offset, length), lines) in &sorted {
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&length.to_le_bytes());
        body.extend_from_slice(&(lines.len() as u32).to_le_bytes());
        for line in lines.iter() {
            for text in [&line.function, &line.system_name, &line.file] {
                body.extend_from_slice(&string_ids[&**text].to_le_bytes());
            }
            body.extend_from_slice(&line.line.to_le_bytes());
        }
    }

    let mut out = Vec::with_capacity(body.len() + 1024);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.0);
    out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    for text in &strings {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&(sorted.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The names in `bytes` if they are a whole, uncorrupted file of this
/// format, stored under `key` (the digest of a [`SymbolKey`] and the
/// ddprof build). Each string is made once (by `intern`) and shared by the
/// lines naming it, so that what a file holds bounds what it costs.
fn decode(
    bytes: &[u8],
    key: &Digest,
    intern: &mut dyn FnMut(&str) -> Arc<str>,
) -> Option<Vec<StoredNames>> {
    let mut fields = Fields::checked(bytes, MAGIC, FORMAT_VERSION)?;
    if fields.take(key.0.len())? != key.0 {
        return None;
    }
    let string_count = fields.u32()? as usize;
    // Each string takes at least its 4-byte length, each entry
    // MIN_ENTRY_BYTES: a count the rest cannot hold is refused before
    // anything of its size is allocated.
    if string_count > fields.rest.len() / 4 {
        return None;
    }
    let mut strings: Vec<Arc<str>> = Vec::with_capacity(string_count);
    for _ in 0..string_count {
        let len = fields.u32()? as usize;
        strings.push(intern(std::str::from_utf8(fields.take(len)?).ok()?));
    }
    let entry_count = fields.u32()? as usize;
    if entry_count > MAX_ENTRIES_PER_FILE || entry_count > fields.rest.len() / MIN_ENTRY_BYTES {
        return None;
    }
    let string = |id: u32| strings.get(id as usize).cloned();
    let mut entries = Vec::with_capacity(entry_count);
    for _ in 0..entry_count {
        let offset = fields.u64()?;
        let length = fields.u32()?;
        let line_count = fields.u32()? as usize;
        if length == 0
            || offset.checked_add(u64::from(length)).is_none()
            || line_count == 0
            || line_count > fields.rest.len() / LINE_BYTES
        {
            return None;
        }
        let mut lines = Vec::with_capacity(line_count);
        for _ in 0..line_count {
            lines.push(SymbolLine {
                function: string(fields.u32()?)?,
                system_name: string(fields.u32()?)?,
                file: string(fields.u32()?)?,
                line: fields.u32()?,
            });
        }
        entries.push(StoredNames {
            offset,
            length,
            symbols: FrameSymbols::from(lines),
        });
    }
    fields.rest.is_empty().then_some(entries)
}

/// A split debug file found for a file, and its digest.
#[derive(Debug, Clone)]
pub(super) struct KnownDebugFile {
    pub path: PathBuf,
    pub hashed: FileDigest,
}

impl KnownDebugFile {
    /// Whether the file at the path is still the one hashed.
    pub fn unchanged(&self) -> bool {
        TargetRoot::own()
            .and_then(|root| root.open(&self.path))
            .is_ok_and(|opened| self.hashed.still_matches(&opened.file))
    }
}

/// How the symbolizer uses the store.
impl Symbolizer {
    /// Names the addresses of `file` that the store holds, the first time
    /// the file is met.
    pub(super) fn read_store(&mut self, key: &MappedFile, file: &ObjectFile) {
        let store_key = match self.store {
            Some(_) => self.symbol_key(key, file),
            None => None,
        };
        let stored = match (self.store.clone(), &store_key) {
            (Some(store), Some(store_key)) => store.load(store_key, &mut |text| self.intern(text)),
            _ => Vec::new(),
        };
        let cache = self.files.get_mut(key).expect("the caller created it");
        cache.store_key = Some(store_key);
        let mut added = 0;
        for named in stored {
            let new = if named.length == 1 {
                cache
                    .addresses
                    .insert(named.offset, named.symbols)
                    .is_none()
            } else {
                let end = named.offset + u64::from(named.length);
                cache
                    .spans
                    .insert(named.offset, (end, named.symbols))
                    .is_none()
            };
            if new {
                added += 1;
            }
        }
        if added > 0 {
            log::debug!(
                "names of {added} addresses of {} read from the symbol store",
                file.path
            );
        }
        self.cached_addresses += added;
    }

    /// What `file`'s names are resolved from: its bytes, the split debug
    /// files that could be found for it, and `-I`. `None` for a file not
    /// held open (nothing of it is read) or that cannot be hashed.
    fn symbol_key(&mut self, key: &MappedFile, file: &ObjectFile) -> Option<SymbolKey> {
        let hashed = digest::of_file(file.held()?).ok()?;
        let debug_files = self
            .known_debug_files(key, file)
            .into_iter()
            .map(|known| known.hashed.digest)
            .collect();
        if let Some(cache) = self.files.get_mut(key) {
            cache.hashed = Some(hashed);
        }
        Some(SymbolKey {
            file: hashed.digest,
            debug_files,
            inlined_functions: self.inlined_functions,
        })
    }

    /// [`Symbolizer::debug_files_of`] the file under `key` (which the
    /// caller created), looked for once: one installed later in the run is
    /// neither in the key nor evicted until the worker is replaced.
    pub(super) fn known_debug_files(
        &mut self,
        key: &MappedFile,
        file: &ObjectFile,
    ) -> Vec<KnownDebugFile> {
        if let Some(found) = self.files.get(key).and_then(|c| c.debug_files.clone()) {
            return found;
        }
        let found = self.debug_files_of(file);
        if let Some(cache) = self.files.get_mut(key) {
            cache.debug_files = Some(found.clone());
        }
        found
    }

    /// The split debug files of `file` that exist where gdb or blazesym
    /// look for them: `DEBUG_DIR/.build-id/xx/rest.debug`, and for a
    /// `.gnu_debuglink` name, beside the file (and in its `.debug/`), under
    /// each debug directory at the file's directory, and in each debug
    /// directory itself. Each regular file (opened without blocking), with
    /// its digest.
    fn debug_files_of(&self, file: &ObjectFile) -> Vec<KnownDebugFile> {
        if file.open_path.is_empty() {
            return Vec::new();
        }
        let debuglink = read_debuglink(&file.open_path);
        let mut candidates = Vec::new();
        for dir in &self.debug_dirs {
            candidates.extend(debug_file::candidates(
                dir,
                &file.path,
                file.build_id.as_deref(),
                debuglink.as_deref(),
            ));
            if let Some(name) = debuglink
                .as_deref()
                .and_then(|l| std::str::from_utf8(l).ok())
            {
                if !name.is_empty() && !name.contains('/') {
                    candidates.push(dir.join(name));
                }
            }
        }
        let Ok(root) = TargetRoot::own() else {
            return Vec::new();
        };
        let mut found: Vec<KnownDebugFile> = Vec::new();
        for candidate in candidates {
            if found.iter().any(|known| known.path == candidate) {
                continue;
            }
            let Ok(opened) = root.open(&candidate) else {
                continue;
            };
            let Ok(hashed) = digest::of_file(&opened.file) else {
                continue;
            };
            found.push(KnownDebugFile {
                path: candidate,
                hashed,
            });
        }
        found
    }

    /// Adds the names resolved this period to the store. A store that
    /// cannot be written is not tried again in this run.
    pub(super) fn write_store(&mut self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let started = std::time::Instant::now();
        let mut written = false;
        let mut failed = false;
        for (file, cache) in &mut self.files {
            let unsaved = std::mem::take(&mut cache.unsaved);
            let unsaved_spans = std::mem::take(&mut cache.unsaved_spans);
            let Some(Some(key)) = &cache.store_key else {
                continue;
            };
            if failed || (unsaved.is_empty() && unsaved_spans.is_empty()) {
                continue;
            }
            let addresses = unsaved
                .iter()
                .filter_map(|offset| Some(((*offset, 1), cache.addresses.get(offset)?)));
            let spans = unsaved_spans.iter().filter_map(|start| {
                let (end, symbols) = cache.spans.get(start)?;
                Some(((*start, u32::try_from(end - start).ok()?), symbols))
            });
            let names = addresses.chain(spans);
            match store.save(key, names) {
                Ok(()) => written = true,
                Err(error) => {
                    log::info!(
                        "symbol store: cannot write the names of {}: {error}; later runs \
                         resolve them again (--debug-cache DIR: another place)",
                        file.path
                    );
                    failed = true;
                }
            }
        }
        if written {
            store.evict();
            log::debug!("symbol store: written in {:?}", started.elapsed());
        }
        if failed {
            self.store = None;
            // Nothing more is kept for a store that is gone.
            for cache in self.files.values_mut() {
                cache.store_key = Some(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::SystemTime;

    fn key() -> SymbolKey {
        SymbolKey {
            file: Digest::of_bytes(b"the file"),
            debug_files: vec![Digest::of_bytes(b"its debug file")],
            inlined_functions: false,
        }
    }

    /// Where `store` keeps `key`'s names.
    fn path_of(store: &SymbolStore, key: &SymbolKey) -> PathBuf {
        let (prefix, name) = SymbolStore::place_of(&key.digest(own_build_id().unwrap()));
        store.dir.path().join(prefix).join(name)
    }

    fn line(function: &str, file: &str, number: u32) -> SymbolLine {
        SymbolLine {
            function: function.into(),
            system_name: format!("_Z{function}").into(),
            file: file.into(),
            line: number,
        }
    }

    /// Two addresses, and a run of 0x40 (a function named whole) that
    /// starts at the first.
    fn names() -> HashMap<(u64, u32), FrameSymbols> {
        HashMap::from([
            (
                (0x1130, 1),
                FrameSymbols::from(vec![line("leaf", "chain.c", 12)]),
            ),
            (
                (0x1130, 0x40),
                FrameSymbols::from(vec![line("leaf", "chain.c", 13)]),
            ),
            (
                (0x2040, 1),
                FrameSymbols::from(vec![
                    line("inlined_helper", "util.h", 3),
                    line("caller", "chain.c", 40),
                ]),
            ),
        ])
    }

    fn sorted(entries: Vec<StoredNames>) -> Vec<((u64, u32), FrameSymbols)> {
        let mut entries: Vec<_> = entries
            .into_iter()
            .map(|named| ((named.offset, named.length), named.symbols))
            .collect();
        entries.sort_by_key(|(span, _)| *span);
        entries
    }

    fn sorted_names() -> Vec<((u64, u32), FrameSymbols)> {
        let mut entries: Vec<_> = names().into_iter().collect();
        entries.sort_by_key(|(span, _)| *span);
        entries
    }

    fn intern(text: &str) -> Arc<str> {
        Arc::from(text)
    }

    #[test]
    fn stored_names_read_back_only_under_the_same_key() {
        let dir = std::env::temp_dir().join(format!("ddprof-symbol-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = SymbolStore::new(dir.clone());
        let names = names();
        store
            .save(&key(), names.iter().map(|(span, s)| (*span, s)))
            .unwrap();
        assert_eq!(sorted(store.load(&key(), &mut intern)), sorted_names());

        // A later save adds to what is there; one that adds nothing writes
        // nothing.
        let more = HashMap::from([(
            (0x3000u64, 1u32),
            FrameSymbols::from(vec![line("other", "o.c", 1)]),
        )]);
        store
            .save(&key(), more.iter().map(|(span, s)| (*span, s)))
            .unwrap();
        let all = store.load(&key(), &mut intern);
        assert_eq!(all.len(), 4);
        let path = path_of(&store, &key());
        let before = fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        store
            .save(&key(), more.iter().map(|(span, s)| (*span, s)))
            .unwrap();
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);

        // Any part of the key that differs finds nothing.
        let mut inlined = key();
        inlined.inlined_functions = true;
        let mut no_debug_file = key();
        no_debug_file.debug_files.clear();
        let mut other_file = key();
        other_file.file = Digest::of_bytes(b"another file, same build id");
        for other in [inlined, no_debug_file, other_file] {
            assert!(store.load(&other, &mut intern).is_empty(), "{other:?}");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_refused() {
        let digest = key().digest(b"ddprof-build-id!");
        let bytes = encode(&digest, &names());
        assert_eq!(
            decode(&bytes, &digest, &mut intern).map(sorted),
            Some(sorted_names())
        );
        let other_build = key().digest(b"another-build-id");
        assert_eq!(decode(&bytes, &other_build, &mut intern), None);
        for len in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..len], &digest, &mut intern),
                None,
                "truncated to {len}"
            );
        }
        for index in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[index] ^= 1 << bit;
                assert_eq!(
                    decode(&flipped, &digest, &mut intern),
                    None,
                    "byte {index} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn the_store_is_trimmed_at_most_once_per_interval() {
        let dir = std::env::temp_dir().join(format!("ddprof-symbol-evict-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = SymbolStore::new(dir.clone());
        let big = dir.join("ab").join("big.syms");
        let make_big = || {
            fs::create_dir_all(big.parent().unwrap()).unwrap();
            // Sparse: its length counts, not its blocks.
            let file = fs::File::create(&big).unwrap();
            file.set_len(STORE_MAX_BYTES + 1).unwrap();
        };
        make_big();
        store.evict();
        assert!(!big.exists(), "the first eviction trims the store");
        make_big();
        store.evict();
        assert!(
            big.exists(),
            "a second one within the interval does nothing"
        );
        let long_ago = SystemTime::now() - EVICTION_INTERVAL - std::time::Duration::from_secs(1);
        fs::File::options()
            .write(true)
            .open(dir.join(EVICTION_MARK))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        store.evict();
        assert!(!big.exists(), "once the interval is over, it trims again");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_store_path_that_is_not_a_regular_file_is_not_read() {
        let dir = std::env::temp_dir().join(format!("ddprof-symbol-fifo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = SymbolStore::new(dir.clone());
        let path = path_of(&store, &key());
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        // A FIFO would block an open for reading; a link to /dev/zero would
        // never end.
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(store.load(&key(), &mut intern).is_empty());
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert!(store.load(&key(), &mut intern).is_empty());
        let _ = fs::remove_dir_all(&dir);
    }
}
