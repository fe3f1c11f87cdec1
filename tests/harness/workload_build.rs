//! How a workload of `tests/workloads/` is compiled, one way for the tests
//! and for `cargo xtask` (bench, soak, demo). Shared as source (`xtask`
//! includes this file with `#[path]`): std only.
use std::path::Path;
use std::process::Command;

/// The compiler command that builds `source` (`.c`, `.cpp` or `.rs`) into
/// `output`: C and C++ `-O2 -fomit-frame-pointer -g` (no frame pointers,
/// as most distribution code), Rust `-C opt-level=2 -C
/// force-frame-pointers=no -g`; a C source named `*_plugin.c` is a shared
/// library, linked `-z lazy` (its calls bound at the first, as Debian links
/// by default and as `lazy_binding_plugin.c` needs whatever the toolchain's
/// default), and one named `*_tlsdesc_plugin.c` reaches its TLS through
/// TLS descriptors (`-mtls-dialect=gnu2`); one named `*_static.c` is
/// linked `-static`, one named `*_static_pie.c` `-static-pie`, and one
/// whose name holds `_musl` is built by `musl-gcc` (Debian's musl-tools,
/// which `cargo xtask dist` installs for the static ddprof) instead of
/// `cc`. `Err` names a
/// language this does not know.
pub fn compile_command(source: &Path, output: &Path) -> Result<Command, String> {
    let name = source.file_name().unwrap_or_default().to_string_lossy();
    let extension = source.extension().unwrap_or_default().to_string_lossy();
    let mut command = match extension.as_ref() {
        "rs" => {
            let mut command = Command::new("rustc");
            command.args([
                "-C",
                "opt-level=2",
                "-C",
                "force-frame-pointers=no",
                "-g",
                "--edition",
                "2021",
            ]);
            command
        }
        "c" | "cpp" => {
            let compiler = match extension.as_ref() {
                "cpp" => "c++",
                _ if name.contains("_musl") => "musl-gcc",
                _ => "cc",
            };
            let mut command = Command::new(compiler);
            command.args(["-O2", "-fomit-frame-pointer", "-g", "-Wall", "-pthread"]);
            if name.ends_with("_plugin.c") {
                command.args(["-shared", "-fPIC", "-Wl,-z,lazy"]);
            }
            if name.ends_with("_tlsdesc_plugin.c") {
                command.arg("-mtls-dialect=gnu2");
            }
            if name.ends_with("_static.c") {
                command.arg("-static");
            }
            if name.ends_with("_static_pie.c") {
                command.args(["-static-pie", "-fPIE"]);
            }
            command
        }
        other => return Err(format!("workload `{name}`: unknown language `.{other}`")),
    };
    command.arg("-o").arg(output).arg(source);
    Ok(command)
}
