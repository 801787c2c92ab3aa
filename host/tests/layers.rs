//! The host's layers, as `src/lib.rs` documents them (section "Layers"):
//! each folder of `src/` is one layer (a layer is one folder, or the files
//! beside `lib.rs`), every module of a folder belongs to its folder's
//! layer, no folder uses a folder above it, every `crate::`, `super::` and
//! `self::` path in the non-test code of a file under `src/` names a module
//! of the same layer or of one below, and no modules use each other round a
//! circle. A failure names the file and line of each offending path.
//!
//! Test code (`#[cfg(test)]` modules, `tests.rs` files) is not read: it may
//! use whatever it tests with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One use of a module by another, where it is written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    file: String,
    line: usize,
}

/// The layers listed in the "Layers" section of the crate docs, top first:
/// each bullet's module paths, the backticked names before its ` — `.
fn layers(lib: &str) -> Vec<Vec<String>> {
    let mut items: Vec<String> = Vec::new();
    let mut in_section = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        if let Some(heading) = doc.strip_prefix("# ") {
            in_section = heading == "Layers";
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some(item) = doc.strip_prefix("- ") {
            items.push(item.to_owned());
        } else if let (Some(rest), Some(last)) = (doc.strip_prefix("  "), items.last_mut()) {
            last.push(' ');
            last.push_str(rest.trim_start());
        }
    }
    items
        .iter()
        .map(|item| {
            let head = item.split(" — ").next().unwrap_or_default();
            head.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The module path of a file under `src/` (`reconcile/validate/counts`;
/// `cli` for `cli/mod.rs`), and whether it is a folder's `mod.rs`.
fn module_of(rel: &str) -> (String, bool) {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    match stem.strip_suffix("/mod") {
        Some(folder) => (folder.to_owned(), true),
        None => (stem.to_owned(), false),
    }
}

/// The text with comments, string literals and char literals blanked
/// (newlines kept, so line numbers stay right).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && (i == 0 || !is_ident(chars[i - 1]))
            && raw_string_at(&chars, i).is_some()
        {
            let end = raw_string_at(&chars, i).unwrap_or(i + 1);
            for &ch in &chars[i..end] {
                out.push(blank(ch));
            }
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && char_literal_len(&chars, i).is_some() {
            let len = char_literal_len(&chars, i).unwrap_or(1);
            out.extend(std::iter::repeat_n(' ', len));
            i += len;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The end of a raw string literal starting at `i` (`r"…"`, `r#"…"#`).
fn raw_string_at(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// The length of a char literal starting at `i` (`'x'`, `'\n'`, `'\u{1F600}'`);
/// `None` for a lifetime.
fn char_literal_len(chars: &[char], i: usize) -> Option<usize> {
    if chars.get(i + 1) == Some(&'\\') {
        let close = (i + 3..chars.len().min(i + 14)).find(|&j| chars[j] == '\'')?;
        return Some(close - i + 1);
    }
    (chars.get(i + 2) == Some(&'\'')).then_some(3)
}

/// Per line of code: whether it is test code, and the inline modules
/// (`mod name { … }`) it sits in.
struct LineInfo {
    test: bool,
    inline: Vec<String>,
}

/// Reads the inline modules of a file, and the test-only submodules it
/// declares (`#[cfg(test)] mod tests;`).
fn line_infos(code: &str) -> (Vec<LineInfo>, Vec<String>) {
    let mut infos = Vec::new();
    let mut test_files = Vec::new();
    let mut depth: i64 = 0;
    // (name, depth outside it, is test code)
    let mut stack: Vec<(String, i64, bool)> = Vec::new();
    let mut cfg_test = false;
    for line in code.lines() {
        let trimmed = line.trim();
        let words: Vec<&str> = trimmed
            .split(|c: char| c.is_whitespace() || c == '{' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        let mod_at = words.iter().position(|w| *w == "mod");
        let declares = mod_at.filter(|&at| {
            words[..at]
                .iter()
                .all(|w| *w == "pub" || w.starts_with("pub("))
        });
        let in_test = stack.last().is_some_and(|s| s.2);
        if let Some(at) = declares
            && let Some(name) = words.get(at + 1)
        {
            if trimmed.ends_with(';') {
                if cfg_test {
                    test_files.push((*name).to_owned());
                }
            } else if trimmed.ends_with('{') {
                stack.push(((*name).to_owned(), depth, cfg_test || in_test));
            }
        }
        let test = stack.last().is_some_and(|s| s.2) || cfg_test;
        infos.push(LineInfo {
            test,
            inline: stack.iter().map(|s| s.0.clone()).collect(),
        });
        if trimmed == "#[cfg(test)]" {
            cfg_test = true;
        } else if !trimmed.starts_with("#[") && !trimmed.is_empty() {
            cfg_test = false;
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    while stack.last().is_some_and(|s| s.1 == depth) {
                        stack.pop();
                    }
                }
                _ => {}
            }
        }
    }
    (infos, test_files)
}

/// The paths of a use tree at `chars[i..]` (after `prefix::`): `a::b`,
/// `{a, b::{c, d}}`, `self`, `*`, `x as y`.
fn use_tree(chars: &[char], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        match chars.get(i) {
            Some('{') => {
                i += 1;
                loop {
                    while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                        i += 1;
                    }
                    match chars.get(i) {
                        None => return i,
                        Some('}') => return i + 1,
                        _ => i = use_tree(chars, i, &path, out),
                    }
                }
            }
            Some('*') => {
                out.push(path);
                return i + 1;
            }
            Some(c) if is_ident(*c) => {
                let start = i;
                while chars.get(i).is_some_and(|c| is_ident(*c)) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                if word != "self" {
                    path.push(word);
                }
                if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
                    i += 2;
                    continue;
                }
                out.push(path);
                // Skip `as name` and anything else up to the item's end.
                while chars
                    .get(i)
                    .is_some_and(|c| !matches!(c, ',' | '}' | ';' | ')' | '(' | '<' | '>' | '='))
                    && !(chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':'))
                {
                    if !chars[i].is_whitespace() && !is_ident(chars[i]) {
                        break;
                    }
                    i += 1;
                }
                return i;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// The module a path names: its longest prefix that is a module.
fn resolve(modules: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].join("/"))
        .find(|m| modules.contains(m))
}

/// Every use of one module by another in the non-test code of `files`
/// (paths relative to `src/`, and their text).
fn edges(files: &[(String, String)]) -> Vec<Edge> {
    let mut modules: BTreeSet<String> = files.iter().map(|(rel, _)| module_of(rel).0).collect();
    modules.insert(String::new());
    let mut test_modules = BTreeSet::new();
    let mut parsed = Vec::new();
    for (rel, text) in files {
        let (module, _) = module_of(rel);
        let code = code_only(text);
        let (infos, tests) = line_infos(&code);
        // `mod x;` in `a.rs` or `a/mod.rs` is `a/x`; in `lib.rs`, `x`.
        for t in tests {
            test_modules.insert(if rel == "lib.rs" {
                t
            } else {
                format!("{module}/{t}")
            });
        }
        parsed.push((rel.clone(), module, code, infos));
    }
    let mut out = Vec::new();
    for (rel, module, code, infos) in parsed {
        if rel == "lib.rs" || rel == "main.rs" || test_modules.contains(&module) {
            continue;
        }
        let chars: Vec<char> = code.chars().collect();
        let mut line = 1;
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '\n' {
                line += 1;
                i += 1;
                continue;
            }
            let starts_word = i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == '$');
            let kw = ["crate", "super", "self"].into_iter().find(|kw| {
                let end = i + kw.len();
                starts_word
                    && chars.len() > end + 1
                    && chars[i..end].iter().copied().eq(kw.chars())
                    && chars[end] == ':'
                    && chars[end + 1] == ':'
            });
            let Some(kw) = kw else {
                i += 1;
                continue;
            };
            let info = &infos[line - 1];
            if info.test {
                i += kw.len();
                continue;
            }
            let mut here: Vec<String> = module
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            here.extend(info.inline.iter().cloned());
            let mut j = i;
            let base: Vec<String> = if kw == "crate" {
                j += "crate::".len();
                Vec::new()
            } else if kw == "self" {
                j += "self::".len();
                here
            } else {
                let mut base = here;
                while chars[j..].starts_with(&['s', 'u', 'p', 'e', 'r', ':', ':']) {
                    base.pop();
                    j += "super::".len();
                }
                base
            };
            let mut paths = Vec::new();
            let end = use_tree(&chars, j, &base, &mut paths);
            for path in paths {
                if let Some(to) = resolve(&modules, &path)
                    && to != module
                {
                    out.push(Edge {
                        from: module.clone(),
                        to,
                        file: format!("src/{rel}"),
                        line,
                    });
                }
            }
            line += chars[i..end.max(i)].iter().filter(|c| **c == '\n').count();
            i = end.max(i + 1);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The layer of a module, counted from the top (0): its longest listed
/// path.
fn layer_of(layers: &[Vec<String>], module: &str) -> Option<(usize, String)> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(n, paths)| paths.iter().map(move |p| (n, p.clone())))
        .filter(|(_, p)| module == p || module.starts_with(&format!("{p}/")))
        .max_by_key(|(_, p)| p.len())
}

/// The folder of a module (`plugin` for `plugin/cache` and for `plugin`
/// when it is `plugin/mod.rs`), or `None` for a file beside `lib.rs`.
fn folder_of(module: &str, folders: &BTreeSet<String>) -> Option<String> {
    let first = module.split('/').next().unwrap_or_default();
    folders.contains(first).then(|| first.to_owned())
}

/// What is wrong with the folders of `files` against `layers`: a layer that
/// is not one folder (nor only files beside `lib.rs`), a folder that is no
/// layer, a module of a folder in another layer than its folder's, and a
/// folder that uses a folder above it (the first such use of each pair,
/// with its file and line).
fn folder_problems(
    files: &[(String, String)],
    layers: &[Vec<String>],
    modules: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let folders: BTreeSet<String> = files
        .iter()
        .filter_map(|(rel, _)| rel.split_once('/').map(|(dir, _)| dir.to_owned()))
        .collect();
    let mut layer_of_folder: BTreeMap<String, usize> = BTreeMap::new();
    let mut root_layer = None;
    for (n, paths) in layers.iter().enumerate() {
        let listed_folders: Vec<&String> = paths.iter().filter(|p| folders.contains(*p)).collect();
        if let [folder] = listed_folders[..]
            && paths.len() == 1
        {
            layer_of_folder.insert(folder.clone(), n);
        } else if listed_folders.is_empty() && paths.iter().all(|p| !p.contains('/')) {
            if root_layer.replace(n).is_some() {
                out.push(format!(
                    "the layer list names files beside lib.rs in two layers; the second is {paths:?}"
                ));
            }
        } else {
            out.push(format!(
                "the layer {paths:?} is not one folder of src/ (nor only files beside lib.rs)"
            ));
        }
    }
    for folder in &folders {
        if !layer_of_folder.contains_key(folder) {
            out.push(format!(
                "folder `{folder}/` is no layer: list it alone in the Layers section of src/lib.rs"
            ));
        }
    }
    for m in modules {
        let (Some(folder), Some((n, at))) = (folder_of(m, &folders), layer_of(layers, m)) else {
            continue;
        };
        if let Some(&own) = layer_of_folder.get(&folder)
            && own != n
        {
            out.push(format!(
                "module `{m}` is in the layer of `{at}`, not in that of its folder `{folder}/`"
            ));
        }
    }
    let layer_of_module = |m: &str| match folder_of(m, &folders) {
        Some(folder) => layer_of_folder.get(&folder).copied(),
        None => root_layer,
    };
    let mut seen = BTreeSet::new();
    let mut edges = edges(files);
    edges.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    for e in edges {
        let (Some(from), Some(to)) = (layer_of_module(&e.from), layer_of_module(&e.to)) else {
            continue;
        };
        let place = |m: &str| {
            folder_of(m, &folders).map_or("the files beside lib.rs".to_owned(), |f| {
                format!("folder `{f}/`")
            })
        };
        let pair = (place(&e.from), place(&e.to));
        if to < from && seen.insert(pair.clone()) {
            out.push(format!(
                "{}:{}: `{}` (layer of {}) uses `{}` (layer of {}, above it)",
                e.file, e.line, e.from, pair.0, e.to, pair.1
            ));
        }
    }
    out
}

/// What is wrong with `files` against `layers`: modules in no layer, listed
/// paths that are no module, uses that point up, and circles.
fn problems(files: &[(String, String)], layers: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| module_of(rel).0)
        .filter(|m| m != "lib" && m != "main")
        .collect();
    for listed in layers.iter().flatten() {
        if !modules.contains(listed) {
            out.push(format!(
                "the layer list names `{listed}`, which is no module"
            ));
        }
    }
    for m in &modules {
        if layer_of(layers, m).is_none() {
            out.push(format!(
                "module `{m}` is in no layer: list it in the Layers section of src/lib.rs"
            ));
        }
    }
    let edges = edges(files);
    for e in &edges {
        let (Some((from, from_at)), Some((to, to_at))) =
            (layer_of(layers, &e.from), layer_of(layers, &e.to))
        else {
            if e.to.is_empty() {
                out.push(format!(
                    "{}:{}: `{}` uses the crate root; name the module that defines the item",
                    e.file, e.line, e.from
                ));
            }
            continue;
        };
        if to < from {
            out.push(format!(
                "{}:{}: `{}` (layer of `{from_at}`) uses `{}` (layer of `{to_at}`, above it)",
                e.file, e.line, e.from, e.to
            ));
        }
    }
    // Circles: a module may use the modules it declares (`x/mod.rs` or
    // `x.rs` using `x/y.rs`).
    let folder_uses_its_own = |e: &Edge| e.to.starts_with(&format!("{}/", e.from));
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges.iter().filter(|e| !folder_uses_its_own(e)) {
        graph.entry(&e.from).or_default().insert(&e.to);
    }
    for circle in strongly_connected(&graph) {
        let inside: Vec<String> = edges
            .iter()
            .filter(|e| {
                !folder_uses_its_own(e)
                    && circle.contains(e.from.as_str())
                    && circle.contains(e.to.as_str())
            })
            .map(|e| format!("{}:{}: `{}` uses `{}`", e.file, e.line, e.from, e.to))
            .collect();
        out.push(format!(
            "modules use each other round a circle: {}",
            inside.join("; ")
        ));
    }
    out
}

/// The strongly connected sets of more than one module (Tarjan).
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<&'a str>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in g.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                set.insert(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}

/// Every `.rs` file under `dir`, as (path relative to `root`, text).
fn read_tree(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(root, &path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((rel, text));
        }
    }
}

fn host_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&root, &root, &mut files);
    files
}

