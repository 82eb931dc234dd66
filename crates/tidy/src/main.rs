//! `strata-tidy [--json] [--list]`: the figures the ratchets in
//! tests/tidy.rs hold, for a review or a closing note.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use strata_tidy::{scan, workspace_root, FILE_LINES, FN_ARGS, FN_LINES};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: strata-tidy [--json] [--list]\n\nCounts over the workspace's non-test Rust (crates/*/src): functions over {FN_LINES} code lines\n(clippy's count) and over {FN_ARGS} arguments, files over 800 and {FILE_LINES} lines,\nsignatures returning Result<_, String>, and back doors around the datastore\ninterface. --list names each one.");
        return;
    }
    let facts = match scan(&workspace_root()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("strata-tidy: {e}");
            std::process::exit(1);
        }
    };
    let long: Vec<_> = facts.funcs.iter().filter(|f| f.too_long()).collect();
    let args_: Vec<_> = facts.funcs.iter().filter(|f| f.too_many_args()).collect();
    let span70 = facts
        .funcs
        .iter()
        .filter(|f| f.span_lines > FN_LINES)
        .count();
    let over = |n: usize| facts.files.iter().filter(|(_, l)| *l > n).count();
    let count = |w: &str| facts.back_doors.iter().filter(|b| b.what == w).count();
    let lines: usize = facts.files.iter().map(|(_, l)| l).sum();
    let figures = serde_json::json!({
        "files": facts.files.len(),
        "physical_lines": lines,
        "functions": facts.funcs.len(),
        "functions_over_70_code_lines": long.len(),
        "functions_over_70_lines_fn_to_brace": span70,
        "functions_over_5_arguments": args_.len(),
        "files_over_800_lines": over(800),
        "files_over_1200_lines": over(FILE_LINES),
        "result_string_signatures": facts.string_errors.len(),
        "downcasts": count("downcast"),
        "kind_branches": count("kind branch"),
        "directory_probes": count("directory probe"),
    });
    if args.iter().any(|a| a == "--json") {
        println!("{figures:#}");
    } else {
        for (k, v) in figures.as_object().unwrap() {
            println!("{k:<40} {v}");
        }
    }
    if args.iter().any(|a| a == "--list") {
        for f in &long {
            println!("long  {} ({} lines)", f.place(), f.body_lines);
        }
        for f in &args_ {
            println!("args  {} ({} arguments)", f.place(), f.args);
        }
        for (p, l) in facts.files.iter().filter(|(_, l)| *l > FILE_LINES) {
            println!("file  {p} ({l} lines)");
        }
        for (p, l, n) in &facts.string_errors {
            println!("string-error  {p}:{l} fn {n}");
        }
        for b in &facts.back_doors {
            println!("{}  {}:{}", b.what, b.file, b.line);
        }
    }
}
