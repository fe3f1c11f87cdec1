//! Files named by their symbol tables alone, without blazesym.
//!
//! A file with no DWARF and no split debug file (the Rust toolchain's
//! `libLLVM` and `librustc_driver`, many a package's library) is named
//! from its `.symtab` and `.dynsym`. blazesym sorts a file's symbols by
//! address before it names one address in it: for `libLLVM`'s 258,000
//! symbols ~15-20 ms, paid again by every run that meets one function it
//! never named before, and a warm `rustc -O` met some in both of those
//! libraries at every run.
//!
//! So such a file's symbols are sorted once per content, exactly as
//! blazesym 0.2 sorts them (the same symbols, by the same comparison, with
//! the same sort: so that ties among aliases come out in the same order),
//! and kept on disk by the file's digest and this ddprof build
//! ([`IndexStore`]); a later run reads the sorted table and looks addresses
//! up in it as blazesym does ([`SymbolIndex::lookup`]: `.symtab` first,
//! then `.dynsym`, among the symbols that start at the greatest address at
//! or below the address, the first that covers it). Names are read from the
//! file's string tables with `pread`. A test holds the answers to those of
//! blazesym for every byte of a built program with aliases, nested, weak
//! and sizeless symbols, and for addresses across `librustc_driver`.
//!
//! Only files that blazesym names from these two tables alone are indexed:
//! no `.debug_info` (compressed or not), no `.gnu_debuglink` or
//! `.gnu_debugaltlink` (blazesym would follow it to a debug file), no
//! `.gnu_debugdata` (it reads that when `.symtab` is empty), no compressed
//! symbol or string table. Anything unexpected (a name that is not UTF-8 or
//! runs past its table, a size beyond 4 GiB) leaves the file to blazesym.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::{Endianness, ReadCache};

use crate::files::cache_dir::{CacheDir, FileView};
use crate::files::elf_headers::ElfHeaders;
use crate::files::{own_build_id, Digest, Fields};

/// Total size of the kept indexes; the least recently used go first.
pub const INDEX_STORE_MAX_BYTES: u64 = 256 << 20;
const MAGIC: &[u8; 8] = b"DDPRSIX\0";
const FORMAT_VERSION: u32 = 1;
/// Bytes of an entry on disk: address, size, name.
const ENTRY_BYTES: usize = 8 + 4 + 4;
/// The longest name read; a longer one leaves the file to blazesym.
const MAX_NAME_BYTES: usize = 64 << 10;
/// Sections that make blazesym read more than the two symbol tables.
const DEBUG_SECTIONS: [&str; 5] = [
    ".debug_info",
    ".zdebug_info",
    ".gnu_debuglink",
    ".gnu_debugaltlink",
    ".gnu_debugdata",
];
/// The high bit of [`Entry::name`]: the symbol is undefined (`SHN_UNDEF`),
/// which blazesym keeps in its order but never reports.
const UNDEFINED: u32 = 1 << 31;

/// One symbol as blazesym's address index holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    value: u64,
    size: u32,
    /// Offset of the name in the table's strings, and [`UNDEFINED`].
    name: u32,
}

impl Entry {
    /// The entry whose bytes in a kept index are `raw` (little-endian).
    fn from_bytes(raw: &[u8; ENTRY_BYTES]) -> Self {
        let [v0, v1, v2, v3, v4, v5, v6, v7, s0, s1, s2, s3, n0, n1, n2, n3] = *raw;
        Entry {
            value: u64::from_le_bytes([v0, v1, v2, v3, v4, v5, v6, v7]),
            size: u32::from_le_bytes([s0, s1, s2, s3]),
            name: u32::from_le_bytes([n0, n1, n2, n3]),
        }
    }
}

/// A table's entries: sorted by this run, or read where they lie in a
/// kept index's mapped file (libLLVM's 258,000 symbols: 4 MB that were
/// read into memory and then decoded into as much again at every run).
#[derive(Debug, Clone)]
enum Entries {
    Built(Vec<Entry>),
    Stored {
        view: Arc<FileView>,
        /// Byte offset of the first entry, checked to hold `count`.
        start: usize,
        count: usize,
    },
}

