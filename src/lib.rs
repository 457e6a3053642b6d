//! ragline turns document corpora into vector indexes for retrieval-augmented generation.
//!
//! See ARCHITECTURE.md for the map. In short: [`connectors`] publish documents through the
//! [`publisher`] onto bounded [`queue`]s; workers run [`stages`] (extract, chunk); the
//! [`embed`] pool batches chunks through the model; [`indexers`] write to a backend; the
//! publisher follows [`event`]s until the [`run`] is complete. [`http`] calls services
//! (embeddings, chat completions) within their limits; [`serve`] is the embeddings server;
//! [`jobs`] assembles what each command runs from its config.

// The command line lives in the library (`cli`), so the Python package runs it in process;
// its modules name the library `ragline::...` as the binary did.
extern crate self as ragline;

/// The tracing target of what the library tells its user as a job goes (where it embeds, a
/// reconnection, a circuit that opened): the CLI shows it by default, as plain lines.
pub const NOTE: &str = "ragline::note";

pub mod cli;
pub mod connectors;
pub mod distance;
pub mod document;
pub mod embed;
pub mod eval;
pub mod event;
#[cfg(all(feature = "nats", feature = "serve"))]
#[doc(hidden)]
pub mod fuzz;
pub mod http;
pub mod indexers;
pub mod jobs;
pub mod lifecycle;
pub mod memory;
pub mod panics;
pub mod publisher;
pub mod queue;
pub mod run;
pub mod search;
pub mod secret;
#[cfg(feature = "serve")]
pub mod serve;
pub mod signal;
pub mod stages;
pub mod stats;
pub mod tokens;

/// The library's own tests run with the accounting allocator the binary installs, so that
/// memory ceilings are tested as they run.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: memory::Counting<std::alloc::System> =
    memory::Counting::new(std::alloc::System);
