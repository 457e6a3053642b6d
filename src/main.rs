//! The `ragline` command.

mod cli;

/// mimalloc keeps freed memory for reuse: the model allocates and frees multi-megabyte
/// activations on every layer, which the system allocator hands back to the kernel and
/// page-faults in again.
/// Counting charges what extraction threads allocate to their account, so a parser is held
/// to `--max-extract-mb` (`ragline::memory`).
#[global_allocator]
static GLOBAL: ragline::memory::Counting<mimalloc::MiMalloc> =
    ragline::memory::Counting::new(mimalloc::MiMalloc);

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Fault injection for tests: FAILPOINTS=name=action (a `failpoints` build only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    init_logging();
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

/// ragline's diagnostics (`tracing`) go to stderr: warnings and errors, unless RAGLINE_LOG
/// names a level (error, warn, info, debug, trace), which then applies to the libraries
/// ragline uses too (their messages repeat what ragline reports, so they are off otherwise).
fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let asked = std::env::var("RAGLINE_LOG")
        .ok()
        .and_then(|l| l.parse::<LevelFilter>().ok());
    let filter = match asked {
        Some(level) => Targets::new().with_default(level),
        None => Targets::new().with_target("ragline", LevelFilter::WARN),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false);
    tracing_subscriber::registry().with(fmt).with(filter).init();
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
