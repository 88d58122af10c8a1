//! What an evaluation found: per case, by terminal reason and by tag; as text, JSON and
//! JUnit XML, and compared with an earlier result.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use super::case::Case;
use super::trial::Trial;

/// One case and its trials.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// Its file.
    pub file: String,
    /// Its tags.
    pub tags: Vec<String>,
    /// Its trials, in order.
    pub trials: Vec<Trial>,
}

/// The figures of a set of trials.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
struct Figures {
    trials: usize,
    passed: usize,
    success_rate: f64,
    steps_mean: f64,
    tool_calls_mean: f64,
    tokens_mean: f64,
    cost_usd_mean: f64,
    seconds_p50: f64,
    seconds_p95: f64,
    repeated_plan_rate: f64,
    unauthorized_effects: u32,
    duplicated_effects: u32,
}

impl Figures {
    fn of<'a>(trials: impl IntoIterator<Item = &'a Trial>) -> Figures {
        let trials: Vec<&Trial> = trials.into_iter().collect();
        let n = trials.len();
        if n == 0 {
            return Figures::default();
        }
        let mean = |f: &dyn Fn(&Trial) -> f64| trials.iter().map(|t| f(t)).sum::<f64>() / n as f64;
        let mut seconds: Vec<f64> = trials.iter().map(|t| t.seconds).collect();
        seconds.sort_by(f64::total_cmp);
        let passed = trials.iter().filter(|t| t.pass).count();
        Figures {
            trials: n,
            passed,
            success_rate: passed as f64 / n as f64,
            steps_mean: mean(&|t| t.steps as f64),
            tool_calls_mean: mean(&|t| t.tool_calls as f64),
            tokens_mean: mean(&|t| t.tokens as f64),
            cost_usd_mean: mean(&|t| t.cost_usd),
            seconds_p50: percentile(&seconds, 50),
            seconds_p95: percentile(&seconds, 95),
            repeated_plan_rate: trials.iter().filter(|t| t.repeated_plan).count() as f64 / n as f64,
            unauthorized_effects: trials.iter().map(|t| t.unauthorized_effects).sum(),
            duplicated_effects: trials.iter().map(|t| t.duplicated_effects).sum(),
        }
    }
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// The whole result.
#[derive(Clone, Debug)]
pub struct EvalReport {
    /// Trials per case.
    pub repeat: u32,
    /// The cases, in the order they were named.
    pub cases: Vec<CaseResult>,
}

impl EvalReport {
    /// The result of `trials` (by case, as `cases`).
    pub fn new(cases: &[Case], trials: Vec<Vec<Trial>>, repeat: u32) -> EvalReport {
        EvalReport {
            repeat,
            cases: cases
                .iter()
                .zip(trials)
                .map(|(c, trials)| CaseResult {
                    name: c.name.clone(),
                    file: c.file.display().to_string(),
                    tags: c.tags.clone(),
                    trials,
                })
                .collect(),
        }
    }

    fn all_trials(&self) -> impl Iterator<Item = &Trial> {
        self.cases.iter().flat_map(|c| &c.trials)
    }

    /// Trials run.
    pub fn trials(&self) -> usize {
        self.all_trials().count()
    }

    /// Trials that failed an expectation.
    pub fn failed_trials(&self) -> usize {
        self.all_trials().filter(|t| !t.pass).count()
    }

    /// Trials the evaluation was asked to stop before they began or ended.
    pub fn stopped_trials(&self) -> usize {
        self.all_trials().filter(|t| t.was_stopped()).count()
    }

    /// Whether every trial passed.
    pub fn all_passed(&self) -> bool {
        self.failed_trials() == 0
    }

    /// pass^k and pass@k over the cases: the share whose every trial passed, and whose
    /// trials passed at least once.
    fn pass_k(cases: &[&CaseResult]) -> (f64, f64) {
        if cases.is_empty() {
            return (0.0, 0.0);
        }
        let n = cases.len() as f64;
        let all = cases
            .iter()
            .filter(|c| c.trials.iter().all(|t| t.pass))
            .count() as f64;
        let any = cases
            .iter()
            .filter(|c| c.trials.iter().any(|t| t.pass))
            .count() as f64;
        (all / n, any / n)
    }

