//! Kernel frames: named from a copy of kallsyms taken at start-up.
use std::path::PathBuf;

use blazesym::symbolize::source::{Kernel, Source};
use blazesym::symbolize::Input;
use blazesym::MaybeDefault;

use super::{sym_lines, FrameSymbols, OwnedLine, Symbolizer, KERNEL};

/// A copy of `/proc/kallsyms`, taken while the profiler may still read
/// kernel addresses: with `kernel.perf_event_paranoid` above 1, the file
/// shows them only to a reader with CAP_SYSLOG (a capability the profiler
/// drops once set up), and as zeros to everyone else.
#[derive(Debug)]
pub struct KallsymsSnapshot {
    /// An in-memory file (not part of the profiler's RSS: never mapped).
    copy: std::fs::File,
}

impl KallsymsSnapshot {
    /// Copies `/proc/kallsyms` as this process sees it now; `None`, with
    /// one warning, when it cannot be read or shows no addresses.
    pub fn take() -> Option<Self> {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        use std::io::{BufRead, Seek};
        let copy = || -> std::io::Result<Option<std::fs::File>> {
            let mut copy =
                std::fs::File::from(memfd_create(c"ddprof-kallsyms", MFdFlags::MFD_CLOEXEC)?);
            std::io::copy(&mut std::fs::File::open("/proc/kallsyms")?, &mut copy)?;
            copy.rewind()?;
            let mut first = String::new();
            std::io::BufReader::new(&copy).read_line(&mut first)?;
            let hidden = first
                .split_whitespace()
                .next()
                .is_none_or(|address| address.trim_start_matches('0').is_empty());
            Ok((!hidden).then_some(copy))
        };
        match copy() {
            Ok(Some(copy)) => Some(Self { copy }),
            Ok(None) => {
                log::warn!(
                    "kernel frames will be unnamed: /proc/kallsyms shows no addresses to this \
                     process (it needs CAP_SYSLOG, or kernel.kptr_restrict=0 with \
                     kernel.perf_event_paranoid<=1)"
                );
                None
            }
            Err(error) => {
                log::warn!("kernel frames will be unnamed: cannot read /proc/kallsyms: {error}");
                None
            }
        }
    }

    /// The copy, from its start, to read it here.
    pub fn listing(&self) -> std::io::Result<impl std::io::BufRead> {
        use std::io::Seek;
        // A duplicate shares the offset; blazesym opens the copy by path,
        // with an offset of its own.
        let mut copy = self.copy.try_clone()?;
        copy.rewind()?;
        Ok(std::io::BufReader::new(copy))
    }

    fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.copy.as_raw_fd()))
    }
}

impl Symbolizer {
    pub(super) fn symbolize_kernel(
        &mut self,
        addrs: &[(usize, u64)],
        frames: &mut [Option<FrameSymbols>],
    ) {
        let mut missing: Vec<u64> = addrs
            .iter()
            .filter(|(_, addr)| !self.kernel.contains_key(addr))
            .map(|(_, addr)| *addr)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let source = Source::Kernel(Kernel {
                // kallsyms only: searching for a vmlinux image costs seconds
                // of I/O and is rarely installed on production hosts.
                vmlinux: MaybeDefault::None,
                kallsyms: self
                    .kallsyms
                    .as_ref()
                    .map_or(MaybeDefault::Default, |snapshot| {
                        MaybeDefault::Some(snapshot.path())
                    }),
                debug_syms: false,
                ..Kernel::default()
            });
            let resolved: Vec<Option<Vec<OwnedLine>>> =
                match self.blazesym.symbolize(&source, Input::AbsAddr(&missing)) {
                    Ok(results) => results.iter().map(|r| sym_lines(r, false)).collect(),
                    Err(error) => {
                        log::debug!("cannot symbolize kernel addresses: {error}");
                        vec![None; missing.len()]
                    }
                };
            let fallback = self.named(KERNEL);
            for (addr, lines) in missing.iter().zip(resolved) {
                let symbols = match lines {
                    Some(lines) if !lines.is_empty() => {
                        FrameSymbols::from(self.intern_lines(lines))
                    }
                    _ => fallback.clone(),
                };
                self.kernel.insert(*addr, symbols);
                self.cached_addresses += 1;
            }
        }
        for &(index, addr) in addrs {
            frames[index] = self.kernel.get(&addr).cloned();
        }
    }
}
