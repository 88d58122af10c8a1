//! Project automation: `cargo xtask ci` runs exactly what CI runs; `cargo xtask bench`
//! runs the benchmarks; `cargo xtask fuzz --minutes N [--jobs J] [TARGET...]` runs the
//! fuzz targets (nightly toolchain, `cargo install cargo-fuzz`).
#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Crates that must not depend on the listed packages (the layering of ARCHITECTURE.md).
const ABSENCES: &[(&str, &[&str])] = &[
    (
        "agent-core",
        &[
            "tokio",
            "reqwest",
            "sled",
            "hyper",
            "async-trait",
            "agent-tools",
            "agent-context",
            "agent-store",
            "agent-providers",
            "agent-runtime",
        ],
    ),
    (
        "agent-store",
        &["agent-providers", "agent-tools", "agent-runtime", "tokio"],
    ),
    (
        "agent-providers",
        &["agent-store", "agent-tools", "agent-runtime", "sled"],
    ),
    (
        "agent-context",
        &[
            "agent-store",
            "agent-providers",
            "agent-tools",
            "tokio",
            "sled",
        ],
    ),
    (
        "agent-tools",
        &["agent-store", "agent-providers", "agent-runtime", "sled"],
    ),
    ("agent-runtime", &["agent-cli", "clap"]),
];

/// Crates taken without their default features must leave their heavy parts behind
/// (pick-and-mix): checked on `cargo tree -e normal --no-default-features`.
const LEAN: &[(&str, &[&str])] = &[
    ("agent-store", &["sled", "postgres", "tokio-postgres"]),
    ("agent-providers", &["reqwest", "hyper", "rustls"]),
    ("agent-tools", &["rmcp", "nix"]),
];

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "ci" => ci(),
        "test" => test(),
        "layering" => layering(),
        "bench" => bench(),
        "fuzz" => fuzz(std::env::args().skip(2).collect()),
        _ => bail!("usage: cargo xtask <ci|test|layering|bench|fuzz>"),
    }
}

fn ci() -> Result<()> {
    run("cargo", &["fmt", "--all", "--", "--check"], &[])?;
    run(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    layering()?;
    // The lean builds stay clean and their own tests pass.
    let lean = [
        "-p",
        "agent-store",
        "-p",
        "agent-providers",
        "-p",
        "agent-tools",
    ];
    let mut clippy = vec!["clippy", "--no-default-features", "--all-targets"];
    clippy.extend(lean);
    clippy.extend(["--", "-D", "warnings"]);
    run("cargo", &clippy, &[])?;
    // The libraries alone too: with `--all-targets` the tests' features are unified in,
    // and code only the default features use does not show as dead.
    let mut clippy_lib = vec!["clippy", "--no-default-features", "--lib"];
    clippy_lib.extend(lean);
    clippy_lib.extend(["--", "-D", "warnings"]);
    run("cargo", &clippy_lib, &[])?;
    let mut lean_tests = vec!["test", "--no-default-features", "--lib"];
    lean_tests.extend(lean);
    run("cargo", &lean_tests, &[])?;
    // The README's test command.
    test()?;
    run(
        "cargo",
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    eprintln!("xtask: ci passed");
    Ok(())
}

/// The README's test command: every test of the workspace, once what they need is here.
fn test() -> Result<()> {
    ensure_postgres()?;
    // The report's test opens `agent report`'s page in a headless browser.
    ensure_program(
        "chromium",
        "chromium",
        "a headless browser for the report's test",
    )?;
    // The durability test reads which of the `agent` process's writes were flushed before
    // it reported each event.
    ensure_program(
        "strace",
        "strace",
        "the system calls of the durability test",
    )?;
    // The git config reader's tests hold it to what git itself reads.
    ensure_program("git", "git", "the git config reader's tests")?;
    run("cargo", &["test", "--workspace"], &[])
}

/// `program` on the `PATH`, else installed from the distribution's `package`.
fn ensure_program(program: &str, package: &str, why: &str) -> Result<()> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|dir| dir.join(program).is_file()));
    if on_path {
        return Ok(());
    }
    eprintln!("xtask: installing {package} ({why})");
    let apt = |args: &[&str]| run("apt-get", args, &[("DEBIAN_FRONTEND", "noninteractive")]);
    apt(&["update", "-qq"])
        .and_then(|()| apt(&["install", "-y", "-qq", package]))
        .with_context(|| {
            format!(
                "{program} is missing and could not be installed; install the \
                 distribution's {package} package"
            )
        })
}

/// The PostgreSQL server's programs (the store's tests start a throwaway cluster): on the
/// `PATH` or in the distribution's place, else installed from the distribution's packages.
fn ensure_postgres() -> Result<()> {
    let found = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let on_path =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|dir| found(&dir)));
    let packaged = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.flatten().any(|d| found(&d.path().join("bin"))))
        .unwrap_or(false);
    if on_path || packaged {
        return Ok(());
    }
    eprintln!("xtask: installing PostgreSQL (the store's tests start a cluster of their own)");
    let apt = |args: &[&str]| run("apt-get", args, &[("DEBIAN_FRONTEND", "noninteractive")]);
    apt(&["update", "-qq"])
        .and_then(|()| apt(&["install", "-y", "-qq", "postgresql"]))
        .context(
            "PostgreSQL's server (initdb, pg_ctl) is missing and could not be installed; \
             install the distribution's postgresql package",
        )
}

