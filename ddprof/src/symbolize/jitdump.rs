//! perf's jitdump format (`jit-PID.dump`, as `perf inject --jit` reads
//! it): a header, then records; the code-load records name a function's
//! code (its address, size and name). Pure byte parsing of a file another
//! user's process writes: every size is checked against what is there.

/// "JiTD" as written by a runtime of this machine's byte order.
const MAGIC: u32 = 0x4A69_5444;
/// The header's fixed part: magic, version, total size, ELF machine,
/// padding, pid (u32 each), timestamp, flags (u64 each).
const HEADER_SIZE: usize = 40;
/// Every record starts with its id, its total size (u32 each) and a
/// timestamp (u64).
const PREFIX_SIZE: usize = 16;
/// `JIT_CODE_LOAD`: pid, tid (u32), vma, code address, code size, code
/// index (u64), then the name (NUL-terminated) and the code.
const CODE_LOAD: u32 = 0;
const CODE_LOAD_FIXED: usize = PREFIX_SIZE + 8 + 4 * 8;
/// The largest record read: a function's code rarely passes a few hundred
/// KiB; a size beyond this is a corrupt or hostile file.
pub(super) const MAX_RECORD: usize = 16 << 20;

/// Where the records start, from the file's first bytes (`None`: not a
/// jitdump of this machine's byte order, or too short to say).
pub(super) fn records_start(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < HEADER_SIZE || u32_at(bytes, 0)? != MAGIC {
        return None;
    }
    let total = u32_at(bytes, 8)? as usize;
    (total >= HEADER_SIZE).then_some(total as u64)
}

/// What one pass over whole records found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Records<'a> {
    /// (code address, code size, name) of each code-load record.
    pub loads: Vec<(u64, u64, &'a str)>,
    /// Bytes of whole records read (the rest waits for more bytes).
    pub consumed: usize,
    /// A record said a size it cannot have: stop reading the file.
    pub corrupt: bool,
}

/// The records wholly in `bytes` (which start at a record).
pub(super) fn records(bytes: &[u8]) -> Records<'_> {
    let mut found = Records::default();
    let mut at = 0;
    while let (Some(id), Some(size)) = (u32_at(bytes, at), u32_at(bytes, at + 4)) {
        let size = size as usize;
        if !(PREFIX_SIZE..=MAX_RECORD).contains(&size) {
            found.corrupt = true;
            break;
        }
        let Some(record) = bytes.get(at..at + size) else {
            break; // Not all there yet.
        };
        if id == CODE_LOAD {
            if let Some(load) = code_load(record) {
                found.loads.push(load);
            }
        }
        at += size;
        found.consumed = at;
    }
    found
}

fn code_load(record: &[u8]) -> Option<(u64, u64, &str)> {
    let address = u64_at(record, PREFIX_SIZE + 16)?;
    let size = u64_at(record, PREFIX_SIZE + 24)?;
    let name = record.get(CODE_LOAD_FIXED..)?;
    let name = &name[..name.iter().position(|&b| b == 0)?];
    let name = std::str::from_utf8(name).ok()?;
    (!name.is_empty() && size > 0).then_some((address, size, name))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// A jitdump's bytes, for tests: a header and code-load records of
/// `functions` (address, size, name), each with `size` bytes of code.
#[cfg(test)]
pub(super) fn write(functions: &[(u64, u64, &str)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for value in [MAGIC, 1, HEADER_SIZE as u32, 62, 0, 42] {
        bytes.extend_from_slice(&value.to_ne_bytes());
    }
    bytes.extend_from_slice(&[0; 16]);
    for (index, (address, size, name)) in functions.iter().enumerate() {
        let total = CODE_LOAD_FIXED + name.len() + 1 + *size as usize;
        bytes.extend_from_slice(&CODE_LOAD.to_ne_bytes());
        bytes.extend_from_slice(&(total as u32).to_ne_bytes());
        bytes.extend_from_slice(&0u64.to_ne_bytes());
        bytes.extend_from_slice(&42u32.to_ne_bytes());
        bytes.extend_from_slice(&42u32.to_ne_bytes());
        for value in [*address, *address, *size, index as u64] {
            bytes.extend_from_slice(&value.to_ne_bytes());
        }
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend(std::iter::repeat_n(0xccu8, *size as usize));
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_code_loads_and_waits_for_a_record_not_all_there() {
        let bytes = write(&[(0x1000, 0x20, "JS:*hot"), (0x2000, 0x10, "JS:cold")]);
        let start = records_start(&bytes).unwrap() as usize;
        assert_eq!(start, HEADER_SIZE);
        let whole = records(&bytes[start..]);
        assert_eq!(
            whole.loads,
            [(0x1000, 0x20, "JS:*hot"), (0x2000, 0x10, "JS:cold")]
        );
        assert_eq!(whole.consumed, bytes.len() - start);
        // Cut in the second record: the first only, and where to go on.
        let cut = records(&bytes[start..bytes.len() - 3]);
        assert_eq!(cut.loads, [(0x1000, 0x20, "JS:*hot")]);
        assert!(!cut.corrupt);
        let rest = records(&bytes[start + cut.consumed..]);
        assert_eq!(rest.loads, [(0x2000, 0x10, "JS:cold")]);
    }

    #[test]
    fn hostile_sizes_and_headers_are_refused_not_trusted() {
        assert_eq!(
            records_start(b"not a jitdump at all, not at all, no no"),
            None
        );
        assert_eq!(records_start(&write(&[])[..20]), None);
        let mut bytes = write(&[(0x1000, 0x20, "f")]);
        // A record that says it is 8 bytes long (shorter than its prefix).
        bytes[HEADER_SIZE + 4..HEADER_SIZE + 8].copy_from_slice(&8u32.to_ne_bytes());
        let found = records(&bytes[HEADER_SIZE..]);
        assert!(found.corrupt && found.loads.is_empty());
        // A name without its NUL: no load taken, and no read past the record.
        let mut bytes = write(&[(0x1000, 0, "f")]);
        bytes.truncate(bytes.len() - 1);
        let size = (bytes.len() - HEADER_SIZE) as u32;
        bytes[HEADER_SIZE + 4..HEADER_SIZE + 8].copy_from_slice(&size.to_ne_bytes());
        assert!(records(&bytes[HEADER_SIZE..]).loads.is_empty());
    }
}
