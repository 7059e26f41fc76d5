//! The library's import graph has no circle, and its layers are the ones
//! `docs/architecture.md` draws: a file never depends, through any chain
//! of imports, on a file that depends on it, and no import points from a
//! layer (a folder of `src/`, or a file at its root) to a layer drawn above
//! it. The drawing must name every folder and root file of `src/`, so it
//! cannot drift from the tree.
//!
//! The graph is file-level. Every `.rs` file under `src/` is a node. There
//! is an edge from file A to file B when A's code names a path that
//! resolves into B's module:
//!
//! - `use` trees (`use crate::a::{b, c::D}`, `use super::*`, `use self::x`,
//!   and uniform paths through a child module: `use report::Damage`);
//! - paths in code (`crate::wal::frame::put(..)`, `super::Inner`,
//!   `commit::lead(..)` where `commit` is a child module);
//! - `pub use` re-exports, including the crate root's: a file that imports
//!   `crate::Semantics` depends on `lib.rs`, which depends on everything it
//!   re-exports, so importing from the root instead of the defining module
//!   is a circle and fails here.
//!
//! A path resolves to the longest prefix that is a module, so
//! `crate::recovery::Damage` is an edge to `recovery/mod.rs` (the re-export)
//! even if `Damage` is defined in `recovery/report.rs`.
//!
//! Not counted: items under `#[cfg(test)]` (test modules may reach across
//! layers to build their fixtures) and files declared only under it
//! (`#[cfg(test)] mod tests;`, or a file beside its module named by
//! `#[cfg(test)] #[path = "x_tests.rs"] mod tests;`), comments and doc
//! links, string literals,
//! `mod x;` declarations (declaring a child is not depending on it), and
//! external crates. Method calls name no path, so an `impl` block in a
//! child file of the type its parent defines counts as the child depending
//! on the parent, which is the honest direction.
//!
//! `IMPORT_GRAPH_SRC=<dir> cargo test --test import_graph` checks another
//! tree's `src/` for circles (an older commit's, say: `git archive` it to a
//! temporary directory); the layer check reads this tree's drawing.
//!
//! A few small tests at the bottom feed the parser made-up sources, so the
//! check itself is shown to find a circle, to follow `super` and re-exports,
//! and to skip test code.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module path from the crate root: `["wal", "frame"]`.
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// A plain string literal's text (escapes left as written): what a
    /// `#[path = "..."]` attribute says.
    Str(String),
    /// `::`
    Sep,
    Punct(char),
}

/// Source text being read: characters, a position, a line count.
struct Chars {
    c: Vec<char>,
    i: usize,
    line: usize,
}

impl Chars {
    fn at(&self, k: usize) -> char {
        self.c.get(self.i + k).copied().unwrap_or('\0')
    }

    /// Moves one character on, counting lines.
    fn bump(&mut self) {
        if self.at(0) == '\n' {
            self.line += 1;
        }
        self.i += 1;
    }

    fn bump_while(&mut self, f: impl Fn(char) -> bool) {
        while self.i < self.c.len() && f(self.at(0)) {
            self.bump();
        }
    }

