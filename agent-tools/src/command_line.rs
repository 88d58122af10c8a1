//! What a `shell` command line really runs, for policy rules on meaning (CONTRACT §5).
//!
//! The line is parsed with `brush-parser` (the parser of the brush shell) into its simple
//! commands, wherever they stand: lists (`;`, `&&`, `||`, `&`, newlines), pipelines,
//! subshells, brace groups, `if`/`while`/`for`/`case` bodies and function bodies. Each
//! simple command is given as the text a rule matches: its words with quotes and escapes
//! removed, joined by single spaces (assignments in front included, redirections left out).
//!
//! What a matcher cannot see through is reported as *opaque*, with the reason: command and
//! process substitution (`$(…)`, backquotes, `<(…)`), commands that run other commands
//! from their arguments (`eval`, `sh -c`, `xargs`, `sudo`, `env CMD`, `find -exec`, …), a
//! command whose name is not a plain word (`$CMD`), output redirected to a file, and a
//! line that does not parse. The commands hidden inside those (the text of a substitution,
//! the script of `sh -c`, what `sudo` or `env` runs) are still collected, for `deny` rules.

use brush_parser::ast::{
    self, Command, CommandPrefixOrSuffixItem, CompoundCommand, CompoundList, ExtendedTestExpr,
    IoFileRedirectKind, IoFileRedirectTarget, IoRedirect, Pipeline, SimpleCommand,
};
use brush_parser::word::{self, WordPiece, WordPieceWithSource};
use brush_parser::{Parser, ParserOptions};

/// Nesting followed into substitutions and `sh -c` scripts, at most.
const MAX_DEPTH: usize = 8;

/// Commands that run another command (or script) taken from their arguments.
const WRAPPERS: &[&str] = &[
    "eval", "exec", "source", ".", "sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh",
    "tcsh", "busybox", "xargs", "sudo", "doas", "su", "env", "nohup", "timeout", "nice", "ionice",
    "stdbuf", "setsid", "chroot", "command", "builtin", "time", "watch", "parallel", "unbuffer",
    "flock",
];

/// Shells whose `-c` argument is a script.
const SHELLS: &[&str] = &[
    "sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh", "tcsh", "busybox",
];

/// One simple command as rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimpleText {
    /// The words, unquoted, joined by single spaces.
    pub text: String,
    /// The same with the command name's directory dropped (`/bin/rm -f x` → `rm -f x`),
    /// when that differs; `deny` rules match either.
    pub bare: Option<String>,
}

/// The analysis of one command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Analysis {
    /// The simple commands the line runs directly, in order.
    pub commands: Vec<SimpleText>,
    /// Commands found inside what is opaque (substitutions, `sh -c` scripts, what a wrapper
    /// runs): not enough to allow the line, but a `deny` rule matching one denies it.
    pub hidden: Vec<SimpleText>,
    /// Why the line cannot be seen through, if it cannot (one reason per construct).
    pub opaque: Vec<String>,
}

impl Analysis {
    /// Every command text, direct or hidden, in both spellings: what `deny` rules match.
    pub fn all_texts(&self) -> impl Iterator<Item = &str> {
        self.commands
            .iter()
            .chain(&self.hidden)
            .flat_map(|c| std::iter::once(c.text.as_str()).chain(c.bare.as_deref()))
    }
}

/// Analyses a command line.
pub fn analyze(line: &str) -> Analysis {
    let mut analysis = Analysis::default();
    Walker {
        out: &mut analysis,
        hidden: false,
        depth: 0,
    }
    .line(line);
    analysis
}

struct Walker<'a> {
    out: &'a mut Analysis,
    /// Inside something opaque: commands go to `hidden`.
    hidden: bool,
    depth: usize,
}

