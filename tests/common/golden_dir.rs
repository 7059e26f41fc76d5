//! The committed golden files of a directory, as the golden-file tests
//! compare them with what this build writes.

// Each test crate that includes `common` uses only part of it.
#![allow(dead_code)]

/// Every file of `dir` (a path relative to the crate) with its bytes,
/// sorted by name.
pub fn committed(dir: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}
