//! The sweep an agent makes at start of what killed agents left beside its cgroup parent, on
//! this host's real cgroups. In a test binary of its own: the parents' locks are `flock`s,
//! which a process forked by another test holds until it executes its program, and the sweep
//! takes each lock only once.

#![allow(clippy::disallowed_methods)] // Tests start the processes they put in cgroups.

mod scratch;

use scratch::*;
use std::path::{Path, PathBuf};
use wharf_isolate::{CgroupOptions, Cgroups};

/// The node's default layout puts each agent's parent beside the others': an agent that
/// starts removes the empty parents of agents that were killed, and leaves the others alone.
#[test]
fn a_new_agent_sweeps_what_dead_agents_left_but_not_running_tasks() {
    let group = format!("wharf-test-isolate-sweep-{}", std::process::id());
    // Dropped last: the group's own directories, once the agents' parents are gone.
    struct Group(Vec<PathBuf>);
    impl Drop for Group {
        fn drop(&mut self) {
            for dir in &self.0 {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    let mut group_dirs = Group(Vec::new());
    let open = |node: &str, sweep: bool| Scratch {
        cgroups: Some(
            Cgroups::open(CgroupOptions {
                sweep_siblings: sweep,
                ..options(&format!("{group}/{node}"))
            })
            .unwrap(),
        ),
        name: format!("{group}/{node}"),
        under_own: false,
    };
    let parents = |scratch: &Scratch| -> Vec<PathBuf> {
        scratch.parents().into_iter().map(Path::to_path_buf).collect()
    };
    // A killed agent leaves its parent behind: made here as it would have been.
    let mut dead = open("dead", false);
    let dead_dirs = parents(&dead);
    group_dirs.0 = dead_dirs.iter().filter_map(|d| d.parent()).map(Path::to_path_buf).collect();
    dead.cgroups = None;
    for dir in &dead_dirs {
        std::fs::create_dir_all(dir).unwrap();
    }
    // A killed agent whose task still runs in its cgroup; and one whose task ended while it
    // was gone, which left an empty cgroup.
    let mut busy = open("busy", false);
    let task = busy.create("a1/left/00000000", &limits(&busy, 16, None)).unwrap();
    let mut child = spawn_in(&task, "echo up; sleep 60");
    assert_eq!(first_line(&mut child), "up");
    busy.cgroups = None;
    let mut idle = open("idle", false);
    let ended = idle.create("a1/ended/00000000", &limits(&idle, 16, None)).unwrap();
    let idle_dirs = parents(&idle);
    idle.cgroups = None;
    let live = open("live", false);

    let new = open("new", true);
    assert!(dead_dirs.iter().all(|d| !d.exists()), "the dead agent's empty parent is gone");
    assert!(ended.dirs().iter().all(|d| !d.exists()), "an empty task cgroup is gone");
    assert!(idle_dirs.iter().all(|d| !d.exists()), "and its parent with it");
    assert!(parents(&live).iter().all(|d| d.exists()), "a live agent's parent stays");
    // A task cgroup with a process in it stays, and the parent holding it.
    for dir in task.dirs() {
        assert!(dir.exists() && dir.parent().unwrap().exists(), "{} is gone", dir.display());
    }

    busy.restart();
    task.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    busy.remove(&task).unwrap();
    drop((new, live, busy));
    for dir in &group_dirs.0 {
        let entries = std::fs::read_dir(dir).unwrap().flatten();
        let left: Vec<_> =
            entries.filter(|e| e.file_type().unwrap().is_dir()).map(|e| e.path()).collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// Agents that start at the same moment beside each other each keep their parent: one's sweep
/// never takes another's parent for a dead agent's in the moment between its making and its
/// locking. Each round starts four at once; every one must be able to make a task's cgroup.
#[test]
fn agents_starting_together_never_sweep_each_others_parents() {
    let group = format!("wharf-test-isolate-together-{}", std::process::id());
    let mut groups = Vec::new();
    for round in 0..10 {
        let agents: Vec<Scratch> = std::thread::scope(|s| {
            let starts: Vec<_> = (0..4)
                .map(|agent| {
                    let name = format!("{group}/r{round}-a{agent}");
                    s.spawn(move || {
                        let options = CgroupOptions { sweep_siblings: true, ..options(&name) };
                        let opened = Cgroups::open(options);
                        Scratch { cgroups: Some(opened.unwrap()), name, under_own: false }
                    })
                })
                .collect();
            starts.into_iter().map(|start| start.join().unwrap()).collect()
        });
        for agent in &agents {
            let task = agent.create("a1/t/00000001", &limits(agent, 16, None));
            let task = task.unwrap_or_else(|e| panic!("round {round}, {}: {e}", agent.name));
            agent.remove(&task).unwrap();
        }
        groups =
            agents[0].parents().iter().filter_map(|p| p.parent()).map(Path::to_path_buf).collect();
    }
    for dir in groups {
        let _ = std::fs::remove_dir(dir);
    }
}
