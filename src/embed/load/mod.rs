//! Finding and reading a model: its files (a folder, ./models, the hub cache), its tokenizer
//! with sentence-transformers' settings (and the fast exact WordPiece path), the device.

pub mod device;
pub mod files;
pub mod tokenizer;
pub mod wordpiece;