    /// After `/*`: to the end of the (nested) block comment.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.c.len() {
            if self.at(0) == '/' && self.at(1) == '*' {
                depth += 1;
                self.i += 2;
            } else if self.at(0) == '*' && self.at(1) == '/' {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// At the opening quote of a string: its text, up to the unescaped
    /// closing quote.
    fn string(&mut self) -> String {
        self.bump();
        let start = self.i;
        while self.i < self.c.len() && self.at(0) != '"' {
            if self.at(0) == '\\' {
                self.bump();
            }
            self.bump();
        }
        let text = self.c[start..self.i.min(self.c.len())].iter().collect();
        self.bump();
        text
    }

    /// How many `#` follow an `r` at `k` if a raw string starts there.
    fn raw_hashes(&self, k: usize) -> Option<usize> {
        let mut n = 0;
        while self.at(k + n) == '#' {
            n += 1;
        }
        (self.at(k + n) == '"').then_some(n)
    }

    /// At the `"` of a raw string with `hashes` hashes: past its end.
    fn raw_string(&mut self, hashes: usize) {
        self.bump();
        while self.i < self.c.len() {
            if self.at(0) == '"' && (1..=hashes).all(|k| self.at(k) == '#') {
                self.i += 1 + hashes;
                return;
            }
            self.bump();
        }
    }

    /// At a `'`: a char literal (`'a'`, `'\n'`) or a lifetime (`'a`).
    fn quote(&mut self) {
        self.i += 1;
        if self.at(0) == '\\' {
            self.i += 1;
            self.bump_while(|c| c != '\'');
            self.i += 1;
        } else if self.at(1) == '\'' {
            self.i += 2;
        } else {
            self.bump_while(|c| c.is_alphanumeric() || c == '_');
        }
    }

    fn word(&mut self) -> String {
        let start = self.i;
        self.bump_while(|c| c.is_alphanumeric() || c == '_');
        self.c[start..self.i].iter().collect()
    }
}

/// Rust source as tokens with their line numbers: identifiers, plain
/// strings, `::` and single punctuation; comments, raw strings, chars,
/// lifetimes and numbers are dropped.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let mut s = Chars {
        c: src.chars().collect(),
        i: 0,
        line: 1,
    };
    let mut out = Vec::new();
    while s.i < s.c.len() {
        let (ch, next, line) = (s.at(0), s.at(1), s.line);
        let prefixed = (ch == 'b' || ch == 'c') && next == 'r';
        if ch.is_whitespace() {
            s.bump();
        } else if ch == '/' && next == '/' {
            s.bump_while(|c| c != '\n');
        } else if ch == '/' && next == '*' {
            s.block_comment();
        } else if ch == '"' {
            out.push((Tok::Str(s.string()), line));
        } else if (ch == 'b' || ch == 'c') && next == '"' {
            s.i += 1;
            s.string();
        } else if let Some(h) = (ch == 'r' || prefixed)
            .then(|| s.raw_hashes(if prefixed { 2 } else { 1 }))
            .flatten()
        {
            s.i += if prefixed { 2 } else { 1 } + h;
            s.raw_string(h);
        } else if ch == '\'' || (ch == 'b' && next == '\'') {
            s.i += usize::from(ch == 'b');
            s.quote();
        } else if ch.is_ascii_digit() {
            s.word();
        } else if ch.is_alphabetic() || ch == '_' {
            if ch == 'r' && next == '#' {
                s.i += 2; // a raw identifier
            }
            out.push((Tok::Ident(s.word()), line));
        } else if ch == ':' && next == ':' {
            out.push((Tok::Sep, line));
            s.i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            s.i += 1;
        }
    }
    out
}

fn is_ident(t: Option<&(Tok, usize)>, name: &str) -> bool {
    matches!(t, Some((Tok::Ident(s), _)) if s == name)
}

fn is_punct(t: Option<&(Tok, usize)>, p: char) -> bool {
    matches!(t, Some((Tok::Punct(q), _)) if *q == p)
}

/// The index just past the item that starts at `i` (after an attribute):
/// its following attributes, then up to a `;`, `,` or the end of its first
/// `{ }` block at depth 0, or the `}` that closes the enclosing block.
fn skip_item(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
            Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                depth -= 1;
                if depth < 0 {
                    return i; // the enclosing block ends: leave its `}`
                }
                if depth == 0 && toks[i].0 == Tok::Punct('}') {
                    return i + 1;
                }
            }
            Tok::Punct(';') | Tok::Punct(',') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Whether `toks[i..]` is `#[cfg(test)]`; returns its length.
fn cfg_test_at(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let want = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let got = toks.get(i..i + want.len())?;
    got.iter()
        .map(|t| &t.0)
        .eq(want.iter())
        .then_some(want.len())
}

/// Expands a `use` tree starting at `toks[i]` into whole paths; returns the
/// index after it (its `;`).
fn use_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path: Vec<String> = prefix.to_vec();
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "as" => {
                i += 2; // `as name`: the path is already complete
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
            }
            Some(Tok::Sep) => i += 1,
            Some(Tok::Punct('*')) => {
                path.push("*".into());
                i += 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    if is_punct(toks.get(i), '}') {
                        i += 1;
                        break;
                    }
                    i = use_tree(toks, i, &path, out);
                    if is_punct(toks.get(i), ',') {
                        i += 1;
                    }
                }
                return i;
            }
            _ => {
                // `,`, `}` or `;`: the path ends here.
                if path.len() > prefix.len() {
                    out.push(path);
                }
                return i;
            }
        }
    }
}

