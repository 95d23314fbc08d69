//! Targets from Prometheus' `file_sd` files: each file a list of groups
//! `{targets: [host:port, …], labels: {…}}` (JSON or YAML), found by a glob whose last
//! path element may hold `*` and `?`, reread when a file's size or modification time
//! changes. `__scheme__`, `__metrics_path__` and `__param_<name>` shape the URL, as in
//! Prometheus; other labels starting with `__` are not put on series.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{Params, TargetSpec};

/// One group of a `file_sd` file.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// Parses a `file_sd` file's text (JSON is YAML too); given by `app`, which owns YAML.
pub type ParseGroups = fn(&str) -> Result<Vec<TargetGroup>, String>;

/// Whether `name` matches `pattern` (`*`: any run, `?`: one character).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The files a pattern names now, sorted.
pub fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
        return Vec::new();
    };
    if !file.contains(['*', '?']) {
        return if path.is_file() {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| !n.starts_with('.') && glob_match(file, n))
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// The groups of one file as last read.
struct Read {
    stamp: (u64, Option<SystemTime>),
    groups: Vec<TargetGroup>,
}

/// The `file_sd` files' targets, reread only when a file changes. A file that no longer
/// parses keeps its last good targets (and says why in the log), as Prometheus does.
#[derive(Default)]
pub struct FileSd {
    files: HashMap<PathBuf, Read>,
}

impl FileSd {
    /// The targets of every file `patterns` name now; `params` are `scrape.params`.
    pub fn refresh(
        &mut self,
        patterns: &[String],
        parse: ParseGroups,
        params: &Params,
    ) -> Vec<TargetSpec> {
        let mut seen: Vec<PathBuf> = Vec::new();
        let mut out = Vec::new();
        for pattern in patterns {
            for path in expand(pattern) {
                if seen.contains(&path) {
                    continue;
                }
                seen.push(path.clone());
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                let stamp = (meta.len(), meta.modified().ok());
                let fresh = self.files.get(&path).is_some_and(|r| r.stamp == stamp);
                if !fresh {
                    match std::fs::read_to_string(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|t| parse(&t))
                    {
                        Ok(groups) => {
                            let targets: usize = groups.iter().map(|g| g.targets.len()).sum();
                            tracing::info!(file = %path.display(), targets, "file_sd read");
                            self.files.insert(path.clone(), Read { stamp, groups });
                        }
                        Err(e) => {
                            tracing::warn!(file = %path.display(), error = %e, "file_sd file not read; its last targets stay");
                            if let Some(r) = self.files.get_mut(&path) {
                                r.stamp = stamp;
                            }
                        }
                    }
                }
                if let Some(r) = self.files.get(&path) {
                    out.extend(targets_of(&r.groups, &path, params));
                }
            }
        }
        self.files.retain(|p, _| seen.contains(p));
        out
    }
}

/// A group's targets as URLs with their labels and query parameters.
fn targets_of(groups: &[TargetGroup], file: &Path, params: &Params) -> Vec<TargetSpec> {
    let mut out = Vec::new();
    for g in groups {
        let own: Params = g
            .labels
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("__param_")?.to_string(), vec![v.clone()])))
            .collect();
        let params = super::merge_params(params, &own);
        let scheme = g.labels.get("__scheme__").map_or("http", String::as_str);
        let path = g
            .labels
            .get("__metrics_path__")
            .map_or("/metrics", String::as_str);
        for t in &g.targets {
            let url = format!("{scheme}://{t}{path}");
            if let Err(e) = url.parse::<http::Uri>() {
                tracing::warn!(file = %file.display(), target = %t, error = %e, "file_sd target left out: not a URL");
                continue;
            }
            let mut labels: BTreeMap<String, String> = g
                .labels
                .iter()
                .filter(|(k, _)| !k.starts_with("__"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.entry("instance".into()).or_insert_with(|| t.clone());
            out.push(TargetSpec {
                url,
                labels,
                params: params.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*.json", "a.json"));
        assert!(glob_match("t?.y*ml", "t1.yaml"));
        assert!(!glob_match("*.json", "a.yaml"));
        assert!(glob_match("*", "x"));
        assert!(!glob_match("a*b", "acbd"));
    }

    #[test]
    fn groups_become_urls_with_labels() {
        let g = vec![TargetGroup {
            targets: vec!["10.0.0.1:8000".into()],
            labels: [
                ("job".to_string(), "vllm".to_string()),
                ("__metrics_path__".to_string(), "/m".to_string()),
                ("__scheme__".to_string(), "https".to_string()),
                ("__param_module".to_string(), "gpu".to_string()),
            ]
            .into(),
        }];
        let global: Params = [
            ("module".to_string(), vec!["x".to_string(), "y".to_string()]),
            ("k".to_string(), vec!["v".to_string()]),
        ]
        .into();
        let t = targets_of(&g, Path::new("f"), &global);
        assert_eq!(t[0].url, "https://10.0.0.1:8000/m");
        assert_eq!(t[0].params["module"], vec!["gpu", "y"]);
        assert_eq!(
            t[0].scrape_url(),
            "https://10.0.0.1:8000/m?k=v&module=gpu&module=y"
        );
        assert!(!t[0].labels.contains_key("__param_module"));
        assert_eq!(t[0].labels.get("instance").unwrap(), "10.0.0.1:8000");
        assert!(!t[0].labels.contains_key("__scheme__"));
    }
}
