//! Where a field lies in one of the kernel's structures, from the kernel's
//! own type information (BTF, `/sys/kernel/btf/vmlinux`), for a BPF program
//! that reads it: aya's programs cannot ask the loader to relocate a field
//! access (libbpf's CO-RE), so the loader looks the offset up here and
//! hands it to the program as a constant (`TASK_PID_OFFSET`: a thread's id
//! in its `task_struct`, which `sWALL` reads for the thread that switches
//! in).
//!
//! The file is the kernel's, but is read as any input: every length and
//! index is checked, and a type section that does not parse ends the
//! search with an error, never a panic.
use std::io::Read;

/// The kernel's BTF.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// The most read of it (a distribution kernel's is 5-7 MiB).
const MAX_BTF_BYTES: u64 = 64 << 20;

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum KernelBtfError {
    #[error("cannot read {VMLINUX_BTF}: {0}")]
    Read(String),
    #[error("{VMLINUX_BTF} is not BTF this ddprof reads ({0})")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no `struct {0}` with a member `{1}`")]
    NotFound(String, String),
}

/// The byte offset of `structure.member` in the running kernel.
pub fn kernel_member_offset(structure: &str, member: &str) -> Result<u32, KernelBtfError> {
    member_offset(&vmlinux_btf()?, structure, member)
}

/// The running kernel's BTF, at most [`MAX_BTF_BYTES`] of it.
fn vmlinux_btf() -> Result<Vec<u8>, KernelBtfError> {
    let file = std::fs::File::open(VMLINUX_BTF)
        .map_err(|error| KernelBtfError::Read(error.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_BTF_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|error| KernelBtfError::Read(error.to_string()))?;
    Ok(bytes)
}

/// The offset of a thread's id (`pid`) in the running kernel's
/// `task_struct`, checked: `tgid` must follow it, as in every kernel (a
/// misread offset would end no wait at all).
pub fn task_pid_offset() -> Result<u32, KernelBtfError> {
    let pid = kernel_member_offset("task_struct", "pid")?;
    let tgid = kernel_member_offset("task_struct", "tgid")?;
    if tgid != pid + 4 {
        return Err(KernelBtfError::Malformed(
            "task_struct's tgid does not follow its pid",
        ));
    }
    Ok(pid)
}

/// The offset of a thread's thread pointer (x86-64 `fsbase`, where its TLS
/// ends and glibc's thread control block starts) in the running kernel's
/// `task_struct`: `thread.fsbase`. The BTF is read once for both members.
pub fn task_fsbase_offset() -> Result<u32, KernelBtfError> {
    let bytes = vmlinux_btf()?;
    let thread = member_offset(&bytes, "task_struct", "thread")?;
    let fsbase = member_offset(&bytes, "thread_struct", "fsbase")?;
    thread
        .checked_add(fsbase)
        .filter(|&offset| offset != 0)
        .ok_or(KernelBtfError::Malformed(
            "task_struct's thread.fsbase is out of range",
        ))
}

/// One type of the section: its kind, name, size-or-type word, and the
/// trailing records (members, for a structure).
#[derive(Debug, Clone, Copy)]
struct Type<'a> {
    kind: u32,
    name: u32,
    kind_flag: bool,
    size_or_type: u32,
    /// A structure's or a union's members, 12 bytes each.
    members: &'a [u8],
}

/// The byte offset of `member` in `struct structure`, in the BTF `bytes`,
/// looking into the anonymous structures and unions it holds.
pub fn member_offset(bytes: &[u8], structure: &str, member: &str) -> Result<u32, KernelBtfError> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let magic = bytes.get(0..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    if magic != Some(MAGIC) {
        return Err(KernelBtfError::Malformed("no little-endian BTF magic"));
    }
    let header = (|| Some((word(4)?, word(8)?, word(12)?, word(16)?, word(20)?)))()
        .ok_or(KernelBtfError::Malformed("a short header"))?;
    let (header_len, type_off, type_len, str_off, str_len) = header;
    let section = |offset: u32, len: u32| -> Option<&[u8]> {
        let start = (header_len as usize).checked_add(offset as usize)?;
        bytes.get(start..start.checked_add(len as usize)?)
    };
    let types =
        section(type_off, type_len).ok_or(KernelBtfError::Malformed("types out of bounds"))?;
    let strings =
        section(str_off, str_len).ok_or(KernelBtfError::Malformed("strings out of bounds"))?;
    let name_at = |offset: u32| -> &[u8] {
        let rest = strings.get(offset as usize..).unwrap_or(&[]);
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let parsed = parse_types(types)?;
    let not_found = || KernelBtfError::NotFound(structure.into(), member.into());
    let target = parsed
        .iter()
        .find(|t| t.kind == KIND_STRUCT && name_at(t.name) == structure.as_bytes())
        .ok_or_else(not_found)?;
    find_member(&parsed, target, member.as_bytes(), &name_at, 0)
        .map(|bits| bits / 8)
        .ok_or_else(not_found)
}

/// The types of a BTF type section, type id 1 first (index 0).
fn parse_types(types: &[u8]) -> Result<Vec<Type<'_>>, KernelBtfError> {
    let mut parsed = Vec::new();
    let mut at = 0usize;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(types.get(at..at + 4)?.try_into().ok()?))
    };
    while at < types.len() {
        let (Some(name), Some(info), Some(size_or_type)) = (word(at), word(at + 4), word(at + 8))
        else {
            return Err(KernelBtfError::Malformed("a truncated type"));
        };
        at += 12;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let trailing = match kind {
            KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
            KIND_ARRAY => 12,
            KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
            KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
            KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
            | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
            // A kind after these: its trailing data cannot be skipped.
            _ => {
                return Err(KernelBtfError::Malformed(
                    "a kind this reader does not know",
                ))
            }
        };
        let members = types
            .get(at..at + trailing)
            .ok_or(KernelBtfError::Malformed("a truncated type"))?;
        at += trailing;
        parsed.push(Type {
            kind,
            name,
            kind_flag: info >> 31 == 1,
            size_or_type,
            members: if matches!(kind, KIND_STRUCT | KIND_UNION) {
                members
            } else {
                &[]
            },
        });
    }
    Ok(parsed)
}

