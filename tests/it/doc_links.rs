//! Every relative link of every Markdown file of the repository resolves: to a file or
//! folder that exists and, for `#anchor` into a Markdown file (or within one), to one of
//! its headings as GitHub names them. Links with a scheme (`https:`, `mailto:`) or `//`
//! are not followed. Walks the whole tree but `target/` and hidden folders (`.git`,
//! `.e2e-bin`, `.tmp`); plain std, so the check is only this file.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files under `dir`, sorted; build output and hidden folders left out.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    todo.push(path);
                }
            } else if path
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("md"))
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// An open code fence: its character and length.
struct Fence(u8, usize);

/// Whether `line` opens or closes a fence (``` or ~~~, up to three spaces in), and how.
fn fence_of(line: &str) -> Option<Fence> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = *t.as_bytes().first()?;
    if c != b'`' && c != b'~' {
        return None;
    }
    let n = t.bytes().take_while(|&b| b == c).count();
    (n >= 3).then_some(Fence(c, n))
}

/// The lines of `text` outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut open: Option<Fence> = None;
    for (i, line) in text.lines().enumerate() {
        match (&open, fence_of(line)) {
            (None, Some(f)) => open = Some(f),
            (Some(Fence(c, n)), Some(Fence(c2, n2)))
                if *c == c2 && n2 >= *n && line.trim().bytes().all(|b| b == c2) =>
            {
                open = None
            }
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` with its code spans taken out (`keep`: their contents left in, without the
/// backticks). A backtick run without a closing run of the same length stays as it is.
fn code_spans(line: &str, keep: bool) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        if b[i] != b'`' {
            i += 1;
            continue;
        }
        let n = b[i..].iter().take_while(|&&c| c == b'`').count();
        let body = i + n;
        // The next run of exactly n backticks closes the span.
        let mut j = body;
        let mut close = None;
        while j < b.len() {
            if b[j] == b'`' {
                let m = b[j..].iter().take_while(|&&c| c == b'`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.push_str(&line[copied..i]);
                if keep {
                    out.push_str(&line[body..j]);
                }
                i = j + n;
                copied = i;
            }
            None => i = body,
        }
    }
    out.push_str(&line[copied..]);
    out
}

/// An inline link's destination, from just after its `](`: `<…>`, or up to the `)` that
/// closes it (balanced parentheses) or the whitespace before a title.
fn destination(rest: &str) -> Option<&str> {
    let rest = rest.trim_start();
    if let Some(r) = rest.strip_prefix('<') {
        return r.find('>').map(|e| &r[..e]);
    }
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(&rest[..i]),
            ')' => depth -= 1,
            c if c.is_whitespace() => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
}

/// The destination of a reference definition (`[name]: DEST`), if `line` is one.
fn reference_definition(line: &str) -> Option<&str> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let t = t.strip_prefix('[')?;
    let end = t.find("]:")?;
    if end == 0 || t[..end].contains('[') {
        return None;
    }
    let dest = t[end + 2..].split_whitespace().next()?;
    Some(dest.trim_start_matches('<').trim_end_matches('>'))
}

/// The values of `attr="…"` (or `'…'`) in `line`.
fn attribute_values<'a>(line: &'a str, attr: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find(attr) {
        let after = &rest[i + attr.len()..];
        let preceded = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_whitespace());
        rest = after;
        if !preceded {
            continue;
        }
        let Some(v) = after.strip_prefix('=') else {
            continue;
        };
        let Some(q) = v.chars().next().filter(|&q| q == '"' || q == '\'') else {
            continue;
        };
        if let Some(end) = v[1..].find(q) {
            out.push(&v[1..1 + end]);
        }
    }
    out
}

