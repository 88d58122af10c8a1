//! The analysis on lines that matter: lists, opaque constructs, inputs that broke the
//! previous parser, the budget.
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