#[test]
fn every_import_of_the_host_points_down_its_documented_layers() {
    let files = host_sources();
    let lib = &files.iter().find(|(rel, _)| rel == "lib.rs").unwrap().1;
    let layers = layers(lib);
    assert!(
        layers.len() >= 10 && layers.iter().all(|l| !l.is_empty()),
        "the Layers section of src/lib.rs lists {layers:?}"
    );
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| module_of(rel).0)
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut problems = folder_problems(&files, &layers, &modules);
    problems.extend(self::problems(&files, &layers));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_import_reader_sees_the_host_s_known_uses() {
    // The check above passes vacuously if nothing is read: these uses exist.
    let edges = edges(&host_sources());
    for (from, to) in [
        ("controller/worker", "reconcile/decide"),
        ("reconcile/decide", "judge/validate"),
        ("judge/snapshot", "judge/existing"),
        ("logging", "key"),
        ("cli/run", "delivery/config"),
        ("execute", "lease/leader"),
        ("plugin", "sandbox"),
    ] {
        assert!(
            edges.iter().any(|e| e.from == from && e.to == to),
            "no use of {to} by {from} found among {} uses",
            edges.len()
        );
    }
}

fn tree(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
        .collect()
}

const TWO_LAYERS: &str =
    "//! # Layers\n//!\n//! - `top`, `low/high` — up;\n//!   more words\n//! - `low` — down.\n";

