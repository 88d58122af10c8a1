//! Finding what is named as [`crate::Workspace::protect_everywhere`] names it (`.git`)
//! anywhere in a workspace, for the sandbox to bind each read-only: a sandboxed command
//! is kept from the hooks and config of a repository nested in the workspace (a
//! submodule's, a checkout's under `~/src`), as the file tools are.
//!
//! The first walk reads every directory; later ones read again only a directory whose
//! inode, modification or change time differ from the last read (an entry was made,
//! removed or renamed in it), and look at the others' times only. A workspace with a build
//! directory of a hundred thousand files then costs a `stat` of each directory a walk.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A directory changed less than this before it was read is read again by the next walk:
/// a change made in the same tick of the file system's clock, after the read, would leave
/// its times as they were.
const SETTLED: Duration = Duration::from_secs(2);

/// The directories of a workspace as its last walk read them.
#[derive(Default)]
pub(crate) struct Listings {
    dirs: HashMap<PathBuf, Listing>,
    /// Directories read (not only looked at) by walks so far, for the tests.
    reads: u64,
}

struct Listing {
    stamp: Stamp,
    /// Whether an unchanged stamp says the directory is as it was read.
    settled: bool,
    /// Its directories (not links to one), to walk into.
    dirs: Vec<OsString>,
    /// Its entries with a name looked for.
    named: Vec<OsString>,
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

impl Listings {
    /// Every entry beneath `root` (its own included) whose name `looked_for` says, without
    /// looking beneath one; a directory reached through a link is not walked into.
    pub(crate) fn find(
        &mut self,
        root: &Path,
        looked_for: impl Fn(&OsStr) -> bool,
    ) -> Vec<PathBuf> {
        let mut last = std::mem::take(&mut self.dirs);
        let mut found = Vec::new();
        let mut walk = vec![root.to_path_buf()];
        while let Some(dir) = walk.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&dir) else {
                continue;
            };
            if !meta.is_dir() {
                continue;
            }
            let stamp = Stamp::of(&meta);
            let listing = match last.remove(&dir) {
                Some(listing) if listing.settled && listing.stamp == stamp => listing,
                _ => {
                    self.reads += 1;
                    read(&dir, stamp, &looked_for)
                }
            };
            found.extend(listing.named.iter().map(|name| dir.join(name)));
            walk.extend(listing.dirs.iter().map(|name| dir.join(name)));
            self.dirs.insert(dir, listing);
        }
        found.sort();
        found
    }

    /// Directories read by walks so far.
    #[cfg(test)]
    pub(crate) fn reads(&self) -> u64 {
        self.reads
    }
}

/// Reads `dir`, whose stamp is `stamp`.
fn read(dir: &Path, stamp: Stamp, looked_for: &impl Fn(&OsStr) -> bool) -> Listing {
    let began = SystemTime::now();
    let mut listing = Listing {
        stamp,
        settled: false,
        dirs: Vec::new(),
        named: Vec::new(),
    };
    // One that cannot be read is read again next time.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return listing;
    };
    for entry in entries {
        let Ok(entry) = entry else {
            return listing;
        };
        let name = entry.file_name();
        if looked_for(&name) {
            listing.named.push(name);
        } else if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            listing.dirs.push(name);
        }
    }
    listing.settled = began
        .duration_since(stamp.changed())
        .is_ok_and(|age| age >= SETTLED);
    listing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(name: &OsStr) -> bool {
        name.eq_ignore_ascii_case(".git")
    }

    /// Sets a directory's modification time `by` from now (its change time becomes now).
    fn touch(dir: &Path, later: bool, by: Duration) {
        let now = SystemTime::now();
        let at = if later { now + by } else { now - by };
        let file = std::fs::File::open(dir).unwrap();
        file.set_times(std::fs::FileTimes::new().set_modified(at))
            .unwrap();
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

    #[test]
    fn walks_find_what_is_there_and_read_again_only_what_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for dir in ["a/.git/hooks", "a/b/c", "d/.GIT", "e/sub", "build/out"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("e/sub/.git"), "gitdir: ../../.git/modules/sub\n").unwrap();
        std::fs::create_dir(root.join(".git")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        let old = |dir: &str| touch(&root.join(dir), false, Duration::from_secs(60));
        DIRS.iter().for_each(|dir| old(dir));
        let mut listings = Listings::default();
        let expected: Vec<PathBuf> = [".git", "a/.git", "d/.GIT", "e/sub/.git"]
            .iter()
            .map(|p| root.join(p))
            .collect();
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
        let mut more = expected.clone();
        more.push(root.join("a/b/c/.git"));
        more.sort();
        assert_eq!(listings.find(root, git), more);
        assert_eq!(listings.reads(), 13);

        // One removed is no longer found, nor is anything of its directory kept.
        std::fs::remove_dir_all(root.join("a/b")).unwrap();
        assert_eq!(listings.find(root, git), expected);
        assert!(!listings.dirs.contains_key(&root.join("a/b/c")));
    }
}