/// Every link destination of a Markdown text with its line: inline links and images,
/// reference definitions, and `href`/`src` of HTML tags; code left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = code_spans(line, false);
        if let Some(d) = reference_definition(&line) {
            out.push((n, d.to_string()));
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(d) = destination(rest) {
                out.push((n, d.to_string()));
            }
        }
        if line.contains('<') {
            for attr in ["href", "src"] {
                for v in attribute_values(&line, attr) {
                    out.push((n, v.to_string()));
                }
            }
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: the text as rendered (links become their
/// text, code its contents), lower-cased; letters, digits, `-` and `_` kept, each space
/// made a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let text = code_spans(heading, true);
    // [text](dest) and ![alt](src) → text.
    let mut plain = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match destination(after) {
            Some(d) => {
                plain.push_str(&rest[..i]);
                let skip = after.find(d).map_or(0, |at| at + d.len());
                let tail = &after[skip..];
                rest = tail.find(')').map_or(tail, |e| &tail[e + 1..]);
            }
            None => {
                plain.push_str(&rest[..i + 2]);
                rest = after;
            }
        }
    }
    plain.push_str(rest);
    plain
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown text defines: one per heading (ATX and setext), a repeated
/// slug numbered `-1`, `-2`, … as GitHub does, and HTML `id`/`name` attributes.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut add = |s: String, out: &mut BTreeSet<String>| {
        let mut candidate = s.clone();
        while out.contains(&candidate) {
            let n = seen.entry(s.clone()).or_insert(0);
            *n += 1;
            candidate = format!("{s}-{n}");
        }
        out.insert(candidate);
    };
    let lines = prose_lines(text);
    for (k, &(n, line)) in lines.iter().enumerate() {
        for attr in ["id", "name"] {
            for v in attribute_values(line, attr) {
                out.insert(v.to_string());
            }
        }
        let t = line.trim_start_matches(' ');
        if line.len() - t.len() <= 3 && t.starts_with('#') {
            let level = t.bytes().take_while(|&b| b == b'#').count();
            let body = &t[level..];
            if level <= 6 && (body.is_empty() || body.starts_with([' ', '\t'])) {
                // An optional closing sequence of #s, after a space.
                let body = body.trim();
                let stripped = body.trim_end_matches('#');
                let body = if stripped.is_empty() || stripped.ends_with([' ', '\t']) {
                    stripped.trim_end()
                } else {
                    body
                };
                add(slug(body), &mut out);
                continue;
            }
        }
        // Setext: a paragraph line directly above a line of = or - alone.
        if let Some(&(m, next)) = lines.get(k + 1) {
            let u = next.trim();
            let underline = !u.is_empty()
                && next.len() - next.trim_start_matches(' ').len() <= 3
                && (u.bytes().all(|b| b == b'=') || u.bytes().all(|b| b == b'-'));
            let paragraph = !t.trim().is_empty()
                && !t.starts_with(['#', '|', '-', '*', '+', '>', '<'])
                && !t.starts_with("    ");
            let previous_blank = k == 0 || lines[k - 1].1.trim().is_empty();
            if m == n + 1 && underline && paragraph && previous_blank {
                add(slug(t.trim()), &mut out);
            }
        }
    }
    out
}