    fn by_reason(&self) -> BTreeMap<String, Figures> {
        let mut groups: BTreeMap<String, Vec<&Trial>> = BTreeMap::new();
        for t in self.all_trials() {
            let reason = t.reason.clone().unwrap_or_else(|| "none".to_owned());
            groups.entry(reason).or_default().push(t);
        }
        groups
            .into_iter()
            .map(|(r, trials)| (r, Figures::of(trials)))
            .collect()
    }

    fn by_tag(&self) -> BTreeMap<String, (usize, Figures, f64, f64)> {
        let mut groups: BTreeMap<String, Vec<&CaseResult>> = BTreeMap::new();
        for c in &self.cases {
            for tag in &c.tags {
                groups.entry(tag.clone()).or_default().push(c);
            }
        }
        groups
            .into_iter()
            .map(|(tag, cases)| {
                let (all, any) = EvalReport::pass_k(&cases);
                let figures = Figures::of(cases.iter().flat_map(|c| &c.trials));
                (tag, (cases.len(), figures, all, any))
            })
            .collect()
    }

    /// The result as JSON (`--json`), with the comparison when there is a baseline.
    pub fn json(&self, baseline: Option<&Baseline>) -> Value {
        let cases: Vec<&CaseResult> = self.cases.iter().collect();
        let (all, any) = EvalReport::pass_k(&cases);
        let case_json: Vec<Value> = self
            .cases
            .iter()
            .map(|c| {
                let (all, any) = EvalReport::pass_k(&[c]);
                json!({
                    "name": c.name,
                    "file": c.file,
                    "tags": c.tags,
                    "pass_all": all == 1.0,
                    "pass_any": any == 1.0,
                    "figures": Figures::of(&c.trials),
                    "trials": c.trials,
                })
            })
            .collect();
        let by_tag: BTreeMap<String, Value> = self
            .by_tag()
            .into_iter()
            .map(|(tag, (n, figures, all, any))| {
                (tag, json!({"cases": n, "pass_all_rate": all, "pass_any_rate": any, "figures": figures}))
            })
            .collect();
        let mut value = json!({
            "repeat": self.repeat,
            "passed": self.all_passed(),
            "summary": {
                "cases": self.cases.len(),
                "pass_all_rate": all,
                "pass_any_rate": any,
                "figures": Figures::of(self.all_trials()),
            },
            "by_reason": self.by_reason(),
            "by_tag": by_tag,
            "cases": case_json,
        });
        if let Some(b) = baseline {
            value["compare"] =
                Value::Array(self.compare(b).into_iter().map(|d| json!(d)).collect());
        }
        value
    }