impl Entries {
    fn len(&self) -> usize {
        match self {
            Entries::Built(entries) => entries.len(),
            Entries::Stored { count, .. } => *count,
        }
    }

    fn get(&self, index: usize) -> Option<Entry> {
        match self {
            Entries::Built(entries) => entries.get(index).copied(),
            Entries::Stored { view, start, count } => {
                if index >= *count {
                    return None;
                }
                let at = start + index * ENTRY_BYTES;
                Some(Entry::from_bytes(
                    view.bytes().get(at..at + ENTRY_BYTES)?.try_into().ok()?,
                ))
            }
        }
    }

    /// The first index whose entry is not `below` (entries sorted so that
    /// `below` holds for a prefix), as `slice::partition_point`.
    fn partition_point(&self, below: impl Fn(&Entry) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = low + (high - low) / 2;
            if self.get(middle).is_some_and(|entry| below(&entry)) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// The entries from `index` on.
    fn iter_from(&self, index: usize) -> impl Iterator<Item = Entry> + '_ {
        (index..self.len()).map_while(|index| self.get(index))
    }
}

impl PartialEq for Entries {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter_from(0).eq(other.iter_from(0))
    }
}

impl Eq for Entries {}

/// One symbol table, sorted as blazesym sorts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Table {
    /// `.dynsym`: a symbol without a size names its own address only.
    dynamic: bool,
    /// Where the table's strings are in the file.
    strings_offset: u64,
    strings_size: u64,
    entries: Entries,
}

/// A symbol found for an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FoundSymbol {
    pub name: String,
    /// Its address (ELF virtual address).
    pub address: u64,
    /// `None` for a symbol without a size.
    pub size: Option<u64>,
}

/// The sorted symbol tables of one file, and its loadable segments (file
/// offsets are turned into addresses as blazesym does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SymbolIndex {
    /// `PT_LOAD` segments in program-header order: offset, file size, address.
    loads: Vec<(u64, u64, u64)>,
    /// `.symtab`, then `.dynsym`.
    tables: Vec<Table>,
}

