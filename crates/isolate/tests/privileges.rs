//! `no_new_privs` for real: a setuid-root program run by a workload user becomes root without
//! it and stays the workload user with it.

mod common;

use common::{require_root, run, test_user};
use std::os::unix::fs::PermissionsExt;
use wharf_isolate::Containment;

#[test]
fn no_new_privs_keeps_a_setuid_program_from_making_the_task_root() {
    require_root();
    assert!(!wharf_isolate::privileges::no_new_privs().unwrap(), "the test process is free");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let setuid_id = dir.path().join("id");
    std::fs::copy("/usr/bin/id", &setuid_id).unwrap();
    std::fs::set_permissions(&setuid_id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let program = setuid_id.to_str().unwrap();
    let user = test_user(30);
    let n = user.get();

    let without = Containment { user: Some(user), ..Containment::default() };
    let outcome = run(&without, &[program], &[]);
    assert!(outcome.stdout.contains("euid=0"), "setuid works without it: {outcome:?}");

    let with = Containment { user: Some(user), no_new_privs: true, ..Containment::default() };
    let outcome = run(&with, &[program], &[]);
    assert!(outcome.ok(), "{outcome:?}");
    assert_eq!(outcome.stdout.trim(), format!("uid={n} gid={n} groups={n}"));
}
