use std::sync::Arc;

use agent_core::{CallId, ErrorKind, ToolError};
use agent_tools::builtin::{Grep, ListDir, ReadFile};
use agent_tools::{Tool, ToolContext, Typed, Workspace};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub fn ctx(root: &std::path::Path) -> ToolContext {
    ToolContext {
        workspace: Arc::new(Workspace::new(root).unwrap()),
        cancel: CancellationToken::new(),
        run_id: "run-1".into(),
        call_id: CallId::from("c1"),
        effect_key: None,
        resolved: None,
    }
}

pub async fn call(
    tool: &dyn Tool,
    root: &std::path::Path,
    args: Value,
) -> Result<String, ToolError> {
    tool.call(args, &ctx(root)).await
}

#[tokio::test]
async fn file_tools_act_on_the_resolution_the_gateway_judged() {
    // The gateway resolves a call's path, policy judges that resolution, and the tool is
    // handed it: a link changed in between does not move the tool somewhere unjudged.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("judged.txt"), "judged\n").unwrap();
    std::fs::write(dir.path().join("other.txt"), "other\n").unwrap();
    std::os::unix::fs::symlink("judged.txt", dir.path().join("link")).unwrap();
    let mut ctx = ctx(dir.path());
    let judged = ctx.workspace.resolve("link").unwrap();
    std::fs::remove_file(dir.path().join("link")).unwrap();
    std::os::unix::fs::symlink("other.txt", dir.path().join("link")).unwrap();
    ctx.resolved = Some(("link".to_owned(), judged));
    let read = Typed(ReadFile)
        .call(json!({"path": "link"}), &ctx)
        .await
        .unwrap();
    assert_eq!(read, "     1\tjudged\n");
    std::fs::create_dir(dir.path().join("judged")).unwrap();
    std::fs::write(dir.path().join("judged/inside.txt"), "").unwrap();
    std::os::unix::fs::symlink("judged", dir.path().join("dir")).unwrap();
    let judged = ctx.workspace.resolve("dir").unwrap();
    std::fs::remove_file(dir.path().join("dir")).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("dir")).unwrap();
    let mut in_dir = ctx.clone();
    in_dir.resolved = Some(("dir".to_owned(), judged));
    let listed = Typed(ListDir)
        .call(json!({"path": "dir"}), &in_dir)
        .await
        .unwrap();
    assert!(listed.contains("inside.txt"), "{listed}");
    // A resolution of another spelling is not borrowed: the tool resolves its own.
    let read = Typed(ReadFile)
        .call(json!({"path": "./link"}), &ctx)
        .await
        .unwrap();
    assert_eq!(read, "     1\tother\n");
}

#[tokio::test]
async fn a_file_that_grew_after_it_was_resolved_is_still_read_whole() {
    // Resolved small (so to be read in place), then grown past the in-place limit before
    // the tool opens it: the size of the file opened decides, and its lines all come back.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("log.txt"), "first\n").unwrap();
    let mut ctx = ctx(dir.path());
    let small = ctx.workspace.resolve("log.txt").unwrap();
    assert!(ctx.workspace.reads_inline(&small));
    let grown: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
    assert!(grown.len() as u64 > agent_tools::INLINE_READ_BYTES);
    std::fs::write(dir.path().join("log.txt"), &grown).unwrap();
    ctx.resolved = Some(("log.txt".to_owned(), small));
    let read = Typed(ReadFile)
        .call(json!({"path": "log.txt", "offset": 9_999}), &ctx)
        .await
        .unwrap();
    assert_eq!(read, "  9999\tline 9998\n 10000\tline 9999\n");
}

#[tokio::test]
async fn read_file_numbers_lines_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\nthree\n").unwrap();
    let tool = Typed(ReadFile);
    let all = call(&tool, dir.path(), json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert_eq!(all, "     1\tone\n     2\ttwo\n     3\tthree\n");
    let page = call(
        &tool,
        dir.path(),
        json!({"path": "a.txt", "offset": 2, "limit": 1}),
    )
    .await
    .unwrap();
    assert!(page.starts_with("     2\ttwo\n"));
    assert!(page.contains("offset 3"));
}

#[tokio::test]
async fn read_file_refuses_binary_files_and_directories_politely() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("img.bin"),
        [0x89, b'P', b'N', b'G', 0, 1, 2],
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let tool = Typed(ReadFile);
    let err = call(&tool, dir.path(), json!({"path": "img.bin"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ExecutionFailed);
    assert!(err.message.contains("binary"), "{err}");
    let err = call(&tool, dir.path(), json!({"path": "sub"}))
        .await
        .unwrap_err();
    assert!(err.message.contains("list_dir"), "{err}");
    let err = call(&tool, dir.path(), json!({"path": "missing.txt"}))
        .await
        .unwrap_err();
    assert!(err.message.contains("no such file"), "{err}");
}

#[tokio::test]
async fn list_dir_sorts_and_marks_directories() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.txt"), "").unwrap();
    std::fs::write(dir.path().join("a.txt"), "").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "").unwrap();
    let tool = Typed(ListDir);
    assert_eq!(
        call(&tool, dir.path(), json!({})).await.unwrap(),
        "a.txt\nb.txt\nsrc/"
    );
    assert_eq!(
        call(&tool, dir.path(), json!({"path": "src"}))
            .await
            .unwrap(),
        "lib.rs"
    );
}