impl SymbolIndex {
    /// The index of `file` if blazesym names it from its symbol tables
    /// alone (see the module's comment), else `None`.
    pub(super) fn build(file: &File) -> Option<Self> {
        let data = ReadCache::new(file);
        let header = elf::FileHeader64::<Endianness>::parse(&data).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, &data).ok()?;
        if DEBUG_SECTIONS
            .iter()
            .any(|name| sections.section_by_name(endian, name.as_bytes()).is_some())
        {
            return None;
        }
        let loads = ElfHeaders::parse(&data)?
            .segments
            .iter()
            .map(|segment| (segment.file_offset, segment.file_size, segment.vaddr))
            .collect();
        let table = |symbols: &str, strings: &str, dynamic: bool| -> Option<Table> {
            let empty = Table {
                dynamic,
                strings_offset: 0,
                strings_size: 0,
                entries: Entries::Built(Vec::new()),
            };
            let compressed = |section: &elf::SectionHeader64<Endianness>| {
                section.sh_flags(endian).contains(elf::SHF_COMPRESSED)
            };
            let (strings_offset, strings_size) =
                match sections.section_by_name(endian, strings.as_bytes()) {
                    Some((_, section)) if compressed(section) => return None,
                    Some((_, section)) if section.sh_type(endian) != elf::SHT_NOBITS => {
                        (section.sh_offset(endian), section.sh_size(endian))
                    }
                    _ => (0, 0),
                };
            if strings_size >= u64::from(UNDEFINED) {
                return None;
            }
            let Some((_, section)) = sections.section_by_name(endian, symbols.as_bytes()) else {
                return Some(empty);
            };
            if compressed(section) {
                return None;
            }
            if section.sh_type(endian) == elf::SHT_NOBITS {
                return Some(empty);
            }
            let symbols: &[elf::Sym64<Endianness>] = section.data_as_array(endian, &data).ok()?;
            Some(Table {
                dynamic,
                strings_offset,
                strings_size,
                entries: Entries::Built(sorted_as_blazesym_sorts(symbols, endian)?),
            })
        };
        Some(Self {
            loads,
            tables: vec![
                table(".symtab", ".strtab", false)?,
                table(".dynsym", ".dynstr", true)?,
            ],
        })
    }

    /// The address of file offset `offset`: in the first loadable segment
    /// that holds it.
    pub(super) fn address_of(&self, offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|&(start, size, address)| {
            (start..start.wrapping_add(size))
                .contains(&offset)
                .then(|| offset - start + address)
        })
    }

    /// The symbol blazesym names `address` after, its name read from
    /// `file`: `Ok(None)` where none does, `Err(())` where a name cannot be
    /// read (blazesym fails the whole lookup then).
    pub(super) fn lookup(&self, file: &File, address: u64) -> Result<Option<FoundSymbol>, ()> {
        for table in &self.tables {
            if let Some(entry) = table.find(address) {
                let name = table.name(file, entry.name & !UNDEFINED).ok_or(())?;
                return Ok(Some(FoundSymbol {
                    name,
                    address: entry.value,
                    size: (entry.size != 0).then_some(u64::from(entry.size)),
                }));
            }
        }
        Ok(None)
    }

    /// Bytes it takes in memory.
    pub(super) fn bytes(&self) -> usize {
        self.tables
            .iter()
            .map(|table| table.entries.len() * std::mem::size_of::<Entry>())
            .sum::<usize>()
            + self.loads.len() * 24
    }

    fn encode(&self, key: &Digest) -> Vec<u8> {
        let entries: usize = self.tables.iter().map(|table| table.entries.len()).sum();
        let mut out = Vec::with_capacity(128 + self.loads.len() * 24 + entries * ENTRY_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&key.0);
        out.extend_from_slice(&(self.loads.len() as u32).to_le_bytes());
        for &(offset, size, address) in &self.loads {
            for value in [offset, size, address] {
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.tables.len() as u32).to_le_bytes());
        for table in &self.tables {
            out.push(u8::from(table.dynamic));
            out.extend_from_slice(&table.strings_offset.to_le_bytes());
            out.extend_from_slice(&table.strings_size.to_le_bytes());
            out.extend_from_slice(&(table.entries.len() as u32).to_le_bytes());
            for entry in table.entries.iter_from(0) {
                out.extend_from_slice(&entry.value.to_le_bytes());
                out.extend_from_slice(&entry.size.to_le_bytes());
                out.extend_from_slice(&entry.name.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The index in `bytes` if they are a whole file of this format for
    /// `key`, each table sorted by address (its entries copied).
    #[cfg(test)]
    fn decode(bytes: &[u8], key: &Digest) -> Option<Self> {
        Self::decode_in(bytes, key, None)
    }

    /// The index in `bytes` (the bytes of `view`, whose entries it then
    /// reads in place, when given) if they are a whole file of this format
    /// for `key`, each table sorted by address.
    fn decode_in(bytes: &[u8], key: &Digest, view: Option<&Arc<FileView>>) -> Option<Self> {
        let mut fields = Fields::checked(bytes, MAGIC, FORMAT_VERSION)?;
        if fields.take(key.0.len())? != key.0 {
            return None;
        }
        let load_count = fields.u32()? as usize;
        // Counts are checked against what is left before anything is
        // allocated for them.
        if load_count.checked_mul(24)? > fields.rest.len() {
            return None;
        }
        let loads = (0..load_count)
            .map(|_| Some((fields.u64()?, fields.u64()?, fields.u64()?)))
            .collect::<Option<Vec<_>>>()?;
        let table_count = fields.u32()?;
        if table_count != 2 {
            return None;
        }
        let mut tables = Vec::with_capacity(2);
        for _ in 0..table_count {
            let dynamic = fields.u8()? != 0;
            let strings_offset = fields.u64()?;
            let strings_size = fields.u64()?;
            let count = fields.u32()? as usize;
            let start = bytes.len() - fields.rest.len() - 4;
            let raw = fields.take(count.checked_mul(ENTRY_BYTES)?)?;
            let (raw, _) = raw.as_chunks::<ENTRY_BYTES>();
            if raw
                .windows(2)
                .any(|pair| Entry::from_bytes(&pair[0]).value > Entry::from_bytes(&pair[1]).value)
            {
                return None;
            }
            let entries = match view {
                Some(view) => Entries::Stored {
                    view: view.clone(),
                    start,
                    count,
                },
                None => Entries::Built(raw.iter().map(Entry::from_bytes).collect()),
            };
            tables.push(Table {
                dynamic,
                strings_offset,
                strings_size,
                entries,
            });
        }
        fields.rest.is_empty().then_some(Self { loads, tables })
    }
}

/// The symbols of a table that blazesym's address index holds (functions,
/// indirect functions, objects and untyped ones, undefined ones included),
/// in its order: the indices sorted by address, then by size descending,
/// with the standard unstable sort (whose order for equal keys is a
/// function of the input alone). `None` for a size beyond 32 bits.
fn sorted_as_blazesym_sorts(
    symbols: &[elf::Sym64<Endianness>],
    endian: Endianness,
) -> Option<Vec<Entry>> {
    let kept = |symbol: &elf::Sym64<Endianness>| {
        matches!(
            symbol.st_type(),
            elf::STT_FUNC | elf::STT_GNU_IFUNC | elf::STT_NOTYPE | elf::STT_OBJECT
        )
    };
    let mut order: Vec<usize> = symbols
        .iter()
        .enumerate()
        .filter(|(_, symbol)| kept(symbol))
        .map(|(index, _)| index)
        .collect();
    let value = |index: usize| symbols[index].st_value(endian);
    let size = |index: usize| symbols[index].st_size(endian);
    order.sort_unstable_by(|&a, &b| {
        value(a)
            .cmp(&value(b))
            .then_with(|| size(a).cmp(&size(b)).reverse())
    });
    order
        .into_iter()
        .map(|index| {
            let symbol = &symbols[index];
            let name = symbol.st_name(endian);
            if name >= UNDEFINED {
                return None;
            }
            let undefined = symbol.st_shndx(endian) == elf::SHN_UNDEF;
            Some(Entry {
                value: symbol.st_value(endian),
                size: u32::try_from(symbol.st_size(endian)).ok()?,
                name: name | if undefined { UNDEFINED } else { 0 },
            })
        })
        .collect()
}

impl Table {
    /// blazesym's answer: among the symbols at the greatest address at or
    /// below `address`, the first defined one that covers it (a symbol
    /// without a size covers every address from its own in `.symtab`, only
    /// its own in `.dynsym`).
    fn find(&self, address: u64) -> Option<Entry> {
        let entries = &self.entries;
        let after = entries.partition_point(|entry| entry.value < address);
        let at = match entries.get(after) {
            Some(entry) if entry.value == address => after,
            _ => {
                let below = entries.get(after.checked_sub(1)?)?.value;
                entries.partition_point(|entry| entry.value < below)
            }
        };
        entries
            .iter_from(at)
            .take_while(|entry| entry.value <= address)
            .find(|entry| {
                let covers = if entry.size == 0 {
                    !self.dynamic || address == entry.value
                } else {
                    address < entry.value.wrapping_add(u64::from(entry.size))
                };
                entry.name & UNDEFINED == 0 && covers
            })
    }

    /// The name at `offset` of the table's strings, read from `file`.
    fn name(&self, file: &File, offset: u32) -> Option<String> {
        let mut at = u64::from(offset);
        let end = self.strings_size;
        let mut name: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 256];
        while at < end && name.len() <= MAX_NAME_BYTES {
            let want = chunk.len().min((end - at) as usize);
            let read = file
                .read_at(&mut chunk[..want], self.strings_offset.checked_add(at)?)
                .ok()?;
            if read == 0 {
                return None;
            }
            if let Some(nul) = chunk[..read].iter().position(|&byte| byte == 0) {
                name.extend_from_slice(&chunk[..nul]);
                return String::from_utf8(name).ok();
            }
            name.extend_from_slice(&chunk[..read]);
            at += read as u64;
        }
        None
    }
}

/// Where the indexes are kept for later runs: `DIR/xx/rest.symidx`, named
/// by the digest of the file's digest and this ddprof build (whose sort
/// made the order).
#[derive(Debug, Clone)]
pub(super) struct IndexStore {
    dir: CacheDir,
}

impl IndexStore {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir: CacheDir::new(dir),
        }
    }

    fn key(file: &Digest) -> Option<Digest> {
        Some(Digest::of_parts(&[
            b"symbol index",
            own_build_id()?,
            &file.0,
        ]))
    }

    fn place_of(key: &Digest) -> (String, String) {
        let hex = key.hex();
        (hex[..2].to_string(), format!("{}.symidx", &hex[2..]))
    }

    /// The kept index of the file of digest `file`.
    pub(super) fn load(&self, file: &Digest) -> Option<SymbolIndex> {
        let key = Self::key(file)?;
        let (prefix, name) = Self::place_of(&key);
        let view = Arc::new(self.dir.map(&prefix, &name, INDEX_STORE_MAX_BYTES)?);
        let index = SymbolIndex::decode_in(view.bytes(), &key, Some(&view));
        match index {
            Some(_) => self.dir.touch(&prefix, &name),
            None => log::debug!(
                "symbol index: {} is stale or corrupt",
                self.dir.path().join(&prefix).join(&name).display()
            ),
        }
        index
    }

    /// Keeps `index`, built from the file of digest `file`.
    pub(super) fn save(&self, file: &Digest, index: &SymbolIndex) -> std::io::Result<()> {
        let Some(key) = Self::key(file) else {
            return Ok(());
        };
        let (prefix, name) = Self::place_of(&key);
        let bytes = index.encode(&key);
        self.dir
            .write(&prefix, &name, |out| out.write_all(&bytes))?;
        self.dir.trim(
            "symbol index store",
            INDEX_STORE_MAX_BYTES,
            Some((&prefix, &name)),
            None,
        );
        Ok(())
    }
}

