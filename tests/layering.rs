//! The layering of `src/` (issue #32: every source file readable in one
//! sitting), checked on the source text itself:
//!
//! - no cycle of files: no two files depend on each other, directly or
//!   around a longer cycle;
//! - no file is over [`MAX_LINES`] lines.
//!
//! A file depends on another when it uses an item of a module that file
//! defines: a `use` (`use crate::a::b::X`, `use super::x::Y`,
//! `use self::c::*`, `use child::Z` for a module it declares), or a path in
//! its code (`crate::a::b::f()`, `super::T`, `child::g()`, and in the
//! binaries `ringlock::a::X`). A path names the module of its longest
//! prefix that is a module (found from the crate roots' `mod`
//! declarations, `#[path]` included), and the dependency is on the file
//! that defines that module (an inline `mod tests { .. }` is its file's).
//! Declaring `mod child;` is not a use of the child; re-exporting one of
//! its items (`pub use child::X;`) is. Comments and string literals are
//! stripped first, so a path in a doc comment is not a dependency.
//!
//! The allow-lists below are empty, and no folder may use them
//! ([`ALLOWED_DIRS`]): issue #32 removed the last cycles (`src/shard`,
//! `src/driver`) and long files. A folder being rewritten may be named
//! there again for a while; then a cycle or a long file not on the lists
//! fails the test, and so does an entry that no longer describes the
//! source (remove it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a file of `src/` may have.
const MAX_LINES: usize = 1000;

/// The folders whose cycles and long files may be on the allow-lists.
const ALLOWED_DIRS: &[&str] = &[];

/// Each entry: the files of one cycle group (a strongly connected set of
/// files: each reaches every other), as the failure message prints them
/// (`cargo test --test layering -- --nocapture` prints these too). A group
/// found in the source passes only when it is exactly one of these: a
/// file that joins or leaves a group fails the test until the entry says
/// so. (A new dependency between two files already in one group is not
/// noticed.)
const ALLOWED_CYCLES: &[&[&str]] = &[];

/// Files still over [`MAX_LINES`] lines.
const ALLOWED_LONG: &[&str] = &[];

// ---- the source text: tokens without comments and literals

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// An identifier or keyword (`r#name` as `name`). Numbers are dropped.
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A string literal's contents (escapes left as written): only
    /// `#[path = "..."]` reads one.
    Str(String),
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `s` from just after an opening `"` (escapes skipped): the contents and
/// the index after the closing `"`.
fn quoted(s: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while i < s.len() && s[i] != '"' {
        i += if s[i] == '\\' { 2 } else { 1 };
    }
    let end = i.min(s.len());
    (s[start..end].iter().collect(), i + 1)
}

/// A raw string from `i`, just after its `r`: `hashes` `#`s, a `"`, the
/// contents, a `"` and as many `#`s. The contents and the index after it.
fn raw_quoted(s: &[char], i: usize, hashes: usize) -> (String, usize) {
    let start = i + hashes + 1;
    let mut j = start;
    while j < s.len() {
        if s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')) {
            return (s[start..j].iter().collect(), j + 1 + hashes);
        }
        j += 1;
    }
    (s[start..].iter().collect(), s.len())
}

/// After a `'` at `i`: the index after the character literal there, or
/// after the lifetime or label (`'a`, `'outer`), which carry no path.
fn skip_quote(s: &[char], i: usize) -> usize {
    if s.get(i + 1) == Some(&'\\') {
        // '\n', '\'', '\\', '\u{..}': the escaped character, then up to the '.
        let mut j = i + 3;
        while j < s.len() && s[j] != '\'' {
            j += 1;
        }
        j + 1
    } else if s.get(i + 2) == Some(&'\'') {
        i + 3
    } else {
        let mut j = i + 1;
        while j < s.len() && is_ident(s[j]) {
            j += 1;
        }
        j
    }
}

/// The tokens of Rust source `src`, comments (doc comments included) and
/// character and number literals dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            let (text, after) = quoted(&s, i + 1);
            out.push(Tok::Str(text));
            i = after;
        } else if c == '\'' {
            i = skip_quote(&s, i);
        } else if is_ident_start(c) || c.is_ascii_digit() {
            let start = i;
            while i < s.len() && is_ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let hashes = s[i..].iter().take_while(|&&h| h == '#').count();
            match (word.as_str(), s.get(i)) {
                ("b" | "c", Some('"')) => {
                    let (text, after) = quoted(&s, i + 1);
                    out.push(Tok::Str(text));
                    i = after;
                }
                ("b", Some('\'')) => i = skip_quote(&s, i),
                ("r" | "br" | "cr", Some('"' | '#')) if s.get(i + hashes) == Some(&'"') => {
                    let (text, after) = raw_quoted(&s, i, hashes);
                    out.push(Tok::Str(text));
                    i = after;
                }
                ("r", Some('#')) if s.get(i + 1).is_some_and(|&n| is_ident_start(n)) => {
                    let start = i + 1;
                    i = start;
                    while i < s.len() && is_ident(s[i]) {
                        i += 1;
                    }
                    out.push(Tok::Ident(s[start..i].iter().collect()));
                }
                _ if c.is_ascii_digit() => {}
                _ => out.push(Tok::Ident(word)),
            }
        } else if c == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

