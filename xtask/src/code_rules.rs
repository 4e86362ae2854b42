//! Two rules about the shape of the code, checked on the source text of every workspace crate
//! (outside tests):
//!
//! - **No file-level import cycle inside a crate.** Each source file is a module; a path that
//!   names another module of the same crate (`crate::a::b`, `super::x`, `self::y`, in a `use`
//!   or inline) is an edge to the deepest module file on that path, and an item of the crate
//!   root (a re-export, say) is an edge to the root. Declaring a child (`mod x;`) is no edge.
//!   The edges must form no cycle: a module that two others need belongs below both, and a
//!   caller gives its callee a narrow interface rather than letting it reach back.
//! - **No function over [`MAX_FUNCTION_LINES`] lines**, but for the few in [`LONG_ALLOWED`],
//!   where a table reads better in one piece.
//!
//! Code under `#[cfg(test)]` and the `tests/`, `benches/` and `examples/` directories is left
//! out. The source is read as text: comments, strings and character literals are blanked
//! first, so braces and paths inside them count for nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be, in lines from its `fn` to its closing brace.
pub(crate) const MAX_FUNCTION_LINES: usize = 150;

/// Functions allowed to be longer, as `path/from/workspace.rs:name`, each with why.
const LONG_ALLOWED: &[(&str, &str)] = &[];

/// One crate's sources: its name and its `src` directory.
pub(crate) struct CrateSources {
    pub(crate) name: String,
    pub(crate) src: PathBuf,
}

/// Every problem found in `crates`, as lines to print.
pub(crate) fn check(root: &Path, crates: &[CrateSources]) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for krate in crates {
        let files = module_files(&krate.src)?;
        let mut sources = BTreeMap::new();
        for (module, path) in &files {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            sources.insert(module.clone(), strip_tests(&blank_literals(&text)));
        }
        for cycle in import_cycles(&files, &sources) {
            let names: Vec<String> =
                cycle.iter().map(|m| display_module(&files, m, root)).collect();
            problems.push(format!(
                "{}: files import each other: {}",
                krate.name,
                names.join(" -> ")
            ));
        }
        for (module, text) in &sources {
            let path = relative(&files[module], root);
            for (name, line, lines) in long_functions(text) {
                let key = format!("{path}:{name}");
                if LONG_ALLOWED.iter().any(|(allowed, _)| *allowed == key) {
                    allowed_seen.insert(key);
                    continue;
                }
                problems.push(format!(
                    "{path}:{line}: fn {name} is {lines} lines; at most {MAX_FUNCTION_LINES} \
                     (split it, or allow it in xtask/src/code_rules.rs with the reason)"
                ));
            }
        }
    }
    for (allowed, _) in LONG_ALLOWED {
        if !allowed_seen.contains(*allowed) {
            problems.push(format!(
                "xtask/src/code_rules.rs allows {allowed} to be long, but it is not (any more): \
                 take it off the list"
            ));
        }
    }
    Ok(problems)
}

fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

fn display_module(
    files: &BTreeMap<Vec<String>, PathBuf>,
    module: &[String],
    root: &Path,
) -> String {
    files.get(module).map(|p| relative(p, root)).unwrap_or_else(|| module.join("::"))
}

/// Every module file of the crate rooted at `src` (lib.rs or main.rs), by module path.
fn module_files(src: &Path) -> Result<BTreeMap<Vec<String>, PathBuf>, String> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .find(|path| path.exists())
        .ok_or_else(|| format!("{} has no lib.rs or main.rs", src.display()))?;
    let mut files = BTreeMap::new();
    let mut pending = vec![(Vec::new(), root)];
    while let Some((module, path)) = pending.pop() {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = strip_tests(&blank_literals(&text));
        // A file's children live beside it (lib.rs, mod.rs) or in a directory of its name.
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "main.rs" | "mod.rs") => path.parent().map(Path::to_owned),
            _ => Some(path.with_extension("")),
        }
        .unwrap_or_default();
        for (child, explicit) in declared_children(&text) {
            let child_path = match explicit {
                Some(relative) => dir.join(relative),
                None if dir.join(format!("{child}.rs")).exists() => dir.join(format!("{child}.rs")),
                None => dir.join(&child).join("mod.rs"),
            };
            if child_path.exists() {
                let mut child_module = module.clone();
                child_module.push(child);
                pending.push((child_module, child_path));
            }
        }
        files.insert(module, path);
    }
    Ok(files)
}

