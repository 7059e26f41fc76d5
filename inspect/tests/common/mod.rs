//! Helpers shared by the tool's integration tests: the binary run as a
//! process, its text, JSON and exit code.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn tool() -> PathBuf {
    // Cargo builds the binary of this package for its integration tests.
    PathBuf::from(env!("CARGO_BIN_EXE_inspect-snapshot"))
}

/// Runs the tool: (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(tool()).args(args).output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into(),
        String::from_utf8_lossy(&stderr).into(),
    )
}

/// Runs the tool with `--json`: (exit code, the document).
pub fn json(args: &[&str]) -> (i32, Value) {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, out, err) = run(&a);
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}\n{err}"));
    (code, v)
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The files of `dir` whose names end in `ext`, sorted.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    v
}