#[tokio::test]
async fn list_dir_and_glob_show_the_first_thousand_by_name_and_count_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    // 1,003 files made in an order that is not their names' order.
    let names: Vec<String> = (0..1_003)
        .map(|i| format!("f{:04}.txt", (i * 7) % 1_003))
        .collect();
    for name in &names {
        std::fs::write(dir.path().join(name), "").unwrap();
    }
    let mut first: Vec<String> = names.clone();
    first.sort();
    first.truncate(1_000);
    let listed = call(&Typed(ListDir), dir.path(), json!({})).await.unwrap();
    assert_eq!(
        listed,
        format!("{}\n(3 more entries not shown)", first.join("\n"))
    );
    let globbed = call(
        &Typed(agent_tools::builtin::Glob),
        dir.path(),
        json!({"pattern": "*.txt"}),
    )
    .await
    .unwrap();
    assert_eq!(
        globbed,
        format!(
            "{}\n(3 more paths not shown; narrow the pattern)",
            first.join("\n")
        )
    );
}

#[tokio::test]
async fn grep_shows_the_first_matches_in_path_order_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    // Names whose order as paths is not their order as strings ("a/..." before "a-b/...",
    // '/' before '-' and '.'), made in an order that is neither.
    let dirs = ["a.d", "a", "b", "a-b"];
    let mut expected: Vec<(std::path::PathBuf, usize, String)> = Vec::new();
    for i in 0..120usize {
        let sub = dirs[(i * 7) % dirs.len()];
        let rel = std::path::PathBuf::from(sub).join(format!("f{:03}.txt", (i * 37) % 120));
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        // Five matching lines among others.
        let mut text = String::new();
        for n in 1..=9usize {
            if n % 2 == 1 {
                text.push_str(&format!("hit {i} {n}\n"));
                expected.push((rel.clone(), n, format!("hit {i} {n}")));
            } else {
                text.push_str("miss\n");
            }
        }
        std::fs::write(dir.path().join(&rel), text).unwrap();
    }
    std::fs::write(dir.path().join("a.txt"), "hit top\n").unwrap();
    expected.push(("a.txt".into(), 1, "hit top".into()));
    let total = expected.len();
    expected.sort();
    let shown: Vec<String> = expected[..500]
        .iter()
        .map(|(rel, n, text)| format!("{}:{n}: {text}", rel.display()))
        .collect();
    let out = call(&Typed(Grep), dir.path(), json!({"pattern": "^hit"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        format!(
            "{}\n({} more matching lines not shown; narrow the pattern or the path)",
            shown.join("\n"),
            total - 500
        )
    );
}

#[test]
fn builtin_schemas_are_generated_from_the_argument_structs() {
    let spec = Typed(ReadFile).spec();
    assert_eq!(spec.name, "read_file");
    let props = &spec.input_schema["properties"];
    assert_eq!(props["path"]["type"], "string");
    assert!(props["offset"].is_object() && props["limit"].is_object());
    assert_eq!(spec.input_schema["required"], json!(["path"]));
    let list = Typed(ListDir).spec();
    assert!(
        list.input_schema
            .get("required")
            .is_none_or(|r| r.as_array().unwrap().is_empty())
    );
}

/// `grep` and `glob` walk on the blocking pool, where a call that timed out or was
/// cancelled cannot be aborted: the gateway answers it at once, and the walk stops at the
/// next file or line it reaches once the call's token has fired, instead of going on
/// through a tree (or a file) of any size. Here the token has fired before they start:
/// they read nothing.
#[tokio::test]
async fn a_stopped_walk_reads_no_further() {
    use agent_tools::builtin::Glob;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.txt"), "needle\n").unwrap();
    std::fs::write(dir.path().join("b.txt"), "needle\n").unwrap();
    let stopped = ctx(dir.path());
    stopped.cancel.cancel();
    for (tool, args, found) in [
        (
            &Typed(Grep) as &dyn Tool,
            json!({"pattern": "needle"}),
            "sub/a.txt:1: needle",
        ),
        (
            &Typed(Grep),
            json!({"pattern": "needle", "path": "b.txt"}),
            "b.txt:1: needle",
        ),
        (&Typed(Glob), json!({"pattern": "**/*.txt"}), "sub/a.txt"),
    ] {
        let going = call(tool, dir.path(), args.clone()).await.unwrap();
        assert!(going.contains(found), "{going}");
        let out = tool.call(args, &stopped).await.unwrap();
        assert!(out.starts_with("no "), "{out}");
    }
}
