//! For tests of code that stores runs in PostgreSQL (feature `testing`): a throwaway
//! cluster, created with `initdb` and started with `pg_ctl` in a temporary directory,
//! reached on a Unix socket only, and stopped when dropped. PostgreSQL refuses to run as
//! root; as root the server runs as the `postgres` user.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A PostgreSQL cluster that lives as long as this value.
#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

/// Where the server's programs are: on the `PATH`, else the distribution's place.
fn server_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file());
    let packaged = || {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("initdb").is_file())
            .collect();
        found.sort();
        found.pop()
    };
    on_path.or_else(packaged).unwrap_or_else(|| {
        panic!(
            "the PostgreSQL server (initdb, pg_ctl) is not installed: install the \
             distribution's postgresql package (.ci/run does)"
        )
    })
}

/// PostgreSQL refuses to run as root: then it runs as the `postgres` user.
fn as_server_user(program: &Path) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// Creates and starts a cluster with fsync off (tests are about the protocol).
    pub fn start() -> Cluster {
        Cluster::start_with(false)
    }

    /// Creates and starts a cluster whose commits reach the disk (for benchmarks).
    pub fn start_durable() -> Cluster {
        Cluster::start_with(true)
    }

    fn start_with(fsync: bool) -> Cluster {
        let bin = server_bin();
        let dir = tempfile::tempdir().unwrap();
        let give = |path: &Path| {
            if Command::new("id")
                .arg("-u")
                .output()
                .unwrap()
                .stdout
                .starts_with(b"0")
            {
                run(
                    {
                        let mut c = Command::new("chown");
                        c.arg("postgres").arg(path);
                        c
                    },
                    "chown",
                );
            }
        };
        give(dir.path());
        let data = dir.path().join("data");
        let socket = dir.path().join("socket");
        std::fs::create_dir(&socket).unwrap();
        give(&socket);
        let mut initdb = as_server_user(&bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "agent", "--no-sync"]);
        run(initdb, "initdb");
        let mut start = as_server_user(&bin.join("pg_ctl"));
        start
            .arg("-D")
            .arg(&data)
            .arg("-o")
            .arg(format!(
                "-k {} -c listen_addresses=''{}",
                socket.display(),
                if fsync { "" } else { " -F" }
            ))
            .arg("-l")
            .arg(dir.path().join("server.log"))
            .args(["-w", "start"]);
        run(start, "pg_ctl start");
        Cluster { dir, bin }
    }

    /// A URL of its `postgres` database (`--store` takes it as it is).
    pub fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&user=agent",
            self.dir.path().join("socket").display()
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut stop = as_server_user(&self.bin.join("pg_ctl"));
        stop.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = stop.output();
    }
}
