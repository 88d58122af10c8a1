//! A repository's `config` file read as git reads it, to tell which of its settings make
//! git run a program. A command may write the file, and a person's next `git status` in
//! that repository obeys it: a reader that splits lines more simply than git does would
//! miss `[core] fsmonitor = evil` (a setting on its header's line) or a setting after a
//! lone carriage return, which git reads as a space.
//!
//! [`read`] follows git's own parser (`config.c`: `git_parse_source`, `get_value`,
//! `parse_value`, `get_base_var`) byte for byte, and the tests hold it to what
//! `git config --list` prints for the same files.

/// Where git stops reading a config file it refuses ("bad config line N"): git then runs
/// no command in that repository until the file is mended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The line, from 1.
    pub line: usize,
}

/// Reads a git config file's `bytes`, handing each setting to `each` in order: its name
/// as `git config --list` prints it (section and key in lower case, a subsection as
/// written, joined by dots) and its value (`None` for a key given no `=`, which git takes
/// as true). What git would refuse is `Err`, after the settings before it were handed.
pub fn read(bytes: &[u8], mut each: impl FnMut(&[u8], Option<&[u8]>)) -> Result<(), Refused> {
    let mut src = Source {
        bytes,
        at: 0,
        line: 1,
        eof: false,
    };
    let refused = |src: &Source| Refused { line: src.line };
    // A UTF-8 byte order mark is skipped; a part of one is refused.
    const BOM: [u8; 3] = [0xef, 0xbb, 0xbf];
    let mut bom = Some(0);
    let mut comment = false;
    let mut name: Vec<u8> = Vec::new();
    let mut section_len = 0;
    let mut value = Vec::new();
    loop {
        let c = src.next();
        if let Some(matched) = bom {
            if matched < BOM.len() && c == BOM[matched] {
                bom = Some(matched + 1);
                continue;
            }
            if matched > 0 && matched < BOM.len() {
                return Err(refused(&src));
            }
            bom = None;
        }
        if c == b'\n' {
            if src.eof {
                return Ok(());
            }
            comment = false;
            continue;
        }
        if comment || is_space(c) {
            continue;
        }
        if c == b'#' || c == b';' {
            comment = true;
            continue;
        }
        if c == b'[' {
            name.clear();
            if section(&mut src, &mut name).is_err() || name.is_empty() {
                return Err(refused(&src));
            }
            name.push(b'.');
            section_len = name.len();
            continue;
        }
        if !c.is_ascii_alphabetic() {
            return Err(refused(&src));
        }
        name.truncate(section_len);
        name.push(c.to_ascii_lowercase());
        match setting(&mut src, &mut name, &mut value) {
            Ok(given) => {
                // git hands on C strings: nothing after a NUL is seen.
                let c_string = |bytes: &[u8]| -> usize {
                    bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())
                };
                let given = given.then(|| &value[..c_string(&value)]);
                each(&name[..c_string(&name)], given);
            }
            Err(()) => return Err(refused(&src)),
        }
    }
}

/// The file as git's `get_next_char` hands it out: `\r\n` as `\n`, and `\n` for ever
/// once it ends; `line` as git counts them, for its messages.
struct Source<'a> {
    bytes: &'a [u8],
    at: usize,
    line: usize,
    eof: bool,
}

impl Source<'_> {
    fn next(&mut self) -> u8 {
        let Some(&c) = self.bytes.get(self.at) else {
            // As git counts: each read past the end is a line more.
            self.eof = true;
            self.line += 1;
            return b'\n';
        };
        self.at += 1;
        let c = if c == b'\r' && self.bytes.get(self.at) == Some(&b'\n') {
            self.at += 1;
            b'\n'
        } else {
            c
        };
        if c == b'\n' {
            self.line += 1;
        }
        c
    }
}

/// git's `isspace`: space, tab, newline and carriage return (not `\v` nor `\f`).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// A section's header after its `[`: `[name]`, `[name.sub]` or `[name "sub"]`.
fn section(src: &mut Source, name: &mut Vec<u8>) -> Result<(), ()> {
    loop {
        let c = src.next();
        if src.eof {
            return Err(());
        }
        if c == b']' {
            return Ok(());
        }
        if is_space(c) {
            return subsection(src, name, c);
        }
        if !is_key_char(c) && c != b'.' {
            return Err(());
        }
        name.push(c.to_ascii_lowercase());
    }
}

/// `"sub"]` after a section's name and the space `c`; a backslash takes the next byte
/// as it is.
fn subsection(src: &mut Source, name: &mut Vec<u8>, mut c: u8) -> Result<(), ()> {
    // A header cut by the end of its line: git names the line it began on.
    let incomplete = |src: &mut Source| {
        src.line -= 1;
        Err(())
    };
    loop {
        if c == b'\n' {
            return incomplete(src);
        }
        c = src.next();
        if !is_space(c) {
            break;
        }
    }
    if c != b'"' {
        return Err(());
    }
    name.push(b'.');
    loop {
        let mut c = src.next();
        if c == b'\n' {
            return incomplete(src);
        }
        if c == b'"' {
            break;
        }
        if c == b'\\' {
            c = src.next();
            if c == b'\n' {
                return incomplete(src);
            }
        }
        name.push(c);
    }
    if src.next() == b']' { Ok(()) } else { Err(()) }
}

