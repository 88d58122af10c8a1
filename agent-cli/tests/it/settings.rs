//! Where each setting comes from: the flag, else `agent.toml` (paths relative to the file),
//! else the environment, else the default. Resolution is pure, so these run without a
//! process, a terminal or a disk.

use std::path::{Path, PathBuf};

use agent_cli::settings::{ConfigFile, Env, McpSource, ModelChoice, Settings};
use agent_cli::stores::StoreLocation;
use agent_cli::{Limits, Setup, config};
use agent_core::{Budget, Risk, ToolCall, ToolSpec, Verdict};
use serde_json::json;

/// `agent.toml` with `text`, read from /proj.
fn file(text: &str) -> Option<ConfigFile> {
    Some(ConfigFile {
        path: PathBuf::from("/proj/agent.toml"),
        config: config::parse(text).unwrap(),
        explicit: false,
        sha256: agent_core::sha256_hex(text.as_bytes()),
    })
}

fn keys() -> Env {
    Env {
        openai_key: Some("sk-open".into()),
        anthropic_key: Some("sk-ant".into()),
        ..Env::default()
    }
}

fn resolve(file: Option<ConfigFile>, store: Option<&str>, setup: &Setup) -> Settings {
    Settings::resolve(
        file,
        store.map(Path::new),
        setup,
        &Limits::default(),
        keys(),
    )
    .unwrap()
}

fn setup(f: impl FnOnce(&mut Setup)) -> Setup {
    let mut s = Setup::default();
    f(&mut s);
    s
}

fn http(settings: &Settings) -> (String, Option<String>, Option<String>) {
    match &settings.model {
        Some(ModelChoice::Http(h)) => (h.model.clone(), h.base_url.clone(), h.api_key.clone()),
        other => panic!("not an HTTP model: {other:?}"),
    }
}

#[test]
fn paths_come_from_the_flag_else_the_file_relative_to_it_else_the_default() {
    let none = Setup::default();
    let ws = setup(|s| s.workspace = Some("/elsewhere".into()));
    let toml = "store = \"runs\"\nworkspace = \"src\"\nmcp_config = \"tools.json\"";
    let abs = "store = \"/var/runs\"";
    let mcp = setup(|s| s.mcp_config = Some("flag.json".into()));
    let cases: Vec<(&str, Settings, (&str, &str, McpSource))> = vec![
        (
            "defaults",
            resolve(None, None, &none),
            (".agent", ".", McpSource::Workspace),
        ),
        (
            "file",
            resolve(file(toml), None, &none),
            (
                "/proj/runs",
                "/proj/src",
                McpSource::File("/proj/tools.json".into()),
            ),
        ),
        (
            "flags over file",
            resolve(file(toml), Some("/mine"), &ws),
            (
                "/mine",
                "/elsewhere",
                McpSource::File("/proj/tools.json".into()),
            ),
        ),
        (
            "absolute in the file",
            resolve(file(abs), None, &mcp),
            ("/var/runs", ".", McpSource::Flag("flag.json".into())),
        ),
    ];
    for (name, s, (store, workspace, mcp)) in cases {
        assert_eq!(
            (s.store.dir(), s.workspace.as_path(), s.mcp),
            (Some(Path::new(store)), Path::new(workspace), mcp),
            "{name}"
        );
    }
}

#[test]
fn the_model_comes_from_the_flag_else_the_file_and_a_script_is_found_next_to_the_file() {
    let none = Setup::default();
    let flag = setup(|s| s.model = Some("script:here.json".into()));
    let cases = [
        (resolve(None, None, &none).model, None),
        (
            resolve(file("model = \"script:s.json\""), None, &none).model,
            Some(ModelChoice::Script("/proj/s.json".into())),
        ),
        (
            resolve(file("model = \"script:s.json\""), None, &flag).model,
            Some(ModelChoice::Script("here.json".into())),
        ),
        (
            resolve(None, None, &setup(|s| s.model = Some("replay:01R".into()))).model,
            Some(ModelChoice::Replay("01R".into())),
        ),
    ];
    for (i, (got, expected)) in cases.into_iter().enumerate() {
        assert_eq!(got, expected, "case {i}");
    }
    let bad = Settings::resolve(
        None,
        None,
        &setup(|s| s.model = Some("gpt-4o".into())),
        &Limits::default(),
        keys(),
    )
    .unwrap_err();
    assert!(bad.to_string().starts_with("--model"), "{bad}");
}

