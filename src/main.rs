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
    ragline::stages::extract::budget::quiet_extraction_panics();
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

/// ragline's diagnostics (`tracing`) go to stderr, as the CLI shows them: the library's notes
/// (target `ragline::note`: where the run embeds, a reconnection, a circuit) as plain lines,
/// warnings as `warning: ...`. RAGLINE_LOG (or RUST_LOG) takes tracing's directives instead
/// (`debug`, `ragline=debug`, `ragline::indexers=trace,info`); a bare level applies to the
/// libraries ragline uses too (their messages repeat what ragline reports, so they are off
/// otherwise).
fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let asked = ["RAGLINE_LOG", "RUST_LOG"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|l| l.parse::<Targets>().ok());
    let filter = asked.unwrap_or_else(|| {
        Targets::new()
            .with_target("ragline", LevelFilter::WARN)
            .with_target(ragline::NOTE, LevelFilter::INFO)
    });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Plain);
    tracing_subscriber::registry().with(fmt).with(filter).init();
}

/// One line an event: its message and fields, after `warning: ` or `error: ` by level.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let prefix = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            tracing::Level::INFO => "",
            _ => "debug: ",
        };
        writer.write_str(prefix)?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
