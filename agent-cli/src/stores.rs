//! Where runs are kept: a directory (sled, the embedded default) or a PostgreSQL database
//! (`--store postgres://…`), and the store opened there.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_store::{
    DirStore, FencedStore, Hold, PostgresStore, QueueState, RunSummary, Store, StoreError,
};

use crate::failure::{Failure, failed, usage};

/// Where the run store is.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A directory of sled files.
    Dir(PathBuf),
    /// A PostgreSQL connection string (`postgres://…` or `postgresql://…`).
    Postgres(String),
}

impl StoreLocation {
    /// A `--store` value: a PostgreSQL URL, or a directory.
    pub fn parse(text: &str) -> StoreLocation {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            StoreLocation::Postgres(text.to_owned())
        } else {
            StoreLocation::Dir(PathBuf::from(text))
        }
    }

    /// The directory, for a sled store.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            StoreLocation::Dir(dir) => Some(dir),
            StoreLocation::Postgres(_) => None,
        }
    }
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for StoreLocation {
    /// The directory, or the database without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Dir(dir) => write!(f, "{}", dir.display()),
            StoreLocation::Postgres(url) => {
                let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
                let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
                match address.split_once('@') {
                    Some((user, host)) => {
                        let user = user.split(':').next().unwrap_or_default();
                        write!(f, "{scheme}://{user}@{host}")?;
                    }
                    None => write!(f, "{scheme}://{address}")?,
                }
                // A password may also come as a parameter.
                let params: Vec<&str> = query
                    .split('&')
                    .filter(|p| !p.is_empty() && !p.starts_with("password="))
                    .collect();
                if !params.is_empty() {
                    write!(f, "?{}", params.join("&"))?;
                }
                Ok(())
            }
        }
    }
}

/// An open store.
pub enum OpenStore {
    /// A directory: a sled database per run, shared by processes.
    Dir(DirStore),
    /// PostgreSQL.
    Postgres(Arc<PostgresStore>),
    /// PostgreSQL, as the worker holding a run's lease writes it.
    Fenced(FencedStore),
}

impl OpenStore {
    /// Opens the store at `location`, creating a directory store when missing.
    pub fn create(location: &StoreLocation) -> Result<OpenStore, Failure> {
        Ok(match location {
            StoreLocation::Dir(dir) => OpenStore::Dir(DirStore::open(dir)?),
            StoreLocation::Postgres(url) => OpenStore::Postgres(Arc::new(connect(url, location)?)),
        })
    }

    /// Opens the store at `location` if there is one (a database always is).
    pub fn existing(location: &StoreLocation) -> Result<Option<OpenStore>, Failure> {
        Ok(match location {
            StoreLocation::Dir(dir) => DirStore::open_existing(dir)?.map(OpenStore::Dir),
            StoreLocation::Postgres(url) => {
                Some(OpenStore::Postgres(Arc::new(connect(url, location)?)))
            }
        })
    }

    /// Opens the store at `location`, which must exist.
    pub fn must_exist(location: &StoreLocation) -> Result<OpenStore, Failure> {
        OpenStore::existing(location)?.ok_or_else(|| {
            usage(format!(
                "no store at {location}; runs are created by `agent run` (or pass --store DIR)"
            ))
        })
    }

    /// Why the store may not be written, if it lost data.
    pub fn damage(&self) -> Option<StoreError> {
        match self {
            OpenStore::Dir(store) => store.damage(),
            OpenStore::Postgres(_) | OpenStore::Fenced(_) => None,
        }
    }

    /// Takes a run for this process to drive before anything is decided about it: a run
    /// another process drives is refused, naming that process. On a database the run is
    /// held under a lease for as long as the store returned lives ([`PostgresStore::hold`]); a
    /// queued run is left to the queue's workers.
    pub fn take(self, run_id: &str) -> Result<OpenStore, Failure> {
        match self {
            OpenStore::Dir(store) => {
                store.take(run_id)?;
                Ok(OpenStore::Dir(store))
            }
            OpenStore::Postgres(store) => hold(store, run_id),
            OpenStore::Fenced(_) => Ok(self),
        }
    }

    /// Holds a new run, `run_id`, before its first commit, on a database (a directory
    /// store takes it with that commit).
    pub fn take_new(self, run_id: &str) -> Result<OpenStore, Failure> {
        match self {
            OpenStore::Postgres(store) => hold(store, run_id),
            other => Ok(other),
        }
    }

