//! Finding what is named as [`crate::Workspace::protect_everywhere`] names it (`.git`)
//! anywhere in a workspace, for the sandbox to bind each read-only: a sandboxed command
//! is kept from the hooks and config of a repository nested in the workspace (a
//! submodule's, a checkout's under `~/src`), as the file tools are.
//!
//! The first walk reads every directory. On Linux it also watches each (inotify: an entry
//! made, removed or renamed in it, the directory itself removed or moved), so that a later
//! walk reads again only the directories that changed in a way that matters (a directory
//! or a name looked for came or went; a file a build writes does not count), and costs
//! nothing when none did. Where the directories cannot all be watched (the user's watches
//! are few, or a quarter of them would not do; the kernel's queue of events overflowed,
//! then only that walk reads all again), a walk looks at each directory's inode and times
//! instead, and reads again those that differ from their last read.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A directory changed less than this before it was read is read again by the next walk
/// that looks at times: a change made in the same tick of the file system's clock, after
/// the read, would leave its times as they were.
const SETTLED: Duration = Duration::from_secs(2);

/// The most directories watched, at most a quarter of the user's watches (the person's
/// editor and other programs need theirs).
#[cfg(target_os = "linux")]
const MAX_WATCHES: usize = 65_536;

/// What a walk does with an entry, by its name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Looked {
    /// Nothing: a directory is walked into.
    Past,
    /// It is found, and not walked into (a `.git`).
    Found,
    /// It is found, and a directory is walked into all the same (a `HEAD`, which says its
    /// directory may be a bare repository's, and may be a directory itself).
    FoundAndPast,
}

/// The directories of a workspace as its last walk read them.
pub(crate) struct Listings {
    dirs: HashMap<PathBuf, Listing>,
    /// What the last walk found, and from where: given again while nothing changed.
    found: Option<(PathBuf, Vec<PathBuf>)>,
    watch: Watch,
    /// Directories read (not only looked at) by walks so far, for the tests.
    reads: u64,
}

impl Default for Listings {
    fn default() -> Listings {
        Listings {
            dirs: HashMap::new(),
            found: None,
            watch: Watch::Untried,
            reads: 0,
        }
    }
}

/// How changes are learnt of.
enum Watch {
    /// The first walk starts watching, if it can.
    Untried,
    /// Each directory read is watched.
    #[cfg(target_os = "linux")]
    On(Watches),
    /// Each directory's inode and times are looked at.
    Off,
}

/// The inotify instance that watches the directories read, and which is which.
#[cfg(target_os = "linux")]
struct Watches {
    fd: std::os::fd::OwnedFd,
    paths: HashMap<i32, PathBuf>,
    most: usize,
}

struct Listing {
    stamp: Stamp,
    /// Whether an unchanged stamp says the directory is as it was read.
    settled: bool,
    /// Its directories (not links to one), to walk into.
    dirs: Vec<OsString>,
    /// Its entries with a name looked for.
    named: Vec<OsString>,
    /// Its watch, while it has one.
    wd: Option<i32>,
}

/// What changes when an entry of a directory is made, removed or renamed, or the directory
/// itself is replaced.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// When an entry was last made, removed or renamed in it, by the system's clock.
    fn changed(&self) -> SystemTime {
        let (secs, nanos) = self.mtime;
        let secs = u64::try_from(secs).unwrap_or(0);
        let nanos = u32::try_from(nanos).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
    }
}

/// What the watches said since the last walk.
#[derive(Default)]
struct Changes {
    /// Directories to read again.
    dirty: HashSet<PathBuf>,
    /// Everything is to be read again (events were lost).
    all: bool,
}

impl Listings {
    /// Listings that never watch: each walk looks at every directory's inode and times.
    #[cfg(test)]
    fn looking() -> Listings {
        Listings {
            watch: Watch::Off,
            ..Listings::default()
        }
    }

