//! Landlock for real: a forked child enforces rules, then runs `cat`, `sh` and friends to show
//! what it can and cannot reach. The cases follow go-landlock's own tests (the library exec2
//! uses): `TestLocker_reads`, `TestLocker_writes`, `TestLocker_creates`,
//! `TestLocker_executes`, each case in a process of its own.

mod common;

use common::{Outcome, defaults, run};
use std::path::{Path, PathBuf};
use wharf_isolate::landlock::{Access, Mode, Rule, Unveil};
use wharf_isolate::{Containment, ContainmentStep};

/// A directory tree like go-landlock's `tests/`.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in [
            ("labels.txt", "labels"),
            ("fruits/apple.txt", "apple"),
            ("fruits/banana.txt", "banana"),
            ("veggies/corn.txt", "corn"),
            ("veggies/unsure/beans.txt", "beans"),
        ] {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let script = dir.path().join("fruits/hello.sh");
        std::fs::write(&script, "#!/bin/sh\necho so you like fruit?\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Tree { dir }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// The node's defaults plus `entries` (`"<mode>:<path relative to the tree>"`).
    fn locked(&self, entries: &[&str]) -> Containment {
        let mut rules = defaults();
        for entry in entries {
            let (mode, relative) = entry.split_once(':').unwrap();
            let unveil = Unveil::parse(&format!("{mode}:{}", self.path(relative).display()));
            rules.push(unveil.unwrap().rule(false));
        }
        Containment { landlock: Some(rules), ..Containment::default() }
    }

    fn sh(&self, containment: &Containment, script: &str) -> Outcome {
        run(
            containment,
            &["/bin/sh", "-c", script],
            &[("T", &self.dir.path().display().to_string())],
        )
    }
}

fn cat(containment: &Containment, path: &Path) -> Outcome {
    run(containment, &["/bin/cat", &path.display().to_string()], &[])
}

fn assert_denied(outcome: &Outcome, what: &str) {
    assert_eq!(outcome.failure, None, "{what}: containment failed: {outcome:?}");
    assert!(!outcome.ok(), "{what}: allowed, should be denied: {outcome:?}");
    assert!(outcome.stderr.contains("Permission denied"), "{what}: {outcome:?}");
}

fn assert_allowed(outcome: &Outcome, what: &str) {
    assert!(outcome.ok(), "{what}: denied, should be allowed: {outcome:?}");
}

#[test]
fn locker_reads() {
    let tree = Tree::new();
    let all = [
        "labels.txt",
        "fruits/apple.txt",
        "fruits/banana.txt",
        "veggies/corn.txt",
        "veggies/unsure/beans.txt",
    ];
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("none", &[], &[]),
        ("write only file", &["w:labels.txt"], &[]),
        ("write only dir", &["w:."], &[]),
        ("read top file", &["r:labels.txt"], &["labels.txt"]),
        ("read top dir", &["r:."], &all),
        ("read fruits dir", &["r:fruits"], &["fruits/apple.txt", "fruits/banana.txt"]),
        ("read beans file", &["r:veggies/unsure/beans.txt"], &["veggies/unsure/beans.txt"]),
        ("mixed file", &["rw:fruits/apple.txt"], &["fruits/apple.txt"]),
    ];
    for (name, entries, readable) in cases {
        let containment = tree.locked(entries);
        for file in all {
            let outcome = cat(&containment, &tree.path(file));
            let what = format!("{name}: cat {file}");
            if readable.contains(&file) {
                assert_allowed(&outcome, &what);
                assert_eq!(outcome.stdout, std::fs::read_to_string(tree.path(file)).unwrap());
            } else {
                assert_denied(&outcome, &what);
            }
        }
    }
    // Nothing outside the rules, however ordinary: not even /etc/passwd, which go-landlock's
    // "etc directory" case opens with a rule for /etc.
    assert_denied(&cat(&tree.locked(&[]), Path::new("/etc/passwd")), "default: /etc/passwd");
    assert_allowed(&cat(&tree.locked(&[]), Path::new("/etc/hosts")), "default: /etc/hosts");
}

#[test]
fn locker_writes() {
    let tree = Tree::new();
    let write = "printf new > $T/fruits/apple.txt";
    let read = "cat $T/fruits/apple.txt";
    for (name, entries, can_write, can_read) in [
        ("none", &[][..], false, false),
        ("one", &["w:fruits/apple.txt"][..], true, false),
        ("one_rw", &["rw:fruits/apple.txt"][..], true, true),
        ("dir_ro", &["r:fruits"][..], false, true),
        ("dir_rw", &["rw:fruits"][..], true, true),
        ("dir_w", &["w:fruits"][..], true, false),
    ] {
        std::fs::write(tree.path("fruits/apple.txt"), "apple").unwrap();
        let containment = tree.locked(entries);
        let wrote = tree.sh(&containment, write);
        let expected = if can_write { "new" } else { "apple" };
        assert_eq!(std::fs::read_to_string(tree.path("fruits/apple.txt")).unwrap(), expected);
        if can_write {
            assert_allowed(&wrote, &format!("{name}: write"));
        } else {
            assert_denied(&wrote, &format!("{name}: write"));
        }
        let read = tree.sh(&containment, read);
        if can_read {
            assert_allowed(&read, &format!("{name}: read"));
        } else {
            assert_denied(&read, &format!("{name}: read"));
        }
    }
}

