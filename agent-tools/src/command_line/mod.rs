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

mod walk;

#[cfg(test)]
mod tests;

use std::ops::ControlFlow;

use tree_sitter::{Node, ParseOptions, ParseState, Parser, Tree};

use walk::Walker;

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
