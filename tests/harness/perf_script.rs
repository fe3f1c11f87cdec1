//! `perf script`'s output read back, one way for the corpus (which compares
//! every stack) and for `cargo xtask bench` (which counts samples, rooted
//! stacks and lost events). Shared as source (`xtask` includes this file
//! with `#[path]`): std only.
use std::io::BufRead;
use std::path::Path;

/// The arguments after `perf` that print, for every sample, a `PID/TID`
/// header line, then its frames innermost first (`ADDRESS SYMBOL (DSO)`),
/// then a blank line, and a `PERF_RECORD_LOST` line where the kernel
/// dropped records; deep stacks whole, no inline expansion (addr2line
/// takes minutes on big programs).
pub fn script_args(perf_data: &Path) -> Vec<String> {
    vec![
        "script".into(),
        "-i".into(),
        perf_data.display().to_string(),
        "-F".into(),
        "pid,tid,ip,sym,dso".into(),
        "--max-stack".into(),
        "1024".into(),
        "--no-inline".into(),
        "--show-lost-events".into(),
    ]
}

/// One frame as `perf script` printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptFrame {
    pub address: u64,
    /// `[unknown]` where perf found no symbol.
    pub symbol: String,
    /// The file's path, or `[unknown]`, `[vdso]`, `[kernel.kallsyms]`.
    pub dso: String,
}

/// One sample: its process, thread and frames (innermost first, kernel
/// frames included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptSample {
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<ScriptFrame>,
}

/// What one stretch of the output says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptRecord {
    Sample(ScriptSample),
    /// Records the kernel dropped (`PERF_RECORD_LOST lost N`, and
    /// `PERF_RECORD_LOST_SAMPLES lost N`).
    Lost(u64),
}

/// Reads `output` of `perf script` with [`script_args`]' fields as it
/// comes, handing each sample and each loss to `on_record`. A line that is
/// neither is an error naming it (the fields were not these).
pub fn read_script(
    output: impl BufRead,
    mut on_record: impl FnMut(ScriptRecord),
) -> Result<(), String> {
    let mut current: Option<ScriptSample> = None;
    for line in output.split(b'\n') {
        let line = line.map_err(|e| format!("perf script: cannot read its output: {e}"))?;
        let line = String::from_utf8_lossy(&line);
        if line.trim().is_empty() {
            // The end of a sample's stack.
            if let Some(sample) = current.take() {
                on_record(ScriptRecord::Sample(sample));
            }
            continue;
        }
        if line.contains("PERF_RECORD_LOST") {
            let lost = line
                .split_whitespace()
                .skip_while(|word| *word != "lost")
                .nth(1)
                .and_then(|count| count.parse().ok())
                .ok_or_else(|| format!("perf script: unexpected loss line `{line}`"))?;
            on_record(ScriptRecord::Lost(lost));
            continue;
        }
        if !line.starts_with('\t') {
            // `  PID/TID ` (the PID right-aligned): a new sample. Frames
            // start with a tab.
            if let Some(sample) = current.take() {
                on_record(ScriptRecord::Sample(sample));
            }
            let (pid, tid) = line
                .trim()
                .split_once('/')
                .and_then(|(pid, tid)| Some((pid.parse().ok()?, tid.trim().parse().ok()?)))
                .ok_or_else(|| format!("perf script: unexpected sample header `{line}`"))?;
            current = Some(ScriptSample {
                pid,
                tid,
                frames: Vec::new(),
            });
            continue;
        }
        let Some(sample) = current.as_mut() else {
            return Err(format!("perf script: a frame before any sample: `{line}`"));
        };
        let (address, rest) = line
            .trim()
            .split_once(' ')
            .ok_or_else(|| format!("perf script: unexpected frame `{line}`"))?;
        let address = u64::from_str_radix(address, 16)
            .map_err(|_| format!("perf script: unexpected address in `{line}`"))?;
        let (symbol, dso) = split_symbol_and_dso(rest)
            .ok_or_else(|| format!("perf script: no `(dso)` in `{line}`"))?;
        sample.frames.push(ScriptFrame {
            address,
            symbol: symbol.to_string(),
            dso: dso.to_string(),
        });
    }
    if let Some(sample) = current {
        on_record(ScriptRecord::Sample(sample));
    }
    Ok(())
}

/// `SYMBOL (DSO)` → (SYMBOL, DSO); the DSO is the last balanced
/// parenthesis group (symbols and paths may contain parentheses).
pub fn split_symbol_and_dso(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_end();
    let at = last_parenthesized_group(text)?;
    Some((text[..at].trim_end(), &text[at + 1..text.len() - 1]))
}

/// Where the balanced parenthesis group that ends `text` opens (`text`
/// ends with `)`; groups may nest), if it does.
pub fn last_parenthesized_group(text: &str) -> Option<usize> {
    if !text.ends_with(')') {
        return None;
    }
    let mut depth = 0usize;
    for (at, byte) in text.bytes().enumerate().rev() {
        match byte {
            b')' => depth += 1,
            b'(' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_frames_and_losses_are_read_in_order() {
        let text = " 2417/2417 \n\
            \tffffffff8100abcd entry_SYSCALL_64 ([kernel.kallsyms])\n\
            \t           4a1f0 write (/lib/libc.so.6)\n\
            \t             77c [unknown] (/usr/bin/yes)\n\
            \n\
            perf 0 [001] 5.5: PERF_RECORD_LOST lost 7\n\
            13405/13406 \n\
            \t            1344 operator()(int) const (/tmp/x/copy (deleted))\n";
        let mut records = Vec::new();
        read_script(text.as_bytes(), |record| records.push(record)).unwrap();
        assert_eq!(records.len(), 3);
        let ScriptRecord::Sample(first) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!((first.pid, first.tid, first.frames.len()), (2417, 2417, 3));
        assert_eq!(first.frames[0].address, 0xffff_ffff_8100_abcd);
        assert_eq!(first.frames[1].symbol, "write");
        assert_eq!(first.frames[2].dso, "/usr/bin/yes");
        assert_eq!(records[1], ScriptRecord::Lost(7));
        let ScriptRecord::Sample(second) = &records[2] else {
            panic!("{records:?}")
        };
        assert_eq!((second.pid, second.tid), (13405, 13406));
        assert_eq!(second.frames[0].symbol, "operator()(int) const");
        assert_eq!(second.frames[0].dso, "/tmp/x/copy (deleted)");
    }

    #[test]
    fn output_of_other_fields_is_refused() {
        let mut records = Vec::new();
        // `-F comm,tid,ip,sym`: no PID/TID header, no DSO.
        let refused = read_script("chain  5711 \n\t16e09 leaf\n".as_bytes(), |record| {
            records.push(record)
        });
        assert!(refused.is_err_and(|e| e.contains("sample header")));
        assert!(read_script("1/1\n\t16e09 leaf\n".as_bytes(), |_| {}).is_err());
    }
}
