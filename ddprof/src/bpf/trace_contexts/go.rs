//! Go programs' pprof labels: where the BPF program finds the labels of
//! the goroutine a thread runs, from the program's Go version.
//!
//! dd-trace-go (and `pprof.Do`) sets a goroutine's labels with
//! `pprof.SetGoroutineLabels`, which stores a pointer to the label map in
//! the runtime's `g.labels`. The thread's running `g` is at a fixed offset
//! from the thread pointer (`-8` in a pure Go program, which sets the
//! thread pointer itself; the `runtime.tlsg` TLS variable of the program's
//! own block in one linked with the C library), and `g.m.curg` is the user
//! goroutine even while the thread runs on its system or signal stack.
//!
//! The offsets of `m`, `curg` and `labels` are the runtime structures'
//! layouts of the releases known here (1.18 to 1.24); a later release's
//! come from its DWARF (`runtime.g`'s and `runtime.m`'s members), read only
//! then, and one built without DWARF is not read. The labels are a map up
//! to Go 1.23, a sorted slice from 1.24 on (or as the DWARF's
//! `runtime/pprof.labelMap` says). A Go before 1.18 is not read (its build
//! information holds no version string to tell the layout by).
use ddprof_common::bpf_maps::{go_labels_layout, GoLabelsSlot};

/// The section a Go linker writes its build information to.
pub const BUILD_INFO_SECTION: &[u8] = b".go.buildinfo";
/// The goroutine pointer's TLS variable in a program linked with the C
/// library (external linking).
pub const TLSG_SYMBOL: &str = "runtime.tlsg";
/// Where a pure Go program keeps the running goroutine: just below the
/// thread pointer (the runtime sets the thread pointer past its `m.tls`).
pub const PURE_GO_G_OFFSET: i64 = -8;

/// The build information's start: magic, pointer size, flags.
const BUILD_INFO_MAGIC: &[u8] = b"\xff Go buildinf:";
/// Flag: the version and module strings follow the header inline (Go
/// 1.18 on), each a varint length and its bytes.
const INLINE_STRINGS: u8 = 2;
const HEADER_BYTES: usize = 32;
/// A version string longer than this is not a Go version.
const MAX_VERSION_BYTES: u64 = 64;
/// A DWARF section bigger than this (uncompressed) is not read: the
/// offsets come from the release's known layout then.
const MAX_DWARF_BYTES: u64 = 64 << 20;

/// Where the runtime's structures keep what the BPF program follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeOffsets {
    /// `runtime.g.m`.
    pub m: u16,
    /// `runtime.m.curg`.
    pub curg: u16,
    /// `runtime.g.labels`.
    pub labels: u16,
    /// How the labels are kept (a [`go_labels_layout`] value), when the
    /// DWARF says (`runtime/pprof.labelMap` a map or a struct).
    pub layout: Option<u16>,
}

/// What ddprof makes of a Go program's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoLabels {
    /// Read at each sample, as the slot says (the version, and whether
    /// the offsets came from the program's DWARF, for the log).
    Read {
        version: String,
        slot: GoLabelsSlot,
        from_dwarf: bool,
    },
    /// Not read: why, for one line at start.
    Unread(String),
}

/// The Go version (`go1.19.8`) of a program's build information (its
/// `.go.buildinfo` section's first bytes); `None` when it is not Go 1.18's
/// or later's inline layout.
pub fn version(build_info: &[u8]) -> Option<String> {
    let rest = build_info.strip_prefix(BUILD_INFO_MAGIC)?;
    let flags = *rest.get(1)?;
    if flags & INLINE_STRINGS == 0 {
        return None;
    }
    let mut at = HEADER_BYTES;
    let mut length = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *build_info.get(at)?;
        at += 1;
        length |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    if length == 0 || length > MAX_VERSION_BYTES {
        return None;
    }
    let bytes = build_info.get(at..at + length as usize)?;
    let version = std::str::from_utf8(bytes).ok()?;
    version.starts_with("go").then(|| version.to_owned())
}

