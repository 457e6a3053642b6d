//! `ragline worker`, `ragline embedder`, `ragline indexer`: the roles of a distributed run.
//! Each connects to the broker, waits for a run (`ragline ingest --queue`), builds its part
//! from the run's settings, and works the run's queue until the run is over; then the next
//! run. SIGTERM: finish what is held, acknowledge it, exit.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use ragline::pipeline::distributed::{self, RoleRequest};
use ragline::run::distributed::Role;

use super::EXIT_OK;

#[derive(Args, Debug, Clone)]
pub struct RoleArgs {
    /// The broker: nats://HOST:PORT[,nats://HOST:PORT...] (the URL `ingest --queue` got).
    #[arg(long, env = "RAGLINE_QUEUE", value_name = "URL")]
    queue: String,

    /// Where this process finds the run's model, when not at the path the run names (it
    /// must be the same model: another fingerprint is refused).
    #[arg(long)]
    model: Option<String>,

    /// The index, when this process reaches it by another URI than the publisher (the run's
    /// settings never hold a password: use PGPASSWORD or ~/.pgpass, or give it here).
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,

    /// `worker`: threads (extract, chunk, tokenize) [default: the run's --workers, else the
    /// number of cores]. `indexer`: connections to the index [default: the run's --indexers].
    #[arg(long)]
    threads: Option<usize>,

    /// Leave after one run instead of waiting for the next.
    #[arg(long)]
    once: bool,
}

#[derive(Args, Debug, Clone)]
pub struct EmbedderArgs {
    #[command(flatten)]
    role: RoleArgs,

    /// Where the model runs: cpu, cuda, cuda:N, cuda:0,1 (one embedder per GPU), metal or
    /// auto. [default: the run's --device]
    #[arg(long)]
    device: Option<String>,
}

pub fn run(role: Role, args: RoleArgs, device: Option<String>) -> anyhow::Result<ExitCode> {
    let request = RoleRequest {
        model: args.model,
        index: args.index,
        device,
        threads: args.threads,
        once: args.once,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let reports = distributed::serve(role, &args.queue, &request, &stop)?;
    let runs = reports.len();
    let chunks: u64 = reports.iter().map(|r| r.chunks_embedded).sum();
    if role == Role::Embedder {
        eprintln!("{}: {runs} runs, {chunks} chunks embedded", role.name());
    } else {
        eprintln!("{}: {runs} runs", role.name());
    }
    Ok(ExitCode::from(EXIT_OK))
}

pub fn run_embedder(args: EmbedderArgs) -> anyhow::Result<ExitCode> {
    run(Role::Embedder, args.role, args.device)
}