#[test]
fn locker_creates() {
    let tree = Tree::new();
    let create = "printf x > $T/veggies/new.txt";
    assert_denied(&tree.sh(&tree.locked(&[]), create), "none");
    assert_denied(&tree.sh(&tree.locked(&["rw:veggies"]), create), "dir_rw");
    assert!(!tree.path("veggies/new.txt").exists());
    assert_allowed(&tree.sh(&tree.locked(&["rwc:veggies"]), create), "dir_rwc");
    assert!(tree.path("veggies/new.txt").exists());
    // `c` also removes what it may create.
    assert_allowed(&tree.sh(&tree.locked(&["rwc:veggies"]), "rm $T/veggies/new.txt"), "rm");

    // A rule for a path that does not exist fails the start, naming the rule; the node's
    // defaults that a host lacks are skipped instead.
    let mut containment = tree.locked(&[]);
    let rules = containment.landlock.as_mut().unwrap();
    rules.push(Rule::new(tree.path("missing.txt"), Mode::ALL.access()));
    let index = rules.len() - 1;
    let outcome = tree.sh(&containment, "true");
    let failure = outcome.failure.expect("the start fails");
    assert_eq!(failure.step, ContainmentStep::LandlockRule(index as u32));
    assert!(failure.describe(&containment).contains("missing.txt: No such file"));
    let optional =
        Rule { if_exists: true, ..Rule::new(tree.path("missing.txt"), Access::READ_FILE) };
    *containment.landlock.as_mut().unwrap().last_mut().unwrap() = optional;
    assert_allowed(&tree.sh(&containment, "true"), "a missing optional path");
}

#[test]
fn locker_executes() {
    let tree = Tree::new();
    let script = tree.path("fruits/hello.sh").display().to_string();
    let only = |rules: Vec<Rule>| Containment { landlock: Some(rules), ..Containment::default() };
    // No rules at all: not even the shell can be executed.
    let outcome = run(&only(Vec::new()), &[&script], &[]);
    assert_eq!(outcome.code, Some(127), "{outcome:?}");
    // The interpreter and its libraries, but the script only readable.
    let mut rules = defaults();
    rules.push(Rule::new(tree.path("fruits/hello.sh"), Mode::parse("rw").unwrap().access()));
    assert_eq!(run(&only(rules.clone()), &[&script], &[]).code, Some(127));
    // Read and execute.
    rules.last_mut().unwrap().access = Mode::READ_EXECUTE.access();
    let outcome = run(&only(rules), &[&script], &[]);
    assert_allowed(&outcome, "allow_script");
    assert_eq!(outcome.stdout, "so you like fruit?\n");
}

#[test]
fn a_task_directory_rule_without_remove_dir_keeps_its_directories_in_place() {
    // The exec driver gives a task every right on its directory but REMOVE_DIR, so the
    // directories the shim writes (logs/, the run records) cannot be moved away, and every
    // right on local/ and secrets/ below it.
    let tree = Tree::new();
    let mut containment = tree.locked(&[]);
    let rules = containment.landlock.as_mut().unwrap();
    rules.push(Rule::new(tree.path("."), Mode::ALL.access().without(Access::REMOVE_DIR)));
    rules.push(Rule::new(tree.path("fruits"), Mode::ALL.access()));
    for (script, allowed) in [
        ("printf x > $T/new.txt && cat $T/new.txt && rm $T/new.txt", true),
        ("mkdir $T/made", true),
        ("rmdir $T/made", false),
        ("mv $T/veggies $T/moved", false),
        ("mkdir $T/fruits/sub && mv $T/fruits/sub $T/fruits/sub2 && rmdir $T/fruits/sub2", true),
    ] {
        let outcome = tree.sh(&containment, script);
        if allowed {
            assert_allowed(&outcome, script);
        } else {
            assert_denied(&outcome, script);
        }
    }
    assert!(tree.path("veggies/corn.txt").exists() && tree.path("made").is_dir());
}

/// Kills and reaps its process when dropped.
struct Sleeper(std::process::Child);

impl Drop for Sleeper {
    #[allow(clippy::disallowed_methods)] // The test's own bystander, killed and reaped.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_landlocked_process_cannot_signal_outside_its_domain() {
    let abi = wharf_isolate::landlock::abi().expect("Landlock is needed for this test");
    assert!(abi >= 6, "signal scoping needs Landlock ABI 6 (Linux 6.12); this kernel has {abi}");
    // A process outside any domain, of the same user, which plain permission checks would let
    // the child signal.
    #[allow(clippy::disallowed_methods)] // A bystander for the test; reaped by `Sleeper`.
    let bystander = Sleeper(std::process::Command::new("/bin/sleep").arg("60").spawn().unwrap());
    let probe = format!("kill -0 {}", bystander.0.id());
    let free = run(&Containment::default(), &["/bin/sh", "-c", &probe], &[]);
    assert_allowed(&free, "unconfined kill -0");
    let locked = Containment { landlock: Some(defaults()), ..Containment::default() };
    let outcome = run(&locked, &["/bin/sh", "-c", &probe], &[]);
    assert!(!outcome.ok() && outcome.stderr.contains("ermitted"), "{outcome:?}");
    // Its own children are in its domain and can be signalled.
    let own = run(&locked, &["/bin/sh", "-c", "sleep 60 & kill $! && wait $!; test $? = 143"], &[]);
    assert_allowed(&own, "signal its own child");
}
