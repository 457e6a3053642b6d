//! `ragline worker`, `ragline embedder`, `ragline indexer`: the roles of a distributed run.
//! Each connects to the broker, waits for a run (`ragline ingest --queue`), builds its part
//! from the run's settings, and works the run's queue until the run is over; then the next
//! run. SIGTERM: finish what is held, acknowledge it, exit.
//!
//! The places a role sends data or keys to (the index, the services) are its own: `--index`
//! and the services' sections of its own ragline.toml (`--config`). A run whose settings name
//! other places is refused with the difference.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use ragline::jobs::distributed::{self, RoleRequest};
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

    /// The index (the same as the run's publisher wrote to; the run's settings never hold a
    /// password: give it here, or in PGPASSWORD or ~/.pgpass). A run whose index is another
    /// is refused.
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

pub fn run(
    role: Role,
    args: RoleArgs,
    device: Option<String>,
    config_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let mut own = super::load_config(config_file)?;
    super::apply_index(&mut own, &args.index)?;
    let request = RoleRequest {
        own,
        model: args.model,
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

pub fn run_embedder(
    args: EmbedderArgs,
    config_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    run(Role::Embedder, args.role, args.device, config_file)
}
