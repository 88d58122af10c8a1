//! What a `shell` command line really runs, for policy rules on meaning (CONTRACT §5).
//!
//! The line is parsed with tree-sitter's bash grammar into a syntax tree, and every simple
//! command in it is collected, wherever it stands: lists (`;`, `&&`, `||`, `&`, newlines),
//! pipelines, subshells, brace groups, `if`/`while`/`for`/`case` bodies, function bodies,
//! what follows a here-document's operator. Each simple command is given as the text a rule
//! matches: its words with quotes and escapes removed, joined by single spaces
//! (assignments in front included, redirections left out).
//!
//! What a matcher cannot see through is reported as *opaque*, with the reason: command and
//! process substitution (`$(…)`, backquotes, `<(…)`), commands that run other commands
//! from their arguments (`eval`, `sh -c`, `xargs`, `sudo`, `env CMD`, `find -exec`, …), a
//! command whose name is not a plain word (`$CMD`), output redirected to a file, a syntax
//! the walk does not know, and a line that does not parse. The commands hidden inside those
//! (the text of a substitution, the script of `sh -c`, what `sudo` or `env` runs) are still
//! collected, for `deny` rules.
//!
//! The line comes from the model, so the analysis is bounded whatever it is: the parser
//! (an LR parser with error recovery, linear in the line) is given a budget of work in
//! proportion to the line's length and is stopped past it, the walk stops at a nesting
//! depth, and scripts inside scripts (`sh -c`, `eval`) are followed a few levels deep.
//! No clock is involved, so the same line always gets the same analysis.

use std::ops::ControlFlow;

use tree_sitter::{Node, ParseOptions, ParseState, Parser, Tree};

/// Nesting followed into `sh -c` and `eval` scripts, at most.
const MAX_DEPTH: usize = 8;

/// Depth of the syntax tree walked, at most (a line of thousands of nested parentheses
/// parses, but is not followed all the way down).
const MAX_TREE_DEPTH: usize = 256;

/// The parser reports progress every hundred or so operations; a line may use this many
/// reports, plus one per [`BYTES_PER_REPORT`] bytes. Ordinary lines need one report per
/// 30 to 100 bytes; the budget is only reached by a line built to make the parser's error
/// recovery work hard, and such a line is not analysed (it asks a person).
const BASE_REPORTS: usize = 64;
const BYTES_PER_REPORT: usize = 4;

/// Commands that run another command (or script) taken from their arguments.
const WRAPPERS: &[&str] = &[
    "eval", "exec", "source", ".", "sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh",
    "tcsh", "busybox", "xargs", "sudo", "doas", "su", "env", "nohup", "timeout", "nice", "ionice",
    "stdbuf", "setsid", "chroot", "command", "builtin", "time", "watch", "parallel", "unbuffer",
    "flock", "coproc",
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
    analyze_within(line, budget(line))
}

fn analyze_within(line: &str, budget: usize) -> Analysis {
    let mut analysis = Analysis::default();
    Walker {
        out: &mut analysis,
        hidden: false,
        depth: 0,
        budget: Some(budget),
    }
    .line(line);
    analysis
}

/// The parser's budget for a line: in proportion to its length.
fn budget(line: &str) -> usize {
    BASE_REPORTS + line.len() / BYTES_PER_REPORT
}

/// Parses a line within a budget of progress reports.
fn parse_within(line: &str, budget: usize) -> Result<Tree, &'static str> {
    thread_local! {
        /// A parser per thread, set up once (it is not `Sync`; setting one up costs more
        /// than parsing a short line).
        static PARSER: std::cell::RefCell<Option<Parser>> = const { std::cell::RefCell::new(None) };
    }
    PARSER.with(|cell| {
        let mut slot = cell.try_borrow_mut().map_err(|_| "the parser is busy")?;
        if slot.is_none() {
            let mut parser = Parser::new();
            parser
                .set_language(&tree_sitter_bash::LANGUAGE.into())
                .map_err(|_| "the shell grammar does not load")?;
            *slot = Some(parser);
        }
        let parser = slot.as_mut().ok_or("the shell grammar does not load")?;
        let tree = parse_with(parser, line, budget);
        if tree.is_err() {
            // A stopped parse would otherwise be resumed by the next one.
            parser.reset();
        }
        tree
    })
}

