//! The BTF that types each unwind table's map as the program's `TABLES`
//! template is typed: a 32-bit `int` key and a struct value of one array
//! member.
//!
//! Why: a map is put in an array of maps only if it matches the inner-map
//! template the kernel keeps, and until Linux 6.2 that comparison included
//! the offset of a `bpf_timer` in the value, which is `-ENOENT` for a map
//! whose value is a BTF struct without one (the template aya creates from
//! the program's BTF) but `-EINVAL` for a map created without BTF. So on
//! 5.15-6.1 kernels (Debian 12's, Ubuntu 22.04's) every table map created
//! without BTF was refused (`EINVAL`) and nothing was unwound in the
//! kernel. Typed like the template, the maps match on every kernel.
//!
//! The blob is built here rather than taken from the program's BTF: three
//! types, and no dependency on how the object's BTF numbers them.

/// `BTF_MAGIC`.
const MAGIC: u16 = 0xeb9f;
/// `BTF_KIND_INT`, `BTF_KIND_ARRAY`, `BTF_KIND_STRUCT`.
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
/// The header's size (`struct btf_header`).
const HEADER_LEN: u32 = 24;

/// The key's type id in [`blob`]'s BTF (`int`, 32 bits).
pub const KEY_TYPE_ID: u32 = 1;
/// The value's type id (a struct of `value_size` bytes).
pub const VALUE_TYPE_ID: u32 = 3;

/// The strings: "", "int", "rows".
const STRINGS: &[u8] = b"\0int\0rows\0";
const NAME_INT: u32 = 1;
const NAME_ROWS: u32 = 5;

/// The BTF (for `BPF_BTF_LOAD`) of an `int` key and a value struct of
/// `value_size` bytes (`struct { int rows[value_size / 4]; }`), or `None`
/// when `value_size` is not a whole number of `int`s.
pub fn blob(value_size: u32) -> Option<Vec<u8>> {
    if value_size == 0 || !value_size.is_multiple_of(4) {
        return None;
    }
    let info = |kind: u32, vlen: u32| kind << 24 | vlen;
    let types: [u32; 13] = [
        // [1] int: name, info, size; then bits 32, offset 0, unsigned.
        NAME_INT,
        info(KIND_INT, 0),
        4,
        32,
        // [2] int[value_size / 4]: no name, info, 0; element, index, count.
        0,
        info(KIND_ARRAY, 0),
        0,
        KEY_TYPE_ID,
        KEY_TYPE_ID,
        value_size / 4,
        // [3] struct { rows }: no name, info (one member), size.
        0,
        info(KIND_STRUCT, 1),
        value_size,
    ];
    // Its member: name, type, bit offset.
    let member: [u32; 3] = [NAME_ROWS, 2, 0];
    let type_len = ((types.len() + member.len()) * 4) as u32;
    let mut out = Vec::with_capacity((HEADER_LEN + type_len) as usize + STRINGS.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(1); // version
    out.push(0); // flags
    for field in [HEADER_LEN, 0, type_len, type_len, STRINGS.len() as u32] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    for word in types.iter().chain(&member) {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(STRINGS);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_is_a_header_three_types_and_their_names() {
        let blob = blob(192).unwrap();
        let word = |at: usize| u32::from_le_bytes(blob[at..at + 4].try_into().unwrap());
        assert_eq!(&blob[..4], &[0x9f, 0xeb, 1, 0]);
        assert_eq!(word(4), HEADER_LEN);
        let (type_len, str_off, str_len) = (word(12), word(16), word(20));
        assert_eq!(type_len, 64);
        assert_eq!(str_off, type_len);
        assert_eq!(blob.len() as u32, HEADER_LEN + type_len + str_len);
        // The array's element count and the struct's size.
        assert_eq!(word(24 + 16 + 20), 48);
        assert_eq!(word(24 + 16 + 24 + 8), 192);
        assert_eq!(&blob[blob.len() - 10..], b"\0int\0rows\0");
        assert!(super::blob(190).is_none());
        assert!(super::blob(0).is_none());
    }
}
