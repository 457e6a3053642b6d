//! The architectures: the BERT-like families, the rotary families, and the task models built
//! on them (cross-encoders, SPLADE, sequence and token classifiers) with their heads.

pub mod bert;
pub mod classify;
pub mod cross_encoder;
pub mod head;
pub mod ner;
pub mod rotary;
pub mod splade;
