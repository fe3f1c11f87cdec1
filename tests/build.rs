//! Exports `custom-labels`' ABI symbols (`custom_labels_current_set`,
//! `custom_labels_abi_version`) from the package's binaries, as the ABI
//! requires of a program that publishes labels (workloads/trace_requests.rs).
fn main() {
    custom_labels::build::emit_build_instructions();
}