#[test]
fn base_urls_and_keys_follow_the_provider() {
    let model = |m: &str| setup(|s| s.model = Some(m.into()));
    let cases = [
        (
            "openai:gpt-4o",
            None,
            "https://api.openai.com/v1",
            Some("sk-open"),
        ),
        (
            "anthropic:claude",
            None,
            "https://api.anthropic.com",
            Some("sk-ant"),
        ),
        (
            "openai:gpt-4o",
            Some("base_url = \"http://proxy:1/v1\""),
            "http://proxy:1/v1",
            Some("sk-open"),
        ),
        (
            "openai-compat:llama",
            Some("base_url = \"http://localhost:11434/v1\""),
            "http://localhost:11434/v1",
            Some("sk-open"),
        ),
    ];
    for (m, toml, url, key) in cases {
        let s = resolve(toml.and_then(file), None, &model(m));
        let (_, got_url, got_key) = http(&s);
        assert_eq!(
            (got_url.as_deref(), got_key.as_deref()),
            (Some(url), key),
            "{m}"
        );
    }
    // The flag wins over the file.
    let flagged = setup(|s| {
        s.model = Some("openai:gpt-4o".into());
        s.base_url = Some("http://flag/v1".into());
    });
    let s = resolve(file("base_url = \"http://file/v1\""), None, &flagged);
    assert_eq!(http(&s).1.as_deref(), Some("http://flag/v1"));
}

#[test]
fn what_a_model_call_lacks_is_said_before_anything_runs() {
    let no_keys = |m: &str| {
        Settings::resolve(
            None,
            None,
            &setup(|s| s.model = Some(m.into())),
            &Limits::default(),
            Env::default(),
        )
        .unwrap()
    };
    let ready = |s: &Settings| match &s.model {
        Some(ModelChoice::Http(h)) => h.ready().map(|_| ()).map_err(|e| e.to_string()),
        _ => Ok(()),
    };
    let cases = [
        ("openai:gpt-4o", Some("OPENAI_API_KEY is not set")),
        ("anthropic:claude", Some("ANTHROPIC_API_KEY is not set")),
        ("openai-compat:llama", Some("needs --base-url URL")),
        ("script:s.json", None),
    ];
    for (m, expected) in cases {
        let got = ready(&no_keys(m));
        match expected {
            Some(text) => assert!(got.as_ref().unwrap_err().contains(text), "{m}: {got:?}"),
            None => assert_eq!(got, Ok(()), "{m}"),
        }
    }
    // A local server needs no key.
    let local = Settings::resolve(
        None,
        None,
        &setup(|s| {
            s.model = Some("openai-compat:llama".into());
            s.base_url = Some("http://127.0.0.1:1/v1".into());
        }),
        &Limits::default(),
        Env::default(),
    )
    .unwrap();
    assert_eq!(ready(&local), Ok(()));
    // A base URL that is none, before any key is asked for.
    for url in ["notaurl", "localhost:11434/v1", "ftp://host/v1", "http://"] {
        let odd = Settings::resolve(
            None,
            None,
            &setup(|s| {
                s.model = Some("openai:gpt-4o".into());
                s.base_url = Some(url.into());
            }),
            &Limits::default(),
            Env::default(),
        )
        .unwrap();
        let err = ready(&odd).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "the base URL {url:?} (--base-url or base_url) is not an"
            )),
            "{url}: {err}"
        );
    }
    // Keys never show in debug output.
    assert!(!format!("{local:?}{:?}", keys()).contains("sk-"));
}