    /// Every entry beneath `root` (its own included) whose name `looked_for` says is found,
    /// in order, looking beneath one only where it says so; a directory reached through a
    /// link is not walked into.
    pub(crate) fn find(
        &mut self,
        root: &Path,
        looked_for: impl Fn(&OsStr) -> Looked,
    ) -> Vec<PathBuf> {
        if matches!(self.watch, Watch::Untried) {
            self.watch = Watch::start();
        }
        let changes = self.changes(&looked_for);
        let watching = !matches!(self.watch, Watch::Off);
        if let Some((from, found)) = &self.found
            && watching
            && from == root
            && !changes.all
            && changes.dirty.is_empty()
        {
            return found.clone();
        }
        let mut last = std::mem::take(&mut self.dirs);
        let mut found = Vec::new();
        let mut walk = vec![root.to_path_buf()];
        while let Some(dir) = walk.pop() {
            let kept = last.remove(&dir).and_then(|listing| {
                let unchanged = if matches!(self.watch, Watch::Off) {
                    let stamp = std::fs::symlink_metadata(&dir).map(|meta| Stamp::of(&meta));
                    listing.settled && stamp.is_ok_and(|stamp| stamp == listing.stamp)
                } else {
                    listing.wd.is_some() && !changes.all && !changes.dirty.contains(&dir)
                };
                if unchanged {
                    Some(listing)
                } else {
                    self.unwatch(&dir, &listing);
                    None
                }
            });
            let listing = match kept {
                Some(listing) => listing,
                None => match self.read(&dir, &looked_for) {
                    Some(listing) => listing,
                    None => continue,
                },
            };
            found.extend(listing.named.iter().map(|name| dir.join(name)));
            walk.extend(listing.dirs.iter().map(|name| dir.join(name)));
            self.dirs.insert(dir, listing);
        }
        for (dir, listing) in &last {
            self.unwatch(dir, listing);
        }
        found.sort();
        self.found = Some((root.to_path_buf(), found.clone()));
        found
    }

    /// Reads `dir` (watched first, where directories are), or `None` where it is not a
    /// directory.
    fn read(&mut self, dir: &Path, looked_for: &impl Fn(&OsStr) -> Looked) -> Option<Listing> {
        let wd = self.watch(dir);
        let meta = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir())?;
        let stamp = Stamp::of(&meta);
        self.reads += 1;
        let began = SystemTime::now();
        let mut listing = Listing {
            stamp,
            settled: false,
            dirs: Vec::new(),
            named: Vec::new(),
            wd: None,
        };
        // One that cannot be read is read again next time: no watch, not settled.
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Some(listing);
        };
        for entry in entries {
            let Ok(entry) = entry else {
                return Some(listing);
            };
            let name = entry.file_name();
            let looked = looked_for(&name);
            if looked != Looked::Found && entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                listing.dirs.push(name.clone());
            }
            if looked != Looked::Past {
                listing.named.push(name);
            }
        }
        listing.settled = began
            .duration_since(stamp.changed())
            .is_ok_and(|age| age >= SETTLED);
        listing.wd = wd;
        Some(listing)
    }

    /// Directories read by walks so far.
    #[cfg(test)]
    fn reads(&self) -> u64 {
        self.reads
    }

    /// Whether directories are watched now.
    #[cfg(test)]
    fn watching(&self) -> bool {
        !matches!(self.watch, Watch::Off | Watch::Untried)
    }
}

