//! The house's size rules (docs/architecture.md, "Sizes"), checked on
//! every library file of the workspace: no file over 800 lines (a file's
//! unit tests move beside it, to `x_tests.rs`, before it passes that), and
//! no function over 100 lines unless a comment just above it starts with
//! "Over 100 lines on purpose" and says why.
//!
//! A line-based reading of rustfmt's output: a function starts at a line
//! whose first word (after `pub(...)`, `const`, `async`, `unsafe`) is
//! `fn`, its body opens on the first line after that ends in `{`, and it
//! ends at the first line that is its indentation and `}`. Unit tests (a
//! file's `#[cfg(test)]` module and the `x_tests.rs` files) are not
//! library code and are not read.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;
const WHY: &str = "Over 100 lines on purpose";
/// How many lines above a function its reason may stand (docs and
/// attributes come between).
const WHY_WITHIN: usize = 20;

/// The library sources of every workspace member (not its tests, benches
/// or examples; not vendored crates).
const ROOTS: &[&str] = &[
    "src",
    "broker/src",
    "inspect/src",
    "replicated/src",
    "prometheus/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if !(name.ends_with("_tests.rs") || name == "tests.rs") {
                out.push(path);
            }
        }
    }
}

/// The name of the function a line declares, if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(r) => r.split_once(')')?.1.trim_start(),
            None => r.trim_start(),
        };
    }
    for word in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(word).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    rest.get(..end).filter(|n| !n.is_empty())
}

/// Where the file's unit-test module starts: a top-level `#[cfg(test)]`
/// whose item (after any other attributes) is a `mod` (a test-only helper
/// function elsewhere in the file is library code to this check).
fn test_module(lines: &[&str]) -> Option<usize> {
    (0..lines.len()).find(|&i| {
        lines[i].starts_with("#[cfg(test)]")
            && lines[i + 1..]
                .iter()
                .find(|l| !l.starts_with("#["))
                .is_some_and(|l| l.starts_with("mod "))
    })
}

/// Every function of `lines` (up to the file's test module) over the
/// limit without a reason above it: (first line, name, lines).
fn long_functions(lines: &[&str]) -> Vec<(usize, String, usize)> {
    let end = test_module(lines).unwrap_or(lines.len());
    let lines = &lines[..end];
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        // A declaration without a body (a trait's) ends in `;` first, a
        // body on one line in `}`.
        let Some(open) = lines[i..]
            .iter()
            .position(|l| l.trim_end().ends_with(['{', ';', '}']))
            .map(|k| i + k)
            .filter(|&k| lines[k].trim_end().ends_with('{'))
        else {
            continue;
        };
        let close_line = format!("{indent}}}");
        let Some(close) = lines[open..]
            .iter()
            .position(|l| l.trim_end() == close_line)
            .map(|k| open + k)
        else {
            continue;
        };
        let len = close - i + 1;
        let why = lines[i.saturating_sub(WHY_WITHIN)..i]
            .iter()
            .any(|l| l.contains(WHY));
        if len > MAX_FN_LINES && !why {
            out.push((i + 1, name.to_string(), len));
        }
    }
    out
}

#[test]
fn no_library_file_or_function_passes_its_size() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for r in ROOTS {
        rust_files(&root.join(r), &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "the walk found the sources: {files:?}");
    let mut faults = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let shown = f.strip_prefix(root).unwrap_or(f).display();
        if lines.len() > MAX_FILE_LINES {
            faults.push(format!(
                "{shown}: {} lines (at most {MAX_FILE_LINES}: move its unit tests to a file beside it, or split it)",
                lines.len()
            ));
        }
        for (at, name, len) in long_functions(&lines) {
            faults.push(format!(
                "{shown}:{at}: fn {name} is {len} lines (at most {MAX_FN_LINES}, or a comment above it saying \"{WHY}: ...\" and why)"
            ));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn the_reading_finds_functions_and_their_reasons() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let long = format!(
        "impl A {{\n    pub(crate) fn long(\n        a: u8,\n    ) -> u8 {{\n{}    }}\n}}\n",
        body(100)
    );
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(long_functions(&lines), vec![(2, "long".to_string(), 104)]);
    let excused = format!("// {WHY}: one pass.\n{long}");
    let lines: Vec<&str> = excused.lines().collect();
    assert!(long_functions(&lines).is_empty());
    let short = format!("fn short() {{\n{}}}\n", body(98));
    let lines: Vec<&str> = short.lines().collect();
    assert!(long_functions(&lines).is_empty());
    let tests = format!("#[cfg(test)]\n#[allow(clippy::x)]\nmod tests {{\n{long}}}\n");
    let lines: Vec<&str> = tests.lines().collect();
    assert!(long_functions(&lines).is_empty());
    // A test-only helper before the code does not hide the code.
    let helper = format!("#[cfg(test)]\nfn helper() {{}}\n\n{long}");
    let lines: Vec<&str> = helper.lines().collect();
    assert_eq!(long_functions(&lines).len(), 1);
    for (line, name) in [
        ("pub fn a(", Some("a")),
        ("    pub(super) const fn b_2() {", Some("b_2")),
        ("    async unsafe fn c<T>(", Some("c")),
        ("    fn d(&self) -> u8;", Some("d")),
        ("    let fn_len = 3;", None),
        ("// fn e()", None),
    ] {
        assert_eq!(declared_fn(line), name, "{line}");
    }
}
