//! `promnorm migrate grafana DIR -o OUTDIR` (and `rules`): a whole directory at once.
//! OUTDIR becomes a copy of DIR in which every dashboard, rule file, PrometheusRule and
//! ConfigMap is migrated and every other file is copied as it is, so that it can replace
//! DIR in one commit; one summary line per file says what happened to it.

use std::path::{Path, PathBuf};

use super::files::{self, Rewriters};
use super::{Entry, MigrateError};

/// What happened to one file of the tree.
pub struct FileOutcome {
    /// The path below DIR.
    pub path: PathBuf,
    pub what: Outcome,
}

pub enum Outcome {
    /// Migrated (written to OUTDIR when one is given).
    Migrated {
        form: files::Form,
        changed: bool,
        entries: Vec<Entry>,
    },
    /// Not a dashboard or a rule file (a README, a kustomization): copied unchanged.
    Copied,
    /// A dashboard or rule file that could not be read: copied unchanged, reported.
    Failed(String),
}

impl FileOutcome {
    /// The summary line: `path: form, N rewritten, M need a human`.
    pub fn summary(&self) -> String {
        let p = self.path.display();
        match &self.what {
            Outcome::Migrated {
                form,
                changed,
                entries,
            } => {
                let rewritten = entries.iter().filter(|e| e.before != e.after).count();
                let human = entries.iter().filter(|e| e.needs_human()).count();
                let old: usize = entries.iter().map(|e| e.old_references.len()).sum();
                format!(
                    "{p}: {}, {}; {rewritten} expressions rewritten, {human} need a human, \
                     {old} old references left",
                    form.name(),
                    if *changed { "changed" } else { "unchanged" }
                )
            }
            Outcome::Copied => format!("{p}: not a dashboard or a rule file, copied as it is"),
            Outcome::Failed(e) => format!("{p}: FAILED, copied as it is: {e}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the output directory {0} is inside the input directory")]
    OutputInsideInput(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TreeError + '_ {
    move |source| TreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Migrates every file under `dir` (hidden entries skipped, symbolic links not
/// followed) and, with `out`, writes the tree there. Entries' locations start with the
/// file's path below `dir`.
pub fn migrate_tree(
    rw: &Rewriters<'_, '_>,
    dir: &Path,
    out: Option<&Path>,
) -> Result<Vec<FileOutcome>, TreeError> {
    if let Some(o) = out {
        let (d, o2) = (
            dir.canonicalize().map_err(io(dir))?,
            absolute(o).map_err(io(o))?,
        );
        if o2.starts_with(&d) && o2 != d {
            return Err(TreeError::OutputInsideInput(o.to_path_buf()));
        }
    }
    let mut paths = Vec::new();
    walk(dir, Path::new(""), &mut paths)?;
    paths.sort();
    let mut outcomes = Vec::with_capacity(paths.len());
    for rel in paths {
        let src = dir.join(&rel);
        let bytes = std::fs::read(&src).map_err(io(&src))?;
        let migratable = rel
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "json" | "yaml" | "yml"));
        let (what, new_bytes) = match std::str::from_utf8(&bytes) {
            Ok(text) if migratable => match files::migrate(rw, text) {
                Ok(m) => {
                    let prefix = rel.display().to_string();
                    let entries = m
                        .entries
                        .into_iter()
                        .map(|mut e| {
                            e.location = format!("{prefix}: {}", e.location);
                            e
                        })
                        .collect();
                    (
                        Outcome::Migrated {
                            form: m.form,
                            changed: m.changed,
                            entries,
                        },
                        m.text.into_bytes(),
                    )
                }
                Err(MigrateError::Unrecognized(_)) => (Outcome::Copied, bytes),
                Err(e) => (Outcome::Failed(e.to_string()), bytes),
            },
            _ => (Outcome::Copied, bytes),
        };
        if let Some(o) = out {
            let dst = o.join(&rel);
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::write(&dst, &new_bytes).map_err(io(&dst))?;
        }
        outcomes.push(FileOutcome { path: rel, what });
    }
    Ok(outcomes)
}

fn absolute(p: &Path) -> std::io::Result<PathBuf> {
    match p.canonicalize() {
        Ok(c) => Ok(c),
        // Not there yet: its parent's real path and its name.
        Err(_) => {
            let base = if p.is_absolute() {
                PathBuf::new()
            } else {
                std::env::current_dir()?
            };
            Ok(base.join(p))
        }
    }
}

/// The files below `dir/rel`, as paths below `dir`.
fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), TreeError> {
    let here = dir.join(rel);
    for entry in std::fs::read_dir(&here).map_err(io(&here))? {
        let entry = entry.map_err(io(&here))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type().map_err(io(&entry.path()))?;
        let child = rel.join(&name);
        if kind.is_dir() {
            walk(dir, &child, out)?;
        } else if kind.is_file() {
            out.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::QueryRewriter;

    #[test]
    fn a_tree_is_copied_with_its_dashboards_and_rules_migrated() {
        let rules = crate::migrate::test_rules(
            "pack: t\nrules:\n  - match: {family: old_g}\n    type: gauge\n    rename: new_g\n",
        );
        let rw = QueryRewriter::new(&rules, true);
        let rws = Rewriters {
            dashboards: &rw,
            rules: &rw,
        };
        let base = std::env::temp_dir().join(format!("promnorm-tree-{}", std::process::id()));
        let (src, dst) = (base.join("in"), base.join("out"));
        std::fs::create_dir_all(src.join("team/a")).expect("mkdir");
        std::fs::write(
            src.join("team/a/d.json"),
            "{\"panels\": [{\"targets\": [{\"expr\": \"old_g\"}]}]}",
        )
        .expect("write");
        std::fs::write(
            src.join("r.yaml"),
            "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: old_g > 1\n",
        )
        .expect("write");
        std::fs::write(src.join("README.md"), "# ours\n").expect("write");
        std::fs::write(src.join("kustomization.yaml"), "resources: [r.yaml]\n").expect("write");
        std::fs::write(src.join("broken.json"), "{\"panels\": [").expect("write");
        let outcomes = migrate_tree(&rws, &src, Some(&dst)).expect("migrates");
        let lines: Vec<String> = outcomes.iter().map(FileOutcome::summary).collect();
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.starts_with("broken.json: FAILED")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("kustomization.yaml: not a dashboard")),
            "{lines:#?}"
        );
        let d = std::fs::read_to_string(dst.join("team/a/d.json")).expect("written");
        assert!(d.contains("new_g"), "{d}");
        let r = std::fs::read_to_string(dst.join("r.yaml")).expect("written");
        assert!(r.contains("new_g > 1"), "{r}");
        assert_eq!(
            std::fs::read_to_string(dst.join("README.md")).expect("copied"),
            "# ours\n"
        );
        assert!(matches!(
            migrate_tree(&rws, &src, Some(&src.join("out"))),
            Err(TreeError::OutputInsideInput(_))
        ));
        let _ = std::fs::remove_dir_all(&base);
    }
}