#[cfg(target_os = "linux")]
impl Watch {
    /// Watches, if the system gives an inotify instance and some watches to spare.
    fn start() -> Watch {
        use rustix::fs::inotify;
        let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .unwrap_or(8_192);
        let flags = inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK;
        match inotify::init(flags) {
            Ok(fd) => Watch::On(Watches {
                fd,
                paths: HashMap::new(),
                most: (limit / 4).min(MAX_WATCHES),
            }),
            Err(_) => Watch::Off,
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Watch {
    fn start() -> Watch {
        Watch::Off
    }
}

#[cfg(target_os = "linux")]
impl Listings {
    /// The watch of `dir`, started before it is read; where one cannot be had, watching
    /// stops for good (every watch let go) and walks look at times.
    fn watch(&mut self, dir: &Path) -> Option<i32> {
        use rustix::fs::inotify::{WatchFlags, add_watch};
        let Watch::On(watches) = &mut self.watch else {
            return None;
        };
        let flags = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW;
        let added = if watches.paths.len() < watches.most {
            add_watch(&watches.fd, dir, flags).ok()
        } else {
            None
        };
        match added {
            Some(wd) => {
                // A directory moved keeps its watch: it is now this one's.
                watches.paths.insert(wd, dir.to_path_buf());
                Some(wd)
            }
            None => {
                self.stop_watching();
                None
            }
        }
    }

    /// Lets every watch go (the instance closed); walks look at times from now on.
    fn stop_watching(&mut self) {
        self.watch = Watch::Off;
        for listing in self.dirs.values_mut() {
            listing.wd = None;
        }
    }

    /// Lets go of the watch of `dir` (no longer walked, or read again), unless it is
    /// another directory's now (one moved).
    fn unwatch(&mut self, dir: &Path, listing: &Listing) {
        let (Watch::On(watches), Some(wd)) = (&mut self.watch, listing.wd) else {
            return;
        };
        if watches.paths.get(&wd).is_some_and(|path| path == dir) {
            watches.paths.remove(&wd);
            let _ = rustix::fs::inotify::remove_watch(&watches.fd, wd);
        }
    }

    /// What the watches said since the last walk: the directories in which a directory
    /// or a name looked for came or went, those removed or moved themselves.
    fn changes(&mut self, looked_for: &impl Fn(&OsStr) -> Looked) -> Changes {
        use rustix::fs::inotify::{ReadFlags, Reader};
        use std::os::unix::ffi::OsStrExt;
        let mut changes = Changes::default();
        let Watch::On(watches) = &mut self.watch else {
            return changes;
        };
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = Reader::new(&watches.fd, &mut buf);
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // Whatever it was, what happened is not known: all is read again.
                Err(_) => {
                    changes.all = true;
                    break;
                }
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                changes.all = true;
                continue;
            }
            let Some(dir) = watches.paths.get(&event.wd()) else {
                continue;
            };
            let itself = ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::IGNORED;
            let matters = flags.intersects(itself)
                || flags.contains(ReadFlags::ISDIR)
                || event.file_name().is_some_and(|name| {
                    looked_for(OsStr::from_bytes(name.to_bytes())) != Looked::Past
                });
            if matters {
                changes.dirty.insert(dir.clone());
            }
            // A directory made, removed or moved in it is read again too, whatever its own
            // watch says: the kernel tells a removed directory's watch (`DELETE_SELF`) only
            // once nobody holds its entry any more, which another thread's lookup can put
            // off past this look, and the parent's listing alone would keep the old one's.
            if flags.contains(ReadFlags::ISDIR)
                && let Some(name) = event.file_name()
            {
                changes
                    .dirty
                    .insert(dir.join(OsStr::from_bytes(name.to_bytes())));
            }
            if flags.contains(ReadFlags::IGNORED) {
                watches.paths.remove(&event.wd());
            }
        }
        changes
    }
}

#[cfg(not(target_os = "linux"))]
impl Listings {
    fn watch(&mut self, _dir: &Path) -> Option<i32> {
        None
    }

    fn unwatch(&mut self, _dir: &Path, _listing: &Listing) {}