    /// For a queued run no worker started (it has no log), where it stands in words:
    /// `waits in the queue for a worker`, or `was taken off the queue`. `None` for any
    /// other run.
    pub fn never_started(&self, run_id: &str) -> Result<Option<&'static str>, Failure> {
        let OpenStore::Postgres(store) = self else {
            return Ok(None);
        };
        Ok(match store.queue_state(run_id)? {
            Some(QueueState::Runnable | QueueState::Running) => {
                Some("waits in the queue for a worker")
            }
            Some(QueueState::Ended) => Some("was taken off the queue before a worker started it"),
            Some(QueueState::Paused) | None => None,
        })
    }

    /// Who drives the run right now, if anyone does (`process 1234`, `worker host:42/0`).
    pub fn driver(&self, run_id: &str) -> Result<Option<String>, Failure> {
        Ok(match self {
            OpenStore::Dir(store) => store.driver(run_id).map(|pid| format!("process {pid}")),
            OpenStore::Postgres(store) => store.driven_by(run_id)?,
            OpenStore::Fenced(_) => None,
        })
    }

    /// What will commit more of the run with no one asking, in words (`driven by process
    /// 1234`, `waiting in the queue for a worker`); `None` when nothing will until a person
    /// acts (it ended, paused, or was interrupted).
    pub fn going_on(&self, run_id: &str) -> Result<Option<String>, Failure> {
        Ok(match self {
            OpenStore::Dir(store) => store
                .driver(run_id)
                .map(|pid| format!("driven by process {pid}")),
            OpenStore::Postgres(store) => match store.queue_state(run_id)? {
                Some(QueueState::Runnable) => Some("waiting in the queue for a worker".into()),
                Some(QueueState::Running) => Some(match store.lease_holder(run_id)? {
                    Some(worker) => format!("driven by worker {worker}"),
                    None => "driven by a worker whose lease ran out, until another takes it \
                             over"
                        .into(),
                }),
                Some(QueueState::Paused | QueueState::Ended) => None,
                // Not queued: the process that holds it, if one does; a sub-agent's run,
                // whoever drives the run it belongs to.
                None => store.driven_by(run_id)?.map(|by| format!("driven by {by}")),
            },
            OpenStore::Fenced(_) => None,
        })
    }

    /// How long a follower waits for a commit before it looks again at what drives the
    /// run: a directory's owner answers as soon as it commits or lets go, a database is
    /// looked at every [`agent_store::FOLLOW_POLL`] and its queue every second.
    pub fn follow_wait(&self) -> std::time::Duration {
        match self {
            OpenStore::Dir(_) => std::time::Duration::from_secs(30),
            OpenStore::Postgres(_) | OpenStore::Fenced(_) => std::time::Duration::from_secs(1),
        }
    }

    /// The store that may be written: a damaged one is refused before anything happens.
    pub fn writable(self) -> Result<OpenStore, Failure> {
        match self.damage() {
            Some(damage) => Err(failed(damage)),
            None => Ok(self),
        }
    }

    /// As the `Store` trait.
    pub fn as_store(&self) -> &dyn Store {
        match self {
            OpenStore::Dir(store) => store,
            OpenStore::Postgres(store) => store.as_ref(),
            OpenStore::Fenced(store) => store,
        }
    }

    /// Shared, for the runtime.
    pub fn into_shared(self) -> Arc<dyn Store> {
        match self {
            OpenStore::Dir(store) => Arc::new(store),
            OpenStore::Postgres(store) => store,
            OpenStore::Fenced(store) => Arc::new(store),
        }
    }
}

/// The PostgreSQL store at `location`, for the commands of the queue (`submit`, `worker`).
pub fn queue(location: &StoreLocation, command: &str) -> Result<PostgresStore, Failure> {
    match location {
        StoreLocation::Postgres(url) => connect(url, location),
        StoreLocation::Dir(_) => Err(usage(format!(
            "agent {command} needs a database store: pass --store postgres://… (or set \
             AGENT_STORE); a directory store serves the processes of one machine"
        ))),
    }
}

/// How long a process's hold on a run lasts unless renewed (every third of it): after a
/// crash on another machine, another process takes the run up at most this long after.
const HOLD_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Holds `run_id` on the database for this process ([`PostgresStore::hold`]): the store of
/// the held run, or the database's as it was for a queued run (its workers drive it). A run
/// another live process holds is refused, naming it; one whose holder died on this machine
/// is taken over at once.
fn hold(store: Arc<PostgresStore>, run_id: &str) -> Result<OpenStore, Failure> {
    let me = This::process();
    let mut over = None;
    loop {
        match store.hold(run_id, &me.owner, &me.machine, HOLD_TTL, over)? {
            Hold::Held(lease) => {
                return Ok(OpenStore::Fenced(FencedStore::holding(
                    store, lease, HOLD_TTL,
                )));
            }
            Hold::Queued => return Ok(OpenStore::Postgres(store)),
            Hold::By(holder) if over.is_none() && me.outlived(&holder.machine) => {
                over = Some(holder.token);
            }
            Hold::By(holder) => {
                return Err(StoreError::Busy {
                    run_id: run_id.to_owned(),
                    by: format!(
                        "{} (if it died, the run is free {} s after its last sign of life)",
                        holder.owner,
                        HOLD_TTL.as_secs()
                    ),
                }
                .into());
            }
        }
    }
}

