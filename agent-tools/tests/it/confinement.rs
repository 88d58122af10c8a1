//! Every route out of the workspace is refused, for files and directories alike.

use agent_core::ErrorKind;
use agent_tools::Typed;
use agent_tools::builtin::{ListDir, ReadFile};
use serde_json::json;

use crate::builtins::call;

struct Setup {
    _outer: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn setup() -> Setup {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("ws");
    std::fs::create_dir_all(root.join("inner")).unwrap();
    std::fs::write(root.join("inner/ok.txt"), "inside\n").unwrap();
    let outside = outer.path().join("secret.txt");
    std::fs::write(&outside, "secret\n").unwrap();
    Setup {
        _outer: outer,
        root,
        outside,
    }
}

async fn refused(root: &std::path::Path, path: &str) -> String {
    let err = call(&Typed(ReadFile), root, json!({ "path": path }))
        .await
        .expect_err(path);
    assert_eq!(err.kind, ErrorKind::Denied, "{path}: {err}");
    err.message
}

#[tokio::test]
async fn dot_dot_escapes_are_refused() {
    let s = setup();
    let msg = refused(&s.root, "../secret.txt").await;
    assert!(msg.contains("climbs out"), "{msg}");
    refused(&s.root, "inner/../../secret.txt").await;
    // Climbing inside the workspace is fine.
    let ok = call(
        &Typed(ReadFile),
        &s.root,
        json!({"path": "inner/../inner/ok.txt"}),
    )
    .await
    .unwrap();
    assert!(ok.contains("inside"));
}

#[tokio::test]
async fn absolute_paths_outside_are_refused_and_inside_are_accepted() {
    let s = setup();
    let msg = refused(&s.root, s.outside.to_str().unwrap()).await;
    assert!(msg.contains("outside the workspace"), "{msg}");
    refused(&s.root, "/etc/passwd").await;
    let inside = s.root.canonicalize().unwrap().join("inner/ok.txt");
    let ok = call(
        &Typed(ReadFile),
        &s.root,
        json!({"path": inside.to_str().unwrap()}),
    )
    .await
    .unwrap();
    assert!(ok.contains("inside"));
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_that_resolve_outside_are_refused() {
    let s = setup();
    std::os::unix::fs::symlink(&s.outside, s.root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(s.outside.parent().unwrap(), s.root.join("up")).unwrap();
    let msg = refused(&s.root, "link.txt").await;
    assert!(msg.contains("symlink"), "{msg}");
    refused(&s.root, "up/secret.txt").await;
    let err = call(&Typed(ListDir), &s.root, json!({"path": "up"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied);
    // A symlink that stays inside is followed.
    std::os::unix::fs::symlink(s.root.join("inner/ok.txt"), s.root.join("alias.txt")).unwrap();
    let ok = call(&Typed(ReadFile), &s.root, json!({"path": "alias.txt"}))
        .await
        .unwrap();
    assert!(ok.contains("inside"));
}