#[test]
fn an_import_that_points_up_is_named_with_its_file_and_line() {
    let layers = layers(TWO_LAYERS);
    assert_eq!(layers, [vec!["top", "low/high"], vec!["low"]]);
    let files = tree(&[
        ("lib.rs", TWO_LAYERS),
        ("top.rs", "pub fn go() {}\n"),
        (
            "low/mod.rs",
            "pub mod high;\n\nfn f() {\n    crate::top::go();\n}\n",
        ),
        ("low/high.rs", "use super::thing;\n"),
    ]);
    assert_eq!(
        problems(&files, &layers),
        ["src/low/mod.rs:4: `low` (layer of `low`) uses `top` (layer of `top`, above it)"]
    );
}

#[test]
fn a_circle_within_one_layer_is_named_but_a_module_using_its_own_modules_is_not() {
    let layers = layers("//! # Layers\n//!\n//! - `a`, `b`, `c`, `e` — one layer.\n");
    let files = tree(&[
        ("lib.rs", ""),
        ("a.rs", "use crate::b::{x, y::{z}};\n"),
        (
            "b.rs",
            "fn f() { let _ = \"crate::c::no\"; } // crate::c::no\nuse crate::{\n    a::w,\n};\n",
        ),
        ("c/mod.rs", "mod d;\nuse self::d::D;\n"),
        ("c/d.rs", "use super::C;\n"),
        ("e.rs", "mod f;\nuse self::f::F;\n"),
        ("e/f.rs", "use super::E;\n"),
    ]);
    let found = problems(&files, &layers);
    assert_eq!(
        found,
        [
            "modules use each other round a circle: src/a.rs:1: `a` uses `b`; src/b.rs:2: `b` uses `a`"
        ]
    );
}

