//! Workload users: the lease journal (after Nomad's `helper/users/dynamic/pool_test.go` and
//! `dynamic_users_hook_test.go`), and a forked child that really switches to one.

mod common;

use common::{require_root, run, test_user};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use wharf_isolate::dirs::OpenDir;
use wharf_isolate::users::{Ugid, UgidRange, UserPool, hand_over};
use wharf_isolate::{Containment, IsolateError};

/// A journal and task directories to own leases.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup { dir: tempfile::tempdir().unwrap() }
    }

    fn journal(&self) -> PathBuf {
        self.dir.path().join("workload-users")
    }

    /// A pool of the ids `BASE + min` to `BASE + max`.
    fn pool(&self, min: u32, max: u32) -> UserPool {
        UserPool::open(&self.journal(), UgidRange::new(BASE + min, BASE + max).unwrap()).unwrap()
    }

    /// A task directory that exists.
    fn owner(&self, name: &str) -> PathBuf {
        let dir = self.dir.path().join("allocs").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

/// Where the ids these tests lease start: far above any account's, so that no process of the
/// host runs as one of them (the pool keeps a uid that a process runs as, and the tests, which
/// run beside others, would see their answers change).
const BASE: u32 = 1_900_200_000;

/// A leased id, counted from [`BASE`].
fn id(user: Ugid) -> u32 {
    user.get() - BASE
}

fn ids(users: &[Ugid]) -> Vec<u32> {
    let mut ids: Vec<u32> = users.iter().map(|u| id(*u)).collect();
    ids.sort_unstable();
    ids
}

/// `TestPool_Acquire_exhausted`.
#[test]
fn pool_acquire_exhausted() {
    let setup = Setup::new();
    let pool = setup.pool(200, 209);
    let users: Vec<Ugid> =
        (0..10).map(|n| pool.acquire(&setup.owner(&format!("t{n}"))).unwrap()).collect();
    assert_eq!(ids(&users), (200..=209).collect::<Vec<_>>());
    match pool.acquire(&setup.owner("one-too-many")) {
        Err(IsolateError::UsersExhausted { min, max, leased: 10 })
            if (min, max) == (BASE + 200, BASE + 209) => {}
        other => panic!("{other:?}"),
    }
    // Let go of one (its task directory is collected): the next acquire gets it.
    std::fs::remove_dir(setup.owner("t4")).unwrap();
    assert_eq!(pool.acquire(&setup.owner("one-too-many")).unwrap(), users[4]);
}

/// `TestPool_Acquire_random`: Nomad picks at random so a released id is unlikely to come back
/// at once; wharf goes round-robin, so it comes back as late as possible.
#[test]
fn pool_acquire_round_robin() {
    let setup = Setup::new();
    let pool = setup.pool(200, 209);
    let first: Vec<Ugid> =
        (0..3).map(|n| pool.acquire(&setup.owner(&format!("t{n}"))).unwrap()).collect();
    assert_eq!(ids(&first), [200, 201, 202]);
    std::fs::remove_dir(setup.owner("t0")).unwrap();
    assert_eq!(pool.sweep().unwrap(), 1);
    let next: Vec<u32> =
        (3..10).map(|n| id(pool.acquire(&setup.owner(&format!("t{n}"))).unwrap())).collect();
    assert_eq!(next, (203..=209).collect::<Vec<_>>(), "200 is free but comes back last");
    assert_eq!(id(pool.acquire(&setup.owner("t10")).unwrap()), 200);
}

/// `TestPool_Restore`: leases made before an agent restart are in use after it.
#[test]
fn pool_restore() {
    let setup = Setup::new();
    {
        let pool = setup.pool(500, 505);
        for (n, expected) in [(0, 500), (1, 501), (2, 502), (3, 503), (4, 504)] {
            assert_eq!(id(pool.acquire(&setup.owner(&format!("t{n}"))).unwrap()), expected);
        }
        for gone in ["t0", "t3"] {
            std::fs::remove_dir(setup.owner(gone)).unwrap();
        }
    }
    // The agent comes back (501, 502 and 504 are still held): the next three are the others.
    let pool = setup.pool(500, 505);
    let next: Vec<Ugid> =
        (5..8).map(|n| pool.acquire(&setup.owner(&format!("t{n}"))).unwrap()).collect();
    assert_eq!(ids(&next), [500, 503, 505]);
}

/// `TestTaskRunner_DynamicUsersHook_Prestart_State`: a task that runs again keeps its user,
/// across agent restarts too.
#[test]
fn a_task_keeps_its_user_across_runs_and_restarts() {
    let setup = Setup::new();
    let owner = setup.owner("web");
    let first = setup.pool(100, 199).acquire(&owner).unwrap();
    let pool = setup.pool(100, 199);
    assert_eq!(pool.acquire(&owner).unwrap(), first);
    assert_ne!(pool.acquire(&setup.owner("db")).unwrap(), first);
    assert!((100..=199).contains(&id(first)));
}

/// Kills and reaps its process when dropped.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn as_user(user: Ugid) -> Sleeper {
        #[allow(clippy::disallowed_methods)] // A process of a workload user for the test.
        let child = std::process::Command::new("/bin/sleep")
            .arg("60")
            .uid(user.get())
            .gid(user.get())
            .spawn()
            .unwrap();
        Sleeper(child)
    }
}

