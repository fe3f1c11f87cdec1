//! Compiles an ELF file's call frame information (`.eh_frame`, and
//! `.debug_frame` from the file or its split debug file) into a sorted
//! table of [`UnwindRow`]s, the format both unwinders walk.
//!
//! Each FDE's CFI program is evaluated with gimli into one row per address
//! range; consecutive rows with the same rule are merged. Rules the row
//! format cannot express become [`RowKind::Unsupported`] rows (the unwinder
//! then tries frame pointers); code not covered by any FDE gets a
//! [`RowKind::NoInfo`] row, except PLT stubs, whose rules are read from
//! their code when the linker gave them no CFI (see [`super::plt`]).
//!
//! An arm64 file's rows follow that architecture's conventions (see
//! `ddprof_common::unwind`): a CFA on SP or X29, the caller's X29 and the
//! return address X30 saved in the frame or (X30) not yet saved.
use crate::files::cache_dir::FileView;
use crate::files::elf_headers::{ElfHeaders, Segment};
use ddprof_common::unwind::{
    rows_from_bytes, Isa, RowKind, UnwindRow, DEFAULT_RA_OFFSET_BY_8, DWARF_RBP, DWARF_RSP,
    GPR_COUNT, RBX_UNKNOWN, ROW_SIZE,
};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Operation,
    Reader, RegisterRule, UnwindContext, UnwindExpression, UnwindSection, UnwindTableRow, Vendor,
    X86_64,
};
use object::read::elf::ElfFile64;
use object::{Object, ObjectSection, ReadRef};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The smallest page size: segment file offsets are mapped from a multiple of it.
const PAGE_SIZE: u64 = 4096;

/// Why a file got no table.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("not a 64-bit little-endian ELF file: {0}")]
    NotElf(#[from] object::Error),
    #[error("not a 64-bit ELF file whose headers can be read")]
    NoElfHeaders,
    #[error("the file has neither .eh_frame nor .debug_frame (frame pointers will be used)")]
    NoCfi,
    #[error("the file has no executable PT_LOAD segment")]
    NoExecutableSegment,
    #[error("the file's call frame information could not be read (corrupt file?)")]
    Corrupt,
    #[error("the file's code is for another architecture ({0:?}) than x86-64 or arm64")]
    ForeignArchitecture(object::Architecture),
}

/// The conventions of a file's code, from its ELF header.
pub fn isa_of<'d>(file: &impl Object<'d>) -> Result<Isa, CompileError> {
    match file.architecture() {
        object::Architecture::X86_64 => Ok(Isa::X86_64),
        object::Architecture::Aarch64 => Ok(Isa::Aarch64),
        other => Err(CompileError::ForeignArchitecture(other)),
    }
}

/// A `PT_LOAD` segment that holds code: how file offsets map to the ELF
/// virtual addresses the rows use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
}

impl LoadSegment {
    /// The constant to subtract from a PC in a mapping (which starts at
    /// `mapping_start`, at offset `mapping_file_offset` of the file) to get
    /// the ELF virtual address, given the file's executable segments:
    /// `None` when none of them holds that file offset.
    pub fn bias_for_mapping(
        segments: &[LoadSegment],
        mapping_start: u64,
        mapping_file_offset: u64,
    ) -> Option<u64> {
        // The kernel maps whole pages: a segment whose p_offset is not page
        // aligned (lld packs segments without padding) is mapped from the
        // page that holds its first byte, so the mapping's offset is below
        // p_offset.
        let segment = segments.iter().find(|s| {
            mapping_file_offset >= s.file_offset & !(PAGE_SIZE - 1)
                && mapping_file_offset < s.file_offset.saturating_add(s.file_size.max(1))
        })?;
        // vaddr = pc - mapping_start + mapping_file_offset - p_offset + p_vaddr
        Some(
            mapping_start
                .wrapping_sub(mapping_file_offset)
                .wrapping_add(segment.file_offset)
                .wrapping_sub(segment.vaddr),
        )
    }
}