/// `%XX` escapes decoded (a link to `a%20b.md` names `a b.md`).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| (c as char).to_digit(16);
    while i < b.len() {
        let escape = if b[i] == b'%' && i + 2 < b.len() {
            hex(b[i + 1]).zip(hex(b[i + 2]))
        } else {
            None
        };
        if let Some((h, l)) = escape {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a destination leaves the repository: a URI scheme (`https:`, `mailto:`) or a
/// network path (`//host`).
fn external(dest: &str) -> bool {
    if dest.starts_with("//") {
        return true;
    }
    match dest.find(':') {
        Some(i) => {
            let scheme = &dest[..i];
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                && !scheme.contains('/')
        }
        None => false,
    }
}

/// `path` with `.` and `..` folded, or `None` when it climbs out of `root`.
fn inside(root: &Path, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(root).ok()?;
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    let mut out = root.to_path_buf();
    out.extend(parts);
    Some(out)
}

/// Every broken link of `files` (under `root`), as `file:line: dest: why`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut anchor_cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let rel = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, dest) in links(&text) {
            if dest.is_empty() || external(&dest) {
                continue;
            }
            let (path, fragment) = match dest.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (dest.as_str(), None),
            };
            let path = path.split('?').next().unwrap_or_default();
            let target = if path.is_empty() {
                file.clone()
            } else {
                let decoded = percent_decoded(path);
                let base = if let Some(abs) = decoded.strip_prefix('/') {
                    root.join(abs)
                } else {
                    file.parent().unwrap_or(root).join(&decoded)
                };
                match inside(root, &base) {
                    Some(t) => t,
                    None => {
                        problems.push(format!("{rel}:{n}: {dest}: leaves the repository"));
                        continue;
                    }
                }
            };
            if !target.exists() {
                problems.push(format!("{rel}:{n}: {dest}: no such file"));
                continue;
            }
            let Some(fragment) = fragment.filter(|f| !f.is_empty()) else {
                continue;
            };
            if target.extension().is_none_or(|x| x != "md") {
                continue;
            }
            let known = anchor_cache
                .entry(target.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(&target).unwrap_or_default()));
            let fragment = percent_decoded(fragment);
            if !known.contains(&fragment) {
                problems.push(format!(
                    "{rel}:{n}: {dest}: no heading with the anchor #{fragment} in {}",
                    target.strip_prefix(root).unwrap_or(&target).display()
                ));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_of_every_markdown_file_resolves() {
    let root = root();
    let files = markdown_files(&root);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    // The walk sees the files it must.
    for must in [
        "README.md",
        "BENCHMARKS.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "docs/README.md",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "{must} not found: {names:?}"
        );
    }
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("target/") || n.starts_with(".e2e-bin/")),
        "build output walked: {names:?}"
    );
    let problems = broken_links(&root, &files);
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Keep old dashboards working"),
        "keep-old-dashboards-working"
    );
    assert_eq!(
        slug("Side by side with vmagent (`bench/vs-vmagent.sh 4 15`, every case)"),
        "side-by-side-with-vmagent-benchvs-vmagentsh-4-15-every-case"
    );
    // Punctuation goes, the spaces around it stay: two hyphens.
    assert_eq!(
        slug("Latency at 80 % of the maximum"),
        "latency-at-80--of-the-maximum"
    );
    assert_eq!(slug("Two cores ÷ one, 1.98×"), "two-cores--one-198");
    assert_eq!(slug("`max_series` and `le`"), "max_series-and-le");
    assert_eq!(slug("See [the docs](docs/x.md) now"), "see-the-docs-now");
    assert_eq!(slug("Über Größe"), "über-größe");
    let text = "# A\n\n## A\n\n```\n# not a heading\n```\n\n## A ##\n\nSetext\n------\n\n<a id=\"here\"></a>\n";
    let found = anchors(text);
    let want: BTreeSet<String> = ["a", "a-1", "a-2", "setext", "here"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "See [a](docs/a.md#x) and ![p](img/p.png \"title\") and [b](<with space.md>).\n\
                `[not](a-link.md)` and ``[nor](this.md)``\n\
                ```md\n[fenced](no.md)\n```\n\
                [ref]: ../other.md\n\
                <img src=\"pic.svg\" alt=\"\"> [ext](https://example.com/x.md) [m](mailto:a@b)\n\
                [nested](a_(b).md)\n";
    let found: Vec<String> = links(text).into_iter().map(|(_, d)| d).collect();
    assert_eq!(
        found,
        [
            "docs/a.md#x",
            "img/p.png",
            "with space.md",
            "../other.md",
            "https://example.com/x.md",
            "mailto:a@b",
            "pic.svg",
            "a_(b).md",
        ]
    );
    assert!(external("https://example.com") && external("mailto:a@b") && external("//cdn/x"));
    assert!(!external("docs/a.md") && !external("a.md#b:c") && !external("#x"));
}

#[test]
fn broken_links_are_reported() {
    let dir = std::env::temp_dir().join(format!("promnorm-doc-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(
        dir.join("README.md"),
        "# Top\n\n## Part one\n\n[ok](docs/b.md#there) [ok](#part-one) [ok](docs/)\n\
         [bad](docs/missing.md) [bad](docs/b.md#nowhere) [bad](#part-two) [bad](../../x.md)\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("docs/b.md"),
        "# B\n\n### There\n\n[ok](../README.md#top)\n",
    )
    .unwrap();
    let files = markdown_files(&dir);
    let problems = broken_links(&dir, &files);
    std::fs::remove_dir_all(&dir).unwrap();
    let problems: Vec<&str> = problems
        .iter()
        .map(|p| p.split(": ").nth(1).unwrap())
        .collect();
    assert_eq!(
        problems,
        [
            "docs/missing.md",
            "docs/b.md#nowhere",
            "#part-two",
            "../../x.md"
        ]
    );
}