/// The modules `text` declares from files (`mod x;`, `#[path = "..."] mod x;`).
fn declared_children(text: &str) -> Vec<(String, Option<String>)> {
    let mut children = Vec::new();
    let mut path_attribute: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("#[path") {
            // The path itself was blanked with the strings; keep only that one was given.
            path_attribute = Some(rest.to_owned());
            continue;
        }
        let declaration = line
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ");
        if let Some(rest) = declaration.strip_prefix("mod ")
            && let Some(name) = rest.strip_suffix(';')
        {
            // A #[path] module's file is named in a string: it is not followed (wharf uses
            // them only for sources shared with a build script).
            if path_attribute.take().is_none() {
                children.push((name.trim().to_owned(), None));
            }
        } else if !line.starts_with("#[") {
            path_attribute = None;
        }
    }
    children
}

/// Edges from each module file to the module files it names, and the cycles among them. A
/// re-export (`pub use`) is no edge of the file that makes it; a path through one is an edge
/// to the module it re-exports from.
fn import_cycles(
    files: &BTreeMap<Vec<String>, PathBuf>,
    sources: &BTreeMap<Vec<String>, String>,
) -> Vec<Vec<Vec<String>>> {
    let mut reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut uses: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
    for (module, text) in sources {
        let (used, exported) = split_reexports(text);
        let children: Vec<String> = files
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .filter_map(|m| m.last().cloned())
            .collect();
        uses.insert(module.clone(), module_paths(&used, module, &children));
        let names = reexports.entry(module.clone()).or_default();
        for path in module_paths(&exported, module, &children) {
            if let Some(name) = path.last() {
                names.insert(name.clone(), path.clone());
            }
        }
    }
    let resolve = |mut path: Vec<String>| -> Vec<String> {
        for _ in 0..8 {
            let mut target = path.clone();
            while !target.is_empty() && !files.contains_key(&target) {
                target.pop();
            }
            let rest = &path[target.len()..];
            match rest.first().and_then(|name| reexports.get(&target)?.get(name)) {
                Some(origin) if *origin != path => {
                    let mut through = origin.clone();
                    through.extend_from_slice(&rest[1..]);
                    path = through;
                }
                _ => return target,
            }
        }
        Vec::new()
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, paths) in uses {
        let targets: BTreeSet<Vec<String>> =
            paths.into_iter().map(&resolve).filter(|target| *target != module).collect();
        edges.insert(module, targets);
    }
    cycles(&edges)
}

/// `text` split in two: its code without the re-exports (`pub use ...;`, `pub(crate) use
/// ...;`), and the re-exports alone.
fn split_reexports(text: &str) -> (String, String) {
    let (mut code, mut exported) = (String::with_capacity(text.len()), String::new());
    let mut rest = text;
    loop {
        let next = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter_map(|prefix| rest.find(prefix))
            .min();
        let Some(start) = next else { break };
        let end = rest[start..].find(';').map_or(rest.len(), |i| start + i + 1);
        code.push_str(&rest[..start]);
        code.extend(rest[start..end].chars().filter(|&c| c == '\n'));
        exported.push_str(&rest[start..end]);
        exported.push('\n');
        rest = &rest[end..];
    }
    code.push_str(rest);
    (code, exported)
}