#[test]
fn test_code_and_strings_and_comments_are_not_imports() {
    let files = tree(&[
        ("lib.rs", ""),
        (
            "a.rs",
            "/* crate::b::x */\nconst S: &str = r#\"crate::b\"#;\nconst C: char = '\"';\nfn f<'a>(x: &'a str) {}\n#[cfg(test)]\nmod tests {\n    use crate::b::x;\n}\n#[cfg(test)]\nmod more;\nfn g() { crate::b::used(); }\n",
        ),
        ("a/more.rs", "use crate::b::y;\n"),
        ("b.rs", ""),
    ]);
    let found = edges(&files);
    assert_eq!(
        found,
        [Edge {
            from: "a".into(),
            to: "b".into(),
            file: "src/a.rs".into(),
            line: 11
        }]
    );
}

const FOLDER_LAYERS: &str =
    "//! # Layers\n//!\n//! - `top` — up.\n//! - `low` — down.\n//! - `leaf` — leaves.\n";

/// The folder problems of a tree whose `lib.rs` is `listed`.
fn folder_problems_of(listed: &str, files: &[(&str, &str)]) -> Vec<String> {
    let mut files = tree(files);
    files.push(("lib.rs".to_owned(), listed.to_owned()));
    let modules = files
        .iter()
        .map(|(rel, _)| module_of(rel).0)
        .filter(|m| m != "lib" && m != "main")
        .collect();
    folder_problems(&files, &layers(listed), &modules)
}