fn parse_with(parser: &mut Parser, line: &str, budget: usize) -> Result<Tree, &'static str> {
    let bytes = line.as_bytes();
    let mut reports = 0usize;
    let mut progress = |_: &ParseState| {
        reports += 1;
        if reports > budget {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let options = ParseOptions::new().progress_callback(&mut progress);
    parser
        .parse_with_options(
            &mut |at, _| bytes.get(at..).unwrap_or_default(),
            None,
            Some(options),
        )
        .ok_or("too complex to analyse")
}

/// Where a tree first fails to parse, as a byte offset (depth-first, bounded).
fn first_error(node: Node, level: usize) -> Option<usize> {
    if node.is_error() || node.is_missing() {
        return Some(node.start_byte());
    }
    if !node.has_error() || level > MAX_TREE_DEPTH {
        return None;
    }
    let mut cursor = node.walk();
    let found = node
        .children(&mut cursor)
        .find_map(|child| first_error(child, level + 1));
    found.or(Some(node.start_byte()))
}

/// Kinds that only group or carry other nodes: walked through.
const STRUCTURE: &[&str] = &[
    "program",
    "list",
    "pipeline",
    "redirected_statement",
    "subshell",
    "compound_statement",
    "if_statement",
    "elif_clause",
    "else_clause",
    "while_statement",
    "for_statement",
    "c_style_for_statement",
    "do_group",
    "case_statement",
    "case_item",
    "function_definition",
    "negated_command",
    "heredoc_redirect",
    "heredoc_body",
    "heredoc_start",
    "heredoc_end",
    "heredoc_content",
    "herestring_redirect",
    "comment",
    "ERROR",
];

/// Kinds of words and expressions: walked through for the substitutions inside them.
const WORDS: &[&str] = &[
    "command_name",
    "word",
    "string",
    "string_content",
    "raw_string",
    "ansi_c_string",
    "translated_string",
    "concatenation",
    "number",
    "simple_expansion",
    "expansion",
    "arithmetic_expansion",
    "variable_name",
    "special_variable_name",
    "subscript",
    "array",
    "brace_expression",
    "binary_expression",
    "unary_expression",
    "ternary_expression",
    "postfix_expression",
    "parenthesized_expression",
    "test_operator",
    "extglob_pattern",
    "regex",
    "file_descriptor",
];

/// Kinds whose value is only known when the line runs.
const EXPANSIONS: &[&str] = &[
    "simple_expansion",
    "expansion",
    "command_substitution",
    "process_substitution",
    "arithmetic_expansion",
    "brace_expression",
];

/// Redirection operators that write to their target.
const WRITES: &[&str] = &[">", ">>", ">|", "&>", "&>>", ">&", "<>"];

struct Walker<'a> {
    out: &'a mut Analysis,
    /// Inside something opaque: commands go to `hidden`.
    hidden: bool,
    /// Scripts inside scripts followed so far.
    depth: usize,
    /// The parser's budget for the top line (scripts inside get their own).
    budget: Option<usize>,
}

