//! The `ragline` command.

/// mimalloc keeps freed memory for reuse: the model allocates and frees multi-megabyte
/// activations on every layer, which the system allocator hands back to the kernel and
/// page-faults in again.
/// Counting charges what extraction threads allocate to their account, so a parser is held
/// to `--max-extract-mb` (`ragline::memory`).
#[global_allocator]
static GLOBAL: ragline::memory::Counting<mimalloc::MiMalloc> =
    ragline::memory::Counting::new(mimalloc::MiMalloc);

use std::process::ExitCode;

fn main() -> ExitCode {
    // Fault injection for tests: FAILPOINTS=name=action (a `failpoints` build only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    ragline::cli::main(std::env::args_os())
}
