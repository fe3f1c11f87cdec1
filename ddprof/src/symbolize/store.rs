//! Names of code addresses kept on disk by build id, so that a later run
//! (or the next worker of this one) names the addresses an earlier one
//! resolved without parsing the file's DWARF again.
//!
//! blazesym reads a file's unit headers, names and line programs before it
//! can name one address in it: 7-8 ms for a small Rust binary and libc's
//! debug file, the largest step of a short run's profiler CPU after the BPF
//! verifier, paid again by every run and every restarted worker, whose
//! in-memory caches start empty. A file's names are written to
//! `DIR/xx/rest.syms` (the build id in hex) when a period resolved new
//! addresses in it, merged with what the file held; a run reads them the
//! first time it meets the file and asks blazesym only for the others.
//!
//! Names depend on more than the build id, and the key holds it all: the
//! ddprof build that resolved them ([`own_build_id`]: its symbolizer),
//! whether inlined functions are frames of their own (`-I`), and the split
//! debug file found for the file (a debug package installed later gives
//! lines and inlined functions that the symbol table alone did not). Each
//! file is checked before use (CRC-32, counts against its length, string
//! indices, UTF-8), so that a truncated, corrupt or foreign file costs a
//! parse, never a wrong name. Files are written beside their name and
//! renamed into place, and the least recently used go once the directory
//! holds more than [`STORE_MAX_BYTES`].
use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{FrameSymbols, OwnedLine, Symbolizer};
use crate::files::{
    build_id_hex, debug_file, own_build_id, read_debuglink, remove_least_recently_used, FileStamp,
    MappedFile, ObjectFile, MAX_BUILD_ID_LEN, MIN_BUILD_ID_LEN,
};

/// Total size of the stored names; the least recently used files go first.
pub const STORE_MAX_BYTES: u64 = 64 << 20;
/// Addresses kept per file: a long run of a large program resolves more,
/// but the hot ones are met first.
const MAX_ENTRIES_PER_FILE: usize = 200_000;
const MAGIC: &[u8; 8] = b"DDPRSYM\0";
const FORMAT_VERSION: u32 = 1;
/// Bytes of a line in the file: three string indices and the line number.
const LINE_BYTES: usize = 16;

/// What a file's names were resolved from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolKey {
    pub build_id: Vec<u8>,
    /// The split debug file found for it, if any.
    pub debug_file: Option<FileStamp>,
    /// `-I`: inlined functions reported as frames of their own.
    pub inlined_functions: bool,
}

/// The directory of stored names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolStore {
    dir: PathBuf,
}

impl SymbolStore {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// `DIR/xx/rest.syms` (`rest.inlined.syms` with `-I`, so that runs with
    /// and without it keep their own); `None` for ids too short or too long
    /// to be one.
    fn path_of(&self, key: &SymbolKey) -> Option<PathBuf> {
        if !(MIN_BUILD_ID_LEN..=MAX_BUILD_ID_LEN).contains(&key.build_id.len()) {
            return None;
        }
        let hex = build_id_hex(&key.build_id);
        let kind = if key.inlined_functions {
            ".inlined"
        } else {
            ""
        };
        Some(
            self.dir
                .join(&hex[..2])
                .join(format!("{}{kind}.syms", &hex[2..])),
        )
    }

    /// The stored names of `key`'s file, by file offset (empty when none
    /// were stored, or the file is stale or damaged).
    pub(super) fn load(&self, key: &SymbolKey) -> HashMap<u64, Vec<OwnedLine>> {
        let Some((own, path)) = own_build_id().zip(self.path_of(key)) else {
            return HashMap::new();
        };
        let Some(entries) = read(&path, key, own) else {
            return HashMap::new();
        };
        // Marks it recently used for the eviction order.
        let _ = fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|file| file.set_modified(SystemTime::now()));
        entries
    }

    /// Adds `names` (file offset → lines) to what the store holds for
    /// `key`'s file.
    pub(super) fn save<'a>(
        &self,
        key: &SymbolKey,
        names: impl IntoIterator<Item = (u64, &'a [OwnedLine])>,
    ) -> std::io::Result<()> {
        let Some((own, path)) = own_build_id().zip(self.path_of(key)) else {
            return Ok(());
        };
        // Another run may have added names since this one read the file.
        let mut entries = read(&path, key, own).unwrap_or_default();
        for (offset, lines) in names {
            if entries.len() >= MAX_ENTRIES_PER_FILE {
                break;
            }
            entries.entry(offset).or_insert_with(|| lines.to_vec());
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let partial = path.with_extension(format!("syms.{}.partial", std::process::id()));
        let written = fs::File::create(&partial)
            .and_then(|mut file| file.write_all(&encode(key, &entries, own)))
            .and_then(|()| fs::rename(&partial, &path));
        if written.is_err() {
            let _ = fs::remove_file(&partial);
            return written;
        }
        Ok(())
    }

    /// Removes the least recently used files until the store holds at most
    /// [`STORE_MAX_BYTES`] (once after a period's saves: it lists them all).
    pub fn evict(&self) {
        for removed in remove_least_recently_used(&self.dir, STORE_MAX_BYTES, Path::new("")) {
            log::info!(
                "symbol store: removed {} (over {} MiB)",
                removed.display(),
                STORE_MAX_BYTES >> 20
            );
        }
    }
}