impl Walker<'_> {
    fn opaque(&mut self, why: String) {
        if !self.out.opaque.contains(&why) {
            self.out.opaque.push(why);
        }
    }

    /// Parses a script found in an argument (`sh -c`, `eval`) and walks it as hidden.
    fn nested(&mut self, script: &str) {
        if self.depth >= MAX_DEPTH {
            self.opaque("commands nested too deeply to follow".to_owned());
            return;
        }
        let mut inner = Walker {
            out: &mut *self.out,
            hidden: true,
            depth: self.depth + 1,
            budget: None,
        };
        inner.line(script);
    }

    fn line(&mut self, line: &str) {
        let budget = self.budget.unwrap_or_else(|| budget(line));
        match parse_within(line, budget) {
            Ok(tree) => {
                let root = tree.root_node();
                if let Some(at) = first_error(root, 0) {
                    self.opaque(format!("the command line does not parse (at byte {at})"));
                    self.push_whole(line);
                    // What did parse is still looked at, for `deny` rules only.
                    let was = std::mem::replace(&mut self.hidden, true);
                    self.node(root, line, 0);
                    self.hidden = was;
                } else {
                    self.node(root, line, 0);
                }
            }
            Err(why) => {
                self.opaque(format!("the command line is {why}"));
                self.push_whole(line);
            }
        }
    }

    /// A line that could not be analysed: a `deny` rule still sees the whole line, and,
    /// as hidden commands, each stretch of it between shell operators, roughly unquoted
    /// (so `(( rm -rf x ) )`, which bash runs as nested subshells, is still denied by
    /// `rm *` however the parser read it).
    fn push_whole(&mut self, line: &str) {
        self.push(SimpleText {
            text: line.trim().to_owned(),
            bare: None,
        });
        let was = std::mem::replace(&mut self.hidden, true);
        for stretch in line.split([';', '&', '|', '(', ')', '{', '}', '\n', '`', '<', '>']) {
            let words: Vec<String> = stretch
                .split_whitespace()
                .map(|w| w.replace(['\'', '"', '\\', '$'], ""))
                .filter(|w| !w.is_empty())
                .collect();
            if !words.is_empty() {
                self.simple(&[], &words);
            }
        }
        self.hidden = was;
    }

    fn push(&mut self, command: SimpleText) {
        if self.hidden {
            self.out.hidden.push(command);
        } else {
            self.out.commands.push(command);
        }
    }

    /// Walks the named children of `node`.
    fn children(&mut self, node: Node, src: &str, level: usize) {
        let mut cursor = node.walk();
        for child in node.named_children(&mut cursor) {
            self.node(child, src, level + 1);
        }
    }

    fn hidden_children(&mut self, node: Node, src: &str, level: usize) {
        let was = std::mem::replace(&mut self.hidden, true);
        self.children(node, src, level);
        self.hidden = was;
    }

    fn node(&mut self, node: Node, src: &str, level: usize) {
        if level > MAX_TREE_DEPTH {
            self.opaque("the command line is nested too deeply to follow".to_owned());
            return;
        }
        match node.kind() {
            "command" => self.command(node, src, level),
            "declaration_command" | "unset_command" => self.builtin(node, src, level),
            "variable_assignment" | "variable_assignments"
                if !node.parent().is_some_and(|p| {
                    matches!(
                        p.kind(),
                        "command" | "declaration_command" | "variable_assignments"
                    )
                }) =>
            {
                // Assignments alone: they change the shell's variables.
                let text = if node.kind() == "variable_assignment" {
                    unquote(node, src)
                } else {
                    let mut cursor = node.walk();
                    let parts: Vec<String> = node
                        .named_children(&mut cursor)
                        .map(|a| unquote(a, src))
                        .collect();
                    parts.join(" ")
                };
                self.push(SimpleText { text, bare: None });
                self.children(node, src, level);
            }
            "test_command" => {
                // `[ … ]` is the `test` command; `[[ … ]]` is syntax and runs nothing.
                if node.child(0).is_some_and(|c| c.kind() == "[") {
                    let mut words = Vec::new();
                    leaves(node, src, &mut words, level);
                    self.push(SimpleText {
                        text: words.join(" "),
                        bare: None,
                    });
                }
                self.children(node, src, level);
            }
            "variable_assignment" => self.children(node, src, level),
            "command_substitution" => {
                self.opaque(format!("command substitution {}", source(node, src)));
                self.hidden_children(node, src, level);
            }
            "process_substitution" => {
                self.opaque("process substitution".to_owned());
                self.hidden_children(node, src, level);
            }
            "file_redirect" => self.redirect(node, src, level),
            kind if STRUCTURE.contains(&kind) || WORDS.contains(&kind) => {
                self.children(node, src, level);
            }
            other => {
                self.opaque(format!("the shell syntax {other} is not analysed"));
                self.children(node, src, level);
            }
        }
    }

    fn command(&mut self, node: Node, src: &str, level: usize) {
        let mut words: Vec<String> = Vec::new();
        let mut assignments: Vec<String> = Vec::new();
        let mut name_static = true;
        // Where the last word ended: a word that follows it across nothing but a line
        // continuation (`r\⏎m`) is the same word to the shell.
        let mut last_end: Option<usize> = None;
        let mut cursor = node.walk();
        for child in node.named_children(&mut cursor) {
            match child.kind() {
                "variable_assignment" if words.is_empty() => {
                    // In front of the command: it changes the command's environment.
                    assignments.push(unquote(child, src));
                    self.node(child, src, level + 1);
                }
                "file_redirect" | "herestring_redirect" | "heredoc_redirect" | "comment" => {
                    self.node(child, src, level + 1);
                }
                "subshell" => {
                    self.opaque("a subshell inside a command's words".to_owned());
                    self.hidden_children(child, src, level + 1);
                }
                _ => {
                    let text = unquote(child, src);
                    let joined = last_end.is_some_and(|end| continues(src, end, child));
                    if child.kind() == "command_name" || (joined && words.len() == 1) {
                        name_static &= is_static(child, src);
                    }
                    match words.last_mut() {
                        Some(last) if joined => last.push_str(&text),
                        _ => words.push(text),
                    }
                    last_end = Some(child.end_byte());
                    self.node(child, src, level + 1);
                }
            }
        }
        if !name_static && let Some(name) = words.first() {
            self.opaque(format!("the command name {name} is computed when it runs"));
        }
        self.simple(&assignments, &words);
    }

    /// `export`, `local`, `declare`, `readonly`, `typeset`, `unset`: commands of the shell
    /// itself, given with their words like any other.
    fn builtin(&mut self, node: Node, src: &str, level: usize) {
        let mut words = Vec::new();
        let mut cursor = node.walk();
        for child in node.children(&mut cursor) {
            if child.kind() != "comment" {
                words.push(unquote(child, src));
            }
        }
        self.children(node, src, level);
        self.simple(&[], &words);
    }

    /// Collects one simple command and looks at what it runs from its arguments.
    fn simple(&mut self, assignments: &[String], words: &[String]) {
        let text = assignments
            .iter()
            .chain(words)
            .cloned()
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
        self.wrapped(words);
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

    fn redirect(&mut self, node: Node, src: &str, level: usize) {
        let mut cursor = node.walk();
        let operator = node
            .children(&mut cursor)
            .find(|c| !c.is_named())
            .map(|c| c.kind())
            .unwrap_or("");
        let target = node
            .child_by_field_name("destination")
            .map(|d| unquote(d, src))
            .unwrap_or_default();
        let duplicates = matches!(operator, ">&" | "<&")
            && target
                .trim_end_matches('-')
                .chars()
                .all(|c| c.is_ascii_digit());
        if WRITES.contains(&operator) && !duplicates && !is_harmless_sink(&target) {
            self.opaque(format!("output is redirected to the file {target}"));
        }
        self.children(node, src, level);
    }
}

