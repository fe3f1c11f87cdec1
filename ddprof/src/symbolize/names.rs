//! Mangled names: telling them apart, and demangling Rust and C++.

/// Whether `name` is a Rust (legacy or v0) or C++ (Itanium) mangled name.
pub(super) fn is_mangled(name: &str) -> bool {
    name.starts_with("_Z") || name.starts_with("_R")
}

/// Demangles Rust (legacy and v0) and C++ names; other names, and names
/// neither demangler accepts, are returned as they are. Safe on any text.
///
/// Rust is tried first: a legacy Rust name (`_ZN…E`) is also a valid C++
/// nested name, which the C++ demangler would render with Rust's escapes
/// left in (`_$LT$core..hash..sip..Hasher$LT$S$GT$…::write::h4f7b…`).
/// `rustc_demangle` only accepts a `_ZN` name whose path is followed by
/// nothing but compiler suffixes such as `.llvm.NNN`, so C++ names (which
/// go on with their parameter types) fall through to `cpp_demangle`.
pub fn demangle(name: &str) -> String {
    let rust = || {
        // `#`: without the legacy `::h<16 hex>` hash and v0's crate
        // disambiguators.
        let demangled = rustc_demangle::try_demangle(name).ok()?;
        Some(format!("{demangled:#}"))
    };
    let cpp = || cpp_demangle::Symbol::new(name).ok()?.demangle().ok();
    let demangled = if name.starts_with("_R") {
        rust()
    } else if name.starts_with("_Z") {
        rust().or_else(cpp)
    } else {
        None
    };
    // An empty path (`_ZNE`) is no better a name than the symbol itself.
    demangled
        .filter(|demangled| !demangled.is_empty())
        .unwrap_or_else(|| name.to_string())
}