fn read(path: &Path, key: &SymbolKey, own: &[u8]) -> Option<HashMap<u64, Vec<OwnedLine>>> {
    let mut file = fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > STORE_MAX_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let entries = decode(&bytes, key, own);
    if entries.is_none() {
        log::debug!("symbol store: {} is stale or corrupt", path.display());
    }
    entries
}

/// The file's bytes: magic, version, the key, the strings, the entries, and
/// the CRC-32 of everything before it.
fn encode(key: &SymbolKey, entries: &HashMap<u64, Vec<OwnedLine>>, own: &[u8]) -> Vec<u8> {
    let mut strings: Vec<&str> = Vec::new();
    let mut string_ids: HashMap<&str, u32> = HashMap::new();
    for line in entries.values().flatten() {
        for text in [&line.function, &line.system_name, &line.file] {
            string_ids.entry(text).or_insert_with(|| {
                strings.push(text);
                strings.len() as u32 - 1
            });
        }
    }
    let mut sorted: Vec<(&u64, &Vec<OwnedLine>)> = entries.iter().collect();
    sorted.sort_by_key(|(offset, _)| **offset);
    let mut body = Vec::new();
    for (offset, lines) in &sorted {
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&(lines.len() as u32).to_le_bytes());
        for line in lines.iter() {
            for text in [&line.function, &line.system_name, &line.file] {
                body.extend_from_slice(&string_ids[text.as_str()].to_le_bytes());
            }
            body.extend_from_slice(&line.line.to_le_bytes());
        }
    }

    let mut out = Vec::with_capacity(body.len() + 1024);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for id in [own, key.build_id.as_slice()] {
        out.extend_from_slice(&(id.len() as u32).to_le_bytes());
        out.extend_from_slice(id);
    }
    out.push(u8::from(key.inlined_functions));
    out.push(u8::from(key.debug_file.is_some()));
    let stamp = key.debug_file.unwrap_or_default();
    for value in [stamp.inode, stamp.size] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in [stamp.mtime, stamp.mtime_nsec] {
        out.extend_from_slice(&value.to_le_bytes());
    }
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

/// A little-endian reader over a byte slice that fails past its end.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.rest.split_at_checked(count)?;
        self.rest = rest;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// The names in `bytes` if they are a whole, uncorrupted file of this
/// format, resolved from `key`'s files by the ddprof build `own`.
fn decode(bytes: &[u8], key: &SymbolKey, own: &[u8]) -> Option<HashMap<u64, Vec<OwnedLine>>> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let mut fields = Fields { rest: body };
    if fields.take(MAGIC.len())? != MAGIC || fields.u32()? != FORMAT_VERSION {
        return None;
    }
    for id in [own, key.build_id.as_slice()] {
        let len = fields.u32()? as usize;
        if fields.take(len)? != id {
            return None;
        }
    }
    if fields.u8()? != u8::from(key.inlined_functions) {
        return None;
    }
    let has_debug_file = fields.u8()? != 0;
    let stamp = FileStamp {
        inode: fields.u64()?,
        size: fields.u64()?,
        mtime: fields.u64()? as i64,
        mtime_nsec: fields.u64()? as i64,
    };
    if key.debug_file != has_debug_file.then_some(stamp) {
        return None;
    }
    let string_count = fields.u32()? as usize;
    // Each string takes at least its 4-byte length: a count the rest cannot
    // hold is refused before anything of its size is allocated.
    if string_count > fields.rest.len() / 4 {
        return None;
    }
    let mut strings = Vec::with_capacity(string_count);
    for _ in 0..string_count {
        let len = fields.u32()? as usize;
        strings.push(std::str::from_utf8(fields.take(len)?).ok()?);
    }
    let entry_count = fields.u32()? as usize;
    if entry_count > fields.rest.len() / 12 {
        return None;
    }
    let string = |id: u32| strings.get(id as usize).map(|text| text.to_string());
    let mut entries = HashMap::with_capacity(entry_count);
    for _ in 0..entry_count {
        let offset = fields.u64()?;
        let line_count = fields.u32()? as usize;
        if line_count == 0 || line_count > fields.rest.len() / LINE_BYTES {
            return None;
        }
        let mut lines = Vec::with_capacity(line_count);
        for _ in 0..line_count {
            lines.push(OwnedLine {
                function: string(fields.u32()?)?,
                system_name: string(fields.u32()?)?,
                file: string(fields.u32()?)?,
                line: fields.u32()?,
            });
        }
        entries.insert(offset, lines);
    }
    fields.rest.is_empty().then_some(entries)
}

