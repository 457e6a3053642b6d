//! The fuzz targets of `ragline::fuzz` under libFuzzer: `RAGLINE_FUZZ_TARGET` names one
//! (wire, run_record, jsonl, html, markdown, rst, pdf, docx, serve_request, retry_after).
//! Built and run by `scripts/fuzz.sh TARGET SECONDS`, which instruments the code for coverage
//! (stable Rust: `-C passes=sancov-module`).

#![no_main]

use std::sync::OnceLock;

/// As the `ragline` binary: extraction threads' allocations are counted, so parsers are held
/// to their memory ceiling here too.
#[global_allocator]
static ALLOCATOR: ragline::memory::Counting<std::alloc::System> =
    ragline::memory::Counting::new(std::alloc::System);

fn target() -> ragline::fuzz::Target {
    static TARGET: OnceLock<ragline::fuzz::Target> = OnceLock::new();
    *TARGET.get_or_init(|| {
        // libFuzzer's hook aborts on any panic; a panic production contains (a third-party
        // parser under catch_unwind) unwinds as it does there.
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !ragline::fuzz::panic_is_contained() {
                abort(info);
            }
        }));
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