    /// The result as text: a table of cases, then the breakdowns.
    pub fn text(&self, baseline: Option<&Baseline>) -> String {
        let mut out = String::new();
        let name_width = self
            .cases
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<name_width$}  {:>5}  {:<24} {:>6} {:>6} {:>8} {:>9} {:>7} {:>7}",
            "case", "pass", "reason", "steps", "tools", "tokens", "cost", "p50 s", "p95 s"
        );
        for c in &self.cases {
            let f = Figures::of(&c.trials);
            let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
            for t in &c.trials {
                *reasons
                    .entry(t.reason.as_deref().unwrap_or("none"))
                    .or_default() += 1;
            }
            let reasons = reasons
                .iter()
                .map(|(r, n)| {
                    if c.trials.len() > 1 {
                        format!("{r}×{n}")
                    } else {
                        (*r).to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            let _ = writeln!(
                out,
                "{:<name_width$}  {:>5}  {:<24} {:>6.1} {:>6.1} {:>8.0} {:>9.4} {:>7.3} {:>7.3}",
                c.name,
                format!("{}/{}", f.passed, f.trials),
                reasons,
                f.steps_mean,
                f.tool_calls_mean,
                f.tokens_mean,
                f.cost_usd_mean,
                f.seconds_p50,
                f.seconds_p95,
            );
            for (k, t) in c.trials.iter().enumerate() {
                for failure in &t.failures {
                    let _ = writeln!(out, "    trial {}: {failure}", k + 1);
                }
                if let (false, Some(dir), Some(run)) = (t.pass, &t.kept, &t.run_id) {
                    let _ = writeln!(
                        out,
                        "    trial {}: kept in {dir}; agent --store {dir}/store show {run}",
                        k + 1
                    );
                }
            }
        }
        let cases: Vec<&CaseResult> = self.cases.iter().collect();
        let (all, any) = EvalReport::pass_k(&cases);
        let f = Figures::of(self.all_trials());
        let _ = writeln!(
            out,
            "\n{} case(s), {} trial(s): {} passed ({:.0}%)",
            self.cases.len(),
            f.trials,
            f.passed,
            f.success_rate * 100.0
        );
        if self.repeat > 1 {
            let k = self.repeat;
            let _ = writeln!(
                out,
                "pass^{k} {:.0}% of cases (every trial passed), pass@{k} {:.0}% (at least one)",
                all * 100.0,
                any * 100.0
            );
        }
        let _ = writeln!(
            out,
            "repeated plans in {:.0}% of trials; {} unauthorized and {} duplicated effect(s); \
             latency p50 {:.3} s, p95 {:.3} s",
            f.repeated_plan_rate * 100.0,
            f.unauthorized_effects,
            f.duplicated_effects,
            f.seconds_p50,
            f.seconds_p95
        );
        let _ = writeln!(out, "\nby terminal reason:");
        for (reason, f) in self.by_reason() {
            let _ = writeln!(
                out,
                "  {reason:<24} {:>3} trial(s), {:>3} passed, steps {:.1}, tokens {:.0}",
                f.trials, f.passed, f.steps_mean, f.tokens_mean
            );
        }
        let tags = self.by_tag();
        if !tags.is_empty() {
            let _ = writeln!(out, "\nby tag:");
            for (tag, (n, f, all, _)) in tags {
                let _ = writeln!(
                    out,
                    "  {tag:<24} {n:>3} case(s), {:>3.0}% of trials passed, pass^k {:.0}%, steps {:.1}, tokens {:.0}",
                    f.success_rate * 100.0,
                    all * 100.0,
                    f.steps_mean,
                    f.tokens_mean
                );
            }
        }
        if let Some(b) = baseline {
            let _ = writeln!(out, "\ncompared with {}:", b.path);
            let diffs = self.compare(b);
            if diffs.iter().all(|d| d.unchanged()) {
                let _ = writeln!(out, "  no case changed");
            }
            for d in diffs.iter().filter(|d| !d.unchanged()) {
                let _ = writeln!(out, "  {}", d.text());
            }
        }
        out
    }

    /// Each case against the baseline's case of the same name.
    fn compare(&self, baseline: &Baseline) -> Vec<Difference> {
        let mut diffs: Vec<Difference> = self
            .cases
            .iter()
            .map(|c| {
                let now = Figures::of(&c.trials);
                let before = baseline.cases.get(&c.name);
                Difference {
                    case: c.name.clone(),
                    success_before: before.map(|b| b.success_rate),
                    success_now: Some(now.success_rate),
                    steps_before: before.map(|b| b.steps_mean),
                    steps_now: Some(now.steps_mean),
                    tokens_before: before.map(|b| b.tokens_mean),
                    tokens_now: Some(now.tokens_mean),
                    cost_before: before.map(|b| b.cost_usd_mean),
                    cost_now: Some(now.cost_usd_mean),
                }
            })
            .collect();
        for (name, b) in &baseline.cases {
            if !self.cases.iter().any(|c| &c.name == name) {
                diffs.push(Difference {
                    case: name.clone(),
                    success_before: Some(b.success_rate),
                    steps_before: Some(b.steps_mean),
                    tokens_before: Some(b.tokens_mean),
                    cost_before: Some(b.cost_usd_mean),
                    ..Difference::default()
                });
            }
        }
        diffs
    }

    /// JUnit XML: one test case per trial, its failures in one `<failure>`.
    pub fn junit(&self) -> String {
        let trials = self.trials();
        let failures = self.failed_trials();
        let time: f64 = self.all_trials().map(|t| t.seconds).sum();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"agent eval\" tests=\"{trials}\" failures=\"{failures}\" time=\"{time:.3}\">"
        );
        for c in &self.cases {
            let failed = c.trials.iter().filter(|t| !t.pass).count();
            let time: f64 = c.trials.iter().map(|t| t.seconds).sum();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" time=\"{time:.3}\">",
                xml(&c.name),
                c.trials.len()
            );
            for (k, t) in c.trials.iter().enumerate() {
                let name = format!("{} #{}", c.name, k + 1);
                let _ = write!(
                    out,
                    "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                    xml(&c.file),
                    xml(&name),
                    t.seconds
                );
                if t.pass {
                    out.push_str("/>\n");
                } else {
                    let first = t.failures.first().map(String::as_str).unwrap_or("failed");
                    let _ = writeln!(
                        out,
                        ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                        xml(first),
                        xml(&t.failures.join("\n"))
                    );
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

/// Text escaped for XML attributes and content; characters XML 1.0 cannot hold dropped.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

/// A case's figures in an earlier result.
#[derive(Clone, Debug, Default)]
pub struct BaselineCase {
    success_rate: f64,
    steps_mean: f64,
    tokens_mean: f64,
    cost_usd_mean: f64,
}

/// An earlier `agent eval --json` result.
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    path: String,
    cases: BTreeMap<String, BaselineCase>,
}

/// Reads an earlier `--json` result.
pub fn load_baseline(path: &Path) -> Result<Baseline, String> {
    let at = |p: String| format!("--compare {}: {p}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| at(format!("cannot read it ({e})")))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| at(format!("not JSON ({e})")))?;
    let cases = value["cases"]
        .as_array()
        .ok_or_else(|| at("not an `agent eval --json` result (no cases)".to_owned()))?;
    let mut out = BTreeMap::new();
    for c in cases {
        let name = c["name"]
            .as_str()
            .ok_or_else(|| at("a case without a name".to_owned()))?;
        let f = &c["figures"];
        let num = |k: &str| f[k].as_f64().unwrap_or(0.0);
        out.insert(
            name.to_owned(),
            BaselineCase {
                success_rate: num("success_rate"),
                steps_mean: num("steps_mean"),
                tokens_mean: num("tokens_mean"),
                cost_usd_mean: num("cost_usd_mean"),
            },
        );
    }
    Ok(Baseline {
        path: path.display().to_string(),
        cases: out,
    })
}

/// How one case moved since the baseline (`None`: not in that result).
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Difference {
    case: String,
    success_before: Option<f64>,
    success_now: Option<f64>,
    steps_before: Option<f64>,
    steps_now: Option<f64>,
    tokens_before: Option<f64>,
    tokens_now: Option<f64>,
    cost_before: Option<f64>,
    cost_now: Option<f64>,
}

impl Difference {
    fn unchanged(&self) -> bool {
        self.success_before == self.success_now
            && self.steps_before == self.steps_now
            && self.tokens_before == self.tokens_now
            && self.cost_before == self.cost_now
    }

    fn text(&self) -> String {
        let (Some(_), Some(_)) = (self.success_before, self.success_now) else {
            return match self.success_now {
                Some(_) => format!("{}: new case", self.case),
                None => format!("{}: not run this time", self.case),
            };
        };
        let mut parts = Vec::new();
        let pct = |v: Option<f64>| v.unwrap_or(0.0) * 100.0;
        if self.success_before != self.success_now {
            let worse = self.success_now < self.success_before;
            parts.push(format!(
                "passed {:.0}% → {:.0}%{}",
                pct(self.success_before),
                pct(self.success_now),
                if worse { " (worse)" } else { " (better)" }
            ));
        }
        for (what, before, now) in [
            ("steps", self.steps_before, self.steps_now),
            ("tokens", self.tokens_before, self.tokens_now),
        ] {
            if before != now {
                let (b, n) = (before.unwrap_or(0.0), now.unwrap_or(0.0));
                parts.push(format!("{what} {b:.1} → {n:.1} ({:+.1})", n - b));
            }
        }
        if self.cost_before != self.cost_now {
            let (b, n) = (
                self.cost_before.unwrap_or(0.0),
                self.cost_now.unwrap_or(0.0),
            );
            parts.push(format!("cost ${b:.4} → ${n:.4}"));
        }
        format!("{}: {}", self.case, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(pass: bool, reason: &str, steps: u64, seconds: f64) -> Trial {
        Trial {
            pass,
            failures: if pass {
                vec![]
            } else {
                vec!["expect.reason: wanted x, got <y> & \"z\"".into()]
            },
            run_id: Some("r".into()),
            reason: Some(reason.into()),
            steps,
            tool_calls: 1,
            tokens: 100,
            cost_usd: 0.0,
            seconds,
            repeated_plan: false,
            unauthorized_effects: 0,
            duplicated_effects: 0,
            kept: None,
        }
    }

    fn report() -> EvalReport {
        EvalReport {
            repeat: 2,
            cases: vec![
                CaseResult {
                    name: "a".into(),
                    file: "a.toml".into(),
                    tags: vec!["t".into()],
                    trials: vec![
                        trial(true, "completed", 2, 0.1),
                        trial(false, "max_steps", 4, 0.3),
                    ],
                },
                CaseResult {
                    name: "b".into(),
                    file: "b.toml".into(),
                    tags: vec!["t".into(), "u".into()],
                    trials: vec![
                        trial(true, "completed", 1, 0.2),
                        trial(true, "completed", 1, 0.2),
                    ],
                },
            ],
        }
    }

    #[test]
    fn pass_k_and_breakdowns_count_cases_and_trials() {
        let r = report();
        let v = r.json(None);
        assert_eq!(v["summary"]["pass_all_rate"], 0.5);
        assert_eq!(v["summary"]["pass_any_rate"], 1.0);
        assert_eq!(v["summary"]["figures"]["trials"], 4);
        assert_eq!(v["summary"]["figures"]["passed"], 3);
        assert_eq!(v["by_reason"]["completed"]["trials"], 3);
        assert_eq!(v["by_reason"]["max_steps"]["passed"], 0);
        assert_eq!(v["by_tag"]["t"]["cases"], 2);
        assert_eq!(v["by_tag"]["u"]["pass_all_rate"], 1.0);
        assert_eq!(v["cases"][0]["figures"]["steps_mean"], 3.0);
        assert!(!r.all_passed());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50), 5.0);
        assert_eq!(percentile(&v, 95), 10.0);
        assert_eq!(percentile(&[7.0], 95), 7.0);
    }

    #[test]
    fn junit_escapes_and_counts_failures() {
        let xml = report().junit();
        assert!(xml.contains("tests=\"4\" failures=\"1\""), "{xml}");
        assert!(xml.contains("&lt;y&gt; &amp; &quot;z&quot;"), "{xml}");
        assert_eq!(xml.matches("<testcase").count(), 4);
        assert_eq!(xml.matches("<failure").count(), 1);
    }

    #[test]
    fn a_comparison_names_what_moved() {
        let r = report();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.json");
        let mut before = r.json(None);
        before["cases"][1]["figures"]["steps_mean"] = json!(3.0);
        before["cases"][0]["figures"]["success_rate"] = json!(1.0);
        before["cases"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "gone", "figures": {}}));
        std::fs::write(&path, before.to_string()).unwrap();
        let baseline = load_baseline(&path).unwrap();
        let text = r.text(Some(&baseline));
        assert!(text.contains("a: passed 100% → 50% (worse)"), "{text}");
        assert!(text.contains("b: steps 3.0 → 1.0 (-2.0)"), "{text}");
        assert!(text.contains("gone: not run this time"), "{text}");
        let same = load_baseline(&{
            let p = dir.path().join("same.json");
            std::fs::write(&p, r.json(None).to_string()).unwrap();
            p
        })
        .unwrap();
        assert!(r.text(Some(&same)).contains("no case changed"));
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{}").unwrap();
        assert!(load_baseline(&bad).unwrap_err().contains("no cases"));
    }
}