/// Counters of what the compiler saw, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// FDEs turned into rows.
    pub fdes: u64,
    /// FDEs dropped: unparsable, empty, overlapping an earlier one, or
    /// with code above 4 GiB.
    pub skipped_fdes: u64,
    /// FDEs whose CFI program failed to evaluate (covered by one
    /// `Unsupported` row).
    pub failed_fdes: u64,
    /// Rows of kind `Unsupported` in the final table.
    pub unsupported_rows: u64,
    /// PLT stubs without CFI whose rule was read from their code.
    pub plt_stubs: u64,
}

/// The rows of a table: compiled here, or a view of the table store's
/// file (read from the page cache in place: copied into fresh memory, the
/// 2.4 M rows of a 246 MB static binary cost 150-500 ms of page faults on a
/// VM, more than the rest of the table's load).
#[derive(Clone)]
pub enum Rows {
    Compiled(Vec<UnwindRow>),
    Stored(StoredRows),
}

/// Rows in a mapped store file: `count` of them at byte `start`, checked
/// when mapped (aligned, sorted, under the file's CRC).
#[derive(Clone)]
pub struct StoredRows {
    view: std::sync::Arc<FileView>,
    start: usize,
    count: usize,
}

impl StoredRows {
    /// The `count` rows at byte `start` of `view`, if they are there and
    /// aligned.
    pub fn new(view: std::sync::Arc<FileView>, start: usize, count: usize) -> Option<Self> {
        let end = count.checked_mul(ROW_SIZE)?.checked_add(start)?;
        rows_from_bytes(view.bytes().get(start..end)?)?;
        Some(Self { view, start, count })
    }
}

impl std::ops::Deref for Rows {
    type Target = [UnwindRow];

    fn deref(&self) -> &[UnwindRow] {
        match self {
            Rows::Compiled(rows) => rows,
            Rows::Stored(stored) => stored
                .view
                .bytes()
                .get(stored.start..stored.start + stored.count * ROW_SIZE)
                .and_then(rows_from_bytes)
                // Checked in `StoredRows::new`, and the view never changes.
                .unwrap_or_default(),
        }
    }
}

impl Default for Rows {
    fn default() -> Self {
        Rows::Compiled(Vec::new())
    }
}

impl From<Vec<UnwindRow>> for Rows {
    fn from(rows: Vec<UnwindRow>) -> Self {
        Rows::Compiled(rows)
    }
}

impl PartialEq for Rows {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Rows::Compiled(_) => "compiled",
            Rows::Stored(_) => "stored",
        };
        write!(f, "Rows({} {kind})", self.len())
    }
}

/// The unwind table of one ELF file, shared by every process that maps it.
#[derive(Debug, Clone, Default)]
pub struct UnwindTable {
    /// Sorted by `start` (ELF virtual addresses), non-empty ranges.
    pub rows: Rows,
    /// Executable `PT_LOAD` segments.
    pub segments: Vec<LoadSegment>,
    pub stats: CompileStats,
}

impl UnwindTable {
    /// Bytes this table takes (rows as stored in a BPF map, plus segments).
    pub fn size_bytes(&self) -> usize {
        self.rows.len() * ROW_SIZE + self.segments.len() * std::mem::size_of::<LoadSegment>()
    }

    /// The constant to subtract from a PC in a mapping of this file (which
    /// starts at `mapping_start`, at offset `mapping_file_offset` of the
    /// file) to get the ELF virtual address: `None` when no executable
    /// segment holds that file offset.
    pub fn bias_for_mapping(&self, mapping_start: u64, mapping_file_offset: u64) -> Option<u64> {
        LoadSegment::bias_for_mapping(&self.segments, mapping_start, mapping_file_offset)
    }

    /// The row covering ELF virtual address `vaddr`.
    pub fn row_for(&self, vaddr: u64) -> Option<&UnwindRow> {
        let vaddr = u32::try_from(vaddr).ok()?;
        ddprof_common::unwind::find_row(&self.rows, vaddr)
    }
}

