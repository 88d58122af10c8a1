//! Project automation: `cargo xtask ci` runs exactly what CI runs; `cargo xtask bench`
//! runs the benchmarks.
#![allow(clippy::print_stderr)]

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

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "ci" => ci(),
        "layering" => layering(),
        "bench" => bench(),
        _ => bail!("usage: cargo xtask <ci|layering|bench>"),
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
    // The README's test command.
    run("cargo", &["test", "--workspace"], &[])?;
    run(
        "cargo",
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    eprintln!("xtask: ci passed");
    Ok(())
}

fn bench() -> Result<()> {
    run(
        "cargo",
        &["bench", "-p", "agent-core", "--bench", "machine"],
        &[],
    )
}

/// Checks the absences that make the layering real, from `cargo tree`.
fn layering() -> Result<()> {
    for (krate, forbidden) in ABSENCES {
        let out = Command::new("cargo")
            .args([
                "tree", "-p", krate, "-e", "normal", "--prefix", "none", "--format", "{p}",
            ])
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
                bail!("layering: {krate} depends on {bad}, which ARCHITECTURE.md forbids");
            }
        }
    }
    eprintln!("xtask: layering holds");
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
