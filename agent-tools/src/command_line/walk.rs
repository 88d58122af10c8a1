//! The walk over the syntax tree: every simple command collected as the text a rule
//! matches, and what cannot be seen through marked opaque with its reason.

use tree_sitter::Node;

use super::{
    Analysis, MAX_DEPTH, MAX_TREE_DEPTH, SHELLS, SimpleText, WRAPPERS, budget, first_error,
    parse_within,
};

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

/// Collects the commands of a line (and of the scripts inside it) into an analysis.
pub(super) struct Walker<'a> {
    pub(super) out: &'a mut Analysis,
    /// Inside something opaque: commands go to `hidden`.
    pub(super) hidden: bool,
    /// Scripts inside scripts followed so far.
    pub(super) depth: usize,
    /// The parser's budget for the top line (scripts inside get their own).
    pub(super) budget: Option<usize>,
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

    pub(super) fn line(&mut self, line: &str) {
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