/// The release (`(1, 19)`) of a version string: `go1.19.8`, `go1.21rc2`,
/// `go1.23.0 X:boringcrypto`.
fn release(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix("go")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The runtime's offsets in a Go release known here (x86-64).
fn known_offsets(release: (u32, u32)) -> Option<RuntimeOffsets> {
    let labels = match release {
        (1, 18..=20) => 360,
        (1, 21..=22) => 344,
        (1, 23..=24) => 352,
        _ => return None,
    };
    Some(RuntimeOffsets {
        m: 48,
        curg: 192,
        labels,
        layout: None,
    })
}

/// How a Go release keeps a goroutine's labels: `None` before 1.18.
fn layout(release: (u32, u32)) -> Option<u16> {
    match release {
        (1, 18..=23) => Some(go_labels_layout::MAP),
        (1, 24..) => Some(go_labels_layout::SLICE),
        _ => None,
    }
}

/// The runtime's offsets in a program's DWARF: its `.debug_info` and
/// `.debug_abbrev` sections (`sections` of the ELF file `data`), each
/// uncompressed (zlib or zstd) and at most `MAX_DWARF_BYTES`.
pub fn file_dwarf_offsets<'data, R: object::ReadRef<'data>>(
    sections: &object::read::elf::SectionTable<
        'data,
        object::elf::FileHeader64<object::Endianness>,
        R,
    >,
    endian: object::Endianness,
    data: R,
) -> Option<RuntimeOffsets> {
    use object::read::elf::SectionHeader;
    use object::read::{CompressedData, CompressionFormat};
    let section = |name: &[u8]| -> Option<std::borrow::Cow<'data, [u8]>> {
        let (_, section) = sections.section_by_name(endian, name)?;
        match section.compression(endian, data).ok()? {
            None => {
                if section.sh_size(endian) > MAX_DWARF_BYTES {
                    return None;
                }
                section
                    .data(endian, data)
                    .ok()
                    .map(std::borrow::Cow::Borrowed)
            }
            Some((header, offset, size)) => {
                let uncompressed_size = header.ch_size.get(endian);
                if uncompressed_size > MAX_DWARF_BYTES || size > MAX_DWARF_BYTES {
                    return None;
                }
                let format = match header.ch_type.get(endian) {
                    object::elf::ELFCOMPRESS_ZLIB => CompressionFormat::Zlib,
                    object::elf::ELFCOMPRESS_ZSTD => CompressionFormat::Zstandard,
                    _ => return None,
                };
                let compressed = CompressedData {
                    format,
                    data: data.read_bytes_at(offset, size).ok()?,
                    uncompressed_size,
                };
                compressed.decompress().ok()
            }
        }
    };
    dwarf_offsets(&section(b".debug_info")?, &section(b".debug_abbrev")?)
}

/// The runtime's offsets as a program's DWARF gives them (`runtime.g`'s
/// members `m` and `labels`, `runtime.m`'s `curg`), from its uncompressed
/// `.debug_info` and `.debug_abbrev`; `None` when it has none (or they
/// do not say).
pub fn dwarf_offsets(info: &[u8], abbrev: &[u8]) -> Option<RuntimeOffsets> {
    use gimli::{constants, LittleEndian};
    let info = gimli::DebugInfo::new(info, LittleEndian);
    let abbrev = gimli::DebugAbbrev::new(abbrev, LittleEndian);
    fn name_of<'a>(
        entry: &gimli::DebuggingInformationEntry<gimli::EndianSlice<'a, LittleEndian>>,
    ) -> Option<&'a [u8]> {
        match entry.attr_value(constants::DW_AT_name) {
            Some(gimli::AttributeValue::String(name)) => Some(name.slice()),
            _ => None,
        }
    }
    let (mut m, mut curg, mut labels, mut layout) = (None, None, None, None);
    let mut units = info.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(abbreviations) = header.abbreviations(&abbrev) else {
            continue;
        };
        let Ok(mut tree) = header.entries_tree(&abbreviations, None) else {
            continue;
        };
        let Ok(root) = tree.root() else {
            continue;
        };
        let mut types = root.children();
        while let Ok(Some(node)) = types.next() {
            let entry = node.entry();
            if name_of(entry) == Some(b"runtime/pprof.labelMap") {
                // Up to Go 1.23 a named map type (a typedef of the map);
                // from 1.24 a struct holding the sorted slice.
                layout = layout.or(match entry.tag() {
                    constants::DW_TAG_typedef => Some(go_labels_layout::MAP),
                    constants::DW_TAG_structure_type => Some(go_labels_layout::SLICE),
                    _ => None,
                });
            }
            if entry.tag() != constants::DW_TAG_structure_type {
                continue;
            }
            let structure = match name_of(entry) {
                Some(b"runtime.g") => b'g',
                Some(b"runtime.m") => b'm',
                _ => continue,
            };
            let mut members = node.children();
            while let Ok(Some(member)) = members.next() {
                let entry = member.entry();
                let offset = entry
                    .attr_value(constants::DW_AT_data_member_location)
                    .and_then(|value| value.udata_value())
                    .and_then(|offset| u16::try_from(offset).ok());
                match (structure, name_of(entry)) {
                    (b'g', Some(b"m")) => m = m.or(offset),
                    (b'g', Some(b"labels")) => labels = labels.or(offset),
                    (b'm', Some(b"curg")) => curg = curg.or(offset),
                    _ => {}
                }
            }
            if let (Some(m), Some(curg), Some(labels), Some(layout)) = (m, curg, labels, layout) {
                return Some(RuntimeOffsets {
                    m,
                    curg,
                    labels,
                    layout: Some(layout),
                });
            }
        }
    }
    Some(RuntimeOffsets {
        m: m?,
        curg: curg?,
        labels: labels?,
        layout,
    })
}

