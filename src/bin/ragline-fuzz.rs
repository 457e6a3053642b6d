//! The fuzz targets of `ragline::fuzz` under libFuzzer: `RAGLINE_FUZZ_TARGET` names one
//! (wire, run_record, jsonl, html, markdown, rst, pdf, docx, serve_request, retry_after).
//! Built and run by `scripts/fuzz.sh TARGET SECONDS`, which instruments the code for coverage
//! (stable Rust: `-C passes=sancov-module`).

#![no_main]

use std::sync::OnceLock;

fn target() -> fn(&[u8]) {
    static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("RAGLINE_FUZZ_TARGET").unwrap_or_default();
        ragline::fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = ragline::fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "RAGLINE_FUZZ_TARGET=`{name}` is not a target; one of: {}",
                names.join(", ")
            );
            std::process::exit(2)
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    target()(data);
});
