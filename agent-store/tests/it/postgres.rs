//! The PostgreSQL store against the conformance suite, on a throwaway cluster of the test's
//! own (`initdb` and `pg_ctl` in a temporary directory, reached on a Unix socket only).

use std::path::{Path, PathBuf};
use std::process::Command;

use agent_store::conformance::{check_all, check_reopen, filler, started};
use agent_store::{PostgresStore, Store, StoreError};

/// A PostgreSQL cluster that lives as long as this value.
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
    /// Creates and starts a cluster (fsync off: these tests are about the protocol).
    pub fn start() -> Cluster {
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
            .arg(format!("-k {} -c listen_addresses='' -F", socket.display()))
            .arg("-l")
            .arg(dir.path().join("server.log"))
            .args(["-w", "start"]);
        run(start, "pg_ctl start");
        Cluster { dir, bin }
    }

    /// A connection string to its `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host={} user=agent dbname=postgres",
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

#[test]
fn the_postgres_store_conforms_and_reopens() {
    let cluster = Cluster::start();
    check_all(&PostgresStore::connect(&cluster.url()).unwrap());
    let url = cluster.url();
    check_reopen(&|| Box::new(PostgresStore::connect(&url).unwrap()));
}

#[test]
fn two_writers_of_one_run_cannot_both_commit_a_version() {
    let cluster = Cluster::start();
    let a = PostgresStore::connect(&cluster.url()).unwrap();
    let b = PostgresStore::connect(&cluster.url()).unwrap();
    let run = "shared";
    assert_eq!(a.append(run, 0, &[started(run, 1)]).unwrap(), 1);
    // Both read version 1; the first commit wins, the second is a conflict.
    assert_eq!(a.append(run, 1, &[filler(2, 1)]).unwrap(), 2);
    let lost = b.append(run, 1, &[filler(2, 1)]).unwrap_err();
    assert!(
        matches!(
            lost,
            StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            }
        ),
        "{lost:?}"
    );
    assert_eq!(
        b.load(run).unwrap().len(),
        2,
        "nothing of the loser was written"
    );
    // Many writers racing for the first entry of a new run: exactly one wins.
    let fresh = "fresh";
    let stores: Vec<PostgresStore> = (0..8)
        .map(|_| PostgresStore::connect(&cluster.url()).unwrap())
        .collect();
    let results: Vec<Result<u64, StoreError>> = std::thread::scope(|s| {
        let handles: Vec<_> = stores
            .iter()
            .map(|store| s.spawn(move || store.append(fresh, 0, &[started(fresh, 1)])))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    // The database's unique key refused the others, and said so as a conflict.
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, StoreError::Conflict { .. })),
        "{results:?}"
    );
    assert_eq!(a.load(fresh).unwrap().len(), 1);
}

#[test]
fn a_server_that_is_not_there_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        PostgresStore::connect(&format!("host={} user=agent", dir.path().display())).unwrap_err();
    assert!(
        err.to_string().contains("cannot connect to PostgreSQL"),
        "{err}"
    );
}