/// Compiles the table of an ELF file. `debug_file` is its split debug file
/// (for `.debug_frame`), when one was found.
pub fn compile_elf<'d, R: ReadRef<'d>>(
    data: R,
    debug_file: Option<R>,
) -> Result<UnwindTable, CompileError> {
    let file = ElfFile64::<object::Endianness, R>::parse(data)?;
    let isa = isa_of(&file)?;
    let segments = ElfHeaders::parse(data)
        .map(|headers| executable_segments(&headers.segments))
        .unwrap_or_default();
    if segments.is_empty() {
        return Err(CompileError::NoExecutableSegment);
    }

    let section_address = |name: &str| file.section_by_name(name).map(|s| s.address());
    let mut bases = BaseAddresses::default();
    if let Some(text) = section_address(".text") {
        bases = bases.set_text(text);
    }
    if let Some(got) = section_address(".got") {
        bases = bases.set_got(got);
    }

    let mut fdes = Vec::new();
    let mut stats = CompileStats::default();
    let mut found_cfi = false;
    if let Some(section) = file.section_by_name(".eh_frame") {
        let data = section.uncompressed_data().unwrap_or_default();
        if !data.is_empty() {
            found_cfi = true;
            let eh_bases = bases.clone().set_eh_frame(section.address());
            let mut eh_frame = EhFrame::new(&data, LittleEndian);
            if isa == Isa::Aarch64 {
                // `DW_CFA_AARCH64_negate_ra_state` (pointer authentication)
                // shares its opcode with SPARC's `DW_CFA_GNU_window_save`.
                eh_frame.set_vendor(Vendor::AArch64);
            }
            collect_fdes(isa, &eh_frame, &eh_bases, &mut fdes, &mut stats);
        }
    }
    // .debug_frame adds FDEs for code .eh_frame does not cover (overlapping
    // FDEs are dropped in favour of .eh_frame's, which sort first).
    // A debug file from another build (stale debuglink) would describe
    // other code: when both carry a build id they must match.
    let own_build_id = file.build_id().ok().flatten();
    let debug = debug_file
        .and_then(|d| ElfFile64::<object::Endianness, R>::parse(d).ok())
        .filter(
            |debug| match (own_build_id, debug.build_id().ok().flatten()) {
                (Some(own), Some(theirs)) => own == theirs,
                _ => true,
            },
        );
    for source in [Some(&file), debug.as_ref()].into_iter().flatten() {
        let Some(section) = source.section_by_name(".debug_frame") else {
            continue;
        };
        let data = section.uncompressed_data().unwrap_or_default();
        if data.is_empty() {
            continue;
        }
        found_cfi = true;
        let mut debug_frame = DebugFrame::new(&data, LittleEndian);
        debug_frame.set_address_size(8);
        if isa == Isa::Aarch64 {
            debug_frame.set_vendor(Vendor::AArch64);
        }
        collect_fdes(isa, &debug_frame, &bases, &mut fdes, &mut stats);
    }
    if !found_cfi {
        return Err(CompileError::NoCfi);
    }
    let (plt_rows, plt_stubs) = match isa {
        Isa::X86_64 => super::plt::uncovered_plt_rows(&file, &fdes),
        Isa::Aarch64 => super::aarch64::plt_rows(&file),
    };
    stats.plt_stubs = plt_stubs;
    fdes.extend(plt_rows);
    let rows = assemble_rows(fdes, &mut stats);
    Ok(UnwindTable {
        rows: rows.into(),
        segments,
        stats,
    })
}

/// The executable ones of a file's `PT_LOAD` `segments`, as a table keeps
/// them (and as a stored table is checked against its file).
pub fn executable_segments(segments: &[Segment]) -> Vec<LoadSegment> {
    segments
        .iter()
        .filter(|segment| segment.executable)
        .map(|segment| LoadSegment {
            file_offset: segment.file_offset,
            vaddr: segment.vaddr,
            file_size: segment.file_size,
        })
        .collect()
}

/// The rows of one FDE: `(address, row)` pairs, addresses ascending, all in
/// `start..end`.
#[derive(Debug)]
pub(crate) struct FdeRows {
    pub start: u64,
    pub end: u64,
    pub rows: Vec<(u64, UnwindRow)>,
}