/// The bit offset of `member` in `structure` (plus `base`), looking into
/// anonymous members; `None` if it has none of that name. Depth-bounded:
/// a type that contains itself is malformed.
fn find_member<'s>(
    types: &[Type<'_>],
    structure: &Type<'_>,
    member: &[u8],
    name_at: &dyn Fn(u32) -> &'s [u8],
    depth: u32,
) -> Option<u32> {
    if depth > 8 {
        return None;
    }
    for record in structure.members.chunks_exact(12) {
        let word = |i: usize| u32::from_le_bytes(record[i..i + 4].try_into().expect("4 bytes"));
        let (name, type_id, offset) = (word(0), word(4), word(8));
        // With the kind flag, the high byte is a bitfield's size.
        let bits = if structure.kind_flag {
            offset & 0x00ff_ffff
        } else {
            offset
        };
        if name != 0 {
            if name_at(name) == member {
                return Some(bits);
            }
            continue;
        }
        // An anonymous structure or union: its members are this one's.
        let inner = resolve(types, type_id)?;
        if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
            if let Some(found) = find_member(types, inner, member, name_at, depth + 1) {
                return bits.checked_add(found);
            }
        }
    }
    None
}

/// The type `id` names, through typedefs and qualifiers.
fn resolve<'t, 'a>(types: &'t [Type<'a>], mut id: u32) -> Option<&'t Type<'a>> {
    for _ in 0..16 {
        let found = types.get(id.checked_sub(1)? as usize)?;
        match found.kind {
            KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                id = found.size_or_type
            }
            _ => return Some(found),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `struct outer { int a; union { int b; struct { int
    /// c; int d; }; }; }`, with `d` at byte 8.
    fn blob() -> Vec<u8> {
        let strings = b"\0outer\0a\0b\0c\0d\0int\0";
        let name = |s: &str| {
            let at = strings
                .windows(s.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=s.len()] == s.as_bytes() && w[s.len() + 1] == 0)
                .unwrap();
            (at + 1) as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend(w.to_le_bytes()));
        // 1: int
        push(&[name("int"), KIND_INT << 24, 4, 32]);
        // 2: struct { int c; int d; }
        push(&[0, KIND_STRUCT << 24 | 2, 8]);
        push(&[name("c"), 1, 0, name("d"), 1, 32]);
        // 3: union { int b; struct 2; }
        push(&[0, KIND_UNION << 24 | 2, 8]);
        push(&[name("b"), 1, 0, 0, 2, 0]);
        // 4: typedef of 3
        push(&[0, KIND_TYPEDEF << 24, 3]);
        // 5: struct outer { int a; <anonymous 4> at 32 bits; }
        push(&[name("outer"), KIND_STRUCT << 24 | 2, 12]);
        push(&[name("a"), 1, 0, 0, 4, 32]);
        let mut bytes = Vec::new();
        bytes.extend(MAGIC.to_le_bytes());
        bytes.extend([1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            bytes.extend(word.to_le_bytes());
        }
        bytes.extend(&types);
        bytes.extend(strings);
        bytes
    }

    #[test]
    fn a_member_is_found_through_anonymous_unions_and_structures() {
        let bytes = blob();
        assert_eq!(member_offset(&bytes, "outer", "a"), Ok(0));
        assert_eq!(member_offset(&bytes, "outer", "b"), Ok(4));
        assert_eq!(member_offset(&bytes, "outer", "d"), Ok(8));
        assert!(matches!(
            member_offset(&bytes, "outer", "e"),
            Err(KernelBtfError::NotFound(..))
        ));
    }

    #[test]
    fn bytes_that_are_not_btf_are_refused_without_a_panic() {
        let bytes = blob();
        for cut in 0..bytes.len() {
            let _ = member_offset(&bytes[..cut], "outer", "d");
        }
        assert!(member_offset(b"not btf", "outer", "d").is_err());
        let mut lying = bytes.clone();
        // The types' length past the end.
        lying[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            member_offset(&lying, "outer", "d"),
            Err(KernelBtfError::Malformed(_))
        ));
    }

    /// The running kernel's `task_struct`: `tgid` follows `pid` in every
    /// kernel (both `pid_t`), a check that the offsets are the kernel's.
    #[test]
    fn the_kernels_task_struct_has_its_thread_id_before_its_process_id() {
        let pid = kernel_member_offset("task_struct", "pid").unwrap();
        let tgid = kernel_member_offset("task_struct", "tgid").unwrap();
        assert_eq!(tgid, pid + 4);
        assert!(pid > 0 && pid < 16384, "{pid}");
        assert_eq!(task_pid_offset(), Ok(pid));
    }
}
