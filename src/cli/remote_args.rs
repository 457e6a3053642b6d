//! Flags that make the embed stage call a service instead of a model in this process
//! (`ingest`, `enrich`, `embed`): the library's typed request, filled by clap here and by
//! keywords in Python.

pub use ragline::jobs::RemoteRequest as RemoteArgs;