#[test]
fn a_folder_that_uses_a_folder_above_it_is_named_once_with_its_first_use() {
    let deep = "use super::x;\nfn f() {\n    crate::top::run::go();\n    crate::top::go();\n}\n";
    assert_eq!(
        folder_problems_of(
            FOLDER_LAYERS,
            &[
                ("top/mod.rs", "pub mod run;\nuse crate::low::deep::x;\n"),
                ("top/run.rs", "use crate::leaf::y;\n"),
                ("low/mod.rs", "pub mod deep;\n"),
                ("low/deep.rs", deep),
                ("leaf.rs", "use crate::low::deep::z;\n"),
            ]
        ),
        [
            "src/leaf.rs:1: `leaf` (layer of the files beside lib.rs) uses `low/deep` (layer of folder `low/`, above it)",
            "src/low/deep.rs:3: `low/deep` (layer of folder `low/`) uses `top/run` (layer of folder `top/`, above it)",
        ]
    );
}

#[test]
fn a_layer_is_one_folder_and_every_module_of_a_folder_is_in_its_layer() {
    let listed = "//! # Layers\n//!\n//! - `a`, `b` — two folders.\n//! - `c` — one.\n//! - `c/d`, `e` — a module of `c` and a file.\n//! - `e` — a file.\n";
    let folders = [
        "a/mod.rs", "b/mod.rs", "c/mod.rs", "c/d.rs", "e.rs", "f/g.rs",
    ]
    .map(|f| (f, ""));
    assert_eq!(
        folder_problems_of(listed, &folders),
        [
            "the layer [\"a\", \"b\"] is not one folder of src/ (nor only files beside lib.rs)",
            "the layer [\"c/d\", \"e\"] is not one folder of src/ (nor only files beside lib.rs)",
            "folder `a/` is no layer: list it alone in the Layers section of src/lib.rs",
            "folder `b/` is no layer: list it alone in the Layers section of src/lib.rs",
            "folder `f/` is no layer: list it alone in the Layers section of src/lib.rs",
            "module `c/d` is in the layer of `c/d`, not in that of its folder `c/`",
        ]
    );
}
