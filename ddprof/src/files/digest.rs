//! What a file's content is: the SHA-256 of its bytes, the key under which
//! ddprof shares and keeps everything it derives from a file (unwind
//! tables, names, decompressed debug files), in memory and on disk.
//!
//! A GNU build id would be cheaper, but whoever builds a file chooses it:
//! a library built with another's build id (`-Wl,--build-id=0x…`) would
//! get that library's table and names, or give them its own. A digest
//! cannot be chosen, and it also keys files that have no build id (the
//! Rust toolchain's libraries), which were compiled again at every run.
//!
//! Hashing a file costs ~0.5 ms per MiB here, so each digest is
//! remembered by the file's identity as `fstat` tells it — device, inode,
//! size, modification and change times (the change time is set by the
//! kernel at any write, and no user can set it back) — in memory, and on
//! disk in the cache directory ([`DigestMemo`]) for later runs: a run
//! hashes a file only the first time it meets it, or after it changed.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Mutex;

use super::Fields;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({})", self.hex())
    }
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::of_parts(&[bytes])
    }

    /// The digest of the concatenation of `parts`, each preceded by its
    /// length (so that parts cannot be shifted into each other).
    pub fn of_parts(parts: &[&[u8]]) -> Self {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for part in parts {
            context.update(&(part.len() as u64).to_le_bytes());
            context.update(part);
        }
        Self::from_ring(context.finish())
    }

    fn from_ring(digest: ring::digest::Digest) -> Self {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Self(bytes)
    }

    /// Lowercase hex.
    pub fn hex(&self) -> String {
        super::build_id_hex(&self.0)
    }
}

/// What `fstat` says of a file: when all of it is the same, so are its
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StatKey {
    dev: u64,
    inode: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl StatKey {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            dev: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.len(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// Digests remembered in memory at most (beyond it the memo starts over).
const MEMORY_ENTRIES: usize = 1 << 16;

static MEMORY: Mutex<Option<HashMap<StatKey, Digest>>> = Mutex::new(None);

/// A file's digest, and the `fstat` it was taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDigest {
    pub digest: Digest,
    stat: StatKey,
}

impl FileDigest {
    /// Whether `file` is still as it was when hashed. Anything derived
    /// from a file is kept under its digest only if this holds once it is
    /// derived: bytes written meanwhile (which change the change time)
    /// would otherwise be kept under the digest of other bytes.
    pub fn still_matches(&self, file: &File) -> bool {
        file.metadata()
            .is_ok_and(|metadata| StatKey::of(&metadata) == self.stat)
    }
}

/// Where digests are remembered across runs (see [`use_memo`]).
static MEMO: std::sync::OnceLock<DigestMemo> = std::sync::OnceLock::new();

/// Remembers digests in `memo` (the cache directory's), for this process
/// and its workers.
pub fn use_memo(memo: DigestMemo) {
    let _ = MEMO.set(memo);
}

/// The digest of `file`'s bytes, from the memo when the same file (by its
/// `fstat`) was hashed before, in this process or in an earlier run.
pub fn of_file(file: &File) -> std::io::Result<FileDigest> {
    let metadata = file.metadata()?;
    let stat = StatKey::of(&metadata);
    if let Some(remembered) = remembered_for(stat) {
        return Ok(remembered);
    }
    let digest = hash_file(file, metadata.len())?;
    let hashed = FileDigest { digest, stat };
    // A file written while it was read has other bytes than either digest.
    if !hashed.still_matches(file) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "the file changed while it was hashed",
        ));
    }
    remember(stat, digest);
    if let Some(memo) = MEMO.get() {
        memo.put(&stat, digest);
    }
    Ok(hashed)
}

/// The digest of `file`'s bytes if the memo has it, without hashing the
/// file otherwise (a read ahead of need must stay cheap: hashing a 246 MB
/// binary takes ~0.7 s).
pub fn remembered(file: &File) -> Option<FileDigest> {
    remembered_for(StatKey::of(&file.metadata().ok()?))
}

fn remembered_for(stat: StatKey) -> Option<FileDigest> {
    if let Some(digest) = MEMORY
        .lock()
        .ok()
        .and_then(|memory| memory.as_ref()?.get(&stat).copied())
    {
        return Some(FileDigest { digest, stat });
    }
    let digest = MEMO.get()?.get(&stat)?;
    remember(stat, digest);
    Some(FileDigest { digest, stat })
}

fn remember(key: StatKey, digest: Digest) {
    if let Ok(mut memory) = MEMORY.lock() {
        let memory = memory.get_or_insert_with(HashMap::new);
        if memory.len() >= MEMORY_ENTRIES {
            memory.clear();
        }
        memory.insert(key, digest);
    }
}