impl Walker<'_> {
    fn opaque(&mut self, why: String) {
        if !self.out.opaque.contains(&why) {
            self.out.opaque.push(why);
        }
    }

    /// Parses a script and walks it; what it runs is hidden from here on if `hidden`.
    fn nested(&mut self, script: &str) {
        if self.depth >= MAX_DEPTH {
            self.opaque("commands nested too deeply to follow".to_owned());
            return;
        }
        let mut inner = Walker {
            out: &mut *self.out,
            hidden: true,
            depth: self.depth + 1,
        };
        inner.line(script);
    }

    fn line(&mut self, line: &str) {
        match parse(line) {
            Ok(program) => {
                for list in &program.complete_commands {
                    self.list(list);
                }
            }
            Err(e) => {
                self.opaque(format!("the command line does not parse ({e})"));
                // A deny rule still sees the whole line.
                self.push(SimpleText {
                    text: line.trim().to_owned(),
                    bare: None,
                });
            }
        }
    }

    fn push(&mut self, command: SimpleText) {
        if self.hidden {
            self.out.hidden.push(command);
        } else {
            self.out.commands.push(command);
        }
    }

    fn list(&mut self, list: &CompoundList) {
        for item in &list.0 {
            let and_or = &item.0;
            self.pipeline(&and_or.first);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &Command) {
        match command {
            Command::Simple(simple) => self.simple(simple),
            Command::Compound(compound, redirects) => {
                self.compound(compound);
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect);
                }
            }
            Command::Function(function) => {
                self.compound(&function.body.0);
                for redirect in function.body.1.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect);
                }
            }
            Command::ExtendedTest(test, redirects) => {
                self.test(&test.expr);
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect);
                }
            }
        }
    }

    fn test(&mut self, expr: &ExtendedTestExpr) {
        match expr {
            ExtendedTestExpr::And(a, b) | ExtendedTestExpr::Or(a, b) => {
                self.test(a);
                self.test(b);
            }
            ExtendedTestExpr::Not(a) | ExtendedTestExpr::Parenthesized(a) => self.test(a),
            ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(&w.value);
            }
            ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(&a.value);
                self.word(&b.value);
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand) {
        match compound {
            CompoundCommand::Arithmetic(a) => self.arithmetic(&a.expr.value),
            CompoundCommand::ArithmeticForClause(f) => {
                for expr in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&expr.value);
                }
                self.list(&f.body.list);
            }
            CompoundCommand::BraceGroup(g) => self.list(&g.list),
            CompoundCommand::Subshell(s) => self.list(&s.list),
            CompoundCommand::ForClause(f) => {
                for w in f.values.iter().flatten() {
                    self.word(&w.value);
                }
                self.list(&f.body.list);
            }
            CompoundCommand::CaseClause(c) => {
                self.word(&c.value.value);
                for case in &c.cases {
                    for p in &case.patterns {
                        self.word(&p.value);
                    }
                    if let Some(cmd) = &case.cmd {
                        self.list(cmd);
                    }
                }
            }
            CompoundCommand::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for clause in i.elses.iter().flatten() {
                    if let Some(cond) = &clause.condition {
                        self.list(cond);
                    }
                    self.list(&clause.body);
                }
            }
            CompoundCommand::WhileClause(w) | CompoundCommand::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            CompoundCommand::Coprocess(c) => {
                self.opaque("a coprocess".to_owned());
                self.command(&c.body);
            }
        }
    }

    fn arithmetic(&mut self, expr: &str) {
        if expr.contains("$(") || expr.contains('`') {
            self.opaque("command substitution in an arithmetic expression".to_owned());
            self.nested_substitutions(expr);
        }
    }

    /// Best effort for text the word parser does not split: each `$(…)` or backquoted part.
    fn nested_substitutions(&mut self, text: &str) {
        for part in text.split("$(").skip(1) {
            let inner = part.split(')').next().unwrap_or(part);
            self.nested(inner);
        }
        for (i, part) in text.split('`').enumerate() {
            if i % 2 == 1 {
                self.nested(part);
            }
        }
    }

    fn simple(&mut self, simple: &SimpleCommand) {
        let mut words: Vec<String> = Vec::new();
        let mut assignments: Vec<String> = Vec::new();
        for item in simple.prefix.iter().flat_map(|p| &p.0) {
            self.item(item, &mut words, &mut assignments);
        }
        if let Some(name) = &simple.word_or_name {
            let text = self.word(&name.value);
            if !is_static(&name.value) {
                self.opaque(format!(
                    "the command name {} is computed when it runs",
                    name.value
                ));
            }
            words.push(text);
        }
        for item in simple.suffix.iter().flat_map(|s| &s.0) {
            self.item(item, &mut words, &mut assignments);
        }
        let text = assignments
            .iter()
            .cloned()
            .chain(words.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let bare = words.first().and_then(|name| {
            let base = name.rsplit('/').next().unwrap_or(name);
            (base != name && !base.is_empty()).then(|| {
                assignments
                    .iter()
                    .cloned()
                    .chain(std::iter::once(base.to_owned()))
                    .chain(words.iter().skip(1).cloned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        });
        if !text.is_empty() {
            self.push(SimpleText { text, bare });
        }
        self.wrapped(&words);
    }

    fn item(
        &mut self,
        item: &CommandPrefixOrSuffixItem,
        words: &mut Vec<String>,
        assignments: &mut Vec<String>,
    ) {
        match item {
            CommandPrefixOrSuffixItem::IoRedirect(r) => self.redirect(r),
            CommandPrefixOrSuffixItem::Word(w) => {
                let text = self.word(&w.value);
                words.push(text);
            }
            CommandPrefixOrSuffixItem::AssignmentWord(_, w) => {
                let text = self.word(&w.value);
                if words.is_empty() {
                    // In front of the command: it changes the command's environment.
                    assignments.push(text);
                } else {
                    words.push(text);
                }
            }
            CommandPrefixOrSuffixItem::ProcessSubstitution(_, sub) => {
                self.opaque("process substitution".to_owned());
                self.hidden_list(&sub.list);
                words.push("<(…)".to_owned());
            }
        }
    }

    /// Commands that run a command from their arguments: opaque, and what they run is
    /// collected for `deny` rules.
    fn wrapped(&mut self, words: &[String]) {
        let Some(name) = words.first() else {
            return;
        };
        let base = name.rsplit('/').next().unwrap_or(name);
        let runs_other = match base {
            "find" => words
                .iter()
                .any(|w| matches!(w.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir")),
            "fd" | "fdfind" => words
                .iter()
                .any(|w| matches!(w.as_str(), "-x" | "--exec" | "-X" | "--exec-batch")),
            "exec" | "command" | "builtin" => words.len() > 1,
            "env" => words
                .iter()
                .skip(1)
                .any(|w| !w.starts_with('-') && !w.contains('=')),
            other => WRAPPERS.contains(&other),
        };
        if !runs_other {
            return;
        }
        self.opaque(format!("{base} runs a command taken from its arguments"));
        if SHELLS.contains(&base) {
            // `-c`, or options that include it (`-lc`, `-ec`).
            let at = words
                .iter()
                .position(|w| w.starts_with('-') && !w.starts_with("--") && w.contains('c'));
            if let Some(script) = at.and_then(|at| words.get(at + 1)) {
                let script = script.clone();
                self.nested(&script);
            }
            return;
        }
        if base == "eval" {
            let script = words[1..].join(" ");
            self.nested(&script);
            return;
        }
        // What a wrapper runs: its arguments after options, assignments and numbers.
        let rest: Vec<String> = words[1..]
            .iter()
            .skip_while(|w| {
                w.starts_with('-')
                    || w.contains('=')
                    || w.chars().next().is_some_and(|c| c.is_ascii_digit())
            })
            .cloned()
            .collect();
        if !rest.is_empty() {
            let script = rest.join(" ");
            self.nested(&script);
        }
    }

    fn hidden_list(&mut self, list: &CompoundList) {
        let was = self.hidden;
        self.hidden = true;
        self.list(list);
        self.hidden = was;
    }

    fn redirect(&mut self, redirect: &IoRedirect) {
        match redirect {
            IoRedirect::File(_, kind, target) => match target {
                IoFileRedirectTarget::Filename(w) => {
                    let name = self.word(&w.value);
                    let writes = matches!(
                        kind,
                        IoFileRedirectKind::Write
                            | IoFileRedirectKind::Append
                            | IoFileRedirectKind::ReadAndWrite
                            | IoFileRedirectKind::Clobber
                            | IoFileRedirectKind::DuplicateOutput
                    );
                    if writes && !is_harmless_sink(&name) {
                        self.opaque(format!("output is redirected to the file {name}"));
                    }
                }
                IoFileRedirectTarget::Duplicate(w) => {
                    let name = self.word(&w.value);
                    let fd = name.trim_end_matches('-');
                    if !fd.chars().all(|c| c.is_ascii_digit()) && !is_harmless_sink(&name) {
                        self.opaque(format!("output is redirected to the file {name}"));
                    }
                }
                IoFileRedirectTarget::Fd(_) => {}
                IoFileRedirectTarget::ProcessSubstitution(_, sub) => {
                    self.opaque("process substitution".to_owned());
                    self.hidden_list(&sub.list);
                }
            },
            IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    self.word(&doc.doc.value);
                }
            }
            IoRedirect::HereString(_, w) => {
                self.word(&w.value);
            }
            IoRedirect::OutputAndError(w, _) => {
                let name = self.word(&w.value);
                if !is_harmless_sink(&name) {
                    self.opaque(format!("output is redirected to the file {name}"));
                }
            }
        }
    }

    /// A word's text with quotes removed; substitutions in it are opaque and walked.
    fn word(&mut self, raw: &str) -> String {
        match parse_word(raw) {
            Ok(pieces) => {
                let mut text = String::new();
                self.pieces(raw, &pieces, &mut text);
                text
            }
            Err(_) => {
                self.opaque(format!("the word {raw} does not parse"));
                raw.to_owned()
            }
        }
    }

    fn pieces(&mut self, raw: &str, pieces: &[WordPieceWithSource], text: &mut String) {
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or("");
            match &piece.piece {
                WordPiece::Text(s) | WordPiece::SingleQuotedText(s) => text.push_str(s),
                WordPiece::AnsiCQuotedText(s) => text.push_str(s),
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, text);
                }
                WordPiece::EscapeSequence(s) => text.push_str(s.strip_prefix('\\').unwrap_or(s)),
                WordPiece::TildeExpansion(_) => text.push_str(source),
                WordPiece::ParameterExpansion(_) => {
                    if source.contains("$(") || source.contains('`') || source.contains("<(") {
                        self.opaque("command substitution inside a parameter expansion".into());
                        self.nested_substitutions(source);
                    }
                    text.push_str(source);
                }
                WordPiece::CommandSubstitution(inner)
                | WordPiece::BackquotedCommandSubstitution(inner) => {
                    self.opaque(format!("command substitution {source}"));
                    let inner = inner.clone();
                    self.nested(&inner);
                    text.push_str(source);
                }
                WordPiece::ArithmeticExpression(expr) => {
                    self.arithmetic(&expr.value);
                    text.push_str(source);
                }
            }
        }
    }
}