/// One file's parse: the paths it names, each with the module it is named
/// in (inline modules change what `super` and `self` mean) and its line.
struct Named {
    from: ModPath,
    path: Vec<String>,
    line: usize,
}

fn named_paths(
    file_mod: &ModPath,
    src: &str,
    children: &dyn Fn(&ModPath) -> BTreeSet<String>,
) -> Vec<Named> {
    let toks = lex(src);
    let mut out = Vec::new();
    // (module, brace depth at which it closes)
    let mut mods: Vec<(ModPath, i32)> = vec![(file_mod.clone(), -1)];
    let mut depth = 0i32;
    let mut i = 0;
    while i < toks.len() {
        let here = mods.last().map(|m| m.0.clone()).unwrap_or_default();
        if let Some(n) = cfg_test_at(&toks, i) {
            i = skip_item(&toks, i + n);
            continue;
        }
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if mods.last().is_some_and(|m| m.1 == depth) {
                    mods.pop();
                }
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some((Tok::Ident(name), _)), true) =
                    (toks.get(i + 1), is_punct(toks.get(i + 2), '{'))
                {
                    let mut m = here.clone();
                    m.push(name.clone());
                    mods.push((m, depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(k) if k == "use" => {
                let line = toks[i].1;
                let mut paths = Vec::new();
                i = use_tree(&toks, i + 1, &[], &mut paths);
                for p in paths {
                    out.push(Named {
                        from: here.clone(),
                        path: p,
                        line,
                    });
                }
                continue;
            }
            Tok::Ident(first)
                if matches!(toks.get(i + 1).map(|t| &t.0), Some(Tok::Sep))
                    && !matches!(
                        i.checked_sub(1).and_then(|j| toks.get(j)).map(|t| &t.0),
                        Some(Tok::Sep)
                    )
                    && (first == "crate"
                        || first == "super"
                        || first == "self"
                        || children(&here).contains(first)) =>
            {
                let line = toks[i].1;
                let mut p = vec![first.clone()];
                let mut j = i + 1;
                while matches!(toks.get(j).map(|t| &t.0), Some(Tok::Sep)) {
                    match toks.get(j + 1).map(|t| &t.0) {
                        Some(Tok::Ident(s)) => p.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                out.push(Named {
                    from: here.clone(),
                    path: p,
                    line,
                });
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The crate's modules and the edges between their files.
struct Graph {
    /// Module path -> the file that holds it (inline modules map to their
    /// file).
    files: BTreeMap<ModPath, String>,
    /// file -> file -> where (first line and path text)
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

/// A module's path from its file's name relative to `src/`.
fn module_of(name: &str) -> ModPath {
    let mut parts: Vec<String> = name
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

/// Test code by declaration: the modules declared only under
/// `#[cfg(test)]`, and the files such a declaration names with `#[path]`.
fn test_code(sources: &[(String, String)]) -> (BTreeSet<ModPath>, BTreeSet<String>) {
    // Files declared only under #[cfg(test)] are test code.
    let mut test_only: BTreeSet<ModPath> = BTreeSet::new();
    // ... or named by `#[path = "..."]` on such a declaration (a file's
    // tests kept beside it: `#[cfg(test)] #[path = "x_tests.rs"] mod tests;`).
    let mut test_files: BTreeSet<String> = BTreeSet::new();
    for (name, src) in sources {
        let m = module_of(name);
        let toks = lex(src);
        for i in 0..toks.len() {
            let Some(n) = cfg_test_at(&toks, i) else {
                continue;
            };
            let mut j = i + n;
            let mut path = None;
            while is_punct(toks.get(j), '#') {
                if let (true, Some((Tok::Str(p), _))) =
                    (is_ident(toks.get(j + 2), "path"), toks.get(j + 4))
                {
                    path = Some(p.clone());
                }
                j = skip_attr(&toks, j);
            }
            if is_ident(toks.get(j), "mod")
                && let Some((Tok::Ident(child), _)) = toks.get(j + 1)
                && is_punct(toks.get(j + 2), ';')
            {
                match path {
                    // Relative to the declaring file's folder.
                    Some(p) => {
                        let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                        test_files.insert(if dir.is_empty() {
                            p
                        } else {
                            format!("{dir}/{p}")
                        });
                    }
                    None => {
                        let mut c = m.clone();
                        c.push(child.clone());
                        test_only.insert(c);
                    }
                }
            }
        }
    }
    (test_only, test_files)
}

/// Builds the graph of a crate given as (file name relative to `src/`,
/// source) pairs.
fn graph(sources: &[(String, String)]) -> Graph {
    let (test_only, test_files) = test_code(sources);
    let mut files: BTreeMap<ModPath, String> = sources
        .iter()
        .map(|(name, _)| (module_of(name), name.clone()))
        .collect();
    files.retain(|m, name| {
        !test_only.iter().any(|t| m.starts_with(t)) && !test_files.contains(name)
    });
    let mods: BTreeSet<ModPath> = files.keys().cloned().collect();
    let children = |m: &ModPath| -> BTreeSet<String> {
        mods.iter()
            .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
            .map(|c| c[m.len()].clone())
            .collect()
    };
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, file) in &files {
        let src = &sources
            .iter()
            .find(|(n, _)| n == file)
            .map(|s| s.1.clone())
            .unwrap_or_default();
        let mut inline = BTreeSet::new();
        for named in named_paths(m, src, &|h: &ModPath| {
            let mut c = children(h);
            if h.len() > m.len() {
                c.clear(); // inline modules have no file children
            }
            c
        }) {
            inline.insert(named.from.clone());
            let Some(target) = resolve(&named.from, &named.path, &mods, &children) else {
                continue;
            };
            // Inline modules live in their file.
            let mut t = target;
            while !files.contains_key(&t) && !t.is_empty() {
                t.pop();
            }
            let to = files[&t].clone();
            if &to != file {
                edges
                    .entry(file.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| format!("{file}:{} {}", named.line, named.path.join("::")));
            }
        }
    }
    Graph { files, edges }
}

fn skip_attr(toks: &[(Tok, usize)], mut i: usize) -> usize {
    // `#` `[` ... `]`
    i += 1;
    let mut depth = 0;
    while i < toks.len() {
        match toks[i].0 {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The module a path named in module `here` points into, or `None` for an
/// external crate.
fn resolve(
    here: &ModPath,
    path: &[String],
    mods: &BTreeSet<ModPath>,
    children: &dyn Fn(&ModPath) -> BTreeSet<String>,
) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = vec![];
            rest = &path[1..];
        }
        Some("self") => {
            base = here.clone();
            rest = &path[1..];
        }
        Some("super") => {
            base = here.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first)
            if children(here).contains(first)
                || mods.contains(&[here.clone(), vec![first.to_string()]].concat()) =>
        {
            base = here.clone();
        }
        _ => return None,
    }
    // The longest prefix that is a module.
    let mut best = base.clone();
    let mut m = base;
    for seg in rest {
        if seg == "self" || seg == "*" {
            break;
        }
        m.push(seg.clone());
        if mods.contains(&m) || mods.iter().any(|x| x.starts_with(&m)) {
            best = m.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// Tarjan's state over a graph given as adjacency lists.
struct Tarjan<'a> {
    adj: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    sccs: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on[v] = true;
        for k in 0..self.adj[v].len() {
            let w = self.adj[v][k];
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on[w] => self.low[v] = self.low[v].min(iw),
                _ => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                self.sccs.push(scc);
            }
        }
    }
}

/// The strongly connected components of more than one node.
fn components(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adj.len();
    let mut t = Tarjan {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: vec![],
        next: 0,
        sccs: vec![],
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.sccs
}

/// One loop through a component: the shortest path from its first node
/// back to itself, first node at both ends.
fn one_loop(scc: &[usize], adj: &[Vec<usize>]) -> Vec<usize> {
    let inside: BTreeSet<usize> = scc.iter().copied().collect();
    let start = *scc.iter().min().unwrap_or(&0);
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut end = None;
    'bfs: while let Some(v) = queue.pop_front() {
        for &w in adj[v].iter().filter(|w| inside.contains(w)) {
            if w == start {
                end = Some(v);
                break 'bfs;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = prev.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start];
    let mut v = end.unwrap_or(start);
    while v != start {
        path.push(v);
        v = prev[&v];
    }
    path[1..].reverse();
    path.push(start);
    path
}

/// The circles: strongly connected components of more than one file,
/// each as one loop through it and all its files.
fn circles(g: &Graph) -> Vec<(Vec<String>, Vec<String>)> {
    let nodes: Vec<String> = g.files.values().cloned().collect();
    let idx: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let adj: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            let targets = g.edges.get(n).into_iter().flat_map(|e| e.keys());
            targets
                .filter_map(|t| idx.get(t.as_str()).copied())
                .collect()
        })
        .collect();
    components(&adj)
        .iter()
        .map(|scc| {
            let files = one_loop(scc, &adj)
                .iter()
                .map(|&v| nodes[v].clone())
                .collect();
            let mut all: Vec<String> = scc.iter().map(|&v| nodes[v].clone()).collect();
            all.sort();
            (files, all)
        })
        .collect()
}

fn report(g: &Graph, loops: &[(Vec<String>, Vec<String>)]) -> String {
    let mut s = String::new();
    for (l, all) in loops {
        let _ = writeln!(
            s,
            "circle of {} files ({}), one loop: {}",
            all.len(),
            all.join(", "),
            l.join(" -> ")
        );
        for w in l.windows(2) {
            let _ = writeln!(s, "    {}", g.edges[&w[0]][&w[1]]);
        }
    }
    s
}

fn crate_sources(root: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read src/")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let name = p
                    .strip_prefix(root)
                    .expect("under src/")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((
                    name,
                    std::fs::read_to_string(&p).expect("read a source file"),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

fn src_dir() -> PathBuf {
    match std::env::var_os("IMPORT_GRAPH_SRC") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    }
}

#[test]
fn the_library_has_no_import_circle() {
    let g = graph(&crate_sources(&src_dir()));
    assert!(
        g.files.len() > 30,
        "the walk found the library's files: {:?}",
        g.files.values()
    );
    let loops = circles(&g);
    if std::env::var_os("IMPORT_GRAPH_PRINT").is_some() {
        for (from, to) in &g.edges {
            for (t, at) in to {
                println!("{from} -> {t}    ({at})");
            }
        }
    }
    assert!(
        loops.is_empty(),
        "the import graph of src/ has {} circle(s); import from the defining module, or move the shared item below both:\n{}",
        loops.len(),
        report(&g, &loops)
    );
}

/// The layers a drawing lists, top first: each line's entries (`store/`,
/// `error.rs`), and the sub-folders it names (`engine/kafka/`). The drawing
/// is the fenced block after the line holding `marker`; a line's entries
/// are its leading words that end in `/` or `.rs`.
fn drawn_layers(doc: &str, marker: &str) -> (Vec<Vec<String>>, BTreeSet<String>) {
    let mut lines = doc.lines().skip_while(|l| !l.contains(marker)).skip(1);
    assert!(
        lines.next().is_some_and(|l| l.starts_with("```")),
        "a fenced block follows the marker {marker:?}"
    );
    let (mut layers, mut subfolders) = (Vec::new(), BTreeSet::new());
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let mut layer = Vec::new();
        for word in line
            .split_whitespace()
            .take_while(|w| w.ends_with('/') || w.ends_with(".rs"))
        {
            if word.trim_end_matches('/').contains('/') {
                subfolders.insert(word.to_string());
            } else {
                layer.push(word.to_string());
            }
        }
        if !layer.is_empty() {
            layers.push(layer);
        }
    }
    (layers, subfolders)
}

/// A file's layer: the folder of `src/` it is in (`store/`), or itself at
/// the root (`error.rs`).
fn layer_of(file: &str) -> String {
    match file.split_once('/') {
        Some((folder, _)) => format!("{folder}/"),
        None => file.to_string(),
    }
}

#[test]
fn the_layers_are_the_ones_architecture_md_draws() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md"))
        .expect("read docs/architecture.md");
    let (layers, subfolders) = drawn_layers(&doc, "<!-- import-graph: layers");
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |e| (e.as_str(), i)))
        .collect();
    assert_eq!(
        rank.len(),
        layers.iter().map(Vec::len).sum::<usize>(),
        "an entry is drawn twice: {layers:?}"
    );

    // The drawing names exactly the tree: every folder and root file of
    // src/, and every deeper folder.
    let src = root.join("src");
    let mut tree = BTreeSet::new();
    let mut deeper = BTreeSet::new();
    for e in std::fs::read_dir(&src).expect("read src/") {
        let p = e.expect("entry").path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 name")
            .to_string();
        if p.is_dir() {
            tree.insert(format!("{name}/"));
            let mut stack = vec![p];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).expect("read a folder") {
                    let q = e.expect("entry").path();
                    if q.is_dir() {
                        let rel = q
                            .strip_prefix(&src)
                            .expect("under src/")
                            .to_string_lossy()
                            .replace('\\', "/");
                        deeper.insert(format!("{rel}/"));
                        stack.push(q);
                    }
                }
            }
        } else if name.ends_with(".rs") {
            tree.insert(name);
        }
    }
    let drawn: BTreeSet<String> = rank.keys().map(|k| k.to_string()).collect();
    assert_eq!(
        drawn, tree,
        "docs/architecture.md's layers name every folder and root file of src/, and nothing else"
    );
    assert_eq!(
        subfolders, deeper,
        "docs/architecture.md names every deeper folder of src/, and nothing else"
    );

    // No import points up.
    let g = graph(&crate_sources(&src));
    let mut up = Vec::new();
    for (from, tos) in &g.edges {
        for (to, at) in tos {
            let (a, b) = (layer_of(from), layer_of(to));
            if a != b && rank[b.as_str()] < rank[a.as_str()] {
                up.push(format!("{a} -> {b}    ({at})"));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports point from a layer to one docs/architecture.md draws above it (move the item down, or redraw the layers if the design changed):\n{}",
        up.join("\n")
    );
}

#[test]
fn a_drawing_is_read_line_by_line() {
    let doc = "text\n<!-- import-graph: layers -->\n```text\nstore/   the store\n  store/x/  deeper\ncodec/ fs/  two at once\na.rs b.rs  words after/ are prose\n```\nafter.rs\n";
    let (layers, sub) = drawn_layers(doc, "<!-- import-graph: layers");
    assert_eq!(
        layers,
        vec![vec!["store/"], vec!["codec/", "fs/"], vec!["a.rs", "b.rs"]]
    );
    assert_eq!(sub, BTreeSet::from(["store/x/".to_string()]));
}

fn crate_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect()
}

#[test]
fn a_circle_through_a_root_reexport_is_found() {
    let g = graph(&crate_of(&[
        ("lib.rs", "mod a; mod b; pub use a::Thing;"),
        ("a.rs", "use crate::b::helper; pub struct Thing;"),
        (
            "b.rs",
            "// crate::a is named in a comment only\npub fn helper() -> crate::Thing { todo!() }",
        ),
    ]));
    let loops = circles(&g);
    assert_eq!(loops.len(), 1, "{}", report(&g, &loops));
    assert_eq!(loops[0].0.len(), 4, "lib -> a -> b -> lib: {:?}", loops[0]);
}

#[test]
fn super_child_paths_and_groups_are_followed() {
    let g = graph(&crate_of(&[
        ("lib.rs", "mod store;"),
        (
            "store/mod.rs",
            "mod keys; mod options; pub struct Store { k: keys::Keys }",
        ),
        (
            "store/keys.rs",
            "use super::{options::{self, Opts}, Store as S}; pub struct Keys;",
        ),
        (
            "store/options.rs",
            "pub struct Opts; const S: &str = \"use super::Store;\"; fn f<'a>(x: &'a u8) -> char { 'x' }",
        ),
    ]));
    assert!(g.edges["store/mod.rs"].contains_key("store/keys.rs"));
    assert!(g.edges["store/keys.rs"].contains_key("store/options.rs"));
    assert!(g.edges["store/keys.rs"].contains_key("store/mod.rs"));
    assert!(
        !g.edges.contains_key("store/options.rs"),
        "a string is not an import"
    );
    assert_eq!(circles(&g).len(), 1);
}

#[test]
fn test_code_is_not_counted() {
    let g = graph(&crate_of(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests { use crate::b::g; }\n#[cfg(test)]\nmod more;",
        ),
        ("a/more.rs", "use crate::b::g;"),
        ("b_tests.rs", "use super::*; use crate::a::f;"),
        (
            "b.rs",
            "pub fn g() { crate::a::f() }\n#[cfg(test)]\nfn only_in_tests() { crate::a::f(); }\n#[cfg(test)]\n#[path = \"b_tests.rs\"]\nmod tests;",
        ),
    ]));
    assert!(circles(&g).is_empty(), "{}", report(&g, &circles(&g)));
    assert!(g.edges["b.rs"].contains_key("a.rs"));
    assert!(!g.files.values().any(|f| f == "a/more.rs"));
    assert!(
        !g.files.values().any(|f| f == "b_tests.rs"),
        "a test file named by #[path]"
    );
}
