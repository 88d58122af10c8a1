//! The process that drives a run answers for it: it listens on a Unix socket named in the
//! run's owner file and serves the committed log to readers, who could not open the run's
//! database while it is held. A socket nobody answers on is a process that is gone.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use agent_core::Entry;
use serde::{Deserialize, Serialize};

use crate::{SledStore, Store, StoreError};

/// How long a reader waits on an owner for each read or write of the exchange.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request line an owner reads.
const MAX_REQUEST: u64 = 256 * 1024;
/// The longest socket path that fits a `sockaddr_un`, with room to spare.
const MAX_SOCKET_PATH: usize = 100;
/// The longest an owner keeps a reader waiting for a commit, whatever it asked.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Readers an owner serves at once, each on a thread of its own. The socket is the user's
/// alone, but so are the commands a run starts: one that opens thousands of connections
/// gets [`BUSY`] past these, not as many threads in the process driving the run.
pub(super) const MAX_READERS: usize = 64;
/// The answer to a reader past [`MAX_READERS`]: the owner is there (so the run is not taken
/// for interrupted), and it serves neither a summary nor entries now.
const BUSY: &[u8] = b"{\"busy\":true}\n";

/// Who drives a run: written by the owner when it takes the run, removed when it lets go.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct OwnerFile {
    /// The owner's process id.
    pub(super) pid: u32,
    /// Where it listens.
    pub(super) socket: PathBuf,
    /// When it took the run (ms since the epoch).
    pub(super) since_ms: u64,
}

