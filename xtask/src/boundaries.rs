//! The dependency rules of DESIGN.md, checked against `cargo metadata`, and the clippy
//! configurations that keep calls inside the crates that own them.
//!
//! Only the shipped graph counts: normal and build dependencies, not dev-dependencies.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What one crate may depend on.
struct Rule {
    krate: &'static str,
    /// Workspace crates it may depend on directly.
    may_use: &'static [&'static str],
    /// If set, the only external crates it may depend on directly.
    externals_only: Option<&'static [&'static str]>,
    /// Crates that must not be reachable from it at all.
    never_reaches: &'static [&'static str],
}

const RULES: &[Rule] = &[
    Rule {
        krate: "wharf-state",
        may_use: &[],
        externals_only: Some(&["serde", "serde_json", "serde_path_to_error", "thiserror", "toml"]),
        never_reaches: &["tokio", "redb", "libc", "nix", "rustix"],
    },
    Rule {
        krate: "wharf-store",
        may_use: &["wharf-state"],
        externals_only: None,
        never_reaches: &[],
    },
    Rule {
        krate: "wharf-driver",
        may_use: &["wharf-state"],
        externals_only: None,
        never_reaches: &["redb"],
    },
    Rule {
        // The raw system calls of the static shim: `core` and nothing else.
        krate: "wharf-nolibc",
        may_use: &[],
        externals_only: Some(&[]),
        never_reaches: &[],
    },
    Rule {
        krate: "wharf-isolate",
        may_use: &["wharf-nolibc", "wharf-state"],
        externals_only: None,
        // It signals nothing (nix is the other way to signals); see also its clippy.toml.
        never_reaches: &["tokio", "redb", "nix"],
    },
    Rule {
        krate: "wharf-exec",
        may_use: &["wharf-driver", "wharf-isolate", "wharf-nolibc", "wharf-state"],
        externals_only: None,
        never_reaches: &["redb"],
    },
    Rule {
        // The container driver reuses exec's shim and isolate's cgroups.
        krate: "wharf-container",
        may_use: &["wharf-driver", "wharf-exec", "wharf-isolate", "wharf-state"],
        externals_only: None,
        never_reaches: &["redb"],
    },
    Rule {
        krate: "wharf-task",
        // wharf-isolate for its directories, which root makes where a task may write.
        may_use: &["wharf-store", "wharf-driver", "wharf-isolate", "wharf-state"],
        externals_only: None,
        never_reaches: &[],
    },
    Rule {
        krate: "wharf-health",
        may_use: &["wharf-driver", "wharf-state"],
        externals_only: None,
        // Checks speak HTTP through their own small client: no HTTP stack, and no store.
        never_reaches: &["hyper", "axum", "reqwest", "http", "redb"],
    },
    Rule {
        krate: "wharf-alloc",
        may_use: &["wharf-task", "wharf-store", "wharf-driver", "wharf-health", "wharf-state"],
        externals_only: None,
        // The alloc runner runs checks through wharf-health, never an HTTP client of its own.
        never_reaches: &["hyper", "axum", "reqwest", "http"],
    },
    Rule {
        // Artifacts: its own HTTP client (hyper, rustls) and archive readers, and a task hook.
        krate: "wharf-artifact",
        may_use: &["wharf-task", "wharf-state"],
        externals_only: None,
        never_reaches: &["axum", "openssl", "aws-lc-rs"],
    },
    Rule {
        krate: "wharf-prober",
        may_use: &["wharf-state"],
        externals_only: None,
        never_reaches: &["redb"],
    },
    Rule {
        krate: "wharf-fleet",
        may_use: &["wharf-prober", "wharf-store", "wharf-state"],
        externals_only: None,
        never_reaches: &[],
    },
    Rule {
        // Translation only: Nomad's JSON in, wharf's spec out, and back. HTTP stays in node.
        krate: "wharf-nomad",
        may_use: &["wharf-state"],
        externals_only: Some(&["serde", "serde_json", "thiserror"]),
        never_reaches: &["tokio", "redb", "libc", "nix", "rustix", "axum", "hyper"],
    },
    Rule {
        krate: "wharf-node",
        may_use: &[
            "wharf-fleet",
            "wharf-alloc",
            "wharf-artifact",
            "wharf-container",
            "wharf-task",
            "wharf-store",
            "wharf-driver",
            "wharf-exec",
            "wharf-health",
            "wharf-isolate",
            "wharf-prober",
            "wharf-nomad",
            "wharf-state",
        ],
        externals_only: None,
        never_reaches: &[],
    },
];