/// Parses a command line. The parser is a dependency: a panic in it (fuzzing found one, on
/// a redirection's file descriptor number too large for an `i32`) is a line that does not
/// parse, never a crash of the agent. Such numbers are refused before the parser sees them,
/// so the panic hook does not even print.
fn parse(line: &str) -> Result<ast::Program, String> {
    if has_huge_fd(line) {
        return Err("a number too large for the parser".to_owned());
    }
    if has_nested_heredoc(line) {
        return Err("a here-document inside a substitution".to_owned());
    }
    if nesting(line) > MAX_NESTING {
        return Err("groups nested too deeply".to_owned());
    }
    std::panic::catch_unwind(|| {
        let options = ParserOptions::default();
        let mut parser = Parser::new(std::io::Cursor::new(line.as_bytes()), &options);
        parser.parse_program().map_err(|e| e.to_string())
    })
    .unwrap_or_else(|_| Err("the parser failed on it".to_owned()))
}

/// A word's pieces; a panic of the parser is an error, as for lines.
fn parse_word(raw: &str) -> Result<Vec<WordPieceWithSource>, String> {
    if has_huge_fd(raw) {
        return Err("a number too large for the parser".to_owned());
    }
    if has_nested_heredoc(raw) {
        return Err("a here-document inside a substitution".to_owned());
    }
    if nesting(raw) > MAX_NESTING {
        return Err("groups nested too deeply".to_owned());
    }
    std::panic::catch_unwind(|| {
        word::parse(raw, &ParserOptions::default()).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|_| Err("the parser failed on it".to_owned()))
}

/// A here-document operator in a line that also opens a substitution. The parser's
/// tokenizer can loop without end on some such lines (the `shell_parser` fuzz target found
/// one, 41 bytes long, that never returned and kept allocating): they are not parsed, and
/// so ask a person.
fn has_nested_heredoc(text: &str) -> bool {
    text.contains("<<")
        && (text.contains("$(")
            || text.contains('`')
            || text.contains("<(")
            || text.contains(">(")
            // A here-document among control characters or undecodable bytes: the
            // fuzzer found one that made the tokenizer allocate more than 2 GB.
            || text
                .chars()
                .any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{fffd}'))
}

/// Deepest nesting of `(` and `{` parsed. The parser backtracks: its time doubles with each
/// unclosed level (the fuzzer found a 44-byte line of 23 open parentheses that took more
/// than 12 s). Real command lines stay far below this.
const MAX_NESTING: usize = 8;

/// The deepest nesting of `(` and `{` in `text`, counted without regard to quoting (so it
/// errs on the deep side).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for c in text.chars() {
        match c {
            '(' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Ten or more digits right before `<` or `>` (a descriptor number) or right after `~`,
/// `~+` or `~-` (a directory-stack index): numbers the parser unwraps into an `i32` and
/// panics on (the fuzzer found both).
fn has_huge_fd(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut run = 0;
    for &b in bytes {
        if b.is_ascii_digit() {
            run += 1;
            continue;
        }
        if run >= 10 && (b == b'<' || b == b'>') {
            return true;
        }
        run = 0;
    }
    // Directory-stack indices: `~N`, `~+N`, `~-N`.
    text.match_indices('~').any(|(at, _)| {
        let rest = &text[at + 1..];
        let rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
        rest.bytes().take_while(u8::is_ascii_digit).count() >= 10
    })
}

/// Whether a word is the same whatever the environment: no expansion in it.
fn is_static(raw: &str) -> bool {
    match parse_word(raw) {
        Ok(pieces) => pieces.iter().all(static_piece),
        Err(_) => false,
    }
}

fn static_piece(piece: &WordPieceWithSource) -> bool {
    match &piece.piece {
        WordPiece::Text(_)
        | WordPiece::SingleQuotedText(_)
        | WordPiece::AnsiCQuotedText(_)
        | WordPiece::EscapeSequence(_) => true,
        WordPiece::DoubleQuotedSequence(inner) | WordPiece::GettextDoubleQuotedSequence(inner) => {
            inner.iter().all(static_piece)
        }
        _ => false,
    }
}

/// Redirect targets that write nothing anywhere.
fn is_harmless_sink(name: &str) -> bool {
    matches!(name, "/dev/null" | "/dev/stdout" | "/dev/stderr")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<String> {
        analyze(line).commands.into_iter().map(|c| c.text).collect()
    }

    #[test]
    fn splits_lists_pipes_and_groups() {
        assert_eq!(
            texts("git status; echo X > ../outside/file"),
            ["git status", "echo X"]
        );
        assert_eq!(
            texts("a && b || c | d\ne & f"),
            ["a", "b", "c", "d", "e", "f"]
        );
        assert_eq!(texts("( cd x && make ) ; { ls; }"), ["cd x", "make", "ls"]);
        assert_eq!(texts("if true; then rm -rf x; fi"), ["true", "rm -rf x"]);
        assert_eq!(texts("'g'it \"status\" \\--short"), ["git status --short"]);
        assert_eq!(texts("FOO=1 git status"), ["FOO=1 git status"]);
    }

    #[test]
    fn opaque_constructs_are_named() {
        let a = analyze("echo $(rm -rf x)");
        assert!(a.opaque[0].contains("command substitution"), "{a:?}");
        assert_eq!(a.hidden[0].text, "rm -rf x");
        let a = analyze("sh -c 'rm -rf /'");
        assert!(!a.opaque.is_empty());
        assert_eq!(a.hidden[0].text, "rm -rf /");
        let a = analyze("git status > out.txt");
        assert!(a.opaque[0].contains("out.txt"), "{a:?}");
        assert!(analyze("git status 2>/dev/null >&2").opaque.is_empty());
        let a = analyze("/bin/rm -rf x");
        assert_eq!(a.commands[0].bare.as_deref(), Some("rm -rf x"));
    }

    #[test]
    fn what_the_parser_chokes_on_is_opaque_not_a_crash() {
        // Found by the shell_parser fuzz target: brush-parser unwraps the descriptor number.
        for line in [
            ". 2222222222222222222222222>&ot22x-+",
            "echo 99999999999<in",
            "x 4294967296>f",
        ] {
            let a = analyze(line);
            assert!(
                a.opaque.iter().any(|o| o.contains("does not parse")),
                "{line}: {a:?}"
            );
        }
        assert!(analyze("echo hi 2>/dev/null").opaque.is_empty());
        // Found by the fuzzer: the parser never returned on this line.
        let hang = "(\n\0d x \u{e7}&x &$(\u{c4}echo \u{a4}\u{18} << <<@< <<@<&&& x ";
        assert!(
            analyze(hang)
                .opaque
                .iter()
                .any(|o| o.contains("here-document"))
        );
        assert!(
            analyze("cat <<EOF\nhi\nEOF\n").opaque.is_empty(),
            "plain here-documents parse"
        );
    }
}