fn bench() -> Result<()> {
    run(
        "cargo",
        &["bench", "-p", "agent-core", "--bench", "machine"],
        &[],
    )?;
    // A turn's cost end to end: the release `agent` on ../shared/bench's workload.
    run("python3", &["xtask/speed.py"], &[])?;
    // What a run costs with a provider's prompt cache, against a naive resend.
    run("python3", &["xtask/cache.py"], &[])
}

/// Runs each fuzz target for `--minutes` (default 10), `--jobs` at a time (default 1), and
/// prints one line per target: minutes, executions, and whether it crashed. A crash leaves
/// its input under `fuzz/artifacts/TARGET/`; add it to `fuzz/corpus/TARGET/` once fixed.
fn fuzz(args: Vec<String>) -> Result<()> {
    let mut minutes = 10u64;
    let mut jobs = 1usize;
    let mut targets = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--minutes" => {
                minutes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .context("--minutes takes a whole number")?;
            }
            "--jobs" => {
                jobs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|j| *j > 0)
                    .context("--jobs takes a whole number above 0")?;
            }
            other if other.starts_with('-') => bail!("unknown option {other}"),
            other => targets.push(other.to_owned()),
        }
    }
    if targets.is_empty() {
        let mut all: Vec<String> = std::fs::read_dir("fuzz/fuzz_targets")
            .context("fuzz/fuzz_targets (run from the repository root)")?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.path()
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .collect();
        all.sort();
        targets = all;
    }
    // cargo fuzz's default: optimized, with debug assertions and overflow checks, so an
    // overflow on outside numbers is a crash the fuzzer sees.
    run_in("fuzz", "cargo", &["+nightly", "fuzz", "build"])
        .context("building the fuzz targets (needs the nightly toolchain and cargo-fuzz)")?;
    let queue = std::sync::Mutex::new(targets.into_iter());
    let lines = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.next());
                    let Some(target) = next else { break };
                    let line = fuzz_one(&target, minutes);
                    eprintln!("xtask: {line}");
                    if let Ok(mut l) = lines.lock() {
                        l.push(line);
                    }
                }
            });
        }
    });
    let lines = lines.into_inner().unwrap_or_default();
    eprintln!("xtask: fuzzing done");
    for line in &lines {
        eprintln!("  {line}");
    }
    if lines.iter().any(|l| l.contains("CRASH")) {
        bail!("a fuzz target crashed; see fuzz/artifacts");
    }
    Ok(())
}

/// One target for `minutes`; the summary line.
fn fuzz_one(target: &str, minutes: u64) -> String {
    // New inputs go to the working corpus (not kept in git); the repository's small corpus
    // is read as seeds.
    let work = format!("work/{target}");
    let seeds = format!("corpus/{target}");
    let _ = std::fs::create_dir_all(format!("fuzz/{work}"));
    let secs = format!("-max_total_time={}", minutes * 60);
    let out = Command::new("cargo")
        .current_dir("fuzz")
        .args([
            "+nightly",
            "fuzz",
            "run",
            target,
            &work,
            &seeds,
            "--",
            &secs,
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
        ])
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => return format!("{target}: could not run cargo fuzz: {e}"),
    };
    let log = String::from_utf8_lossy(&out.stderr);
    let runs = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .map_or_else(|| "?".to_owned(), |n| n.trim().to_owned());
    let _ = std::fs::write(format!("fuzz/{target}.log"), log.as_bytes());
    if out.status.success() {
        format!("{target}: {minutes} min, {runs} executions, no crash")
    } else {
        format!("{target}: {minutes} min, {runs} executions, CRASH (log in fuzz/{target}.log)")
    }
}

/// Checks the absences that make the layering real, and those that make the crates
/// pick-and-mix, from `cargo tree`.
fn layering() -> Result<()> {
    absent(ABSENCES, &[], "ARCHITECTURE.md forbids")?;
    absent(
        LEAN,
        &["--no-default-features"],
        "its default features should bring, not the crate itself",
    )?;
    eprintln!("xtask: layering holds, and the crates come lean without default features");
    Ok(())
}

fn absent(rules: &[(&str, &[&str])], flags: &[&str], why: &str) -> Result<()> {
    for (krate, forbidden) in rules {
        let out = Command::new("cargo")
            .args([
                "tree", "-p", krate, "-e", "normal", "--prefix", "none", "--format", "{p}",
            ])
            .args(flags)
            .output()
            .with_context(|| format!("running cargo tree -p {krate}"))?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {krate} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tree = String::from_utf8_lossy(&out.stdout);
        let names: Vec<&str> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for bad in *forbidden {
            if names.contains(bad) {
                bail!(
                    "layering: {krate} {} depends on {bad}, which {why}",
                    flags.join(" ")
                );
            }
        }
    }
    Ok(())
}

fn run_in(dir: &str, program: &str, args: &[&str]) -> Result<()> {
    eprintln!("xtask: (in {dir}) {program} {}", args.join(" "));
    let status = Command::new(program)
        .current_dir(dir)
        .args(args)
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("{program} {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    eprintln!("xtask: {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("{program} {} failed ({status})", args.join(" "));
    }
    Ok(())
}