/// The rest of a setting's key (appended to `name`) and its value, into `value`:
/// whether it was given one.
fn setting(src: &mut Source, name: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<bool, ()> {
    let mut c;
    loop {
        c = src.next();
        if src.eof || !is_key_char(c) {
            break;
        }
        name.push(c.to_ascii_lowercase());
    }
    while c == b' ' || c == b'\t' {
        c = src.next();
    }
    if c == b'\n' {
        return Ok(false);
    }
    if c != b'=' {
        return Err(());
    }
    parse_value(src, value)?;
    Ok(true)
}

/// A value after its `=`, to the end of its line (or of the lines a backslash joins):
/// quotes and escapes taken away, a comment and the spaces before it left out.
fn parse_value(src: &mut Source, value: &mut Vec<u8>) -> Result<(), ()> {
    value.clear();
    let mut quote = false;
    let mut comment = false;
    // Where the spaces at the end begin (0: none yet).
    let mut trim = 0;
    loop {
        let mut c = src.next();
        if c == b'\n' {
            if quote {
                // git names the line the value began on.
                src.line -= 1;
                return Err(());
            }
            if trim > 0 {
                value.truncate(trim);
            }
            return Ok(());
        }
        if comment {
            continue;
        }
        if is_space(c) && !quote {
            if trim == 0 {
                trim = value.len();
            }
            if !value.is_empty() {
                value.push(c);
            }
            continue;
        }
        if !quote && (c == b';' || c == b'#') {
            comment = true;
            continue;
        }
        trim = 0;
        if c == b'\\' {
            c = match src.next() {
                b'\n' => continue,
                b't' => b'\t',
                b'b' => 0x08,
                b'n' => b'\n',
                c @ (b'\\' | b'"') => c,
                _ => return Err(()),
            };
            value.push(c);
            continue;
        }
        if c == b'"' {
            quote = !quote;
            continue;
        }
        value.push(c);
    }
}

/// The last part of a setting's name that makes git run a program (`core.fsmonitor`,
/// `core.sshCommand`, a filter's `clean`, a diff driver's `textconv`, `credential.helper`,
/// `gpg.program`, a tool's `cmd`, `sendemail.toCmd`, `imap.tunnel`…) or read another
/// file's settings (`include.path`).
const RUNS_A_PROGRAM: &[&[u8]] = &[
    b"fsmonitor",
    b"hookspath",
    b"sshcommand",
    b"pager",
    b"editor",
    b"askpass",
    b"gitproxy",
    b"alternaterefscommand",
    b"external",
    b"command",
    b"textconv",
    b"driver",
    b"clean",
    b"smudge",
    b"process",
    b"helper",
    b"program",
    b"cmd",
    b"path",
    b"uploadpack",
    b"receivepack",
    b"packobjectshook",
    b"proxycommand",
    b"difffilter",
    b"tunnel",
    b"tocmd",
    b"cccmd",
    b"headercmd",
    b"sendmailcmd",
    b"smtpserver",
];

/// Whether the setting `name` (as [`read`] hands it) with `value` makes git run a program
/// or read another file: a key such as `fsmonitor`, `sshcommand`, `clean`, `textconv`,
/// `helper`, `cmd` or `path` (of `include.path`), any `pager.*`, or an alias or a
/// submodule's `update` whose value begins with `!` (a shell command).
pub fn runs_a_program(name: &[u8], value: Option<&[u8]>) -> bool {
    let section = name.split(|&b| b == b'.').next().unwrap_or_default();
    let key = name.rsplit(|&b| b == b'.').next().unwrap_or_default();
    let shell = value.is_some_and(|v| v.first() == Some(&b'!'));
    RUNS_A_PROGRAM.contains(&key)
        || section == b"pager"
        || (shell && (section == b"alias" || (section == b"submodule" && key == b"update")))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Settings = Vec<(Vec<u8>, Option<Vec<u8>>)>;

    fn ours(config: &[u8]) -> (Settings, Result<(), Refused>) {
        let mut settings = Vec::new();
        let read = read(config, |name, value| {
            settings.push((name.to_vec(), value.map(<[u8]>::to_vec)));
        });
        (settings, read)
    }

    /// `git config --list` of `config`: its settings, or the line it refuses.
    fn gits(dir: &std::path::Path, config: &[u8]) -> Result<Settings, usize> {
        let file = dir.join("config");
        std::fs::write(&file, config).unwrap();
        let out = std::process::Command::new("git")
            .args(["config", "--no-includes", "--list", "-z", "--file"])
            .arg(&file)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .env_remove("GIT_CONFIG_PARAMETERS")
            .env_remove("GIT_CONFIG_COUNT")
            .output()
            .expect("git is installed (cargo xtask test installs it)");
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err
                .split("bad config line ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("git said: {err}"));
            return Err(line);
        }
        Ok(out
            .stdout
            .split(|&b| b == 0)
            .filter(|entry| !entry.is_empty())
            .map(|entry| match entry.iter().position(|&b| b == b'\n') {
                Some(at) => (entry[..at].to_vec(), Some(entry[at + 1..].to_vec())),
                None => (entry.to_vec(), None),
            })
            .collect())
    }

    /// Reads `config` as git does: the same settings in the same order, or the same
    /// line refused.
    fn as_git(dir: &std::path::Path, config: &[u8]) {
        let (settings, read) = ours(config);
        match gits(dir, config) {
            Ok(theirs) => {
                assert_eq!(
                    read,
                    Ok(()),
                    "git reads {:?}",
                    config.escape_ascii().to_string()
                );
                assert_eq!(settings, theirs, "{:?}", config.escape_ascii().to_string());
            }
            Err(line) => assert_eq!(
                read,
                Err(Refused { line }),
                "git refuses {:?} at line {line}",
                config.escape_ascii().to_string()
            ),
        }
    }

    /// What people and tools write, and what an attacker would: each read as git reads
    /// it.
    #[test]
    fn configs_are_read_as_git_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let configs: &[&[u8]] = &[
            b"",
            b"[core]\n\trepositoryformatversion = 0\n\tbare = false\n",
            b"[remote \"origin\"]\n\turl = https://example.invalid/r.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n",
            b"[core] fsmonitor = evil\n",
            b"[core]fsmonitor=evil",
            b"[core]\rfsmonitor = evil\n",
            b"[core]\r\n\tfsmonitor = evil\r\n",
            b"\xef\xbb\xbf[core]\n\tfsmonitor = evil\n",
            b"\xef\xbb[core]\n",
            b"[core]\n\tFsMonitor\n",
            b"[Core \"Sub Section\"]\n\tKey = \"quoted # not a comment\" ; a comment\n",
            b"[a \"x\\\"y\\\\z\\q\"]\n\tk = v\n",
            b"[a.B]\n\tk = v\n",
            b"[alias]\n\tgo = \"!evil\"\n\tst = status\n\tsp = \" !not a shell\"\n",
            b"[a]\n\tk = one \\\n two\n\tl = x\\ty\\nz\\b\n",
            b"[a]\n\tk = bad \\q escape\n",
            b"[a]\n\tk = \"unclosed\n",
            b"[a]\n\tk = v   \n\tl = \"  kept  \"  \n\tm =\n\tn = # only a comment\n",
            b"[a]\n\tk = before\0after\n",
            b"[a \"x\0y\"]\n\tk = v\n",
            b"k = no section\n",
            b"[]\n",
            b"[a\n",
            b"[a \"x\"\n",
            b"[a \"x\" ]\n",
            b"[a]\n\t1k = v\n",
            b"[a]\n\tk v\n",
            b"[a]\n\tk-2 = v\n\tk_2 = v\n",
            b"# comment\n; comment\n[a] ; comment\n\tk = v # comment\n",
            b"[a]\n\tk = v\n[b]\n\tk\n[a]\n\tk = again\n",
            b"[a]\x0b\n",
            b"[a]\n\tk\x0c= v\n",
            b"[filter \"x\"]\n\tclean = evil\n[include]\n\tpath = ../elsewhere\n[pager]\n\tlog = evil\n",
            b"[submodule \"s\"]\n\tupdate = !evil\n",
            b"[a]\n\tk = \\",
        ];
        for config in configs {
            as_git(dir.path(), config);
        }
    }

    /// Small files of the bytes git's grammar turns on, made by a fixed generator: each
    /// read as git reads it.
    #[test]
    fn generated_configs_are_read_as_git_reads_them() {
        const BYTES: &[u8] = b"[]\"\\\n\r \t=#;.-aKz9!\xef\xbb\xbf\0\x0bx";
        let dir = tempfile::tempdir().unwrap();
        // A linear congruential generator: the same files every time.
        let mut state: u64 = 0x5eed;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        for _ in 0..300 {
            let len = next() % 24;
            // Half begin inside a section, half at the top of the file.
            let mut config = if next() % 2 == 0 {
                b"[s]\n".to_vec()
            } else {
                Vec::new()
            };
            config.extend((0..len).map(|_| BYTES[next() % BYTES.len()]));
            as_git(dir.path(), &config);
        }
    }

    #[test]
    fn settings_that_run_programs_are_told_apart() {
        let runs = |name: &str, value: Option<&str>| {
            runs_a_program(name.as_bytes(), value.map(str::as_bytes))
        };
        assert!(runs("core.fsmonitor", Some("evil")));
        assert!(runs("filter.x.y.clean", Some("evil")));
        assert!(runs("pager.log", Some("evil")));
        assert!(runs("alias.go", Some("!evil")));
        assert!(runs("submodule.s.update", Some("!evil")));
        assert!(runs("includeif.gitdir:/x/.path", Some("../elsewhere")));
        assert!(!runs("alias.st", Some("status")));
        assert!(!runs("submodule.s.update", Some("rebase")));
        assert!(!runs("alias.go", None));
        assert!(!runs("core.bare", Some("false")));
        assert!(!runs("remote.origin.url", Some("!x")));
    }
}