#[test]
fn budgets_take_the_flag_else_the_file_else_the_run_or_the_default() {
    let toml =
        "max_steps = 5\nmax_tool_calls = 7\ntimeout = 30\nmax_tokens = 900\nmax_cost_usd = 0.5";
    let flags = Limits {
        max_steps: Some(9),
        max_tool_calls: None,
        timeout: Some(1.5),
        max_tokens: Some(2_000),
        max_cost: Some(1.25),
    };
    let with = |file: Option<ConfigFile>, limits: &Limits| {
        Settings::resolve(file, None, &Setup::default(), limits, Env::default())
            .unwrap()
            .budget
            .apply(Budget::default())
    };
    let default = Budget::default();
    assert_eq!(with(None, &Limits::default()), default);
    let from_file = with(file(toml), &Limits::default());
    assert_eq!(
        (
            from_file.max_steps,
            from_file.max_tool_calls,
            from_file.max_wall_time_ms,
            from_file.max_tokens,
            from_file.max_cost_usd,
        ),
        (5, 7, Some(30_000), Some(900), Some(0.5))
    );
    let flagged = with(file(toml), &flags);
    assert_eq!(
        (
            flagged.max_steps,
            flagged.max_tool_calls,
            flagged.max_wall_time_ms,
            flagged.max_tokens,
            flagged.max_cost_usd,
        ),
        (9, 7, Some(1_500), Some(2_000), Some(1.25))
    );
    // Changes apply over a running budget, leaving what they do not name.
    let running = Budget {
        max_steps: 40,
        max_tool_calls: 3,
        ..Budget::default()
    };
    let s = Settings::resolve(None, None, &Setup::default(), &flags, Env::default()).unwrap();
    let next = s.budget.apply(running);
    assert_eq!((next.max_steps, next.max_tool_calls), (9, 3));
    for (limits, expected) in [
        (
            Limits {
                max_steps: Some(0),
                ..Limits::default()
            },
            "--max-steps must be at least 1",
        ),
        (
            Limits {
                timeout: Some(-1.0),
                ..Limits::default()
            },
            "--timeout = -1",
        ),
        (
            Limits {
                timeout: Some(f64::NAN),
                ..Limits::default()
            },
            "--timeout = NaN",
        ),
        (
            Limits {
                max_tokens: Some(0),
                ..Limits::default()
            },
            "--max-tokens must be at least 1",
        ),
        (
            Limits {
                max_cost: Some(-1.0),
                ..Limits::default()
            },
            "--max-cost -1: give a positive number of dollars",
        ),
        (
            Limits {
                max_cost: Some(f64::INFINITY),
                ..Limits::default()
            },
            "--max-cost inf",
        ),
    ] {
        let err = Settings::resolve(None, None, &Setup::default(), &limits, Env::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn policy_rules_of_the_file_and_the_flags_all_apply_and_deny_wins() {
    let s = resolve(
        file("[policy]\ndeny = [\"write_file(secrets/**)\"]"),
        None,
        &setup(|s| s.allow = vec!["write_file".into()]),
    );
    let mut spec = ToolSpec::new("write_file", "w", json!({}), Risk::Write);
    spec.main_argument = Some("path".into());
    let call = |path: &str| ToolCall::new("c", "write_file", json!({ "path": path }));
    assert_eq!(s.policy.verdict(&spec, &call("notes.md")), Verdict::Allow);
    assert!(matches!(
        s.policy.verdict(&spec, &call("secrets/key")),
        Verdict::Deny { .. }
    ));
    let bad = Settings::resolve(
        None,
        None,
        &setup(|s| s.deny = vec!["shell(".into()]),
        &Limits::default(),
        Env::default(),
    )
    .unwrap_err();
    assert!(bad.to_string().contains("shell("), "{bad}");
}

#[test]
fn a_project_file_brings_what_needs_trust_unless_named_or_overridden() {
    let toml = "base_url = \"http://evil/v1\"\nworkspace = \"/\"\n[policy]\nallow = [\"shell\"]";
    let brought = resolve(file(toml), None, &Setup::default()).file_brings;
    assert_eq!(
        brought,
        [
            "allow rules shell",
            "the workspace /",
            "base_url http://evil/v1 (where your API key is sent)"
        ]
    );
    // A flag overriding a value: the file no longer brings it.
    let flags = setup(|s| {
        s.base_url = Some("http://mine/v1".into());
        s.workspace = Some(".".into());
    });
    assert_eq!(
        resolve(file(toml), None, &flags).file_brings,
        ["allow rules shell"]
    );
    // Named with --config: used as given.
    let mut named = file(toml).unwrap();
    named.explicit = true;
    assert!(
        resolve(Some(named), None, &Setup::default())
            .file_brings
            .is_empty()
    );
}

#[test]
fn a_project_file_that_would_make_a_run_cost_more_needs_trust() {
    let brings = |toml: &str, limits: &Limits| {
        Settings::resolve(file(toml), None, &Setup::default(), limits, keys())
            .unwrap()
            .file_brings
    };
    let none = Limits::default();
    let defaults = Budget::default();
    // Budgets at or below the defaults only narrow.
    let narrow = format!(
        "max_steps = {}\nmax_tool_calls = {}\ntimeout = 60\nmax_cost_usd = 2.0\n\
         effort = \"low\"\n[retry]\nmax_attempts = 4",
        defaults.max_steps, defaults.max_tool_calls
    );
    assert_eq!(brings(&narrow, &none), Vec::<String>::new());
    let wide = format!(
        "max_steps = {}\nmax_tool_calls = {}\nthinking = 2048\nsub_agents = true\n\
         effort = \"max\"\n[retry]\nmax_attempts = 50",
        defaults.max_steps + 1,
        defaults.max_tool_calls + 1
    );
    let brought = brings(&wide, &none);
    assert_eq!(brought.len(), 6, "{brought:?}");
    for (i, what) in [
        "max_steps 33 ",
        "max_tool_calls 129 ",
        "retry.max_attempts 50 ",
        "sub_agents ",
        "thinking 2048 ",
        "effort max ",
    ]
    .iter()
    .enumerate()
    {
        assert!(brought[i].starts_with(what), "{brought:?}");
    }
    // The flags' own budgets replace the file's: nothing of it is used, nothing to trust.
    let flags = Limits {
        max_steps: Some(500),
        max_tool_calls: Some(500),
        ..Limits::default()
    };
    let brought = brings(&wide, &flags);
    assert!(
        brought.iter().all(|b| !b.starts_with("max_")),
        "{brought:?}"
    );
    // Sub-agents asked for on the command line: the person chose them.
    let chosen = Settings::resolve(
        file("sub_agents = true"),
        None,
        &setup(|s| s.sub_agents = true),
        &none,
        keys(),
    )
    .unwrap();
    assert!(chosen.file_brings.is_empty(), "{:?}", chosen.file_brings);
}

/// Secrets a project file gives shell commands need trust, unless the command line
/// passed them too; names are the file's then the flags', once each.
#[test]
fn secrets_given_to_shell_commands_by_a_project_file_need_trust() {
    let toml = r#"shell_env = ["GH_TOKEN", "NPM_TOKEN"]"#;
    let none = Limits::default();
    let plain = Settings::resolve(file(toml), None, &Setup::default(), &none, keys()).unwrap();
    assert_eq!(plain.shell_env, ["GH_TOKEN", "NPM_TOKEN"]);
    assert_eq!(plain.file_brings.len(), 1, "{:?}", plain.file_brings);
    assert!(
        plain.file_brings[0].starts_with("shell_env GH_TOKEN, NPM_TOKEN ("),
        "{:?}",
        plain.file_brings
    );
    let flags = setup(|s| s.shell_env = vec!["NPM_TOKEN".into(), "DB_PASSWORD".into()]);
    let some = Settings::resolve(file(toml), None, &flags, &none, keys()).unwrap();
    assert_eq!(some.shell_env, ["GH_TOKEN", "NPM_TOKEN", "DB_PASSWORD"]);
    assert_eq!(some.file_brings.len(), 1, "{:?}", some.file_brings);
    assert!(
        some.file_brings[0].starts_with("shell_env GH_TOKEN ("),
        "{:?}",
        some.file_brings
    );
    let all = setup(|s| s.shell_env = vec!["GH_TOKEN".into(), "NPM_TOKEN".into()]);
    let chosen = Settings::resolve(file(toml), None, &all, &none, keys()).unwrap();
    assert!(chosen.file_brings.is_empty(), "{:?}", chosen.file_brings);
    for bad in ["", "GH_TOKEN=x"] {
        let err = Settings::resolve(
            None,
            None,
            &setup(|s| s.shell_env = vec![bad.into()]),
            &none,
            keys(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("not an environment variable's name"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn the_context_window_is_the_file_s_else_the_model_s() {
    let none = resolve(None, None, &Setup::default());
    assert_eq!(
        none.context_config("gpt-4").context_window,
        agent_context::context_window("gpt-4")
    );
    let set = resolve(
        file("context_window = 5000\ncompact_at = 0.5"),
        None,
        &Setup::default(),
    );
    let c = set.context_config("gpt-4");
    assert_eq!((c.context_window, c.compact_at), (5_000, 0.5));
}

#[test]
fn tools_replay_names_a_run_or_is_refused() {
    let s = resolve(None, None, &setup(|s| s.tools = Some("replay:01R".into())));
    assert_eq!(s.replay_tools.as_deref(), Some("01R"));
    for text in ["replay:", "record:01R"] {
        let err = Settings::resolve(
            None,
            None,
            &setup(|s| s.tools = Some(text.into())),
            &Limits::default(),
            Env::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("the only form is replay:RUN"),
            "{err}"
        );
    }
}

#[test]
fn mcp_servers_get_the_environment_s_start_up_time_else_the_default() {
    let with = |ms: Option<u64>| {
        let env = Env {
            mcp_timeout_ms: ms,
            ..Env::default()
        };
        Settings::resolve(None, None, &Setup::default(), &Limits::default(), env)
            .unwrap()
            .mcp_timeout
    };
    assert_eq!(with(None), agent_tools::mcp::DEFAULT_STARTUP_TIMEOUT);
    assert_eq!(with(Some(1_500)), std::time::Duration::from_millis(1_500));
}

#[test]
fn the_store_is_the_flag_else_agent_store_else_the_file_and_a_url_is_no_path() {
    // Written in pieces: the repository's own text goes through the redactor in a test.
    let url = &format!("postgres://agent:{}@db.example/runs", "hunter2");
    let with = |flag: Option<&str>, env: Option<&str>, toml: Option<&str>| {
        let env = Env {
            store: env.map(str::to_owned),
            ..Env::default()
        };
        Settings::resolve(
            toml.and_then(file),
            flag.map(Path::new),
            &Setup::default(),
            &Limits::default(),
            env,
        )
        .unwrap()
        .store
    };
    let dir = |d: &str| StoreLocation::Dir(d.into());
    let cases = [
        (with(None, None, None), dir(".agent")),
        (
            with(None, None, Some("store = \"runs\"")),
            dir("/proj/runs"),
        ),
        (
            with(None, Some(url), Some("store = \"runs\"")),
            StoreLocation::Postgres(url.into()),
        ),
        (with(Some("/mine"), Some(url), None), dir("/mine")),
        (
            with(Some(url), None, None),
            StoreLocation::Postgres(url.into()),
        ),
        (
            with(None, None, Some("store = \"postgresql://h/db\"")),
            StoreLocation::Postgres("postgresql://h/db".into()),
        ),
    ];
    for (i, (got, expected)) in cases.into_iter().enumerate() {
        assert_eq!(got, expected, "case {i}");
    }
    // Shown without its password, wherever it is printed.
    let shown = StoreLocation::Postgres(url.clone()).to_string();
    assert_eq!(shown, "postgres://agent@db.example/runs");
    let as_parameter = format!(
        "postgresql:///runs?host=/run/pg&{}=hunter2&user=a",
        "password"
    );
    assert_eq!(
        StoreLocation::Postgres(as_parameter).to_string(),
        "postgresql:///runs?host=/run/pg&user=a"
    );
    let env = Env {
        store: Some(url.into()),
        ..Env::default()
    };
    assert!(!format!("{env:?}").contains("hunter2"));
}
