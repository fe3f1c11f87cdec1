//! What the profiler's processes may do, and what they may not: the
//! capabilities each keeps ([`capabilities`]) and the seccomp filters that
//! bound them: the parent's, which keeps it from signalling or tracing
//! another process ([`sandbox`]), and the worker's allow-list, which keeps
//! what parses the profiled programs' files from writing, running a program
//! or reaching out ([`worker_sandbox`]). Used by the launcher (the set-up)
//! and the profiler (each worker confines itself once forked).
pub mod capabilities;
pub mod sandbox;
pub mod worker_sandbox;