/// The absolute module paths `text` (the source of `module`) names: `crate::a::b::Item` is
/// `[a, b, Item]`, `super::x`, `self::y` and a child's name (`child::Item`, as a parent names
/// its own module `child`) are resolved against `module`. `use` groups
/// (`crate::a::{b, c::D}`) give each member.
fn module_paths(text: &str, module: &[String], children: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &text[at..];
        let start_ok = at == 0 || !is_ident_byte(bytes[at - 1]) && bytes[at - 1] != b':';
        let base: Option<(Vec<String>, usize)> = if !start_ok {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("self::") {
            Some((module.to_vec(), "self::".len()))
        } else if let Some(child) = children
            .iter()
            .find(|c| rest.starts_with(c.as_str()) && rest[c.len()..].starts_with("::"))
        {
            let mut base = module.to_vec();
            base.push(child.clone());
            Some((base, child.len() + 2))
        } else if rest.starts_with("super::") {
            let mut base = module.to_vec();
            let mut length = 0;
            while text[at + length..].starts_with("super::") {
                base.pop();
                length += "super::".len();
            }
            Some((base, length))
        } else {
            None
        };
        match base {
            Some((base, length)) => {
                let (found, used) = path_tail(&text[at + length..], base);
                paths.extend(found);
                at += length + used.max(1);
            }
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    paths
}

/// The paths that continue `base` at the start of `text`, and how much of `text` they took.
fn path_tail(text: &str, base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = base;
    let mut at = 0;
    loop {
        let ident: String = text[at..].chars().take_while(|c| is_ident_char(*c)).collect();
        if !ident.is_empty() {
            path.push(ident.clone());
            at += ident.len();
            if text[at..].starts_with("::") {
                at += 2;
                continue;
            }
            return (vec![path], at);
        }
        if text[at..].starts_with('{') {
            // A group: each member continues the path.
            let end = matching_brace(&text[at..]).unwrap_or(text.len() - at);
            let inner = &text[at + 1..at + end];
            let mut found = Vec::new();
            for member in split_top_level(inner) {
                let member = member.trim();
                if member.is_empty() || member == "self" {
                    found.push(path.clone());
                    continue;
                }
                let (paths, _) = path_tail(member, path.clone());
                found.extend(paths);
            }
            return (found, end + 1);
        }
        return (vec![path], at);
    }
}

/// The parts of a `use` group's inside, split at its top-level commas.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// The cycles of `edges` (strongly connected components of more than one node, and nodes
/// with an edge to themselves), each as one cycle through some of its nodes.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    let nodes: Vec<&Vec<String>> = edges.keys().collect();
    let reach = |from: &Vec<String>| -> BTreeSet<Vec<String>> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let mut reported: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut found = Vec::new();
    for node in nodes {
        if reported.contains(node) || !reach(node).contains(node) {
            continue;
        }
        // One cycle through `node`: a shortest way back to it.
        let mut previous: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([node.clone()]);
        let mut back = None;
        while let Some(current) = queue.pop_front() {
            for next in edges.get(&current).into_iter().flatten() {
                if next == node {
                    back = Some(current.clone());
                    break;
                }
                if !previous.contains_key(next) {
                    previous.insert(next.clone(), current.clone());
                    queue.push_back(next.clone());
                }
            }
            if back.is_some() {
                break;
            }
        }
        // Every node of this strongly connected component is reported with this one cycle.
        let from_node = reach(node);
        for other in &from_node {
            if reach(other).contains(node) {
                reported.insert(other.clone());
            }
        }
        let mut cycle = vec![node.clone()];
        let mut step = back;
        let mut tail = Vec::new();
        while let Some(current) = step {
            if &current == node {
                break;
            }
            tail.push(current.clone());
            step = previous.get(&current).cloned();
        }
        tail.reverse();
        cycle.extend(tail);
        cycle.push(node.clone());
        reported.extend(cycle.iter().cloned());
        found.push(cycle);
    }
    found
}

/// Each function in `text` longer than the limit: its name, first line, and length.
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let mut long = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find("fn ") {
        let start = at + found;
        at = start + 3;
        if start > 0 && is_ident_byte(bytes[start - 1]) {
            continue;
        }
        let name: String = text[at..].chars().take_while(|c| is_ident_char(*c)).collect();
        if name.is_empty() {
            continue;
        }
        // The body starts at the first `{` before any `;` (a declaration without a body).
        let Some(open) = text[at..].find(['{', ';']).map(|i| at + i) else { break };
        if bytes[open] == b';' {
            continue;
        }
        let Some(length) = matching_brace(&text[open..]) else { break };
        let close = open + length;
        let first_line = text[..start].matches('\n').count() + 1;
        let lines = text[start..=close].matches('\n').count() + 1;
        if lines > MAX_FUNCTION_LINES {
            long.push((name, first_line, lines));
        }
    }
    long
}

