//! Local outputs: pprof files per period, flamegraph.svg and stacks.folded.