/// How the symbolizer uses the store.
impl Symbolizer {
    /// Names the addresses of `file` that the store holds, the first time
    /// the file is met.
    pub(super) fn read_store(&mut self, key: &MappedFile, file: &ObjectFile) {
        let store_key = self.store.as_ref().and_then(|_| self.symbol_key(file));
        let stored = match (&self.store, &store_key) {
            (Some(store), Some(store_key)) => store.load(store_key),
            _ => HashMap::new(),
        };
        let stored: Vec<(u64, FrameSymbols)> = stored
            .into_iter()
            .map(|(offset, lines)| (offset, FrameSymbols::from(self.intern_lines(lines))))
            .collect();
        let cache = self.files.get_mut(key).expect("the caller created it");
        cache.store_key = Some(store_key);
        let mut added = 0;
        for (offset, symbols) in stored {
            if cache.addresses.insert(offset, symbols).is_none() {
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

    /// What `file`'s names are resolved from: its build id, the split debug
    /// file blazesym will find for it (by build id or `.gnu_debuglink`, in
    /// the debug directories), and `-I`.
    fn symbol_key(&self, file: &ObjectFile) -> Option<SymbolKey> {
        let build_id = file.build_id.clone()?;
        let debuglink = read_debuglink(&file.open_path);
        let debug_file = self.debug_dirs.iter().find_map(|dir| {
            let candidates =
                debug_file::candidates(dir, &file.path, Some(&build_id), debuglink.as_deref());
            debug_file::open(Path::new(""), &candidates, file.inode)
        });
        Some(SymbolKey {
            build_id,
            debug_file: debug_file
                .and_then(|file| file.metadata().ok())
                .map(|metadata| FileStamp::of(&metadata)),
            inlined_functions: self.inlined_functions,
        })
    }

    /// Adds the names resolved this period to the store. A store that
    /// cannot be written is not tried again in this run.
    pub(super) fn write_store(&mut self) {
        let Some(store) = &self.store else {
            return;
        };
        let mut written = false;
        for (file, cache) in &mut self.files {
            let Some(Some(key)) = &cache.store_key else {
                cache.unsaved.clear();
                continue;
            };
            if cache.unsaved.is_empty() {
                continue;
            }
            let names: Vec<(u64, Vec<OwnedLine>)> = cache
                .unsaved
                .drain(..)
                .filter_map(|offset| {
                    let symbols = cache.addresses.get(&offset)?;
                    Some((offset, symbols.iter().map(OwnedLine::from).collect()))
                })
                .collect();
            let saved = store.save(
                key,
                names.iter().map(|(offset, lines)| (*offset, &lines[..])),
            );
            if let Err(error) = saved {
                log::info!(
                    "symbol store: cannot write the names of {}: {error}; later runs \
                     resolve them again (--debug-cache DIR: another place)",
                    file.path
                );
                self.store = None;
                return;
            }
            written = true;
        }
        if written {
            store.evict();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SymbolKey {
        SymbolKey {
            build_id: vec![0xab; 20],
            debug_file: Some(FileStamp {
                inode: 7,
                size: 4096,
                mtime: 1_700_000_000,
                mtime_nsec: 5,
            }),
            inlined_functions: false,
        }
    }

    fn line(function: &str, file: &str, number: u32) -> OwnedLine {
        OwnedLine {
            function: function.to_string(),
            system_name: format!("_Z{function}"),
            file: file.to_string(),
            line: number,
        }
    }

    fn names() -> HashMap<u64, Vec<OwnedLine>> {
        HashMap::from([
            (0x1130, vec![line("leaf", "chain.c", 12)]),
            (
                0x2040,
                vec![
                    line("inlined_helper", "util.h", 3),
                    line("caller", "chain.c", 40),
                ],
            ),
        ])
    }

    #[test]
    fn stored_names_read_back_only_under_the_same_key() {
        let dir = std::env::temp_dir().join(format!("ddprof-symbol-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = SymbolStore::new(dir.clone());
        let names = names();
        store
            .save(&key(), names.iter().map(|(o, l)| (*o, l.as_slice())))
            .unwrap();
        assert_eq!(store.load(&key()), names);

        // A later save adds to what is there.
        let more = [(0x3000u64, vec![line("other", "other.c", 1)])];
        store
            .save(&key(), more.iter().map(|(o, l)| (*o, l.as_slice())))
            .unwrap();
        let all = store.load(&key());
        assert_eq!(all.len(), 3);
        assert_eq!(all[&0x2040], names[&0x2040]);

        // Any part of the key that differs finds nothing.
        let mut inlined = key();
        inlined.inlined_functions = true;
        let mut no_debug_file = key();
        no_debug_file.debug_file = None;
        let mut other_build = key();
        other_build.build_id[0] = 0;
        for other in [inlined, no_debug_file, other_build] {
            assert!(store.load(&other).is_empty(), "{other:?}");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_refused() {
        let own = b"ddprof-build-id!";
        let bytes = encode(&key(), &names(), own);
        assert_eq!(decode(&bytes, &key(), own), Some(names()));
        assert_eq!(decode(&bytes, &key(), b"another-build-id"), None);
        for len in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..len], &key(), own),
                None,
                "truncated to {len}"
            );
        }
        for index in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[index] ^= 1 << bit;
                assert_eq!(
                    decode(&flipped, &key(), own),
                    None,
                    "byte {index} bit {bit}"
                );
            }
        }
    }
}
