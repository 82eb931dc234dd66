//! The codebase's ratchets (issue 61). Each holds a count of something the
//! next engineer should not meet more of: functions over 70 code lines or 5
//! arguments, files over 1,200 lines, back doors around the datastore
//! interface, and `Result<_, String>` signatures. A count may only go down:
//! a new offender fails here, and so does a fix that leaves the ceiling
//! where it was (lower it in this file, in the same change).
//!
//! Long functions and long argument lists are marked where they are, with
//! `#[expect(clippy::too_many_lines)]` or
//! `#[expect(clippy::too_many_arguments)]`, so `make lint` (clippy, with the
//! thresholds in clippy.toml) agrees with this test and flags an `expect`
//! that is no longer needed; this test flags it too, without clippy.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use strata_tidy::{scan, workspace_root, Facts, Func, FILE_LINES, FN_ARGS, FN_LINES};

/// Functions allowed over 70 code lines (each with its `expect`).
const LONG_FUNCTIONS: usize = 15;
/// Functions allowed over 5 arguments (each with its `expect`).
const MANY_ARGUMENTS: usize = 0;
/// Files allowed over 1,200 physical lines, each no longer than it is now.
const LONG_FILES: &[(&str, usize)] = &[];
/// Back doors above crates/datastore, per file: (downcasts, kind
/// branches, directory probes). The interface is to grow what these ask.
const BACK_DOORS: &[(&str, [usize; 3])] = &[];
/// Signatures returning `Result<_, String>`, which lose the error's kind.
const STRING_ERRORS: usize = 0;

fn facts() -> Facts {
    scan(&workspace_root()).expect("scan the workspace's sources")
}

fn report(problems: &[String], what: &str) {
    assert!(
        problems.is_empty(),
        "{what}:\n  {}\n(`cargo run -p strata-tidy -- --list` shows every count)",
        problems.join("\n  ")
    );
}

/// The ceiling must equal the count: above it is a regression, below it
/// is progress the constant has to record.
fn ratchet(name: &str, count: usize, ceiling: usize) -> Option<String> {
    match count.cmp(&ceiling) {
        std::cmp::Ordering::Greater => Some(format!(
            "{count} {name}, more than the {ceiling} allowed: make the new one smaller instead"
        )),
        std::cmp::Ordering::Less => Some(format!(
            "{count} {name}, fewer than the {ceiling} allowed: lower the ceiling in crates/tidy/tests/tidy.rs to {count}"
        )),
        std::cmp::Ordering::Equal => None,
    }
}

/// One clippy lint held by the ratchet: what a function is measured by,
/// whether it is over, and whether it carries the lint's `expect` or
/// `allow`.
struct Lint {
    name: &'static str,
    /// "code lines" or "arguments", for the messages.
    unit: &'static str,
    limit: usize,
    advice: &'static str,
    ceiling: usize,
    measure: fn(&Func) -> usize,
    over: fn(&Func) -> bool,
    expects: fn(&Func) -> bool,
    allows: fn(&Func) -> bool,
}

/// Every function over the lint's limit is marked `expect` where it is,
/// no mark is stale, none is `allow`, and the marks number the ceiling.
fn marked_and_only_fewer(lint: &Lint, what: &str) {
    let f = facts();
    let mut problems = Vec::new();
    let (name, unit) = (lint.name, lint.unit);
    for func in &f.funcs {
        if (lint.allows)(func) {
            problems.push(format!(
                "{}: #[allow(clippy::{name})]; use expect, which says when it is no longer needed",
                func.place()
            ));
        }
        let n = (lint.measure)(func);
        match ((lint.over)(func), (lint.expects)(func)) {
            (true, false) => problems.push(format!(
                "{}: {n} {unit}, over {}: {}",
                func.place(),
                lint.limit,
                lint.advice
            )),
            (false, true) => problems.push(format!(
                "{}: {n} {unit} now; remove its #[expect(clippy::{name})]",
                func.place()
            )),
            _ => {}
        }
    }
    let marked = f.funcs.iter().filter(|x| (lint.expects)(x)).count();
    problems.extend(ratchet(
        &format!("functions marked {name}"),
        marked,
        lint.ceiling,
    ));
    report(&problems, what);
}