/// Whether a Go program of `version` needs its DWARF read for the runtime's
/// offsets: a release from 1.18 on whose layout is not known here (the
/// known ones are not read for: inflating and walking a big program's
/// DWARF costs up to seconds of the worker's CPU).
pub fn needs_dwarf(version: &str) -> bool {
    release(version)
        .is_some_and(|release| layout(release).is_some() && known_offsets(release).is_none())
}

/// What to make of a Go program's labels: its version (from its build
/// information, `None` if unreadable), the runtime's offsets its DWARF
/// gives (if any) and where its running goroutine is from the thread
/// pointer (`None` if unknown).
pub fn labels(
    version: Option<String>,
    dwarf: Option<RuntimeOffsets>,
    g_offset: Option<i64>,
) -> GoLabels {
    let Some(version) = version else {
        return GoLabels::Unread(
            "a Go program before Go 1.18 (or without a readable version)".into(),
        );
    };
    let release = release(&version);
    let Some(layout) = release.and_then(layout) else {
        return GoLabels::Unread(format!(
            "a {version} program, whose labels this ddprof does not read (Go 1.18 on only)"
        ));
    };
    let from_dwarf = dwarf.is_some();
    let Some(offsets) = dwarf.or_else(|| release.and_then(known_offsets)) else {
        return GoLabels::Unread(format!(
            "a {version} program built without DWARF, whose runtime layout this ddprof does \
             not know (it knows Go 1.18 to 1.24's)"
        ));
    };
    let Some(g_offset) = g_offset.filter(|&offset| offset < 0) else {
        return GoLabels::Unread(format!(
            "a {version} program whose goroutine pointer was not found (no runtime.tlsg symbol)"
        ));
    };
    GoLabels::Read {
        version,
        slot: GoLabelsSlot {
            g_offset,
            m: offsets.m,
            curg: offsets.curg,
            labels: offsets.labels,
            layout: offsets.layout.unwrap_or(layout),
        },
        from_dwarf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_info(flags: u8, version: &[u8]) -> Vec<u8> {
        let mut bytes = BUILD_INFO_MAGIC.to_vec();
        bytes.push(8);
        bytes.push(flags);
        bytes.resize(HEADER_BYTES, 0);
        bytes.push(version.len() as u8);
        bytes.extend_from_slice(version);
        bytes.push(0);
        bytes
    }

    #[test]
    fn reads_the_inline_version_string() {
        assert_eq!(
            version(&build_info(2, b"go1.19.8")).as_deref(),
            Some("go1.19.8")
        );
        // Before 1.18: pointers, no inline strings.
        assert_eq!(version(&build_info(0, b"go1.17")), None);
        // Not Go's magic, a cut header, a length past the end, garbage.
        assert_eq!(version(b"\xff Go buildinf"), None);
        let mut cut = build_info(2, b"go1.19.8");
        cut.truncate(HEADER_BYTES + 4);
        assert_eq!(version(&cut), None);
        assert_eq!(version(&build_info(2, b"not-go")), None);
        let mut endless = build_info(2, b"");
        endless.truncate(HEADER_BYTES);
        endless.extend_from_slice(&[0xff; 16]);
        assert_eq!(version(&endless), None);
    }

    #[test]
    fn knows_the_layouts_of_the_releases_it_names() {
        let read = |v: &str, dwarf: Option<RuntimeOffsets>| match labels(
            Some(v.into()),
            dwarf,
            Some(-8),
        ) {
            GoLabels::Read { slot, .. } => Some((slot.labels, slot.layout)),
            GoLabels::Unread(_) => None,
        };
        let (map, slice) = (go_labels_layout::MAP, go_labels_layout::SLICE);
        assert_eq!(read("go1.18", None), Some((360, map)));
        assert_eq!(read("go1.19.8", None), Some((360, map)));
        assert_eq!(read("go1.21rc2", None), Some((344, map)));
        assert_eq!(read("go1.23.4 X:boringcrypto", None), Some((352, map)));
        assert_eq!(read("go1.24.1", None), Some((352, slice)));
        // A later release: only with its DWARF.
        assert_eq!(read("go1.26.0", None), None);
        let dwarf = RuntimeOffsets {
            m: 48,
            curg: 184,
            labels: 344,
            layout: None,
        };
        assert_eq!(read("go1.26.0", Some(dwarf)), Some((344, slice)));
        // The DWARF's layout wins over the release's.
        let map_dwarf = RuntimeOffsets {
            layout: Some(map),
            ..dwarf
        };
        assert_eq!(read("go1.26.0", Some(map_dwarf)), Some((344, map)));
        // Only a release not known here needs its DWARF read.
        assert!(needs_dwarf("go1.26.0") && needs_dwarf("go1.25rc1"));
        assert!(!needs_dwarf("go1.19.8") && !needs_dwarf("go1.24.0"));
        assert!(!needs_dwarf("go1.17") && !needs_dwarf("devel +abc"));
        assert_eq!(read("go1.17", Some(dwarf)), None);
        assert_eq!(read("go2", None), None);
        assert!(matches!(
            labels(Some("go1.19".into()), None, None),
            GoLabels::Unread(_)
        ));
        assert!(matches!(labels(None, None, Some(-8)), GoLabels::Unread(_)));
    }

    /// `.debug_info` and `.debug_abbrev` of one unit holding `structures`:
    /// (name, [(member, offset)]); a name `typedef NAME` is a typedef.
    fn dwarf(structures: &[(&str, &[(&str, u64)])]) -> (Vec<u8>, Vec<u8>) {
        use gimli::write::{AttributeValue, DwarfUnit, EndianVec, Sections};
        let encoding = gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: 4,
            address_size: 8,
        };
        let mut unit = DwarfUnit::new(encoding);
        let root = unit.unit.root();
        for (name, members) in structures {
            let (tag, name) = match name.strip_prefix("typedef ") {
                Some(name) => (gimli::DW_TAG_typedef, name),
                None => (gimli::DW_TAG_structure_type, *name),
            };
            let structure = unit.unit.add(root, tag);
            unit.unit.get_mut(structure).set(
                gimli::DW_AT_name,
                AttributeValue::String(name.as_bytes().to_vec()),
            );
            for (member, offset) in *members {
                let id = unit.unit.add(structure, gimli::DW_TAG_member);
                let entry = unit.unit.get_mut(id);
                entry.set(
                    gimli::DW_AT_name,
                    AttributeValue::String(member.as_bytes().to_vec()),
                );
                entry.set(
                    gimli::DW_AT_data_member_location,
                    AttributeValue::Udata(*offset),
                );
            }
        }
        let mut sections = Sections::new(EndianVec::new(gimli::LittleEndian));
        unit.write(&mut sections).unwrap();
        (
            sections.debug_info.slice().to_vec(),
            sections.debug_abbrev.slice().to_vec(),
        )
    }

    #[test]
    fn finds_the_runtimes_members_in_dwarf() {
        let g: &[(&str, u64)] = &[("stack", 0), ("m", 48), ("sched", 56), ("labels", 344)];
        let m: &[(&str, u64)] = &[("g0", 0), ("curg", 184)];
        let (info, abbrev) = dwarf(&[
            ("runtime.p", &[("m", 8)]),
            ("runtime.g", g),
            ("runtime.m", m),
        ]);
        let found = RuntimeOffsets {
            m: 48,
            curg: 184,
            labels: 344,
            layout: None,
        };
        assert_eq!(dwarf_offsets(&info, &abbrev), Some(found));
        // `runtime/pprof.labelMap`: a struct from Go 1.24 (the slice), a
        // typedef of the map before.
        for (label_map, layout) in [
            ("runtime/pprof.labelMap", go_labels_layout::SLICE),
            ("typedef runtime/pprof.labelMap", go_labels_layout::MAP),
        ] {
            let (info, abbrev) = dwarf(&[("runtime.g", g), (label_map, &[]), ("runtime.m", m)]);
            assert_eq!(
                dwarf_offsets(&info, &abbrev),
                Some(RuntimeOffsets {
                    layout: Some(layout),
                    ..found
                })
            );
        }
        // A member missing (no `labels`: not a runtime that has them), or
        // an offset past 16 bits: nothing.
        let (info, abbrev) = dwarf(&[("runtime.g", &[("m", 48)]), ("runtime.m", m)]);
        assert_eq!(dwarf_offsets(&info, &abbrev), None);
        let far: &[(&str, u64)] = &[("m", 48), ("labels", 1 << 20)];
        let (info, abbrev) = dwarf(&[("runtime.g", far), ("runtime.m", m)]);
        assert_eq!(dwarf_offsets(&info, &abbrev), None);
    }

    #[test]
    fn finds_nothing_in_garbage_dwarf() {
        assert_eq!(dwarf_offsets(&[], &[]), None);
        assert_eq!(dwarf_offsets(&[0xff; 64], &[0x01; 64]), None);
        assert_eq!(dwarf_offsets(&[7, 0, 0, 0, 4, 0], &[]), None);
    }
}