/// SHA-256 of the first `size` bytes of `file`, read with `pread` (the
/// file's position is left alone), 256 KiB at a time.
fn hash_file(file: &File, size: u64) -> std::io::Result<Digest> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 256 << 10];
    let mut offset = 0u64;
    while offset < size {
        let want = buffer.len().min((size - offset) as usize);
        let read = match file.read_at(&mut buffer[..want], offset) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        context.update(&buffer[..read]);
        offset += read as u64;
    }
    if offset != size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the file is shorter than it says",
        ));
    }
    Ok(Digest::from_ring(context.finish()))
}

/// Digests kept on disk by file identity, for later runs:
/// `DIR/xx/DEV-INODE`, `xx` the inode's low byte. Each entry holds the
/// whole [`StatKey`] it was computed for and is used only when all of it
/// matches; it is written whole or not at all (a fresh file renamed into
/// place) in a directory only ddprof's user can write.
#[derive(Debug, Clone)]
pub struct DigestMemo {
    dir: super::cache_dir::CacheDir,
}

const MAGIC: &[u8; 8] = b"DDPRDIG\0";
const FORMAT_VERSION: u32 = 1;
/// The size of an entry: magic, version, the key, the digest, the CRC.
const ENTRY_BYTES: u64 = 8 + 4 + 8 * 7 + 32 + 4;

impl DigestMemo {
    /// The memo in `dir` (made at its first write).
    pub fn new(dir: std::path::PathBuf) -> Self {
        Self {
            dir: super::cache_dir::CacheDir::new(dir),
        }
    }

    fn place(key: &StatKey) -> (String, String) {
        (
            format!("{:02x}", key.inode & 0xff),
            format!("{:x}-{:x}", key.dev, key.inode),
        )
    }

    fn get(&self, key: &StatKey) -> Option<Digest> {
        let (prefix, name) = Self::place(key);
        let bytes = self.dir.read(&prefix, &name, ENTRY_BYTES)?;
        let mut fields = Fields::checked(&bytes, MAGIC, FORMAT_VERSION)?;
        let stored = StatKey {
            dev: fields.u64()?,
            inode: fields.u64()?,
            size: fields.u64()?,
            mtime: (fields.i64()?, fields.i64()?),
            ctime: (fields.i64()?, fields.i64()?),
        };
        let digest = Digest(fields.array()?);
        (stored == *key && fields.rest.is_empty()).then_some(digest)
    }

    fn put(&self, key: &StatKey, digest: Digest) {
        let (prefix, name) = Self::place(key);
        let mut bytes = Vec::with_capacity(ENTRY_BYTES as usize);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for value in [key.dev, key.inode, key.size] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        for value in [key.mtime.0, key.mtime.1, key.ctime.0, key.ctime.1] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        bytes.extend_from_slice(&digest.0);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        if let Err(error) = self.dir.write(&prefix, &name, |out| out.write_all(&bytes)) {
            log::debug!(
                "digest memo: cannot write {}: {error}",
                self.dir.path().join(&prefix).join(&name).display()
            );
        }
    }

    /// Bounds the memo (entries are 100 bytes: 16 MiB is ~160,000 files),
    /// at most once an hour for all the runs that share it.
    pub fn evict(&self) {
        self.dir.trim(
            "digest memo",
            16 << 20,
            None,
            Some((".evicted", std::time::Duration::from_secs(3600))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_of_the_bytes_and_remembered_by_identity() {
        let dir = std::env::temp_dir().join(format!("ddprof-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let memo = DigestMemo::new(dir.join("memo"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("file");
        std::fs::write(&path, b"abc").unwrap();
        let file = File::open(&path).unwrap();
        let digest = hash_file(&file, 3).unwrap();
        // SHA-256("abc"), FIPS 180-2's first example.
        assert_eq!(
            digest.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Read back from the disk memo (as a later run would).
        let key = StatKey::of(&file.metadata().unwrap());
        memo.put(&key, digest);
        assert_eq!(memo.get(&key), Some(digest));
        let hashed = of_file(&file).unwrap();
        assert_eq!(hashed.digest, digest);
        assert!(hashed.still_matches(&file));
        // A change of content changes the change time, and so the key.
        std::fs::write(&path, b"abd").unwrap();
        assert!(!hashed.still_matches(&file));
        assert_ne!(StatKey::of(&file.metadata().unwrap()), key);
        let changed = of_file(&File::open(&path).unwrap()).unwrap();
        assert_ne!(changed.digest, digest);
        assert_ne!(
            Digest::of_parts(&[b"ab", b"c"]),
            Digest::of_parts(&[b"a", b"bc"])
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