    fn changes(&mut self, _looked_for: &impl Fn(&OsStr) -> Looked) -> Changes {
        Changes::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(name: &OsStr) -> Looked {
        if name.eq_ignore_ascii_case(".git") {
            Looked::Found
        } else {
            Looked::Past
        }
    }

    /// Sets a directory's modification time `by` from now (its change time becomes now).
    fn touch(dir: &Path, later: bool, by: Duration) {
        let now = SystemTime::now();
        let at = if later { now + by } else { now - by };
        let file = std::fs::File::open(dir).unwrap();
        file.set_times(std::fs::FileTimes::new().set_modified(at))
            .unwrap();
    }

    /// `places` and, beneath `root`, `more`, in order.
    fn plus(places: &[PathBuf], root: &Path, more: &[&str]) -> Vec<PathBuf> {
        let mut all = places.to_vec();
        all.extend(more.iter().map(|place| root.join(place)));
        all.sort();
        all
    }

    const DIRS: [&str; 9] = [
        "",
        "a",
        "a/b",
        "a/b/c",
        "d",
        "e",
        "e/sub",
        "build",
        "build/out",
    ];

    /// A workspace: a repository at its root, two nested in it (one spelt in capitals), a
    /// submodule's `.git` file, a build directory, and a link to one of its directories;
    /// each directory last changed a minute ago. Its `.git` places, in order.
    fn tree(root: &Path) -> Vec<PathBuf> {
        for dir in ["a/.git/hooks", "a/b/c", "d/.GIT", "e/sub", "build/out"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("e/sub/.git"), "gitdir: ../../.git/modules/sub\n").unwrap();
        std::fs::create_dir(root.join(".git")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        DIRS.iter()
            .for_each(|dir| touch(&root.join(dir), false, Duration::from_secs(60)));
        [".git", "a/.git", "d/.GIT", "e/sub/.git"]
            .iter()
            .map(|p| root.join(p))
            .collect()
    }

    #[test]
    fn walks_that_look_at_times_read_again_only_what_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let expected = tree(root);
        let old = |dir: &str| touch(&root.join(dir), false, Duration::from_secs(60));
        let mut listings = Listings::looking();
        assert_eq!(listings.find(root, git), expected);
        // Each directory not beneath a `.git` nor through the link, once.
        assert_eq!(listings.reads(), 9);
        assert_eq!(listings.find(root, git), expected);
        assert_eq!(listings.reads(), 9, "nothing changed, nothing is read");

        // A directory that changed about when it was read is read at each walk.
        touch(&root.join("a/b"), true, Duration::from_secs(3600));
        listings.find(root, git);
        assert_eq!(listings.reads(), 10);
        listings.find(root, git);
        assert_eq!(listings.reads(), 11);
        old("a/b");
        listings.find(root, git);
        assert_eq!(listings.reads(), 12);

        // A repository made deep down is found; its directory alone is read again.
        std::fs::create_dir(root.join("a/b/c/.git")).unwrap();
        let more = plus(&expected, root, &["a/b/c/.git"]);
        assert_eq!(listings.find(root, git), more);
        assert_eq!(listings.reads(), 13);

        // One removed is no longer found, nor is anything of its directory kept.
        std::fs::remove_dir_all(root.join("a/b")).unwrap();
        assert_eq!(listings.find(root, git), expected);
        assert!(!listings.dirs.contains_key(&root.join("a/b/c")));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn watched_walks_read_again_only_the_directories_where_what_matters_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let expected = tree(root);
        let mut listings = Listings::default();
        assert_eq!(listings.find(root, git), expected);
        assert!(listings.watching());
        assert_eq!(listings.reads(), 9);
        assert_eq!(listings.find(root, git), expected);
        assert_eq!(listings.reads(), 9, "nothing changed, nothing is read");

        // Files a build writes, and one removed, change nothing that matters.
        std::fs::write(root.join("build/out/main.o"), "o").unwrap();
        std::fs::write(root.join("a/b/notes.txt"), "n").unwrap();
        std::fs::remove_file(root.join("a/b/notes.txt")).unwrap();
        assert_eq!(listings.find(root, git), expected);
        assert_eq!(listings.reads(), 9);

        // A repository made deep down is found; its directory alone is read again.
        std::fs::create_dir(root.join("a/b/c/.git")).unwrap();
        let with = |more: &[&str]| plus(&expected, root, more);
        assert_eq!(listings.find(root, git), with(&["a/b/c/.git"]));
        assert_eq!(listings.reads(), 10);

        // A submodule's `.git` file made is found as well.
        std::fs::write(root.join("e/.git"), "gitdir: ../.git/modules/e\n").unwrap();
        assert_eq!(listings.find(root, git), with(&["a/b/c/.git", "e/.git"]));
        assert_eq!(listings.reads(), 11);
        std::fs::remove_file(root.join("e/.git")).unwrap();
        assert_eq!(listings.find(root, git), with(&["a/b/c/.git"]));
        assert_eq!(listings.reads(), 12);

        // A directory made, with a repository in it: its parent and it are read.
        std::fs::create_dir_all(root.join("build/new/.git")).unwrap();
        let places = with(&["a/b/c/.git", "build/new/.git"]);
        assert_eq!(listings.find(root, git), places);
        assert_eq!(listings.reads(), 14);

        // A directory moved: found where it went, and watched there.
        std::fs::rename(root.join("a/b"), root.join("d/b")).unwrap();
        let places = with(&["d/b/c/.git", "build/new/.git"]);
        assert_eq!(listings.find(root, git), places);
        std::fs::create_dir(root.join("d/b/c/x")).unwrap();
        std::fs::create_dir(root.join("d/b/c/x/.git")).unwrap();
        let reads = listings.reads();
        let after = plus(&places, root, &["d/b/c/x/.git"]);
        assert_eq!(listings.find(root, git), after);
        assert_eq!(listings.reads(), reads + 2, "d/b/c and d/b/c/x");

        // A directory removed and made again at once is read again, though only a file
        // went with it: what is in the new one is found.
        std::fs::remove_dir_all(root.join("build/out")).unwrap();
        std::fs::create_dir_all(root.join("build/out/.git")).unwrap();
        let after = plus(&after, root, &["build/out/.git"]);
        assert_eq!(listings.find(root, git), after);
        assert!(listings.watching());
    }

    /// A directory removed while something holds it open (another program, another
    /// thread's lookup), and made again at once with a repository in it: the kernel tells
    /// the old one's watch only once it is let go, and the new one is read all the same.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_directory_remade_while_the_old_one_is_held_is_read_again() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("build/out")).unwrap();
        let mut listings = Listings::default();
        assert!(listings.find(root, git).is_empty());
        assert!(listings.watching());
        let held = std::fs::File::open(root.join("build/out")).unwrap();
        std::fs::remove_dir(root.join("build/out")).unwrap();
        std::fs::create_dir_all(root.join("build/out/.git")).unwrap();
        assert_eq!(listings.find(root, git), [root.join("build/out/.git")]);
        drop(held);
        assert_eq!(listings.find(root, git), [root.join("build/out/.git")]);
    }

