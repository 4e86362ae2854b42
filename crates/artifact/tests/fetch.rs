//! Fetching artifacts for real: from an HTTP server on 127.0.0.1 and from local files, checked,
//! bounded and unpacked into a temporary task directory. Cases follow go-getter's http, file,
//! checksum and decompressor tests where they apply.

mod common;

use common::{Entry, Route, Server, gzip, md5_hex, sha256_hex, tar, zip};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use wharf_artifact::{ArtifactError, Fetcher, Limits};
use wharf_state::{Artifact, ArtifactMode, ArtifactOptions};

fn artifact(source: &str, destination: &str, mode: ArtifactMode) -> Artifact {
    Artifact {
        source: source.to_owned(),
        destination: destination.to_owned(),
        mode,
        options: ArtifactOptions::default(),
    }
}

fn checked(source: &str, checksum: &str) -> Artifact {
    Artifact {
        options: ArtifactOptions { checksum: Some(checksum.to_owned()) },
        ..artifact(source, "local/", ArtifactMode::Any)
    }
}

/// A fetcher for task directories made by `tempfile`, whose parent (standing for the
/// allocation's directory) is the system's temporary directory, where the tests' source files
/// are too.
fn fetcher() -> Fetcher {
    Fetcher::new(Limits::default()).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Everything under `dir`, as sorted relative paths.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

#[tokio::test]
async fn http_getter_file() {
    let server = Server::start().await;
    server.route("/app.conf", Route::Body(b"listen = 8080\n".to_vec()));
    let task = tempfile::tempdir().unwrap();
    let placed = fetcher()
        .fetch(
            &artifact(&server.url("/app.conf"), "local/conf/app.conf", ArtifactMode::File),
            task.path(),
        )
        .await
        .unwrap();
    assert_eq!(placed, task.path().join("local/conf/app.conf"));
    assert_eq!(read(&placed), "listen = 8080\n");
    assert_eq!(
        tree(task.path()),
        ["local", "local/conf", "local/conf/app.conf"],
        "no part file left"
    );
}

#[tokio::test]
async fn http_getter_any_mode_saves_under_the_source_name() {
    let server = Server::start().await;
    server.route("/files/tool.sh", Route::Body(b"#!/bin/sh\n".to_vec()));
    let task = tempfile::tempdir().unwrap();
    let url = format!("{}?version=2", server.url("/files/tool.sh"));
    server.route("/files/tool.sh?version=2", Route::Body(b"#!/bin/sh\n".to_vec()));
    let placed =
        fetcher().fetch(&artifact(&url, "local/", ArtifactMode::Any), task.path()).await.unwrap();
    assert_eq!(placed, task.path().join("local/tool.sh"), "the query is not part of the name");
}

#[tokio::test]
async fn http_getter_bad_status_is_an_error_naming_it() {
    let server = Server::start().await;
    let task = tempfile::tempdir().unwrap();
    let error = fetcher()
        .fetch(&artifact(&server.url("/missing.tar.gz"), "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(matches!(error, ArtifactError::Fetch { .. }), "{error:?}");
    assert!(error.to_string().contains("404"), "{error}");
    assert!(tree(&task.path().join("local")).is_empty());
}

#[tokio::test]
async fn http_getter_follows_redirects_and_stops_a_loop() {
    let server = Server::start().await;
    server.route("/old", Route::Redirect("/new/app.txt".into()));
    server.route("/new/app.txt", Route::Body(b"moved".to_vec()));
    server.route("/loop", Route::Redirect("/loop".into()));
    let task = tempfile::tempdir().unwrap();
    let placed = fetcher()
        .fetch(&artifact(&server.url("/old"), "local/app.txt", ArtifactMode::File), task.path())
        .await
        .unwrap();
    assert_eq!(read(&placed), "moved");
    let error = fetcher()
        .fetch(&artifact(&server.url("/loop"), "local/x", ArtifactMode::File), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("redirects"), "{error}");
    assert_eq!(server.hits("/loop"), wharf_artifact::MAX_REDIRECTS + 1);
}

#[tokio::test]
async fn http_getter_truncated_body_is_an_error() {
    let server = Server::start().await;
    server.route("/cut", Route::Truncated { claimed: 1000, sent: b"only this".to_vec() });
    let task = tempfile::tempdir().unwrap();
    let result = fetcher()
        .fetch(&artifact(&server.url("/cut"), "local/cut", ArtifactMode::File), task.path())
        .await;
    assert!(result.is_err(), "{result:?}");
    assert!(!task.path().join("local/cut").exists());
}

#[tokio::test]
async fn get_file_checksum_sha256_and_md5() {
    let server = Server::start().await;
    let body = b"the artifact".to_vec();
    server.route("/a.bin", Route::Body(body.clone()));
    let task = tempfile::tempdir().unwrap();
    let url = server.url("/a.bin");
    for checksum in [format!("sha256:{}", sha256_hex(&body)), format!("md5:{}", md5_hex(&body))] {
        let placed = fetcher().fetch(&checked(&url, &checksum), task.path()).await;
        assert_eq!(placed.unwrap(), task.path().join("local/a.bin"), "{checksum}");
    }
}

#[tokio::test]
async fn get_file_checksum_mismatch_is_refused_and_nothing_is_left() {
    let server = Server::start().await;
    server.route("/a.bin", Route::Body(b"tampered".to_vec()));
    let task = tempfile::tempdir().unwrap();
    let wrong = format!("sha256:{}", sha256_hex(b"the artifact"));
    let error =
        fetcher().fetch(&checked(&server.url("/a.bin"), &wrong), task.path()).await.unwrap_err();
    assert!(matches!(error, ArtifactError::Checksum { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&format!("got sha256:{}", sha256_hex(b"tampered"))),
        "{error}"
    );
    assert_eq!(tree(task.path()), Vec::<String>::new(), "neither the file nor the part file");
    let md5 = format!("md5:{}", md5_hex(b"the artifact"));
    let error =
        fetcher().fetch(&checked(&server.url("/a.bin"), &md5), task.path()).await.unwrap_err();
    assert!(error.to_string().contains("does not match"), "{error}");
}

#[tokio::test]
async fn file_getter_file_by_path_and_url() {
    let files = tempfile::tempdir().unwrap();
    let source = files.path().join("data.csv");
    std::fs::write(&source, "a,b\n").unwrap();
    let task = tempfile::tempdir().unwrap();
    let by_path = source.display().to_string();
    let by_url = format!("file://{}", source.display());
    for (source, destination) in [(by_path, "local/one.csv"), (by_url, "local/two.csv")] {
        let placed = fetcher()
            .fetch(&artifact(&source, destination, ArtifactMode::File), task.path())
            .await
            .unwrap();
        assert_eq!(read(&placed), "a,b\n");
    }
    let missing = files.path().join("nope").display().to_string();
    let error = fetcher()
        .fetch(&artifact(&missing, "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("No such file"), "{error}");
    let dir = files.path().display().to_string();
    let error = fetcher()
        .fetch(&artifact(&dir, "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

#[tokio::test]
async fn tar_gz_unpacks_files_dirs_modes_and_inner_links() {
    let server = Server::start().await;
    let archive = gzip(&tar(&[
        Entry::Dir("app/"),
        Entry::File("app/run.sh", b"#!/bin/sh\necho hi\n", 0o4755),
        Entry::File("app/conf/app.conf", b"x = 1\n", 0o640),
        Entry::Symlink("app/current", "conf/app.conf"),
        Entry::HardLink("app/run2.sh", "app/run.sh"),
    ]));
    server.route("/app.tar.gz", Route::Body(archive));
    let task = tempfile::tempdir().unwrap();
    let placed = fetcher()
        .fetch(&artifact(&server.url("/app.tar.gz"), "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap();
    let local = task.path().join("local");
    assert_eq!(placed, local);
    assert_eq!(
        tree(&local),
        ["app", "app/conf", "app/conf/app.conf", "app/current", "app/run.sh", "app/run2.sh"]
    );
    let mode = std::fs::metadata(local.join("app/run.sh")).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755, "the execute bit stays, set-id bits do not");
    assert_eq!(read(&local.join("app/current")), "x = 1\n");
    assert_eq!(read(&local.join("app/run2.sh")), "#!/bin/sh\necho hi\n");
}

#[tokio::test]
async fn tar_and_gz_and_tgz_from_local_files() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("plain.tar"), tar(&[Entry::File("a.txt", b"A", 0o644)]))
        .unwrap();
    std::fs::write(files.path().join("b.tgz"), gzip(&tar(&[Entry::File("b.txt", b"B", 0o644)])))
        .unwrap();
    std::fs::write(files.path().join("notes.txt.gz"), gzip(b"C")).unwrap();
    let task = tempfile::tempdir().unwrap();
    for name in ["plain.tar", "b.tgz", "notes.txt.gz"] {
        let source = files.path().join(name).display().to_string();
        fetcher()
            .fetch(&artifact(&source, "local/", ArtifactMode::Dir), task.path())
            .await
            .unwrap();
    }
    assert_eq!(tree(&task.path().join("local")), ["a.txt", "b.txt", "notes.txt"]);
    assert_eq!(read(&task.path().join("local/notes.txt")), "C");
    // mode "file" with a .gz: the file is the decompressed content.
    let source = files.path().join("notes.txt.gz").display().to_string();
    let placed = fetcher()
        .fetch(&artifact(&source, "local/renamed", ArtifactMode::File), task.path())
        .await
        .unwrap();
    assert_eq!(read(&placed), "C");
}

#[tokio::test]
async fn mode_dir_needs_an_archive() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("plain.txt"), "p").unwrap();
    let task = tempfile::tempdir().unwrap();
    let source = files.path().join("plain.txt").display().to_string();
    let error = fetcher()
        .fetch(&artifact(&source, "local/", ArtifactMode::Dir), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("needs an archive"), "{error}");
}

/// go-getter's decompressor cases that must be refused ("outside parent"), as tar entries.
#[tokio::test]
async fn tar_entries_outside_the_destination_are_refused() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("dot-dot", tar(&[Entry::File("../escaped", b"x", 0o644)]), "outside"),
        ("deep dot-dot", tar(&[Entry::File("a/../../escaped", b"x", 0o644)]), "outside"),
        ("absolute", tar(&[Entry::File("/tmp/escaped", b"x", 0o644)]), "absolute"),
        ("link out", tar(&[Entry::Symlink("evil", "../../etc")]), "leads outside"),
        ("absolute link", tar(&[Entry::Symlink("evil", "/etc")]), "leads outside"),
        (
            "write through a link",
            tar(&[Entry::Symlink("d", "."), Entry::File("d/x", b"x", 0o644)]),
            "through a link",
        ),
        (
            "a chain of links out",
            tar(&[Entry::Symlink("s", "."), Entry::Symlink("a", "s/..")]),
            "leads outside",
        ),
        ("hard link out", tar(&[Entry::HardLink("h", "../../etc/passwd")]), "outside"),
    ];
    let files = tempfile::tempdir().unwrap();
    for (case, bytes, phrase) in cases {
        let task = tempfile::tempdir().unwrap();
        let source = files.path().join("evil.tar");
        std::fs::write(&source, bytes).unwrap();
        let error = fetcher()
            .fetch(
                &artifact(&source.display().to_string(), "local/", ArtifactMode::Any),
                task.path(),
            )
            .await
            .unwrap_err();
        assert!(matches!(error, ArtifactError::Archive { .. }), "{case}: {error:?}");
        assert!(error.to_string().contains(phrase), "{case}: {error}");
        assert!(!task.path().join("escaped").exists(), "{case}");
    }
}

#[tokio::test]
async fn zip_unpacks_deflated_files_dirs_and_inner_links() {
    let files = tempfile::tempdir().unwrap();
    let source = files.path().join("site.zip");
    std::fs::write(
        &source,
        zip(&[
            Entry::Dir("site/"),
            Entry::File("site/index.html", &b"<h1>hi</h1>".repeat(50), 0o644),
            Entry::File("site/bin/serve", b"#!/bin/sh\n", 0o755),
            Entry::Symlink("site/home.html", "index.html"),
        ]),
    )
    .unwrap();
    let task = tempfile::tempdir().unwrap();
    fetcher()
        .fetch(
            &artifact(&source.display().to_string(), "local/www", ArtifactMode::Any),
            task.path(),
        )
        .await
        .unwrap();
    let www = task.path().join("local/www");
    assert_eq!(
        tree(&www),
        ["site", "site/bin", "site/bin/serve", "site/home.html", "site/index.html"]
    );
    assert_eq!(read(&www.join("site/home.html")), "<h1>hi</h1>".repeat(50));
    let mode = std::fs::metadata(www.join("site/bin/serve")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[tokio::test]
async fn zip_entries_outside_the_destination_and_damage_are_refused() {
    let mut damaged = zip(&[Entry::File("a.txt", b"hello hello hello", 0o644)]);
    let last_data = 30 + "a.txt".len() + 2;
    damaged[last_data] ^= 0xff;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("zip slip", zip(&[Entry::File("../../evil.sh", b"x", 0o755)]), "outside"),
        ("absolute", zip(&[Entry::File("/etc/evil", b"x", 0o644)]), "absolute"),
        ("link out", zip(&[Entry::Symlink("l", "../../../etc/passwd")]), "leads outside"),
        ("damaged", damaged, "damaged"),
        ("not a zip", b"PK but not really".to_vec(), "not a zip"),
    ];
    let files = tempfile::tempdir().unwrap();
    for (case, bytes, phrase) in cases {
        let task = tempfile::tempdir().unwrap();
        let source = files.path().join("evil.zip");
        std::fs::write(&source, bytes).unwrap();
        let error = fetcher()
            .fetch(
                &artifact(&source.display().to_string(), "local/", ArtifactMode::Any),
                task.path(),
            )
            .await
            .unwrap_err();
        assert!(error.to_string().contains(phrase), "{case}: {error}");
    }
}

#[tokio::test]
async fn downloads_and_archives_are_bounded_in_size() {
    let server = Server::start().await;
    server.route("/big", Route::Body(vec![7; 4096]));
    let task = tempfile::tempdir().unwrap();
    let small = Limits { max_download_bytes: 1024, ..Limits::default() };
    let error = Fetcher::new(small)
        .unwrap()
        .fetch(&artifact(&server.url("/big"), "local/big", ArtifactMode::File), task.path())
        .await
        .unwrap_err();
    assert!(matches!(error, ArtifactError::TooLarge { limit: 1024, .. }), "{error:?}");

    let files = tempfile::tempdir().unwrap();
    let bomb = files.path().join("bomb.tar.gz");
    std::fs::write(&bomb, gzip(&tar(&[Entry::File("zeros", &vec![0; 1 << 20], 0o644)]))).unwrap();
    assert!(std::fs::metadata(&bomb).unwrap().len() < 8192, "a small download");
    let tight = Limits { max_unpacked_bytes: 64 * 1024, ..Limits::default() };
    let error = Fetcher::new(tight)
        .unwrap()
        .fetch(&artifact(&bomb.display().to_string(), "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("larger than the limit"), "{error}");

    let many = files.path().join("many.tar");
    let names: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
    let entries: Vec<Entry<'_>> = names.iter().map(|n| Entry::File(n, b"", 0o644)).collect();
    std::fs::write(&many, tar(&entries)).unwrap();
    let few = Limits { max_entries: 10, ..Limits::default() };
    let error = Fetcher::new(few)
        .unwrap()
        .fetch(&artifact(&many.display().to_string(), "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("too many entries"), "{error}");
}

#[tokio::test]
async fn a_download_that_does_not_finish_in_time_is_cut_off() {
    let server = Server::start().await;
    server.route("/slow", Route::Hang);
    let task = tempfile::tempdir().unwrap();
    let quick = Limits { timeout: Duration::from_millis(300), ..Limits::default() };
    let started = tokio::time::Instant::now();
    let error = Fetcher::new(quick)
        .unwrap()
        .fetch(&artifact(&server.url("/slow"), "local/x", ArtifactMode::File), task.path())
        .await
        .unwrap_err();
    assert!(matches!(error, ArtifactError::TimedOut { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(tree(task.path()), Vec::<String>::new(), "the part file is gone");
}

#[tokio::test]
async fn a_destination_reached_through_a_link_is_refused() {
    let files = tempfile::tempdir().unwrap();
    let source = files.path().join("a.txt");
    std::fs::write(&source, "a").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let task = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), task.path().join("local")).unwrap();
    let error = fetcher()
        .fetch(&artifact(&source.display().to_string(), "local/", ArtifactMode::Any), task.path())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("is a link"), "{error}");
    assert!(tree(elsewhere.path()).is_empty());
}

/// A local source must be inside the allocation's directory or an allowed root: a job may not
/// copy the node's own files into its task.
#[tokio::test]
async fn local_sources_outside_the_allocation_are_refused_unless_allowed() {
    let alloc = tempfile::tempdir().unwrap();
    let task_dir = alloc.path().join("a1/t");
    std::fs::create_dir_all(alloc.path().join("a1/alloc/data")).unwrap();
    std::fs::create_dir_all(&task_dir).unwrap();
    let inside = alloc.path().join("a1/alloc/data/in.txt");
    std::fs::write(&inside, "in").unwrap();
    let node_files = tempfile::tempdir().unwrap();
    let outside = node_files.path().join("secret.key");
    std::fs::write(&outside, "key").unwrap();
    let through_link = alloc.path().join("a1/alloc/data/link");
    std::os::unix::fs::symlink(&outside, &through_link).unwrap();

    let plain = fetcher();
    let get = |fetcher: &Fetcher, source: &Path, name: &str| {
        let artifact =
            artifact(&source.display().to_string(), &format!("local/{name}"), ArtifactMode::File);
        let (fetcher, task_dir) = (fetcher.clone(), task_dir.clone());
        async move { fetcher.fetch(&artifact, &task_dir).await }
    };
    assert!(get(&plain, &inside, "in").await.is_ok());
    for source in [&outside, &through_link, Path::new("/etc/hostname")] {
        let error = get(&plain, source, "x").await.unwrap_err();
        assert!(
            error.to_string().contains("inside the allocation's directory"),
            "{source:?}: {error}"
        );
    }
    assert!(!task_dir.join("local/x").exists());
    let allowing = fetcher().with_local_roots([node_files.path().to_owned()]);
    assert_eq!(read(&get(&allowing, &outside, "key").await.unwrap()), "key");
}