#[test]
fn long_functions_are_marked_and_only_get_fewer() {
    marked_and_only_fewer(
        &Lint {
            name: "too_many_lines",
            unit: "code lines",
            limit: FN_LINES,
            advice: "split it",
            ceiling: LONG_FUNCTIONS,
            measure: |f| f.body_lines,
            over: Func::too_long,
            expects: |f| f.expects_lines,
            allows: |f| f.allows_lines,
        },
        "long functions",
    );
}

#[test]
fn long_argument_lists_are_marked_and_only_get_fewer() {
    marked_and_only_fewer(
        &Lint {
            name: "too_many_arguments",
            unit: "arguments",
            limit: FN_ARGS,
            advice: "pass a struct",
            ceiling: MANY_ARGUMENTS,
            measure: |f| f.args,
            over: Func::too_many_args,
            expects: |f| f.expects_args,
            allows: |f| f.allows_args,
        },
        "long argument lists",
    );
}

#[test]
fn no_file_grows_past_1200_lines() {
    let f = facts();
    let mut problems = Vec::new();
    for (path, lines) in &f.files {
        match LONG_FILES.iter().find(|(p, _)| p == path) {
            None if *lines > FILE_LINES => problems.push(format!(
                "{path}: {lines} lines, over {FILE_LINES}: give a part of it its own file"
            )),
            Some((_, ceiling)) if lines > ceiling => problems.push(format!(
                "{path}: {lines} lines, more than the {ceiling} it is allowed while it waits to be split"
            )),
            Some(_) if *lines <= FILE_LINES => problems.push(format!(
                "{path}: {lines} lines now; remove it from LONG_FILES"
            )),
            _ => {}
        }
    }
    for (path, _) in LONG_FILES {
        if !f.files.iter().any(|(p, _)| p == path) {
            problems.push(format!("{path} is gone; remove it from LONG_FILES"));
        }
    }
    report(&problems, "long files");
}

#[test]
fn no_new_back_doors_around_the_datastore_interface() {
    let f = facts();
    let kinds = ["downcast", "kind branch", "directory probe"];
    let mut files: Vec<&str> = f.back_doors.iter().map(|b| b.file.as_str()).collect();
    files.extend(BACK_DOORS.iter().map(|(p, _)| *p));
    files.sort_unstable();
    files.dedup();
    let mut problems = Vec::new();
    for file in files {
        let allowed = BACK_DOORS
            .iter()
            .find(|(p, _)| *p == file)
            .map_or([0; 3], |(_, n)| *n);
        for (k, what) in kinds.iter().enumerate() {
            let here: Vec<_> = f
                .back_doors
                .iter()
                .filter(|b| b.file == file && b.what == *what)
                .map(|b| b.line.to_string())
                .collect();
            if let Some(p) = ratchet(&format!("{what}s in {file}"), here.len(), allowed[k]) {
                problems.push(format!(
                    "{p} (lines {}); ask the Datastore trait instead",
                    here.join(", ")
                ));
            }
        }
    }
    report(&problems, "back doors above crates/datastore");
}

#[test]
fn string_errors_only_get_fewer() {
    let f = facts();
    let mut problems: Vec<String> = ratchet(
        "signatures returning Result<_, String>",
        f.string_errors.len(),
        STRING_ERRORS,
    )
    .into_iter()
    .collect();
    if !problems.is_empty() {
        problems.extend(
            f.string_errors
                .iter()
                .map(|(p, l, n)| format!("{p}:{l} fn {n}")),
        );
    }
    report(&problems, "string errors");
}

/// The scanner itself: clippy's line rule on a body with comments, blank
/// lines and a block comment spanning lines.
#[test]
fn body_lines_follow_clippys_rule() {
    let body = "{\n    let a = 1;\n\n    // a comment\n    /* one\n       two */\n    let b = 2; // trailing\n    /* x */ let c = 3;\n}";
    assert_eq!(strata_tidy::body_code_lines(body), 3);
    assert_eq!(strata_tidy::body_code_lines("{}"), 0);
    assert_eq!(strata_tidy::body_code_lines("{ x }"), 1);
}