// ---- one file: its module declarations and the paths it uses

/// `mod name;` or `mod name { .. }`, inside the inline modules `within`.
#[derive(Debug)]
struct ModDecl {
    within: Vec<String>,
    name: String,
    inline: bool,
    path_attr: Option<String>,
}

/// A path the file uses, with the inline modules it is written in.
#[derive(Debug)]
struct PathUse {
    within: Vec<String>,
    segments: Vec<String>,
}

#[derive(Debug, Default)]
struct Scan {
    mods: Vec<ModDecl>,
    uses: Vec<PathUse>,
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The paths of the use tree at `toks[i..]` (after `use`), each with
/// `prefix` in front; returns the index after the tree. A glob (last
/// segment `*`) or a `self` names the prefix's module; a leading `::`
/// makes the path external (first segment `::`).
fn use_tree(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    if toks.get(i) == Some(&Tok::PathSep) {
        path.push("::".into());
        i += 1;
    }
    loop {
        match toks.get(i) {
            Some(Tok::Ident(name)) => {
                path.push(name.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                if ident(toks.get(i)) == Some("as") {
                    i += 2;
                }
                out.push(path);
                return i;
            }
            Some(Tok::Punct('*')) => {
                path.push("*".into());
                out.push(path);
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < toks.len() && toks[i] != Tok::Punct('}') {
                    i = use_tree(toks, i, &path, out);
                    if toks.get(i) == Some(&Tok::Punct(',')) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            _ => return i,
        }
    }
}

/// The module declarations and paths of one file's tokens.
fn scan(toks: &[Tok]) -> Scan {
    let mut out = Scan::default();
    // The inline modules open at the token at hand, each with the brace
    // depth inside it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut opening: Option<String> = None;
    let mut path_attr: Option<String> = None;
    let within = |inline: &[(String, usize)]| inline.iter().map(|(n, _)| n.clone()).collect();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => {
                depth += 1;
                if let Some(name) = opening.take() {
                    inline.push((name, depth));
                }
                path_attr = None;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                path_attr = None;
            }
            Tok::Punct(';') => path_attr = None,
            Tok::Punct('#') if ident(toks.get(i + 2)) == Some("path") => {
                if let (Some(Tok::Punct('=')), Some(Tok::Str(p))) =
                    (toks.get(i + 3), toks.get(i + 4))
                {
                    path_attr = Some(p.clone());
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let Some(name) = ident(toks.get(i + 1)) {
                    let is_inline = toks.get(i + 2) == Some(&Tok::Punct('{'));
                    out.mods.push(ModDecl {
                        within: within(&inline),
                        name: name.to_string(),
                        inline: is_inline,
                        path_attr: path_attr.take(),
                    });
                    if is_inline {
                        opening = Some(name.to_string());
                    }
                    i += 2;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let mut paths = Vec::new();
                let after = use_tree(toks, i + 1, &[], &mut paths);
                for segments in paths {
                    out.uses.push(PathUse {
                        within: within(&inline),
                        segments,
                    });
                }
                i = after.max(i + 1);
                continue;
            }
            Tok::Ident(first) if toks.get(i + 1) == Some(&Tok::PathSep) => {
                let visibility = ident(toks.get(i.wrapping_sub(1))) == Some("in")
                    && toks.get(i.wrapping_sub(2)) == Some(&Tok::Punct('('));
                let continued = i > 0 && toks[i - 1] == Tok::PathSep;
                let mut segments = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::PathSep) {
                    match ident(toks.get(j + 1)) {
                        Some(seg) => segments.push(seg.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                // (`$crate::` in a macro is read as `crate::`: `$` is a token of
                // its own.)
                if !visibility && !continued {
                    out.uses.push(PathUse {
                        within: within(&inline),
                        segments,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

// ---- the crates: module tree, file dependencies

/// The crate the library is (its binaries name it so).
const LIB: &str = "ringlock";

#[derive(Debug, Default)]
struct Module {
    /// The file that defines the module (an inline module's file is the
    /// file it is written in).
    file: String,
    children: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct Tree {
    /// Module path (crate name first) → module.
    modules: BTreeMap<Vec<String>, Module>,
    /// File → the module it defines (crate name first) and its scan.
    files: BTreeMap<String, (Vec<String>, Scan)>,
    /// Problems found while building the tree (a `mod` whose file is
    /// missing, a file no crate reaches).
    errors: Vec<String>,
}

fn parent(file: &str) -> String {
    file.rsplit_once('/')
        .map_or(String::new(), |(d, _)| d.to_string())
}

fn join(dir: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = if dir.is_empty() {
        vec![]
    } else {
        dir.split('/').collect()
    };
    for p in rel.split('/') {
        match p {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

impl Tree {
    /// The module tree and scans of every crate in `sources` (file →
    /// text, paths relative to the package: `src/lib.rs`, ...): the library
    /// `src/lib.rs` and each binary `src/main.rs`, `src/bin/NAME.rs`,
    /// `src/bin/NAME/main.rs`.
    fn build(sources: &BTreeMap<String, String>) -> Tree {
        let mut tree = Tree::default();
        for root in sources.keys() {
            let name = if root == "src/lib.rs" {
                LIB.to_string()
            } else if root == "src/main.rs" {
                "bin:main".to_string()
            } else if let Some(rest) = root.strip_prefix("src/bin/") {
                match rest.split_once('/') {
                    None => format!("bin:{}", rest.trim_end_matches(".rs")),
                    Some((dir, "main.rs")) => format!("bin:{dir}"),
                    Some(_) => continue,
                }
            } else {
                continue;
            };
            tree.load(sources, root, vec![name], true);
        }
        for file in sources.keys() {
            if !tree.files.contains_key(file) {
                tree.errors.push(format!(
                    "{file}: no crate root's `mod` declarations reach it"
                ));
            }
        }
        tree
    }

    fn load(
        &mut self,
        sources: &BTreeMap<String, String>,
        file: &str,
        module: Vec<String>,
        root: bool,
    ) {
        let Some(text) = sources.get(file) else {
            return;
        };
        let scan = scan(&tokens(text));
        let stem = file
            .rsplit('/')
            .next()
            .unwrap_or(file)
            .trim_end_matches(".rs");
        // Where `mod x;` looks for x.rs and x/mod.rs.
        let own_dir = if root || stem == "mod" {
            parent(file)
        } else {
            file.trim_end_matches(".rs").to_string()
        };
        self.modules.entry(module.clone()).or_default().file = file.to_string();
        let mut children = Vec::new();
        for decl in &scan.mods {
            let mut at = module.clone();
            at.extend(decl.within.iter().cloned());
            let mut child = at.clone();
            child.push(decl.name.clone());
            self.modules
                .entry(at)
                .or_default()
                .children
                .insert(decl.name.clone());
            if decl.inline {
                self.modules.entry(child).or_default().file = file.to_string();
                continue;
            }
            let dir = decl.within.iter().fold(own_dir.clone(), |d, m| join(&d, m));
            let found = match &decl.path_attr {
                Some(p) if decl.within.is_empty() => Some(join(&parent(file), p)),
                Some(p) => Some(join(&dir, p)),
                None => [format!("{}.rs", decl.name), format!("{}/mod.rs", decl.name)]
                    .into_iter()
                    .map(|f| join(&dir, &f))
                    .find(|f| sources.contains_key(f)),
            };
            match found {
                Some(f) if sources.contains_key(&f) => children.push((f, child)),
                _ => self
                    .errors
                    .push(format!("{file}: `mod {}`: no file for it", decl.name)),
            }
        }
        self.files.insert(file.to_string(), (module, scan));
        for (f, child) in children {
            self.load(sources, &f, child, false);
        }
    }

    /// The module a path written in module `at` (of file module
    /// `file_module`) names: the longest prefix of it that is a module;
    /// `None` for a path outside the package's crates (std, a dependency)
    /// or one that starts with no module (a type, a variable).
    fn resolve(
        &self,
        file_module: &[String],
        at: &[String],
        path: &[String],
    ) -> Option<Vec<String>> {
        let first = path.first()?;
        let (mut m, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" => (vec![at[0].clone()], &path[1..]),
            "self" | "super" => (at.to_vec(), path),
            LIB if at[0] != LIB => (vec![LIB.to_string()], &path[1..]),
            name => {
                // A module declared in this module or, for an inline module
                // (`mod tests { use super::*; .. }`), one around it.
                let mut scope = at.to_vec();
                loop {
                    if self
                        .modules
                        .get(&scope)
                        .is_some_and(|m| m.children.contains(name))
                    {
                        break (scope, path);
                    }
                    if scope.len() <= file_module.len() {
                        return None;
                    }
                    scope.pop();
                }
            }
        };
        for seg in rest {
            match seg.as_str() {
                "self" => {}
                "super" => {
                    m.pop();
                }
                name if self
                    .modules
                    .get(&m)
                    .is_some_and(|m| m.children.contains(name)) =>
                {
                    m.push(name.to_string())
                }
                _ => break,
            }
        }
        Some(m)
    }

    /// File → the files it depends on, each with the first path that
    /// makes it so.
    fn dependencies(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut deps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (file, (module, scan)) in &self.files {
            let edges = deps.entry(file.clone()).or_default();
            for u in &scan.uses {
                let mut at = module.clone();
                at.extend(u.within.iter().cloned());
                let Some(target) = self.resolve(module, &at, &u.segments) else {
                    continue;
                };
                let Some(m) = self.modules.get(&target) else {
                    continue;
                };
                if m.file != *file && !m.file.is_empty() {
                    edges
                        .entry(m.file.clone())
                        .or_insert_with(|| u.segments.join("::"));
                }
            }
        }
        deps
    }
}

/// The strongly connected groups of more than one file (Tarjan), each
/// sorted, in order of their first file.
fn cycles(deps: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        deps: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a str) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on_stack.insert(v);
        for w in st.deps.get(v).into_iter().flat_map(|e| e.keys()) {
            if !st.index.contains_key(w.as_str()) {
                visit(st, w);
                let lw = st.low[w.as_str()];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(w.as_str()) {
                let iw = st.index[w.as_str()];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut group = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                st.groups.push(group);
            }
        }
    }
    let mut st = State {
        deps,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in deps.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.groups.sort();
    st.groups
}

/// A cycle group as the failure message prints it: its files, and each
/// dependency between two of them with the path that makes it.
fn describe(group: &[String], deps: &BTreeMap<String, BTreeMap<String, String>>) -> String {
    let mut s = format!("cycle of {} files: {}\n", group.len(), group.join(", "));
    for from in group {
        for (to, via) in &deps[from] {
            if group.contains(to) {
                s += &format!("    {from} -> {to}  (`{via}`)\n");
            }
        }
    }
    s
}

// ---- the checks on src/

fn in_allowed_dirs(file: &str) -> bool {
    ALLOWED_DIRS.iter().any(|d| file.starts_with(d))
}

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_src() -> BTreeMap<String, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.insert(rel, text);
            }
        }
    }
    let base = package_dir();
    let mut out = BTreeMap::new();
    walk(&base.join("src"), &base, &mut out);
    out
}

#[test]
fn allow_lists_name_only_the_folders_being_rewritten() {
    for file in ALLOWED_CYCLES
        .iter()
        .flat_map(|g| g.iter())
        .chain(ALLOWED_LONG)
    {
        assert!(
            in_allowed_dirs(file),
            "{file}: only {ALLOWED_DIRS:?} may be allow-listed"
        );
    }
}

#[test]
fn no_file_cycles() {
    let sources = read_src();
    let tree = Tree::build(&sources);
    assert!(tree.errors.is_empty(), "{}", tree.errors.join("\n"));
    let deps = tree.dependencies();
    let found = cycles(&deps);
    let allowed: BTreeSet<Vec<String>> = ALLOWED_CYCLES
        .iter()
        .map(|g| {
            let mut g: Vec<String> = g.iter().map(|f| f.to_string()).collect();
            g.sort();
            g
        })
        .collect();
    let mut report = String::new();
    for group in &found {
        if allowed.contains(group) {
            println!("allow-listed {}", describe(group, &deps));
        } else {
            report += &describe(group, &deps);
        }
    }
    for group in &allowed {
        if !found.contains(group) {
            report += &format!(
                "allow-listed cycle no longer found (remove it from ALLOWED_CYCLES): {}\n",
                group.join(", ")
            );
        }
    }
    println!(
        "{} files, {} dependencies, {} cycle groups",
        deps.len(),
        deps.values().map(BTreeMap::len).sum::<usize>(),
        found.len()
    );
    assert!(report.is_empty(), "cycles of files in src/:\n{report}");
}

#[test]
fn no_long_files() {
    let sources = read_src();
    let mut report = String::new();
    for (file, text) in &sources {
        let lines = text.lines().count();
        let allowed = ALLOWED_LONG.contains(&file.as_str());
        if lines > MAX_LINES {
            println!(
                "{file}: {lines} lines{}",
                if allowed { " (allow-listed)" } else { "" }
            );
            if !allowed {
                report += &format!("{file}: {lines} lines (at most {MAX_LINES})\n");
            }
        } else if allowed {
            report += &format!(
                "{file}: {lines} lines, allow-listed as too long (remove it from ALLOWED_LONG)\n"
            );
        }
    }
    for file in ALLOWED_LONG {
        if !sources.contains_key(*file) {
            report += &format!("{file}: allow-listed but not in src/ (remove it)\n");
        }
    }
    assert!(
        report.is_empty(),
        "files of src/ over {MAX_LINES} lines:\n{report}"
    );
}

// ---- the parser on small sources

fn idents(src: &str) -> Vec<String> {
    tokens(src)
        .into_iter()
        .filter_map(|t| match t {
            Tok::Ident(s) => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn tokens_skip_comments_and_literals() {
    let src = r##"
        // crate::a::line
        /* crate::b /* nested crate::c */ still */
        /// crate::doc
        let s = "crate::d \" crate::e";
        let r = r#"crate::f " crate::g"#;
        let b = b"crate::h"; let q = '"'; let e = '\''; let bs = '\\';
        fn f<'a>(x: &'a str) -> char { 'x' }
        let raw = r#match;
        1.5e3u64
    "##;
    assert_eq!(
        idents(src),
        [
            "let", "s", "let", "r", "let", "b", "let", "q", "let", "e", "let", "bs", "fn", "f",
            "x", "str", "char", "let", "raw", "match"
        ]
    );
}

fn deps_of(files: &[(&str, &str)]) -> (Tree, BTreeMap<String, BTreeMap<String, String>>) {
    let sources: BTreeMap<String, String> = files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    let tree = Tree::build(&sources);
    let deps = tree.dependencies();
    (tree, deps)
}

fn targets(deps: &BTreeMap<String, BTreeMap<String, String>>, file: &str) -> Vec<String> {
    deps[file].keys().cloned().collect()
}

#[test]
fn dependencies_follow_paths_to_the_defining_file() {
    let (tree, deps) = deps_of(&[
        ("src/lib.rs", "pub mod a; mod b; pub use a::X;"),
        (
            "src/a/mod.rs",
            "mod child; pub use child::Y; pub struct X; \
             #[cfg(test)] mod tests { use super::*; fn t() { child::f(); } }",
        ),
        (
            "src/a/child.rs",
            "pub struct Y; pub fn f() { super::super::b::g(); }",
        ),
        (
            "src/b.rs",
            "mod inner; use crate::a::{self, child::{Y as Z}};",
        ),
        (
            "src/b/inner.rs",
            "// use crate::a;\nfn x() -> &'static str { \"crate::a::X\" }",
        ),
        (
            "src/bin/tool/main.rs",
            "#[path = \"extra.rs\"] mod more; use ringlock::a::X;",
        ),
        (
            "src/bin/tool/extra.rs",
            "pub(in crate) fn h() { crate::main(); }",
        ),
    ]);
    assert!(tree.errors.is_empty(), "{:?}", tree.errors);
    assert_eq!(targets(&deps, "src/lib.rs"), ["src/a/mod.rs"]);
    assert_eq!(targets(&deps, "src/a/mod.rs"), ["src/a/child.rs"]);
    assert_eq!(targets(&deps, "src/a/child.rs"), ["src/b.rs"]);
    assert_eq!(
        targets(&deps, "src/b.rs"),
        ["src/a/child.rs", "src/a/mod.rs"]
    );
    assert!(targets(&deps, "src/b/inner.rs").is_empty());
    assert_eq!(targets(&deps, "src/bin/tool/main.rs"), ["src/a/mod.rs"]);
    assert_eq!(
        targets(&deps, "src/bin/tool/extra.rs"),
        ["src/bin/tool/main.rs"]
    );
    // a/mod.rs re-exports child.rs's Y, child.rs calls into b.rs, b.rs
    // imports a/mod.rs.
    assert_eq!(
        cycles(&deps),
        [["src/a/child.rs", "src/a/mod.rs", "src/b.rs"]]
    );
}

#[test]
fn unreached_files_and_missing_modules_are_errors() {
    let (tree, _) = deps_of(&[("src/lib.rs", "mod gone;"), ("src/stray.rs", "")]);
    assert_eq!(
        tree.errors,
        [
            "src/lib.rs: `mod gone`: no file for it",
            "src/stray.rs: no crate root's `mod` declarations reach it"
        ]
    );
}