/// The index, in `text` (which starts with `{`), of the brace that closes it.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, byte) in text.bytes().enumerate() {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `text` with the insides of comments, strings and character literals replaced by spaces
/// (newlines kept), so that only code is left to read.
pub(crate) fn blank_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
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
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && (i == 0 || !is_ident_char(chars[i - 1]))
            && raw_string_start(&chars[i..]).is_some()
        {
            let (prefix, hashes) = raw_string_start(&chars[i..]).unwrap_or((0, 0));
            for _ in 0..prefix {
                out.push(' ');
            }
            i += prefix;
            let closing: Vec<char> =
                std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                out.push(blank(chars[i]));
                i += 1;
            }
            for _ in 0..closing.len().min(chars.len().saturating_sub(i)) {
                out.push(' ');
                i += 1;
            }
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
        } else if c == '\'' {
            // A character literal ('x', '\n', '\'', '\u{..}'), or else a lifetime.
            let literal_end = if next == Some('\\') {
                chars[i + 2..].iter().position(|&c| c == '\'').map(|p| i + 2 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match literal_end {
                Some(end) => {
                    for _ in i..=end {
                        out.push(' ');
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// If `chars` starts a raw string (`r"`, `r#"`, `br##"` ...): the length of its opening and
/// its number of `#`.
fn raw_string_start(chars: &[char]) -> Option<(usize, usize)> {
    let mut i = usize::from(chars.first() == Some(&'b'));
    if chars.get(i) != Some(&'r') {
        return None;
    }
    i += 1;
    let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
    i += hashes;
    (chars.get(i) == Some(&'"')).then_some((i + 1, hashes))
}

/// `text` without the items under `#[cfg(test)]` (a module, a function, an impl).
pub(crate) fn strip_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..found]);
        let after = &rest[found..];
        // The item ends at its closing brace, or at a `;` before any brace (`mod tests;`).
        let open = after.find('{');
        let semicolon = after.find(';');
        let end = match (open, semicolon) {
            (_, Some(s)) if open.is_none_or(|o| s < o) => s,
            (Some(o), _) => o + matching_brace(&after[o..]).unwrap_or(after.len() - o - 1),
            _ => after.len() - 1,
        };
        // Keep the line count, so line numbers stay true.
        out.extend(after[..=end].chars().filter(|&c| c == '\n'));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_comments_are_blanked_with_their_lines_kept() {
        let text = "let a = \"{ crate::x }\"; // crate::y {\nlet b = '{'; let c: &'a str = r#\"}\"#;\n/* { */ fn f() {}";
        let blanked = blank_literals(text);
        assert_eq!(blanked.lines().count(), text.lines().count());
        assert!(!blanked.contains("crate::"), "{blanked}");
        assert_eq!(blanked.matches('{').count(), 1, "{blanked}");
        assert!(blanked.contains("&'a str"), "a lifetime is no literal: {blanked}");
    }

    #[test]
    fn paths_resolve_against_the_module_and_groups_give_each_member() {
        let module = vec!["a".to_owned(), "b".to_owned()];
        let paths = module_paths(
            "use crate::x::{y, z::W};\nuse super::c::D;\nlet v = self::e::f();\nsuper::super::g::H\n\
             let r = api::router(); other::api::x();",
            &module,
            &["api".to_owned()],
        );
        let paths: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(
            paths,
            ["x::y", "x::z::W", "a::c::D", "a::b::e::f", "g::H", "a::b::api::router"]
        );
    }

    #[test]
    fn a_cycle_is_found_and_a_tree_is_not() {
        let edge = |a: &str, b: &str| (vec![a.to_owned()], vec![b.to_owned()]);
        let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (from, to) in [edge("a", "b"), edge("b", "c"), edge("a", "c")] {
            graph.entry(from).or_default().insert(to.clone());
            graph.entry(to).or_default();
        }
        assert!(cycles(&graph).is_empty());
        graph.entry(vec!["c".to_owned()]).or_default().insert(vec!["a".to_owned()]);
        let found = cycles(&graph);
        assert_eq!(found.len(), 1, "{found:?}");
        let names: Vec<String> = found[0].iter().map(|m| m.join("::")).collect();
        assert_eq!(names.first(), names.last(), "a cycle ends where it starts: {names:?}");
    }

    #[test]
    fn long_functions_are_measured_from_fn_to_their_closing_brace() {
        let body = "    let x = 1;\n".repeat(MAX_FUNCTION_LINES);
        let text = format!("fn short() {{}}\nfn long() {{\n{body}}}\nfn declared();\n");
        let long = long_functions(&text);
        assert_eq!(long, [("long".to_owned(), 2, MAX_FUNCTION_LINES + 2)]);
    }

    #[test]
    fn test_code_is_left_out_with_its_lines() {
        let text =
            "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() { crate::x::y(); }\n}\nfn c() {}\n";
        let stripped = strip_tests(text);
        assert!(!stripped.contains("crate::x") && stripped.contains("fn c"), "{stripped}");
        assert_eq!(stripped.lines().count(), text.lines().count());
    }
}