/// The indexes of this run, by file digest (`None`: not a file named from
/// its symbol tables alone), within a memory bound.
#[derive(Debug, Default)]
pub(super) struct SymbolIndexes {
    store: Option<IndexStore>,
    known: std::collections::HashMap<Digest, Option<Arc<SymbolIndex>>>,
    bytes: usize,
}

/// Memory the indexes of a run may take; beyond it they are dropped (and
/// read again from the store when needed).
const MAX_INDEX_BYTES: usize = 64 << 20;

impl SymbolIndexes {
    pub(super) fn new(store: Option<PathBuf>) -> Self {
        Self {
            store: store.map(IndexStore::new),
            ..Self::default()
        }
    }

    /// The index of `file` (opened at `path`), from memory, the store, or
    /// built now (and kept); `None` if blazesym must name it.
    pub(super) fn of(&mut self, file: &File, path: &str) -> Option<Arc<SymbolIndex>> {
        let hashed = crate::files::digest::of_file(file).ok()?;
        if let Some(known) = self.known.get(&hashed.digest) {
            return known.clone();
        }
        let stored = self
            .store
            .as_ref()
            .and_then(|store| store.load(&hashed.digest));
        let index = match stored {
            Some(index) => Some(index),
            None => {
                let started = std::time::Instant::now();
                // The file is whatever a target mapped: a parser bug its
                // bytes trigger costs this index, not the profile.
                let built = std::panic::catch_unwind(|| SymbolIndex::build(file))
                    .ok()
                    .flatten();
                if let Some(index) = &built {
                    log::debug!(
                        "symbol index of {path}: {} symbols sorted in {:?}",
                        index.tables.iter().map(|t| t.entries.len()).sum::<usize>(),
                        started.elapsed()
                    );
                    // Kept only if the file is still the bytes hashed.
                    if let (Some(store), true) = (&self.store, hashed.still_matches(file)) {
                        if let Err(error) = store.save(&hashed.digest, index) {
                            log::debug!("symbol index of {path} not kept: {error}");
                        }
                    }
                }
                built
            }
        };
        let index = index.map(Arc::new);
        let bytes = index.as_ref().map_or(0, |index| index.bytes());
        if self.bytes + bytes > MAX_INDEX_BYTES {
            self.known.clear();
            self.bytes = 0;
        }
        self.bytes += bytes;
        self.known.insert(hashed.digest, index.clone());
        index
    }
}

#[cfg(test)]
mod tests;
