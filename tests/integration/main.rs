//! Integration tests: one binary, one module per area (ripgrep's and qdrant's layout).

mod ann;
mod backend;
mod chunking;
mod distributed;
mod documents;
mod embedding;
mod engine;
mod families;
mod feeds;
mod hardening;
mod index;
mod layers;
mod lifecycle;
mod llm;
mod objects;
mod pages;
mod parquet;
mod pipeline;
mod postgres;
mod serve;
mod site;
mod subjects;
mod tables;
mod tokenizer;
mod util;
mod web;