/// Evaluates every FDE of a `.eh_frame` or `.debug_frame` section of a
/// file of `isa`.
pub(crate) fn collect_fdes<'a, S>(
    isa: Isa,
    section: &S,
    bases: &BaseAddresses,
    out: &mut Vec<FdeRows>,
    stats: &mut CompileStats,
) where
    S: UnwindSection<Slice<'a>>,
{
    let mut context = UnwindContext::new();
    let mut entries = section.entries(bases);
    // A malformed entry length makes the rest of the section unreadable.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            stats.skipped_fdes += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start >= end {
            stats.skipped_fdes += 1;
            continue;
        }
        let encoding = fde.cie().encoding();
        let mut rows = Vec::new();
        let evaluated = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, &mut context)?;
            while let Some(row) = table.next_row()? {
                if row.start_address() >= row.end_address() {
                    continue;
                }
                let address = row.start_address().max(start);
                // A CFI program that moves backwards or past its FDE's end
                // (`DW_CFA_set_loc`, wrapping advances) is corrupt: its rows
                // would unsort the table, and a binary search in it would
                // find other functions' rules.
                let backwards = rows.last().is_some_and(|&(last, _)| address <= last);
                if backwards || address >= end {
                    return Err(gimli::Error::AddressOverflow);
                }
                let converted = match isa {
                    Isa::X86_64 => convert_row(row, section, encoding),
                    Isa::Aarch64 => super::aarch64::convert_row(row),
                };
                rows.push((address, converted));
            }
            Ok(())
        })();
        if evaluated.is_err() || rows.is_empty() {
            stats.failed_fdes += 1;
            rows = vec![(start, UnwindRow::with_kind(0, RowKind::Unsupported))];
        }
        out.push(FdeRows { start, end, rows });
    }
}

/// Sorts FDEs, drops overlapping ones, fills gaps with `NoInfo` rows and
/// merges consecutive rows with the same rule.
pub(crate) fn assemble_rows(mut fdes: Vec<FdeRows>, stats: &mut CompileStats) -> Vec<UnwindRow> {
    // Stable: among FDEs with the same start, the first collected wins.
    fdes.sort_by_key(|f| f.start);
    let mut rows: Vec<UnwindRow> = Vec::new();
    let mut covered_end: Option<u64> = None;
    let push = |rows: &mut Vec<UnwindRow>, start: u32, row: UnwindRow| {
        let row = UnwindRow { start, ..row };
        match rows.last_mut() {
            Some(last) if last.start == start => *last = row,
            Some(last) if last.same_rule(&row) => {}
            _ => rows.push(row),
        }
    };
    for fde in fdes {
        let fits = fde.end <= u64::from(u32::MAX);
        let overlaps = covered_end.is_some_and(|end| fde.start < end);
        if !fits || overlaps {
            stats.skipped_fdes += 1;
            continue;
        }
        if let Some(end) = covered_end {
            if fde.start - end >= MIN_GAP_WITHOUT_INFO {
                push(
                    &mut rows,
                    end as u32,
                    UnwindRow::with_kind(0, RowKind::NoInfo),
                );
            }
        }
        for (address, row) in fde.rows {
            push(&mut rows, address as u32, row);
        }
        covered_end = Some(fde.end);
        stats.fdes += 1;
    }
    if let Some(end) = covered_end {
        push(
            &mut rows,
            end as u32,
            UnwindRow::with_kind(0, RowKind::NoInfo),
        );
    }
    // The merge above may have left two equal rules next to each other
    // after a replacement; one more pass keeps the table minimal.
    rows.dedup_by(|next, prev| prev.same_rule(next));
    stats.unsupported_rows = rows
        .iter()
        .filter(|r| r.row_kind() == RowKind::Unsupported)
        .count() as u64;
    rows
}

/// Smaller gaps between FDEs are alignment padding between functions
/// (never executed, and never a call site), so the previous row simply
/// extends over them: about 10 % fewer rows in big C++ libraries.
const MIN_GAP_WITHOUT_INFO: u64 = 16;

pub(super) const UNSUPPORTED: UnwindRow = UnwindRow::with_kind(0, RowKind::Unsupported);

/// At most this many operations in an expression we try to recognize.
const MAX_EXPRESSION_OPS: usize = 12;

