//! The wrapper launcher, the perf-fd hand-off and the detached profiler daemon.