    /// A name found and walked past (`HEAD`): a file of that name made where directories
    /// were already is found, its directory alone read again; a directory of that name is
    /// walked into.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_name_found_and_walked_past_is_noticed_and_walked_into() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for dir in ["x/objects", "x/refs", "HEAD/deep"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        let looked_for = |name: &OsStr| match name.to_str() {
            Some(".git") => Looked::Found,
            Some("HEAD") => Looked::FoundAndPast,
            _ => Looked::Past,
        };
        let mut listings = Listings::default();
        assert_eq!(listings.find(root, looked_for), [root.join("HEAD")]);
        assert!(listings.watching());
        let reads = listings.reads();
        std::fs::write(root.join("x/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir(root.join("HEAD/deep/.git")).unwrap();
        assert_eq!(
            listings.find(root, looked_for),
            [
                root.join("HEAD"),
                root.join("HEAD/deep/.git"),
                root.join("x/HEAD")
            ]
        );
        assert_eq!(listings.reads(), reads + 2, "x and HEAD/deep");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_walk_that_cannot_watch_every_directory_looks_at_times_instead() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let expected = tree(root);
        let mut listings = Listings {
            watch: Watch::start(),
            ..Listings::default()
        };
        if let Watch::On(watches) = &mut listings.watch {
            watches.most = 4;
        }
        assert_eq!(listings.find(root, git), expected);
        assert!(!listings.watching(), "the fifth directory stopped it");
        assert_eq!(listings.reads(), 9);
        // Times are looked at: nothing changed, nothing is read; a change is seen.
        assert_eq!(listings.find(root, git), expected);
        assert_eq!(listings.reads(), 9);
        std::fs::create_dir(root.join("build/out/.git")).unwrap();
        let more = plus(&expected, root, &["build/out/.git"]);
        assert_eq!(listings.find(root, git), more);
        assert_eq!(listings.reads(), 10);
    }
}