/// External crates only one workspace crate may use directly.
const OWNED: &[(&str, &str)] = &[("redb", "wharf-store")];

/// Workspace members that are tools, not part of the product: no rule applies to them.
const TOOLS: &[&str] = &["xtask", "wharf-bench", "wharf-tests"];

/// Returns one line per broken rule; an error if the metadata is not what cargo prints.
pub(crate) fn check(metadata: &Value) -> Result<Vec<String>, String> {
    let graph = Graph::from_metadata(metadata)?;
    let mut violations = Vec::new();
    for member in &graph.members {
        if TOOLS.contains(&member.as_str()) {
            continue;
        }
        let Some(rule) = RULES.iter().find(|r| r.krate == member) else {
            violations
                .push(format!("{member} is not in DESIGN.md's crate list; add a rule for it"));
            continue;
        };
        for dep in graph.direct(member) {
            if graph.members.contains(dep) {
                if !rule.may_use.contains(&dep.as_str()) {
                    violations.push(format!("{member} depends on {dep}, which it may not use"));
                }
            } else if let Some(allowed) = rule.externals_only
                && !allowed.contains(&dep.as_str())
            {
                violations.push(if allowed.is_empty() {
                    format!("{member} depends on {dep}; it may depend on no other crate")
                } else {
                    format!("{member} depends on {dep}; it may use only {}", allowed.join(", "))
                });
            }
            if let Some((_, owner)) = OWNED.iter().find(|(name, _)| name == dep)
                && owner != member
            {
                violations.push(format!("{member} depends on {dep} directly; only {owner} may"));
            }
        }
        let reachable = graph.reachable(member);
        for forbidden in rule.never_reaches {
            if reachable.contains(*forbidden) {
                violations.push(format!(
                    "{member} reaches {forbidden} through its dependencies; it must not"
                ));
            }
        }
    }
    Ok(violations)
}

/// Crates with a clippy.toml of their own, and calls it must disallow: wharf-isolate spawns,
/// signals and waits on nothing (wharf-exec owns every process call).
const OWN_CLIPPY_RULES: &[(&str, &[&str])] = &[(
    "crates/isolate",
    &[
        "libc::fork",
        "libc::execve",
        "libc::kill",
        "libc::waitpid",
        "wharf_nolibc::sys::clone_vfork",
        "wharf_nolibc::sys::kill",
        "wharf_nolibc::sys::pidfd_kill_group",
        "wharf_nolibc::sys::reap",
        "std::process::Child::kill",
    ],
)];

/// Checks the crates' own clippy.toml files. Clippy reads the nearest one only, so a crate's
/// own replaces the workspace's: it must repeat every rule of the workspace's, and the crates
/// of [`OWN_CLIPPY_RULES`] must have theirs. Returns one line per problem.
pub(crate) fn check_clippy_configs(root: &std::path::Path) -> Result<Vec<String>, String> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let workspace = read(&root.join("clippy.toml"))?;
    let mut problems = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    let mut dirs: Vec<_> = crates.flatten().map(|entry| entry.path()).collect();
    dirs.sort();
    for dir in dirs {
        let config = dir.join("clippy.toml");
        let relative = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
        let own = OWN_CLIPPY_RULES.iter().find(|(krate, _)| *krate == relative);
        if !config.exists() {
            if own.is_some() {
                problems.push(format!("{relative}/clippy.toml is missing"));
            }
            continue;
        }
        let text = read(&config)?;
        let required = own.map(|(_, paths)| *paths).unwrap_or(&[]);
        problems.extend(
            missing_rules(&workspace, &text, required).into_iter().map(|path| {
                format!("{relative}/clippy.toml does not disallow {path}, which it must")
            }),
        );
    }
    Ok(problems)
}