/// This process as a hold names it: who, in words, and where, to tell later whether it is
/// still there (the kernel's boot, the PID namespace and the PID).
struct This {
    owner: String,
    machine: String,
}

impl This {
    fn process() -> This {
        let pid = std::process::id();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        This {
            owner: if host.is_empty() {
                format!("process {pid}")
            } else {
                format!("process {pid} on {host}")
            },
            machine: format!("{}/{pid}", This::place().unwrap_or_default()),
        }
    }

    /// The kernel's boot and this process's PID namespace: a PID means one process only
    /// within both.
    fn place() -> Option<String> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
        Some(format!("{}:{}", boot.trim(), namespace.display()))
    }

    /// Whether the holder `machine` names was a process of this boot and PID namespace that
    /// is gone: its hold can be taken over without waiting for it to run out.
    fn outlived(&self, machine: &str) -> bool {
        let Some(place) = This::place() else {
            return false;
        };
        let Some((there, pid)) = machine.rsplit_once('/') else {
            return false;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            return false;
        };
        there == place && pid != std::process::id() && !alive(pid)
    }
}

/// Whether process `pid` of this PID namespace is running: there, and not a zombie left for
/// its parent to reap.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's name, which ends with the line's last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

fn connect(url: &str, location: &StoreLocation) -> Result<PostgresStore, Failure> {
    // The library's message may quote the connection string: say where, without it.
    PostgresStore::connect(url).map_err(|e| match e {
        StoreError::Engine(message) => failed(format!(
            "the store {location}: {}",
            message.replace(url, &location.to_string())
        )),
        other => Failure::from(other),
    })
}

/// What [`Follower::next`] hands out: the entries committed since the last call, and in
/// words what drives the run, if anything does.
pub(crate) type Followed = (Vec<agent_core::Entry>, Option<String>);

/// A reader following a run as it is committed (`agent show --follow`, `agent chat` on a
/// queued run): each call of [`Follower::next`] hands out the entries committed since the
/// last.
pub(crate) struct Follower {
    run_id: String,
    /// The first version not handed out yet.
    next: u64,
    /// The run's summary as far as its log was handed out.
    seen: RunSummary,
}

impl Follower {
    /// From the run's first entry on.
    pub(crate) fn new(run_id: &str) -> Follower {
        Follower::after(run_id, &[])
    }

    /// After `log`, the run's log as read already.
    pub(crate) fn after(run_id: &str, log: &[agent_core::Entry]) -> Follower {
        let mut seen = RunSummary::new(run_id);
        for entry in log {
            seen.apply(entry);
        }
        Follower {
            run_id: run_id.to_owned(),
            next: log.last().map_or(1, |e| e.version + 1),
            seen,
        }
    }

    /// Whether the run was running as far as its log was handed out (it neither ended nor
    /// waits for a person).
    pub(crate) fn running(&self) -> bool {
        self.seen.status == "running"
    }

    /// The entries committed since the last call, and in words what drives the run
    /// ([`OpenStore::going_on`]): at once when there are some, else the first committed
    /// within [`OpenStore::follow_wait`] while something drives it (possibly none).
    /// `None` once nothing drives the run and every entry was handed out.
    pub(crate) fn next(&mut self, store: &OpenStore) -> Result<Option<Followed>, Failure> {
        self.next_within(store, store.follow_wait())
    }

    /// [`Follower::next`], waiting at most `wait` for an entry.
    pub(crate) fn next_within(
        &mut self,
        store: &OpenStore,
        wait: std::time::Duration,
    ) -> Result<Option<Followed>, Failure> {
        let run_id = self.run_id.as_str();
        let going = store.going_on(run_id)?;
        let new = match &going {
            Some(_) => match store.as_store().wait_from(run_id, self.next, wait) {
                // Queued, not yet started by a worker: no entry yet.
                Err(StoreError::RunNotFound(_)) => {
                    std::thread::sleep(agent_store::FOLLOW_POLL);
                    Vec::new()
                }
                found => found?,
            },
            None => store.as_store().load_from(run_id, self.next)?,
        };
        if new.is_empty() && going.is_none() {
            return Ok(None);
        }
        for entry in &new {
            self.seen.apply(entry);
        }
        if let Some(last) = new.last() {
            self.next = last.version + 1;
        }
        Ok(Some((new, going)))
    }
}