/// A node's text as written.
fn source<'s>(node: Node, src: &'s str) -> &'s str {
    src.get(node.byte_range()).unwrap_or("")
}

/// Whether `next` follows the byte `end` across nothing but a line continuation.
fn continues(src: &str, end: usize, next: Node) -> bool {
    matches!(src.get(end..next.start_byte()), Some("\\\n" | "\\\r\n"))
}

/// A word's text with quotes and escapes removed, as the shell would pass it; what is
/// only known when the line runs (expansions, substitutions) is kept as written.
fn unquote(node: Node, src: &str) -> String {
    let text = source(node, src);
    match node.kind() {
        "word" | "number" => unescape(text),
        "raw_string" => text
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(text)
            .to_owned(),
        "ansi_c_string" => text
            .strip_prefix("$'")
            .and_then(|t| t.strip_suffix('\''))
            .unwrap_or(text)
            .to_owned(),
        "string" => {
            // The content between the quotes, with the escapes double quotes allow.
            let mut out = String::new();
            let mut cursor = node.walk();
            let mut at = node.start_byte();
            for child in node.children(&mut cursor) {
                if let Some(gap) = src.get(at..child.start_byte()) {
                    out.push_str(&unescape_quoted(gap));
                }
                match child.kind() {
                    "\"" => {}
                    "string_content" => out.push_str(&unescape_quoted(source(child, src))),
                    _ => out.push_str(source(child, src)),
                }
                at = child.end_byte();
            }
            out
        }
        "command_name" | "translated_string" | "concatenation" | "variable_assignment" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            let mut at = node.start_byte();
            for child in node.children(&mut cursor) {
                if let Some(gap) = src.get(at..child.start_byte()) {
                    out.push_str(gap);
                }
                if child.kind() != "$" || node.kind() != "translated_string" {
                    out.push_str(&unquote(child, src));
                }
                at = child.end_byte();
            }
            out
        }
        _ => text.to_owned(),
    }
}

/// Backslash escapes outside quotes: `\x` is `x`, a backslash before a newline joins lines.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\n') | None => {}
                Some(next) => out.push(next),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Backslash escapes inside double quotes: only before `$`, `` ` ``, `"`, `\` and newline.
