//! Shell command lines under the policy: a table of lines and rules, a bare allow, and the
//! README's examples.

use super::*;

/// The shell-policy table: chaining, pipes, newlines, substitutions, redirections and
/// quoting tricks, against the README's own kind of rules.
#[test]
fn shell_policy_table() {
    use Action::*;
    let rules: &[(Action, &str)] = &[
        (Allow, "shell(git status*)"),
        (Allow, "shell(git diff*)"),
        (Allow, "shell(ls*)"),
        (Allow, "shell(cargo test*)"),
        (Allow, "shell(echo *)"),
        (Allow, "shell(grep *)"),
        (Allow, "shell(wc *)"),
        (Ask, "shell(git commit*)"),
        (Deny, "shell(rm *)"),
        (Deny, "shell(git push*)"),
        (Deny, "shell(curl *)"),
    ];
    let table: &[(&str, V)] = &[
        // Plain commands.
        ("git status", V::Allow),
        ("git status --short", V::Allow),
        ("ls -la src", V::Allow),
        ("cargo test -p agent-core", V::Allow),
        ("git log", V::Ask),
        ("git commit -m x", V::Ask),
        ("rm -rf target", V::Deny),
        ("git push origin main", V::Deny),
        // Chaining: every command must be allowed, any deny wins.
        ("git status; echo X > ../outside/file", V::Ask),
        ("git status && ls", V::Allow),
        ("git status || echo failed", V::Allow),
        ("git status; rm -rf /", V::Deny),
        ("ls && git push", V::Deny),
        ("git status &\nls", V::Allow),
        ("git status\nrm -rf x", V::Deny),
        ("git status\nmake install", V::Ask),
        ("git status & make", V::Ask),
        // Pipes.
        ("git diff | grep foo", V::Allow),
        ("git diff | wc -l", V::Allow),
        ("git diff | sh", V::Ask),
        ("ls | xargs rm", V::Deny),
        ("ls | xargs cat", V::Ask),
        // Subshells, groups, control flow.
        ("(git status; ls)", V::Allow),
        ("{ git status; make; }", V::Ask),
        ("if git status; then rm -rf x; fi", V::Deny),
        ("for f in a b; do echo $f; done", V::Allow),
        ("while true; do make; done", V::Ask),
        // Substitutions and what runs other commands.
        ("echo $(whoami)", V::Ask),
        ("echo `id`", V::Ask),
        ("echo $(rm -rf x)", V::Deny),
        ("cat <(ls)", V::Ask),
        ("eval git status", V::Ask),
        ("eval 'rm -rf x'", V::Deny),
        ("sh -c 'git status'", V::Ask),
        ("bash -c 'rm -rf ~'", V::Deny),
        ("bash -lc 'rm -rf ~'", V::Deny),
        ("sudo rm -rf /", V::Deny),
        ("env rm -rf x", V::Deny),
        ("$CMD status", V::Ask),
        ("git status --porcelain=$(touch pwned)", V::Ask),
        // Redirections.
        ("git status > status.txt", V::Ask),
        ("git status >> ../outside/log", V::Ask),
        ("git status &> out.log", V::Ask),
        ("git status 2>/dev/null", V::Allow),
        ("git status 2>&1", V::Allow),
        ("echo hi >&2", V::Allow),
        // Quoting tricks.
        ("'rm' -rf x", V::Deny),
        ("r\"m\" -rf x", V::Deny),
        ("\\rm -rf x", V::Deny),
        ("/bin/rm -rf x", V::Deny),
        ("git   status", V::Allow),
        ("'git status'", V::Allow),
        ("ls | xargs", V::Ask),
        ("git status ';' rm -rf x", V::Allow),
        ("echo 'a; rm -rf x'", V::Allow),
        ("echo \"$(rm x)\"", V::Deny),
        ("FOO=1 git status", V::Ask),
        ("PATH=./bin:$PATH; git status", V::Ask),
        ("git status # ; rm -rf x", V::Allow),
        // Does not parse: asks, and what might run is still denied.
        ("git status; (", V::Ask),
        ("(( rm -rf x ) )", V::Deny),
        ("git status; ( 'r'm -rf x", V::Deny),
        // Line continuations, comments, here-documents, assignments, tests.
        ("r\\\nm -rf x", V::Deny),
        ("git status # note \\\nrm -rf x", V::Deny),
        ("cat <<EOF && rm -rf x\nhi\nEOF", V::Deny),
        ("cat <<EOF\n$(rm -rf x)\nEOF", V::Deny),
        ("git status <<'EOF'\n$(rm -rf x)\nEOF", V::Allow),
        ("export X=$(rm -rf x)", V::Deny),
        ("echo ${x[$(rm -rf x)]}", V::Deny),
        ("[ -f x ] && rm -rf x", V::Deny),
        ("f() { rm -rf x; }; f", V::Deny),
        ("git status 3>&1 1>&2", V::Allow),
        ("git status >&out.txt", V::Ask),
    ];
    assert!(table.len() >= 40);
    let t = tree();
    let g = gateway(&t.ws, rules);
    rt().block_on(async {
        let mut wrong = Vec::new();
        for (command, want) in table {
            let got = verdict(&g, "shell", json!({ "command": command })).await;
            if kind(&got) != *want {
                wrong.push(format!("{command:?}: want {want:?}, got {got:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    });
}

#[test]
fn a_bare_allow_allows_every_command_but_denials_still_win() {
    let t = tree();
    let g = gateway(
        &t.ws,
        &[(Action::Allow, "shell"), (Action::Deny, "shell(rm *)")],
    );
    rt().block_on(async {
        assert_eq!(
            verdict(&g, "shell", json!({"command": "echo $(id) > x"})).await,
            Verdict::Allow
        );
        let v = verdict(&g, "shell", json!({"command": "echo $(rm -rf x)"})).await;
        assert_eq!(kind(&v), V::Deny);
    });
}

/// The README's table of rules and commands, as written there.
#[test]
fn the_readme_examples_hold() {
    use Action::*;
    let status: &[(Action, &str)] = &[(Allow, "shell(git status*)")];
    let status_log: &[(Action, &str)] =
        &[(Allow, "shell(git status*)"), (Allow, "shell(git log*)")];
    let all_but_rm: &[(Action, &str)] = &[(Allow, "shell"), (Deny, "shell(rm *)")];
    let echo: &[(Action, &str)] = &[(Allow, "shell(echo *)")];
    type Rules<'a> = &'a [(Action, &'a str)];
    let table: &[(Rules, &str, V)] = &[
        (status, "git status --short", V::Allow),
        (status, "git status; echo X > ../f", V::Ask),
        (status, "git status && git log", V::Ask),
        (status_log, "git status && git log | head", V::Ask),
        (all_but_rm, "ls && 'r'm -rf x", V::Deny),
        (all_but_rm, "echo $(rm -rf x)", V::Deny),
        (echo, "echo $(whoami)", V::Ask),
        (echo, "sh -c 'echo hi'", V::Ask),
    ];
    let t = tree();
    rt().block_on(async {
        for (rules, command, want) in table {
            let g = gateway(&t.ws, rules);
            let got = verdict(&g, "shell", json!({ "command": command })).await;
            assert_eq!(kind(&got), *want, "{rules:?} {command}: {got:?}");
        }
    });
}