impl Drop for Sleeper {
    #[allow(clippy::disallowed_methods)] // The test's own bystander, killed and reaped.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_uid_that_a_process_still_runs_as_is_never_reused() {
    require_root();
    let setup = Setup::new();
    let (min, max) = (test_user(10).get(), test_user(11).get());
    let pool = UserPool::open(&setup.journal(), UgidRange::new(min, max).unwrap()).unwrap();
    let owner = setup.owner("escaped");
    let user = pool.acquire(&owner).unwrap();
    let process = Sleeper::as_user(user);
    // Its directory is gone, but a process of it still runs: after a restart its uid stays
    // taken.
    std::fs::remove_dir(&owner).unwrap();
    drop(pool);
    let pool = UserPool::open(&setup.journal(), UgidRange::new(min, max).unwrap()).unwrap();
    assert_eq!(pool.leases().unwrap(), [(user, owner.clone())]);
    assert_ne!(pool.acquire(&setup.owner("new")).unwrap(), user);
    match pool.acquire(&setup.owner("newer")) {
        Err(IsolateError::UsersExhausted { .. }) => {}
        other => panic!("{other:?}"),
    }
    drop(process);
    assert_eq!(pool.acquire(&setup.owner("newer")).unwrap(), user);
}

#[test]
fn two_agents_sharing_a_journal_never_hand_out_one_uid_twice() {
    let setup = Setup::new();
    let owners: Vec<PathBuf> = (0..40).map(|n| setup.owner(&format!("t{n}"))).collect();
    let (a, b) = (setup.pool(1000, 1099), setup.pool(1000, 1099));
    let taken: Vec<Ugid> = std::thread::scope(|scope| {
        let halves = [(&a, &owners[..20]), (&b, &owners[20..])];
        let workers: Vec<_> = halves
            .into_iter()
            .map(|(pool, owners)| {
                scope.spawn(move || {
                    owners.iter().map(|o| pool.acquire(o).unwrap()).collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let mut unique = ids(&taken);
    unique.dedup();
    assert_eq!(unique.len(), 40, "{taken:?}");
    // Each sees the other's leases, and asks for an owner's lease get the same answer.
    assert_eq!(a.leases().unwrap(), b.leases().unwrap());
    assert_eq!(a.acquire(&owners[25]).unwrap(), b.acquire(&owners[25]).unwrap());
}

#[test]
fn a_sweep_compacts_a_long_journal_and_others_follow_the_new_file() {
    let setup = Setup::new();
    let other = setup.pool(1, 10_000);
    let pool = setup.pool(1, 10_000);
    for n in 0..200 {
        pool.acquire(&setup.owner(&format!("t{n}"))).unwrap();
    }
    let keep = pool.acquire(&setup.owner("keep")).unwrap();
    std::fs::remove_dir_all(setup.dir.path().join("allocs")).unwrap();
    let keep_owner = setup.owner("keep");
    let before = std::fs::metadata(setup.journal()).unwrap();
    assert_eq!(pool.sweep().unwrap(), 200);
    let after = std::fs::metadata(setup.journal()).unwrap();
    assert_ne!(before.ino(), after.ino(), "a new file");
    assert!(after.len() < before.len() / 10, "{} -> {} bytes", before.len(), after.len());
    assert_eq!(pool.leases().unwrap(), [(keep, keep_owner.clone())]);
    // A pool opened before the compaction reads the new file, and so does a new one.
    assert_eq!(other.leases().unwrap(), [(keep, keep_owner.clone())]);
    let fresh = other.acquire(&setup.owner("fresh")).unwrap();
    assert!(pool.leases().unwrap().iter().any(|(u, _)| *u == fresh));
    drop(pool);
    let reopened = setup.pool(1, 10_000);
    assert_eq!(reopened.leases().unwrap().len(), 2);
    assert_eq!(std::fs::metadata(setup.journal()).unwrap().ino(), after.ino(), "nothing to do");
}

#[test]
fn a_torn_last_line_is_cut_and_damage_is_refused_with_its_line() {
    let setup = Setup::new();
    let owner = setup.owner("t");
    let user = setup.pool(300, 309).acquire(&owner).unwrap();
    // A crash in the middle of an append leaves a line without its newline.
    let journal = setup.journal();
    let mut text = std::fs::read(&journal).unwrap();
    text.extend_from_slice(b"+ 305 /half/writ");
    std::fs::write(&journal, &text).unwrap();
    let pool = setup.pool(300, 309);
    assert_eq!(pool.leases().unwrap(), [(user, owner)]);
    let next = pool.acquire(&setup.owner("u")).unwrap();
    assert_eq!(pool.leases().unwrap().len(), 2, "the new line is whole: {next}");

    for (content, line, reason) in [
        ("something else\n", 1, "not a workload-user journal"),
        ("wharf-workload-users-2\n", 1, "written in format wharf-workload-users-2"),
        ("wharf-workload-users-1\n+ 300 relative\n", 2, "without an absolute owner"),
        ("wharf-workload-users-1\n+ 0 /a\n", 2, "bad id \"0\""),
        ("wharf-workload-users-1\n- x\n", 2, "bad id \"x\""),
        ("wharf-workload-users-1\n\n", 2, "not a journal line"),
        ("wharf-workload-users-1\n* 300 /a\n", 2, "not a journal line"),
    ] {
        std::fs::write(&journal, content).unwrap();
        match UserPool::open(&journal, UgidRange::new(300, 309).unwrap()) {
            Err(IsolateError::Journal { path, line: l, reason: r }) => {
                assert_eq!((path.as_path(), l), (journal.as_path(), line), "{content:?}");
                assert!(r.contains(reason), "{content:?}: {r}");
            }
            other => panic!("{content:?}: {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), content, "left as it was");
    }
}

#[test]
fn ranges_and_owners_are_checked() {
    for (min, max, reason) in
        [(0, 10, "includes root"), (10, 9, "below the minimum"), (10, u32::MAX, "above 2147483647")]
    {
        match UgidRange::new(min, max) {
            Err(IsolateError::BadRange { reason: r, .. }) => assert!(r.contains(reason), "{r}"),
            other => panic!("{min}-{max}: {other:?}"),
        }
    }
    assert_eq!(UgidRange::DEFAULT, UgidRange::new(80_000, 89_999).unwrap());
    let setup = Setup::new();
    let pool = setup.pool(1, 5);
    for owner in [Path::new("relative"), Path::new("/with\nnewline")] {
        assert!(matches!(pool.acquire(owner), Err(IsolateError::Journal { .. })), "{owner:?}");
    }
}

#[test]
fn a_contained_child_runs_as_its_workload_user_with_no_other_groups() {
    require_root();
    let user = test_user(1);
    let containment = Containment { user: Some(user), ..Containment::default() };
    let outcome = run(&containment, &["/usr/bin/id"], &[]);
    assert!(outcome.ok(), "{outcome:?}");
    let n = user.get();
    assert_eq!(outcome.stdout.trim(), format!("uid={n} gid={n} groups={n}"));
    let caps = run(&containment, &["/bin/sh", "-c", "grep ^CapEff /proc/self/status"], &[]);
    assert_eq!(caps.stdout.trim(), "CapEff:\t0000000000000000", "{caps:?}");
}

#[test]
fn a_workload_user_cannot_signal_another_ones_processes() {
    require_root();
    let (mine, other) = (test_user(2), test_user(3));
    let bystander = Sleeper::as_user(other);
    let probe = format!("kill -0 {}", bystander.0.id());
    let as_user = |user| Containment { user: Some(user), ..Containment::default() };
    let denied = run(&as_user(mine), &["/bin/sh", "-c", &probe], &[]);
    assert!(!denied.ok() && denied.stderr.contains("ermitted"), "{denied:?}");
    let same = run(&as_user(other), &["/bin/sh", "-c", &probe], &[]);
    assert!(same.ok(), "the same user may: {same:?}");
}

#[test]
fn directories_are_handed_over_without_following_links() {
    require_root();
    let setup = Setup::new();
    let task = setup.owner("web");
    let victim = setup.dir.path().join("victim");
    std::fs::write(&victim, "root's").unwrap();
    let link = task.join("local");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let user = test_user(4);
    let task_dir = OpenDir::open(&task).unwrap();
    // A link where a directory to hand over should be is refused, never followed.
    match task_dir.open_dir("local") {
        Err(IsolateError::NotFollowed { path }) => assert_eq!(path, link),
        other => panic!("{other:?}"),
    }
    std::fs::create_dir(task.join("secrets")).unwrap();
    let secrets = task_dir.open_dir("secrets").unwrap();
    // What a task puts at the path once the directory is open is not touched either.
    std::fs::rename(task.join("secrets"), task.join("moved")).unwrap();
    std::os::unix::fs::symlink(&victim, task.join("secrets")).unwrap();
    hand_over(&[&task_dir, &secrets], user).unwrap();
    assert_eq!(std::fs::metadata(&task).unwrap().uid(), user.get());
    assert_eq!(std::fs::metadata(task.join("moved")).unwrap().uid(), user.get());
    assert_eq!(std::fs::symlink_metadata(&link).unwrap().uid(), 0, "the link is untouched");
    assert_eq!(std::fs::metadata(&victim).unwrap().uid(), 0, "the link's target is untouched");
    match OpenDir::open(setup.dir.path().join("missing")) {
        Err(IsolateError::Io { path, .. }) => assert!(path.ends_with("missing")),
        other => panic!("{other:?}"),
    }
}
