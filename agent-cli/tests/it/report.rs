//! `agent report`: the page of a scripted run with parallel calls, a denial and a
//! compaction, opened in a real headless browser (Chromium), which runs its script: the
//! timeline and the chart must be drawn, with no console message, and a screenshot is kept
//! as a CI artifact (`target/artifacts/report.png`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use super::{Env, stderr, stdout};

fn chromium() -> Command {
    let mut cmd = Command::new("chromium");
    // As root in a container the sandbox cannot start; the page is our own file.
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ]);
    cmd
}

#[test]
fn the_report_of_a_run_renders_its_timeline_and_chart_in_a_browser() {
    let env = Env::new();
    let body = |tag: &str| format!("{tag}: {}\n", "a line of the record ".repeat(150));
    for name in ["a", "b", "c"] {
        std::fs::write(env.dir.path().join(format!("{name}.txt")), body(name)).unwrap();
    }
    std::fs::write(env.dir.path().join("secret.txt"), "no\n").unwrap();
    // A small window: the second model call finds the history past its threshold.
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "context_window = 2000\n[policy]\ndeny = [\"read_file(secret.txt)\"]\n",
    )
    .unwrap();
    let model = env.script(json!([
        {"tool_calls": [
            {"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}},
            {"id": "c2", "name": "read_file", "arguments": {"path": "b.txt"}},
            {"id": "c3", "name": "read_file", "arguments": {"path": "secret.txt"}}
        ], "usage": {"input_tokens": 900, "output_tokens": 60}},
        {"tool_calls": [{"id": "c4", "name": "read_file", "arguments": {"path": "c.txt"}}],
         "usage": {"input_tokens": 1900, "output_tokens": 20}},
        {"final": "Read a, b and c.", "usage": {"input_tokens": 700, "output_tokens": 9}}
    ]));
    let out = env
        .cmd()
        .args([
            "run",
            "--json",
            "--sandbox",
            "--model",
            &model,
            "read the records </script><script>alert(1)</script>",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = run["run_id"].as_str().unwrap();
    let shown = stdout(&env.run(&["show", id]));
    assert!(
        shown.contains("context_compacted"),
        "the run compacted: {shown}"
    );
    assert!(shown.contains("denied"), "{shown}");

    let page = env.dir.path().join("report.html");
    let written = env.run(&["report", id, "--out", page.to_str().unwrap()]);
    assert_eq!(written.status.code(), Some(0), "{}", stderr(&written));
    assert_eq!(stdout(&written).trim(), page.display().to_string());
    let html = std::fs::read_to_string(&page).unwrap();
    for fetch in ["src=", "href=", "url(", "@import", "fetch("] {
        assert!(!html.contains(fetch), "nothing is fetched: {fetch}");
    }
    assert!(
        !html.contains("</script><script>alert"),
        "the goal cannot end the data's script"
    );

    let url = format!("file://{}", page.display());
    let dom = chromium()
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom", &url])
        .output()
        .expect("chromium runs (cargo xtask test installs it when missing)");
    assert!(dom.status.success(), "{}", stderr(&dom));
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let logged = String::from_utf8_lossy(&dom.stderr).into_owned();
    let console: Vec<&str> = logged.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(
        dom_text.contains("data-rendered=\"yes\""),
        "the script ran to its end"
    );
    let bars = |class: &str| dom_text.matches(&format!("class=\"bar {class}")).count();
    assert_eq!(bars("model"), 3, "a bar per model call");
    assert_eq!(bars("tool"), 4, "a bar per tool call");
    assert_eq!(bars("tool error"), 1, "the denied call stands out");
    assert!(
        dom_text.contains("id=\"tokens-line\""),
        "the tokens chart is drawn"
    );
    assert!(dom_text.contains("summarized"), "the compaction is listed");
    assert!(
        dom_text.contains("denied: c3 read_file"),
        "the denial is listed"
    );
    assert!(dom_text.contains("Ended completed"), "{dom_text}");
    assert!(
        dom_text.contains("commands: <b>sandboxed (no network)</b>"),
        "{dom_text}"
    );
    // The three calls of the first turn ran side by side: a row each, over the same time.
    let tool_bars: Vec<(String, String, String)> = dom_text
        .split("<rect class=\"bar tool")
        .skip(1)
        .map(|rest| {
            let attr = |name: &str| {
                let from = rest.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                rest[from..from + rest[from..].find('"').unwrap()].to_owned()
            };
            (attr("x"), attr("y"), attr("width"))
        })
        .collect();
    assert_eq!(tool_bars.len(), 4);
    let first = &tool_bars[..3];
    assert!(
        first.iter().all(|b| b.0 == first[0].0 && b.2 == first[0].2),
        "{first:?}"
    );
    assert!(
        first[0].1 != first[1].1 && first[1].1 != first[2].1,
        "{first:?}"
    );
    // The model's and the person's text is shown as text, never as markup.
    assert!(
        dom_text.contains("read the records &lt;/script&gt;&lt;script&gt;alert(1)"),
        "{dom_text}"
    );

    // Were anything of the run's to get into the page as markup, it would reach nothing:
    // the page's policy lets it fetch nothing (here an image planted in a copy of it, from
    // a server on loopback, is never asked for).
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let asked = std::sync::Arc::clone(&asked);
        std::thread::spawn(move || {
            for mut stream in server.incoming().flatten() {
                asked.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = std::io::Write::write_all(
                    &mut stream,
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
                );
            }
        });
    }
    let planted = env.dir.path().join("planted.html");
    let image = format!("<body><img src=\"http://127.0.0.1:{port}/leak\">");
    std::fs::write(&planted, html.replacen("<body>", &image, 1)).unwrap();
    let opened = chromium()
        .args(["--dump-dom", &format!("file://{}", planted.display())])
        .output()
        .unwrap();
    assert!(opened.status.success(), "{}", stderr(&opened));
    assert!(
        String::from_utf8_lossy(&opened.stdout).contains("data-rendered=\"yes\""),
        "the planted page still renders"
    );
    assert!(
        !asked.load(std::sync::atomic::Ordering::SeqCst),
        "the page asked a server for something"
    );

    let artifacts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let taken = chromium()
        .args(["--window-size=1200,1100"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(taken.status.success(), "{}", stderr(&taken));
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn a_report_for_a_directory_that_is_not_there_is_refused_plainly() {
    let env = Env::new();
    let model = env.script(json!([{"final": "x"}]));
    let run = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let id = serde_json::from_slice::<Value>(&run.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = env.dir.path().join("afile");
    std::fs::write(&file, "mine").unwrap();
    for dir in [env.dir.path().join("missing"), file.clone()] {
        let out_path = dir.join("r.html");
        let out = env.run(&["report", &id, "--out", out_path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).trim(),
            format!(
                "agent: cannot write {}: there is no directory {}; make it, or give another --out",
                out_path.display(),
                dir.display()
            )
        );
    }
    assert!(!env.dir.path().join("missing").exists());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// What `agent report` and `agent eval --junit` write is a file like any the person makes
/// (its mode from their umask, 0644 under the usual 022), for a browser, a web server or
/// a CI system to read: not a temporary file's 0600.
#[test]
fn reports_and_junit_files_get_the_mode_of_a_new_file() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let mode = |name: &str| {
        std::fs::metadata(env.dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    // `agent` under the usual umask, whatever the test runs with.
    let with_umask = |args: &[&str]| {
        let agent = env.cmd();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "umask 022 && exec \"$0\" \"$@\""])
            .arg(agent.get_program())
            .args(agent.get_args())
            .args(args)
            .current_dir(env.dir.path());
        for (name, value) in agent.get_envs() {
            match value {
                Some(value) => cmd.env(name, value),
                None => cmd.env_remove(name),
            };
        }
        cmd.output().unwrap()
    };
    let model = env.script(json!([{"final": "done"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = with_umask(&["report", run["run_id"].as_str().unwrap(), "-o", "page.html"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode("page.html"), 0o644);
    let case = json!({"goal": "g", "model": model, "expect": {"reason": "completed"}});
    std::fs::write(env.dir.path().join("case.json"), case.to_string()).unwrap();
    let out = with_umask(&["eval", "case.json", "--junit", "junit.xml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode("junit.xml"), 0o644);
}

/// As every command, `agent report --json` says what it did in one JSON object: the run and
/// the page it wrote.
#[test]
fn a_report_says_where_it_wrote_in_json() {
    let env = Env::new();
    let model = env.script(json!([{"final": "done"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = run["run_id"].as_str().unwrap();
    let out = env.run(&["report", "--json", id, "-o", "page.html"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said, json!({"run_id": id, "path": "page.html"}));
    assert!(env.dir.path().join("page.html").is_file());
}