fn expression_ops<'a, S: UnwindSection<Slice<'a>>>(
    expression: &UnwindExpression<usize>,
    section: &S,
    encoding: gimli::Encoding,
) -> Option<Vec<Operation<Slice<'a>>>> {
    let expression = expression.get(section).ok()?;
    let mut operations = expression.operations(encoding);
    let mut ops = Vec::new();
    while let Some(op) = operations.next().ok()? {
        if ops.len() == MAX_EXPRESSION_OPS {
            return None;
        }
        ops.push(op);
    }
    Some(ops)
}

/// The DWARF number of a general-purpose register (the rows' 4-bit field).
fn general_register(register: gimli::Register) -> Option<u8> {
    u8::try_from(register.0)
        .ok()
        .filter(|&n| usize::from(n) < GPR_COUNT)
}

/// A general-purpose register other than RSP and RBP. A rule for any of
/// them (RBX too, which the row restores besides) marks a function that
/// may change the caller-saved ones: only RBX is known past it.
fn is_other_register(register: gimli::Register) -> bool {
    general_register(register).is_some_and(|n| n != DWARF_RSP && n != DWARF_RBP)
}

/// The row's byte for the caller's RBX ([`UnwindRow::with_saved_rbx_by_8`]):
/// 0 when unchanged, its slot when saved at a multiple of 8 from the CFA
/// within reach, [`RBX_UNKNOWN`] for any other rule.
fn saved_rbx_by_8(rule: Option<RegisterRule<usize>>) -> i8 {
    match rule {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(offset)) if offset % 8 == 0 && offset != 0 => {
            match i8::try_from(offset / 8) {
                Ok(by_8) if by_8 != RBX_UNKNOWN => by_8,
                _ => RBX_UNKNOWN,
            }
        }
        Some(_) => RBX_UNKNOWN,
    }
}

fn is_deref8<R: Reader>(op: &Operation<R>) -> bool {
    matches!(
        op,
        Operation::Deref {
            size: 8,
            space: false,
            ..
        }
    )
}

/// `DW_OP_breg<register> <offset>` alone.
fn single_register_offset<R: Reader>(
    ops: &[Operation<R>],
    register: gimli::Register,
) -> Option<i64> {
    match ops {
        [Operation::RegisterOffset {
            register: r,
            offset,
            ..
        }] if *r == register => Some(*offset),
        _ => None,
    }
}

/// A constant added by the tail of an expression: nothing, `plus_uconst
/// N`, or `lit/const N; plus` (or `minus`).
fn added_constant<R: Reader>(ops: &[Operation<R>]) -> Option<i64> {
    let constant = |op: &Operation<R>| match *op {
        Operation::UnsignedConstant { value } => i64::try_from(value).ok(),
        Operation::SignedConstant { value } => Some(value),
        _ => None,
    };
    match ops {
        [] => Some(0),
        [Operation::PlusConstant { value }] => i64::try_from(*value).ok(),
        [c, Operation::Plus] => constant(c),
        [c, Operation::Minus] => constant(c)?.checked_neg(),
        _ => None,
    }
}

/// `CFA = *(register + offset) + addend`: `DW_OP_breg<n> offset; DW_OP_deref`
/// and an optional constant (OpenSSL's `.cfi_cfa_expression
/// %rsp+40,deref,+8`; GCC's DRAP `DW_OP_breg6 -8; DW_OP_deref`).
fn deref_expression<R: Reader>(ops: &[Operation<R>]) -> Option<(u8, i64, i64)> {
    match ops {
        [Operation::RegisterOffset {
            register, offset, ..
        }, deref, rest @ ..]
            if is_deref8(deref) =>
        {
            Some((general_register(*register)?, *offset, added_constant(rest)?))
        }
        _ => None,
    }
}

/// Where a `DW_CFA_expression` rule says a register is saved. The CFA is
/// on the DWARF stack when such an expression starts.
enum SaveSlot {
    /// At `CFA + offset`.
    Cfa(i64),
    /// At `register + offset` (this frame's value of the register).
    Register(u8, i64),
}

fn save_slot<R: Reader>(ops: &[Operation<R>]) -> Option<SaveSlot> {
    match ops {
        [Operation::RegisterOffset {
            register, offset, ..
        }] => Some(SaveSlot::Register(general_register(*register)?, *offset)),
        ops => added_constant(ops).map(SaveSlot::Cfa),
    }
}

