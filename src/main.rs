//! The `ragline` command.

mod cli;

/// mimalloc keeps freed memory for reuse: the model allocates and frees multi-megabyte
/// activations on every layer, which the system allocator hands back to the kernel and
/// page-faults in again.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Fault injection for tests: FAILPOINTS=name=action (a `failpoints` build only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::from(cli::EXIT_SETUP)
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