/// The methods of the workspace's `disallowed-methods` and of `required` that `config` does not
/// disallow.
fn missing_rules<'a>(workspace: &'a str, config: &str, required: &[&'a str]) -> Vec<&'a str> {
    let disallowed = disallowed_paths(config);
    disallowed_paths(workspace)
        .into_iter()
        .chain(required.iter().copied())
        .filter(|path| !disallowed.contains(path))
        .collect()
}

/// The `path`s of a clippy.toml's `disallowed-methods` entries, one entry a line.
fn disallowed_paths(config: &str) -> Vec<&str> {
    config
        .lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once("path = \"")?.1.split_once('"').map(|(path, _)| path))
        .collect()
}

/// The resolved dependency graph by package name, normal and build edges only.
struct Graph {
    members: BTreeSet<String>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn from_metadata(metadata: &Value) -> Result<Graph, String> {
        let bad = |what: &str| format!("unexpected cargo metadata: {what}");
        let packages = metadata["packages"].as_array().ok_or_else(|| bad("no packages"))?;
        let name_of: BTreeMap<&str, &str> = packages
            .iter()
            .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
            .collect();
        let members = metadata["workspace_members"]
            .as_array()
            .ok_or_else(|| bad("no workspace_members"))?
            .iter()
            .filter_map(|id| name_of.get(id.as_str()?).map(|n| (*n).to_owned()))
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let nodes =
            metadata["resolve"]["nodes"].as_array().ok_or_else(|| bad("no resolve graph"))?;
        for node in nodes {
            let from = node["id"]
                .as_str()
                .and_then(|id| name_of.get(id))
                .ok_or_else(|| bad("node without a package"))?;
            let entry = edges.entry((*from).to_owned()).or_default();
            for dep in node["deps"].as_array().into_iter().flatten() {
                let shipped = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null() || k["kind"].as_str() == Some("build"));
                let to = dep["pkg"].as_str().and_then(|id| name_of.get(id));
                if let (true, Some(to)) = (shipped, to) {
                    entry.insert((*to).to_owned());
                }
            }
        }
        Ok(Graph { members, edges })
    }

    fn direct(&self, krate: &str) -> impl Iterator<Item = &String> {
        self.edges.get(krate).into_iter().flatten()
    }

    fn reachable(&self, krate: &str) -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![krate];
        while let Some(next) = stack.pop() {
            for dep in self.direct(next) {
                if seen.insert(dep.as_str()) {
                    stack.push(dep);
                }
            }
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A package and its dependencies with their kind (`None` for normal).
    type Package<'a> = (&'a str, &'a [(&'a str, Option<&'a str>)]);

    /// Metadata in cargo's shape; packages whose name starts with `wharf-` are members.
    fn metadata(packages: &[Package<'_>]) -> Value {
        let id = |name: &str| format!("{name} 0.1.0 (path+file:///w)");
        let mut names: BTreeSet<&str> = packages.iter().map(|(n, _)| *n).collect();
        for (_, deps) in packages {
            names.extend(deps.iter().map(|(d, _)| *d));
        }
        json!({
            "packages": names.iter().map(|n| json!({"id": id(n), "name": n})).collect::<Vec<_>>(),
            "workspace_members": names.iter().filter(|n| n.starts_with("wharf-")).map(|n| id(n)).collect::<Vec<_>>(),
            "resolve": {"nodes": names.iter().map(|n| {
                let deps = packages.iter().find(|(p, _)| p == n).map(|(_, d)| *d).unwrap_or(&[]);
                json!({"id": id(n), "deps": deps.iter().map(|(d, kind)| json!({
                    "pkg": id(d), "dep_kinds": [{"kind": kind}]
                })).collect::<Vec<_>>()})
            }).collect::<Vec<_>>()}
        })
    }

    #[test]
    fn the_design_graph_passes() {
        let m = metadata(&[
            ("wharf-state", &[("serde", None), ("thiserror", None), ("proptest", Some("dev"))]),
            ("wharf-store", &[("wharf-state", None), ("redb", None), ("tokio", None)]),
        ]);
        assert_eq!(check(&m).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn state_on_tokio_is_refused_directly_and_transitively() {
        let direct = metadata(&[("wharf-state", &[("tokio", None)])]);
        let violations = check(&direct).unwrap();
        assert!(violations.iter().any(|v| v == "wharf-state depends on tokio; it may use only serde, serde_json, serde_path_to_error, thiserror, toml"), "{violations:?}");
        assert!(
            violations
                .iter()
                .any(|v| v == "wharf-state reaches tokio through its dependencies; it must not"),
            "{violations:?}"
        );

        let transitive =
            metadata(&[("wharf-state", &[("serde", None)]), ("serde", &[("redb", Some("build"))])]);
        assert_eq!(
            check(&transitive).unwrap(),
            ["wharf-state reaches redb through its dependencies; it must not"]
        );
    }

    #[test]
    fn health_stays_off_http_stacks_and_alloc_reaches_none() {
        let m = metadata(&[
            ("wharf-state", &[]),
            ("wharf-health", &[("wharf-state", None), ("wharf-alloc", None), ("hyper", None)]),
            ("wharf-alloc", &[("wharf-health", None)]),
        ]);
        assert_eq!(
            check(&m).unwrap(),
            [
                "wharf-alloc reaches hyper through its dependencies; it must not",
                "wharf-health depends on wharf-alloc, which it may not use",
                "wharf-health reaches hyper through its dependencies; it must not",
            ]
        );
    }

    #[test]
    fn forbidden_edges_between_crates_are_refused() {
        let m = metadata(&[
            ("wharf-state", &[]),
            ("wharf-store", &[("wharf-state", None)]),
            ("wharf-driver", &[("wharf-state", None), ("wharf-store", None), ("redb", None)]),
        ]);
        assert_eq!(
            check(&m).unwrap(),
            [
                "wharf-driver depends on redb directly; only wharf-store may",
                "wharf-driver depends on wharf-store, which it may not use",
                "wharf-driver reaches redb through its dependencies; it must not",
            ]
        );
    }

    #[test]
    fn nolibc_depends_on_nothing_and_isolate_never_reaches_nix() {
        let m = metadata(&[
            ("wharf-state", &[]),
            ("wharf-nolibc", &[("libc", None), ("tempfile", Some("dev"))]),
            ("wharf-isolate", &[("wharf-nolibc", None), ("wharf-state", None), ("nix", None)]),
            ("wharf-exec", &[("wharf-nolibc", Some("build")), ("wharf-isolate", None)]),
        ]);
        assert_eq!(
            check(&m).unwrap(),
            [
                "wharf-isolate reaches nix through its dependencies; it must not",
                "wharf-nolibc depends on libc; it may depend on no other crate",
            ]
        );
    }

    /// One row per case: the workspace's file, a crate's, what the crate must disallow besides,
    /// and what the check finds missing.
    #[test]
    fn a_crate_clippy_config_repeats_the_workspace_rules_and_has_its_own() {
        let workspace = "# rules\ndisallowed-methods = [\n    { path = \"a::b\", reason = \"x\" },\n    { path = \"c::d\", reason = \"y\", allow-invalid = true },\n]\n";
        let full = "disallowed-methods = [\n  { path = \"c::d\" },\n  { path = \"a::b\" },\n  { path = \"libc::kill\" },\n]\n";
        let commented =
            "disallowed-methods = [\n  # { path = \"a::b\" },\n  { path = \"c::d\" },\n]\n";
        let cases: [(&str, &[&str], &[&str]); 5] = [
            (full, &[], &[]),
            (full, &["libc::kill"], &[]),
            (full, &["libc::fork"], &["libc::fork"]),
            (commented, &[], &["a::b"]),
            ("", &["libc::kill"], &["a::b", "c::d", "libc::kill"]),
        ];
        for (config, required, missing) in cases {
            assert_eq!(missing_rules(workspace, config, required), missing, "{config}");
        }
    }

    #[test]
    fn dev_dependencies_do_not_count_and_unknown_crates_are_named() {
        let m = metadata(&[("wharf-state", &[("tokio", Some("dev"))]), ("wharf-gizmo", &[])]);
        assert_eq!(
            check(&m).unwrap(),
            ["wharf-gizmo is not in DESIGN.md's crate list; add a rule for it"]
        );
    }
}