/// The PLT expression GNU ld emits for `.plt`:
/// `breg7 <base>; breg16 0; lit15; and; lit<threshold>; ge; lit3; shl; plus`.
fn plt_expression<R: Reader>(ops: &[Operation<R>]) -> Option<(i64, u64)> {
    match ops {
        [Operation::RegisterOffset {
            register: X86_64::RSP,
            offset: base,
            ..
        }, Operation::RegisterOffset {
            register: X86_64::RA,
            offset: 0,
            ..
        }, Operation::UnsignedConstant { value: 15 }, Operation::And, Operation::UnsignedConstant { value: threshold }, Operation::Ge, Operation::UnsignedConstant { value: 3 }, Operation::Shl, Operation::Plus]
            if *threshold < 16 =>
        {
            Some((*base, *threshold))
        }
        _ => None,
    }
}

/// Translates one gimli row into our row format (its `start` is set by the
/// caller).
fn convert_row<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    encoding: gimli::Encoding,
) -> UnwindRow {
    let ra_rule = row.register(X86_64::RA);
    let rbp_rule = row.register(X86_64::RBP);
    let ops_of = |e: &UnwindExpression<usize>| expression_ops(e, section, encoding);

    // The outermost frame: nothing to return to.
    if matches!(ra_rule, None | Some(RegisterRule::Undefined)) {
        return UnwindRow::with_kind(0, RowKind::Stop);
    }

    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            match (general_register(*register), i32::try_from(*offset)) {
                (Some(register), Ok(offset)) => UnwindRow::cfa(register, offset),
                _ => return UNSUPPORTED,
            }
        }
        CfaRule::Expression(expression) => {
            let Some(ops) = ops_of(expression) else {
                return UNSUPPORTED;
            };
            if let Some((base, threshold)) = plt_expression(&ops) {
                return plt_row(base, threshold, ra_rule, rbp_rule);
            }
            let Some((register, offset, addend)) = deref_expression(&ops) else {
                return UNSUPPORTED;
            };
            // The kernel's and glibc's signal trampolines: every register,
            // the return address too, is read from the ucontext at SP.
            if matches!(ra_rule, Some(RegisterRule::Expression(_))) {
                if register != DWARF_RSP || addend != 0 {
                    return UNSUPPORTED;
                }
                return signal_row(offset, ra_rule, rbp_rule, ops_of);
            }
            match (i16::try_from(offset), i16::try_from(addend)) {
                (Ok(offset), Ok(addend)) => {
                    UnwindRow::cfa_deref(RowKind::CfaDeref, register, offset, addend)
                }
                _ => return UNSUPPORTED,
            }
        }
    };

    // x86_64's `call` pushes the return address just below the CFA; the
    // rows have no room for another place (none seen in real code).
    if ra_rule != Some(RegisterRule::Offset(8 * DEFAULT_RA_OFFSET_BY_8 as i64)) {
        return UNSUPPORTED;
    }
    let cfa = cfa.with_saved_rbx_by_8(saved_rbx_by_8(row.register(X86_64::RBX)));

    let slot = match rbp_rule {
        // Unchanged (an undefined RBP is left as is: callers that need it
        // restore it from their own frame).
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => None,
        Some(RegisterRule::Offset(offset)) => Some(SaveSlot::Cfa(offset)),
        Some(RegisterRule::Expression(expression)) => match ops_of(&expression) {
            Some(ops) => match save_slot(&ops) {
                Some(slot) => Some(slot),
                None => return UNSUPPORTED,
            },
            None => return UNSUPPORTED,
        },
        _ => return UNSUPPORTED,
    };
    let converted = match slot {
        None => cfa,
        Some(slot) => match with_saved_rbp(cfa, slot) {
            Some(row) => row,
            None => return UNSUPPORTED,
        },
    };

    // Registers the walk keeps as "same value" until a frame has a rule
    // for them (the return address and vector registers do not count).
    let saves_others = row
        .registers()
        .any(|(register, rule)| is_other_register(*register) && *rule != RegisterRule::SameValue);
    if saves_others {
        converted.saving_other_registers()
    } else {
        converted
    }
}

