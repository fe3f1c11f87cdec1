//! The whole run's stacks, folded by function name (`stacks.folded`), and
//! the flame graph drawn from them, coloured by where each function's code
//! comes from.
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use crate::provenance::Source;
use crate::symbolize::SymbolizedProfile;

/// Frame slots kept in the whole-run folded aggregate (~16 MiB of ids);
/// stacks that do not fit are counted under `[folded stacks table full]`.
pub const DEFAULT_MAX_FOLDED_FRAMES: usize = 4_000_000;
pub(super) const FOLDED_TABLE_FULL: &str = "[folded stacks table full]";

/// What the flame graph's colours say.
pub const FLAME_GRAPH_LEGEND: &str = "code of the application: red, of its libraries: yellow, \
     of the system: blue, of the kernel: grey, of no known file: purple";

/// A name as a folded line holds it: `;` separates frames, a line ends
/// with its count (names keep their inner spaces: C++ templates).
fn folded_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains([';', '\n', '\r']) {
        std::borrow::Cow::Owned(name.replace(';', ":").replace(['\n', '\r'], " "))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// Whole-run stack counts by function name, root first with the process
/// name as the first frame; bounded in memory (frames stored, and so the
/// names and their sources).
#[derive(Debug)]
pub struct FoldedStacks {
    pub(super) names: Vec<Arc<str>>,
    name_ids: HashMap<Arc<str>, u32>,
    stacks: HashMap<Box<[u32]>, u64>,
    /// Where each name's code comes from, when known (its colour).
    sources: HashMap<u32, Source>,
    frames_stored: usize,
    max_frames: usize,
    total: u64,
}

impl Default for FoldedStacks {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FOLDED_FRAMES)
    }
}

impl FoldedStacks {
    pub fn new(max_frames: usize) -> Self {
        Self {
            names: Vec::new(),
            name_ids: HashMap::new(),
            stacks: HashMap::new(),
            sources: HashMap::new(),
            frames_stored: 0,
            max_frames,
            total: 0,
        }
    }

    fn name_id(&mut self, name: &Arc<str>) -> u32 {
        if let Some(id) = self.name_ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.clone());
        self.name_ids.insert(name.clone(), id);
        id
    }

    /// Adds a symbolized period's samples (of its first event).
    pub fn add(&mut self, profile: &SymbolizedProfile) {
        for (names, count) in Self::stacks_of(profile, 0) {
            self.add_stack(&names, count);
        }
    }

    /// A symbolized period's samples as folded stacks (process name, then
    /// the frames from the root) and counts, as [`add_stack`] takes them:
    /// how a profiler worker hands a period's stacks to its parent.
    ///
    /// [`add_stack`]: FoldedStacks::add_stack
    /// Only the samples of `event` count: a flame graph has one unit.
    pub fn stacks_of(profile: &SymbolizedProfile, event: u16) -> Vec<(Vec<Arc<str>>, u64)> {
        profile
            .period
            .samples
            .iter()
            .filter(|sample| sample.event == event)
            .map(|sample| {
                let process: Arc<str> = match &sample.process_name {
                    Some(name) => name.clone(),
                    None => Arc::from(format!("[pid {}]", sample.pid)),
                };
                let mut names = vec![process];
                names.extend(profile.stack_names(sample.stack).cloned());
                (names, sample.count)
            })
            .collect()
    }

    /// Adds `count` samples of one stack: the process name, then the frames
    /// from the root.
    pub fn add_stack(&mut self, names: &[Arc<str>], count: u64) {
        self.total += count;
        let Some(process) = names.first() else {
            return;
        };
        // A stack met before: all its names are known.
        let known: Option<Vec<u32>> = names
            .iter()
            .map(|name| self.name_ids.get(name).copied())
            .collect();
        if let Some(stored) = known.and_then(|key| self.stacks.get_mut(key.as_slice())) {
            *stored += count;
            return;
        }
        let key: Vec<u32> = if self.frames_stored + names.len() > self.max_frames {
            // Full: no name is added any more (the names table would grow
            // with every new stack), only the marker, under the process's
            // name when it is known.
            let full = self.name_id(&Arc::from(FOLDED_TABLE_FULL));
            vec![self.name_ids.get(process).copied().unwrap_or(full), full]
        } else {
            names.iter().map(|name| self.name_id(name)).collect()
        };
        let stored = self.stacks.entry(key.as_slice().into()).or_insert_with(|| {
            self.frames_stored += key.len();
            0
        });
        *stored += count;
    }

    /// Notes where the code of the names added so far comes from (a name
    /// keeps the first source it was given).
    pub fn add_sources(&mut self, sources: &HashMap<Arc<str>, Source>) {
        for (name, source) in sources {
            if let Some(&id) = self.name_ids.get(name) {
                self.sources.entry(id).or_insert(*source);
            }
        }
    }

    /// Samples added so far.
    pub fn total_samples(&self) -> u64 {
        self.total
    }

    /// `frame;frame;leaf count` lines, sorted.
    pub fn lines(&self) -> Vec<String> {
        // ';' separates frames and a line's last space its count; names
        // keep their inner spaces (C++ templates). Each name is cleaned once
        // (char by char in every line, it was most of the writing of a
        // rustc profile's flame graph).
        let names: Vec<std::borrow::Cow<str>> =
            self.names.iter().map(|name| folded_name(name)).collect();
        let mut lines: Vec<String> = self
            .stacks
            .iter()
            .map(|(stack, count)| {
                let mut line = String::new();
                for (index, id) in stack.iter().enumerate() {
                    if index > 0 {
                        line.push(';');
                    }
                    line.push_str(&names[*id as usize]);
                }
                line.push(' ');
                line.push_str(&count.to_string());
                line
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    pub fn write_folded(&self, out: &mut impl Write) -> std::io::Result<()> {
        for line in self.lines() {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// Renders the flame graph (an SVG that says there were no samples when
    /// the run had none).
    pub fn write_flamegraph(&self, title: &str, out: &mut impl Write) -> std::io::Result<()> {
        let lines = self.lines();
        let mut palette = inferno::flamegraph::color::PaletteMap::default();
        for (&id, source) in &self.sources {
            palette.insert(folded_name(&self.names[id as usize]), source.flame_color());
        }
        let mut options = inferno::flamegraph::Options::default();
        options.title = title.to_string();
        options.subtitle = Some(FLAME_GRAPH_LEGEND.to_string());
        options.count_name = "samples".to_string();
        // Names of no known file (process names, JIT code): one hue apart.
        options.colors = inferno::flamegraph::color::Palette::Basic(
            inferno::flamegraph::color::BasicPalette::Purple,
        );
        options.palette_map = Some(&mut palette);
        let result =
            inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out);
        match result {
            // inferno writes an SVG with an error message for empty input.
            Err(_) if lines.is_empty() => Ok(()),
            other => other,
        }
    }
}