fn unescape_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some('$' | '`' | '"' | '\\')) => out.extend(chars.next()),
            ('\\', Some('\n')) => {
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Whether a word is the same whatever the environment: no expansion in it, and no
/// pattern or tilde the shell would expand.
fn is_static(node: Node, src: &str) -> bool {
    if EXPANSIONS.contains(&node.kind()) {
        return false;
    }
    if node.kind() == "word" {
        let text = source(node, src);
        if text.starts_with('~') || text.contains(['*', '?', '[', '{']) {
            return false;
        }
    }
    let mut cursor = node.walk();
    node.children(&mut cursor).all(|c| is_static(c, src))
}

/// The words of `[ … ]`, in order, unquoted.
fn leaves(node: Node, src: &str, out: &mut Vec<String>, level: usize) {
    if level > MAX_TREE_DEPTH {
        return;
    }
    if node.child_count() == 0 || matches!(node.kind(), "word" | "string" | "raw_string") {
        out.push(unquote(node, src));
        return;
    }
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        leaves(child, src, out, level + 1);
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
    fn lines_that_broke_the_previous_parser_are_analysed_and_ask() {
        // Each of these made brush-parser, the parser used before, panic (descriptor and
        // directory-stack numbers it unwrapped), loop without end (a here-document among
        // substitutions), allocate more than 2 GB, or take time exponential in the
        // nesting (`${x[` seven deep took 221 s). The fuzz corpus keeps them all.
        let subscripts = format!("echo {}1{}", "${x[".repeat(7), "]}".repeat(7));
        let hang = "(\n\0d x \u{e7}&x &$(\u{c4}echo \u{a4}\u{18} << <<@< <<@<&&& x ";
        let deep = format!("{}rm x{}", "( ".repeat(23), " )".repeat(23));
        for line in [
            ". 2222222222222222222222222>&ot22x-+",
            "x 4294967296>f",
            hang,
        ] {
            let a = analyze(line);
            assert!(!a.opaque.is_empty(), "{line:?} should ask: {a:?}");
        }
        assert_eq!(texts(&deep), ["rm x"], "23 nested subshells");
        assert_eq!(
            texts(&subscripts),
            [subscripts.as_str()],
            "expansions are words"
        );
        assert!(
            analyze(&"(".repeat(5000))
                .opaque
                .iter()
                .any(|o| o.contains("does not parse")),
            "5000 unclosed parentheses"
        );
        let nested = format!("{}ls{}", "(".repeat(5000), ")".repeat(5000));
        assert!(
            analyze(&nested)
                .opaque
                .iter()
                .any(|o| o.contains("nested too deeply")),
            "the walk stops at its depth"
        );
        assert!(analyze("echo hi 2>/dev/null").opaque.is_empty());
        assert!(
            analyze("cat <<EOF\nhi\nEOF\n").opaque.is_empty(),
            "plain here-documents parse"
        );
    }

    #[test]
    fn the_parser_stops_at_its_budget() {
        let line = "echo hello world; ".repeat(2000);
        assert!(parse_within(&line, 0).is_err(), "no budget, no tree");
        assert!(parse_within(&line, budget(&line)).is_ok());
        let a = analyze_within(&line, 0);
        assert_eq!(a.opaque, ["the command line is too complex to analyse"]);
        assert_eq!(a.commands.len(), 1);
        assert!(
            a.commands[0].text == line.trim(),
            "deny rules see the whole line"
        );
    }

    #[test]
    fn a_stopped_parse_is_not_resumed_by_the_next_one() {
        let long = "echo hello world; ".repeat(2000);
        assert!(parse_within(&long, 0).is_err());
        assert_eq!(texts("git status"), ["git status"]);
        assert_eq!(analyze("git status").opaque, Vec::<String>::new());
    }

    #[test]
    fn line_continuations_join_words_but_not_comments() {
        assert_eq!(texts("r\\\nm -rf x"), ["rm -rf x"]);
        assert_eq!(texts("rm -r\\\nf x"), ["rm -rf x"]);
        assert_eq!(texts("ls # a comment \\\nrm -rf x"), ["ls", "rm -rf x"]);
        let a = analyze("r\\\n$X -rf x");
        assert!(a.opaque[0].contains("computed"), "{a:?}");
        assert!(
            texts("cd ~+99999999999").len() == 1,
            "tilde arguments are words"
        );
    }
}