/// `cfa` with the caller's RBP saved at `slot`, if the format can say so.
fn with_saved_rbp(cfa: UnwindRow, slot: SaveSlot) -> Option<UnwindRow> {
    let cfa_relative = match (slot, cfa.row_kind()) {
        // Never at CFA + 0 on x86_64 (that is the caller's frame), so 0 is
        // free to mean "unchanged".
        (SaveSlot::Cfa(offset), _) => offset,
        // Register + offset = CFA - cfa_offset + offset.
        (SaveSlot::Register(register, offset), RowKind::Cfa) if register == cfa.cfa_register() => {
            offset.checked_sub(i64::from(cfa.cfa_offset))?
        }
        // DRAP: relative to RBP, whatever the CFA.
        (SaveSlot::Register(DWARF_RBP, offset), RowKind::CfaDeref) => {
            let (deref_offset, addend) = cfa.deref_offsets();
            let drap = UnwindRow::cfa_deref(
                RowKind::CfaDerefDrap,
                cfa.cfa_register(),
                deref_offset,
                addend,
            );
            return Some(
                drap.with_saved_rbx_by_8(cfa.slot_by_8)
                    .with_rbp_offset(i16::try_from(offset).ok()?),
            );
        }
        _ => return None,
    };
    if cfa_relative == 0 {
        return None;
    }
    Some(cfa.with_rbp_offset(i16::try_from(cfa_relative).ok()?))
}

/// A [`RowKind::Plt`] row from the PLT expression's base and threshold.
fn plt_row(
    base: i64,
    threshold: u64,
    ra_rule: Option<RegisterRule<usize>>,
    rbp_rule: Option<RegisterRule<usize>>,
) -> UnwindRow {
    let Ok(cfa_offset) = i32::try_from(base) else {
        return UNSUPPORTED;
    };
    // RBP is untouched in a PLT entry; an RBP rule would be a surprise
    // worth not guessing about.
    if !matches!(rbp_rule, None | Some(RegisterRule::SameValue)) {
        return UNSUPPORTED;
    }
    if !matches!(ra_rule, Some(RegisterRule::Offset(-8))) {
        return UNSUPPORTED;
    }
    UnwindRow::plt(cfa_offset, threshold as u8)
}

/// `CFA = *(SP + sp_slot)`: a signal trampoline whose registers are saved
/// in the `ucontext_t` at SP (glibc's `__restore_rt`, the kernel vDSO's).
/// The return address and RBP rules must be `DW_OP_breg7 <offset>`. The
/// CIE's 'S' augmentation is not required: these expressions say it all.
fn signal_row<'a>(
    sp_slot: i64,
    ra_rule: Option<RegisterRule<usize>>,
    rbp_rule: Option<RegisterRule<usize>>,
    ops_of: impl Fn(&UnwindExpression<usize>) -> Option<Vec<Operation<Slice<'a>>>>,
) -> UnwindRow {
    let sp_relative = |rule: &RegisterRule<usize>| match rule {
        RegisterRule::Expression(expression) => {
            single_register_offset(&ops_of(expression)?, X86_64::RSP)
        }
        _ => None,
    };
    let ra_slot = ra_rule.as_ref().and_then(sp_relative);
    let rbp_slot = match &rbp_rule {
        None | Some(RegisterRule::SameValue) => Some(0),
        Some(rule) => sp_relative(rule).filter(|offset| *offset != 0),
    };
    let (Some(ra_slot), Some(rbp_slot)) = (ra_slot, rbp_slot) else {
        return UNSUPPORTED;
    };
    match (
        i32::try_from(sp_slot),
        (ra_slot % 8 == 0)
            .then(|| i8::try_from(ra_slot / 8).ok())
            .flatten(),
        i16::try_from(rbp_slot),
    ) {
        (Ok(cfa_offset), Some(ra_offset_by_8), Ok(rbp_offset)) => {
            UnwindRow::signal(cfa_offset, ra_offset_by_8, rbp_offset)
        }
        _ => UNSUPPORTED,
    }
}
