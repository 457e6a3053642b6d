//! Flags shared by the commands that run the model. Each overrides the `[model]` section of
//! ragline.toml when given.

use ragline::embed::device::SelectedDevice;
use ragline::embed::{EmbeddingModel, ModelFiles};
use ragline::jobs;
use ragline::jobs::config::ModelConfig;

/// The model flags are the library's typed request, filled by clap here and by keywords in
/// Python.
pub use ragline::jobs::ModelRequest as ModelArgs;

/// The model's files, devices, and the model loaded on the first device.
pub fn load_first(
    config: &ModelConfig,
) -> anyhow::Result<(ModelFiles, Vec<SelectedDevice>, EmbeddingModel)> {
    let files = jobs::model_files(&config.name)?;
    let devices = jobs::devices(config)?;
    let model = jobs::load_model(&files, &devices[0], config)?;
    Ok((files, devices, model))
}