impl OwnerFile {
    pub(super) fn read(path: &Path) -> Option<OwnerFile> {
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Whether the owner is still there: its process is alive (a stopped one too).
    ///
    /// A connection alone does not say so: a child the owner was starting when it died
    /// holds a copy of the listening socket until it executes its program, and the kernel
    /// queues a connection to a socket nobody will accept from. So it asks for the
    /// summary: an answer, or silence (a stopped owner), is an owner; a connection reset
    /// or closed without an answer is a socket that has just lost its last holder.
    pub(super) fn alive(&self) -> bool {
        answers(&self.socket, EXCHANGE_TIMEOUT)
    }
}

/// Whether something holds the socket and either answers or keeps silent for `wait`.
fn answers(socket: &Path, wait: Duration) -> bool {
    let Ok(stream) = UnixStream::connect(socket) else {
        return false;
    };
    let asked = (|| {
        stream.set_read_timeout(Some(wait))?;
        stream.set_write_timeout(Some(wait))?;
        let mut request = serde_json::to_vec(&Request::Summary)?;
        request.push(b'\n');
        // An owner too busy to serve a reader says so at once and closes, maybe before the
        // request is written: what it said is read all the same.
        let _ = (&stream).write_all(&request);
        let mut first = [0u8; 1];
        (&stream).read(&mut first)
    })();
    match asked {
        Ok(n) => n > 0,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Where the owner of a run listens: beside the run when the path fits a socket address,
/// else in the temporary directory under a name drawn from the run's path.
pub(super) fn socket_path(run_dir: &Path) -> PathBuf {
    // `ID.sock`, appended: a run id may hold dots (`with_extension` would make the socket
    // of `a.b` the one of `a`).
    let mut beside = run_dir.as_os_str().to_owned();
    beside.push(".sock");
    let beside = PathBuf::from(beside);
    if beside.as_os_str().len() <= MAX_SOCKET_PATH {
        return beside;
    }
    let digest = agent_core::Handle::of_bytes(run_dir.as_os_str().as_encoded_bytes());
    let name = digest.to_string();
    let hex = name.rsplit(':').next().unwrap_or(&name);
    std::env::temp_dir().join(format!("agent-run-{}.sock", &hex[..24]))
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Request {
    /// The committed entries from this version on.
    LoadFrom(u64),
    /// The same, once there is one: answered when the first is committed, when the run is
    /// let go, or after `wait_ms` (at most [`MAX_WAIT`]) with none.
    WaitFrom { from: u64, wait_ms: u64 },
    /// The run's summary.
    Summary,
    /// Stop driving the run (`agent cancel`): answered [`STOPPING`].
    Stop,
    /// A person's note for the run, read before its next model call: answered [`TOLD`].
    Tell(String),
}

/// The notes a run holds for its driver at most: more are refused until it read some.
pub(super) const MAX_NOTES: usize = 64;

/// The answer to [`Request::Tell`]: the process driving the run has the note.
const TOLD: &[u8] = b"{\"told\":true}\n";

/// The answer to [`Request::Stop`]: the process driving the run was told.
const STOPPING: &[u8] = b"{\"stopping\":true}\n";

#[derive(Serialize, Deserialize)]
struct End {
    /// How many entries were sent before this line.
    end: u64,
}

/// What an owner serves from.
pub(super) struct Served {
    pub(super) run_id: String,
    pub(super) db: SledStore,
    /// The run's summary as of its last commit.
    pub(super) summary: std::sync::Mutex<crate::RunSummary>,
    /// The version confirmed durable: entries past it are in memory, not yet committed.
    pub(super) durable: AtomicU64,
    /// Readers waiting for a commit ([`Served::wait_past`]) and whether the run was let go.
    pub(super) watch: Mutex<Watch>,
    /// Signalled at each commit and when the run is let go.
    pub(super) moved: Condvar,
    /// Readers being served now, at most [`MAX_READERS`].
    pub(super) readers: std::sync::atomic::AtomicUsize,
    /// Someone asked the process driving the run to stop it ([`Request::Stop`]).
    pub(super) stop_asked: AtomicBool,
    /// Notes people sent the run ([`Request::Tell`]), not yet handed to its driver.
    pub(super) told: Mutex<Vec<String>>,
}

/// What readers waiting for a commit share with the owner.
#[derive(Default)]
pub(super) struct Watch {
    /// The run was let go: no commit will come from this process.
    closed: bool,
    /// Readers waiting now.
    waiting: usize,
}

impl Served {
    /// Keeps a person's note for the run's driver; `false` when it holds [`MAX_NOTES`].
    pub(super) fn take_note(&self, text: String) -> bool {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.len() >= MAX_NOTES {
            return false;
        }
        told.push(text);
        true
    }

    /// The log is durable up to `version`: readers waiting for it are answered.
    pub(super) fn committed(&self, version: u64) {
        self.durable.fetch_max(version, Ordering::SeqCst);
        // Taken after the store, so that a reader that saw the old version is already
        // waiting when the signal comes.
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if watch.waiting > 0 {
            self.moved.notify_all();
        }
    }

    /// The run is let go: waiting readers are answered with what there is.
    fn close(&self) {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.moved.notify_all();
    }

    /// Readers waiting for a commit now.
    #[cfg(test)]
    pub(super) fn readers_waiting(&self) -> usize {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).waiting
    }

    /// Waits until version `from` is durable, the run is let go, or `wait` passed.
    pub(super) fn wait_past(&self, from: u64, wait: Duration) {
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        watch.waiting += 1;
        while self.durable.load(Ordering::SeqCst) < from && !watch.closed {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            watch = self
                .moved
                .wait_timeout(watch, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        watch.waiting -= 1;
    }
}

/// The listening side, stopped and removed when dropped.
pub(super) struct Server {
    socket: PathBuf,
    served: Arc<Served>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Listens at `socket` (a stale socket of a process that is gone is replaced: the caller
    /// holds the run's database, so no live owner can be using it).
    pub(super) fn start(
        socket: PathBuf,
        run_id: &str,
        served: Arc<Served>,
    ) -> Result<Server, StoreError> {
        let _ = std::fs::remove_file(&socket);
        let listener =
            UnixListener::bind(&socket).map_err(|e| super::files::io_error(&socket, &e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let serving = Arc::clone(&served);
        let thread = std::thread::Builder::new()
            .name(format!("agent-store-owner-{run_id}"))
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if serving.readers.fetch_add(1, Ordering::SeqCst) >= MAX_READERS {
                        serving.readers.fetch_sub(1, Ordering::SeqCst);
                        // A fresh connection's buffer takes the line at once; no read.
                        let _ = stream.set_nonblocking(true);
                        let _ = (&stream).write_all(BUSY);
                        continue;
                    }
                    let served = Arc::clone(&serving);
                    // One reader's slowness never holds up another.
                    let spawned = std::thread::Builder::new()
                        .name("agent-store-reader".to_owned())
                        .spawn(move || {
                            let _ = serve(stream, &served);
                            served.readers.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        serving.readers.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            })
            .map_err(|e| StoreError::Engine(format!("cannot start the run's listener: {e}")))?;
        Ok(Server {
            socket,
            served,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.served.close();
        // Wakes the accept loop so that it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn serve(stream: UnixStream, served: &Served) -> std::io::Result<()> {
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    stream.set_write_timeout(Some(EXCHANGE_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let from = match serde_json::from_str(&line) {
        Ok(Request::LoadFrom(from)) => from,
        Ok(Request::WaitFrom { from, wait_ms }) => {
            served.wait_past(from, Duration::from_millis(wait_ms));
            from
        }
        Ok(Request::Stop) => {
            served.stop_asked.store(true, Ordering::SeqCst);
            return (&stream).write_all(STOPPING);
        }
        Ok(Request::Tell(text)) => {
            if !served.take_note(text) {
                return Ok(());
            }
            return (&stream).write_all(TOLD);
        }
        Ok(Request::Summary) => {
            let summary = served
                .summary
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let mut out = std::io::BufWriter::new(&stream);
            serde_json::to_writer(&mut out, &summary)?;
            out.write_all(b"\n")?;
            return out.flush();
        }
        Err(_) => return Ok(()),
    };
    let durable = served.durable.load(Ordering::SeqCst);
    let Ok(entries) = served.db.load_from(&served.run_id, from) else {
        return Ok(());
    };
    let mut out = std::io::BufWriter::new(&stream);
    let mut sent = 0u64;
    for entry in entries.iter().filter(|e| e.version <= durable) {
        serde_json::to_writer(&mut out, entry)?;
        out.write_all(b"\n")?;
        sent += 1;
    }
    serde_json::to_writer(&mut out, &End { end: sent })?;
    out.write_all(b"\n")?;
    out.flush()
}

/// The owner's committed entries from version `from` on, or `None` if it did not answer
/// in full (it is gone, or stopped): the caller then reads the database itself.
pub(super) fn load_from(socket: &Path, from: u64) -> Option<Vec<Entry>> {
    entries(socket, &Request::LoadFrom(from), EXCHANGE_TIMEOUT)
}

/// [`load_from`] once there is an entry from `from` on: the owner answers when it commits
/// one, when it lets the run go, or after `wait` (at most a minute) with none. `None` as
/// for [`load_from`], and from an owner that does not know the request (an earlier
/// `agent`).
pub(super) fn wait_from(socket: &Path, from: u64, wait: Duration) -> Option<Vec<Entry>> {
    let wait = wait.min(MAX_WAIT);
    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    entries(
        socket,
        &Request::WaitFrom { from, wait_ms },
        wait + EXCHANGE_TIMEOUT,
    )
}

/// Sends `request` to the owner, on a connection whose reads wait `read_timeout` at most;
/// `None` if it cannot be sent.
fn ask(socket: &Path, request: &Request, read_timeout: Duration) -> Option<UnixStream> {
    let stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(read_timeout)).ok()?;
    stream.set_write_timeout(Some(EXCHANGE_TIMEOUT)).ok()?;
    let mut bytes = serde_json::to_vec(request).ok()?;
    bytes.push(b'\n');
    (&stream).write_all(&bytes).ok()?;
    Some(stream)
}

/// Asks the owner for entries and reads its answer, each read within `read_timeout`.
fn entries(socket: &Path, asked: &Request, read_timeout: Duration) -> Option<Vec<Entry>> {
    let stream = ask(socket, asked, read_timeout)?;
    let mut entries = Vec::new();
    for line in BufReader::new(&stream).lines() {
        let line = line.ok()?;
        if let Ok(end) = serde_json::from_str::<End>(&line) {
            return (end.end == entries.len() as u64).then_some(entries);
        }
        entries.push(serde_json::from_str::<Entry>(&line).ok()?);
    }
    None
}

/// Asks the owner to stop driving its run; whether it said it was told.
pub(super) fn ask_to_stop(socket: &Path) -> bool {
    one_line_answer(socket, &Request::Stop, 64).is_some_and(|line| line.as_bytes() == STOPPING)
}

/// Hands the owner a person's note for its run; whether it said it has it.
pub(super) fn tell(socket: &Path, text: &str) -> bool {
    one_line_answer(socket, &Request::Tell(text.to_owned()), 64)
        .is_some_and(|line| line.as_bytes() == TOLD)
}

/// Sends `request` to the owner and reads its one-line answer, at most `max` bytes of it;
/// `None` if it did not answer.
fn one_line_answer(socket: &Path, request: &Request, max: u64) -> Option<String> {
    let stream = ask(socket, request, EXCHANGE_TIMEOUT)?;
    let mut line = String::new();
    BufReader::new((&stream).take(max))
        .read_line(&mut line)
        .ok()?;
    Some(line)
}

/// The run's summary from its owner, or `None` if it did not answer.
pub(super) fn summary(socket: &Path) -> Option<crate::RunSummary> {
    summary_within(socket, MAX_SUMMARY)
}

/// Longest summary line read from an owner: whatever listens on the socket, a reader's
/// memory stays bounded (a summary is a few hundred bytes and a goal).
const MAX_SUMMARY: u64 = 1 << 20;

/// [`summary`], reading at most `max` bytes of the answer.
fn summary_within(socket: &Path, max: u64) -> Option<crate::RunSummary> {
    serde_json::from_str(&one_line_answer(socket, &Request::Summary, max)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> (tempfile::TempDir, PathBuf, UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        (dir, socket, listener)
    }

    /// An owner whose answer is longer than a reader takes is not read to its end: the
    /// reader's memory is bounded whatever listens on the socket.
    #[test]
    fn a_summary_longer_than_the_limit_is_not_read() {
        let answer = |socket: PathBuf, listener: UnixListener, max: u64| {
            let owner = std::thread::spawn(move || {
                let (stream, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&stream).read_line(&mut line).unwrap();
                let mut summary = crate::RunSummary::new("r");
                summary.goal = "g".repeat(300);
                let mut bytes = serde_json::to_vec(&summary).unwrap();
                bytes.push(b'\n');
                // The reader may close early: what it did not read is not an error here.
                let _ = (&stream).write_all(&bytes);
            });
            let got = summary_within(&socket, max);
            owner.join().unwrap();
            got
        };
        let (_dir, socket, owner) = listener();
        let whole = answer(socket, owner, MAX_SUMMARY).expect("a summary within the limit");
        assert_eq!(whole.goal.len(), 300);
        let (_dir, socket, owner) = listener();
        assert!(answer(socket, owner, 100).is_none());
    }

    #[test]
    fn an_owner_that_answers_is_alive() {
        let (_dir, socket, listener) = listener();
        let owner = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            (&stream).write_all(b"{}\n").unwrap();
        });
        assert!(answers(&socket, EXCHANGE_TIMEOUT));
        owner.join().unwrap();
    }

    #[test]
    fn a_socket_closed_without_an_answer_is_no_owner() {
        // What a reader meets when the last holder of a dead owner's socket (a child that
        // had not yet executed its program) lets go: the connection goes, no answer comes.
        let (_dir, socket, listener) = listener();
        let holder = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            drop(stream);
            drop(listener);
        });
        assert!(!answers(&socket, EXCHANGE_TIMEOUT));
        holder.join().unwrap();
    }

    #[test]
    fn a_silent_owner_is_alive() {
        // A stopped owner holds its socket and never accepts.
        let (_dir, socket, listener) = listener();
        assert!(answers(&socket, Duration::from_millis(50)));
        drop(listener);
    }

    #[test]
    fn runs_whose_ids_differ_after_a_dot_listen_on_sockets_of_their_own() {
        let runs = Path::new("/s/runs");
        let parent = socket_path(&runs.join("01ABC"));
        let child = socket_path(&runs.join("01ABC.1aac68bc4087"));
        assert_eq!(parent, Path::new("/s/runs/01ABC.sock"));
        assert_eq!(child, Path::new("/s/runs/01ABC.1aac68bc4087.sock"));
    }

    #[test]
    fn no_socket_is_no_owner() {
        let (_dir, socket, listener) = listener();
        drop(listener);
        assert!(!answers(&socket, EXCHANGE_TIMEOUT));
    }
}
