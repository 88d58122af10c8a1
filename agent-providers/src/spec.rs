//! The `--model PROVIDER:MODEL` argument.

use std::path::PathBuf;

/// Which model a run uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// `script:PATH`: the offline script model.
    Script(PathBuf),
    /// `openai:MODEL`, key from `OPENAI_API_KEY`.
    OpenAi(String),
    /// `openai-responses:MODEL`: OpenAI's Responses API, key from `OPENAI_API_KEY`.
    OpenAiResponses(String),
    /// `anthropic:MODEL`, key from `ANTHROPIC_API_KEY`.
    Anthropic(String),
    /// `openai-compat:MODEL` with `--base-url` (vLLM, llama.cpp, LM Studio); key optional.
    OpenAiCompat(String),
    /// `ollama:MODEL`: Ollama's own API (`http://localhost:11434` unless `--base-url`
    /// says), which takes the window to load the model with; key optional (its cloud's).
    Ollama(String),
    /// `replay:RUN`: the decisions a recorded run got.
    Replay(String),
}

/// A `--model` value this version cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// No `PROVIDER:` prefix, or nothing after it.
    #[error("model {0:?} is not of the form PROVIDER:MODEL; {hint}", hint = hint(.0))]
    Malformed(String),

    /// A provider nobody knows.
    #[error(
        "model {0}: unknown provider {1:?} (known: script, openai, openai-responses, \
         anthropic, ollama, openai-compat, replay); {hint}",
        hint = hint(.0)
    )]
    UnknownProvider(String, String),
}

/// Each provider with what follows its name, for a `--model` that names a provider and
/// nothing after it.
const EXAMPLES: &[(&str, &str)] = &[
    ("script", "script:PATH, the path of a script file"),
    ("openai", "openai:MODEL, for example openai:gpt-4o"),
    (
        "openai-responses",
        "openai-responses:MODEL, for example openai-responses:gpt-5",
    ),
    (
        "anthropic",
        "anthropic:MODEL, for example anthropic:claude-sonnet-4-5",
    ),
    ("ollama", "ollama:MODEL, for example ollama:qwen3:8b"),
    (
        "openai-compat",
        "openai-compat:MODEL, the name the server knows it by, and --base-url",
    ),
    ("replay", "replay:RUN, the id of a recorded run"),
];

/// What the person probably meant by a `--model` value without a known provider: the
/// provider its name suggests, else a local server's (Ollama names models `llama3.1:8b`).
fn hint(text: &str) -> String {
    let name = text.strip_suffix(':').unwrap_or(text);
    let lower = name.to_ascii_lowercase();
    if name.is_empty() {
        return "for example openai:gpt-4o, anthropic:claude-sonnet-4-5 or script:PATH".to_owned();
    }
    if let Some((_, example)) = EXAMPLES.iter().find(|(provider, _)| *provider == name) {
        return format!("nothing follows {name}: (give {example})");
    }
    if lower.ends_with(".json") {
        format!("did you mean script:{name}?")
    } else if ["gpt-", "o1", "o3", "o4", "chatgpt"]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        format!("did you mean openai:{name}?")
    } else if lower.starts_with("claude") {
        format!("did you mean anthropic:{name}?")
    } else {
        format!(
            "for a model Ollama runs, give ollama:{name}; for another local server (vLLM, \
             llama.cpp), openai-compat:{name} and its --base-url"
        )
    }
}

impl ModelSpec {
    /// Parses `PROVIDER:MODEL`.
    pub fn parse(text: &str) -> Result<ModelSpec, SpecError> {
        let Some((provider, model)) = text.split_once(':') else {
            return Err(SpecError::Malformed(text.to_owned()));
        };
        if model.is_empty() {
            return Err(SpecError::Malformed(text.to_owned()));
        }
        match provider {
            "script" => Ok(ModelSpec::Script(PathBuf::from(model))),
            "openai" => Ok(ModelSpec::OpenAi(model.to_owned())),
            "openai-responses" => Ok(ModelSpec::OpenAiResponses(model.to_owned())),
            "anthropic" => Ok(ModelSpec::Anthropic(model.to_owned())),
            "openai-compat" => Ok(ModelSpec::OpenAiCompat(model.to_owned())),
            "ollama" => Ok(ModelSpec::Ollama(model.to_owned())),
            "replay" => Ok(ModelSpec::Replay(model.to_owned())),
            other => Err(SpecError::UnknownProvider(
                text.to_owned(),
                other.to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_clearly() {
        assert_eq!(
            ModelSpec::parse("script:a/b.json"),
            Ok(ModelSpec::Script("a/b.json".into()))
        );
        assert!(matches!(
            ModelSpec::parse("gpt-4"),
            Err(SpecError::Malformed(_))
        ));
        assert!(matches!(
            ModelSpec::parse("script:"),
            Err(SpecError::Malformed(_))
        ));
        assert_eq!(
            ModelSpec::parse("openai:gpt-4o"),
            Ok(ModelSpec::OpenAi("gpt-4o".into()))
        );
        assert_eq!(
            ModelSpec::parse("openai-compat:llama3.1:8b"),
            Ok(ModelSpec::OpenAiCompat("llama3.1:8b".into()))
        );
        assert_eq!(
            ModelSpec::parse("ollama:qwen3:8b"),
            Ok(ModelSpec::Ollama("qwen3:8b".into()))
        );
        assert_eq!(
            ModelSpec::parse("openai-responses:gpt-5"),
            Ok(ModelSpec::OpenAiResponses("gpt-5".into()))
        );
        assert_eq!(
            ModelSpec::parse("replay:01ABC"),
            Ok(ModelSpec::Replay("01ABC".into()))
        );
        assert!(matches!(
            ModelSpec::parse("foo:bar"),
            Err(SpecError::UnknownProvider(..))
        ));
    }

    #[test]
    fn a_provider_with_nothing_after_it_is_told_what_follows() {
        for provider in [
            "script",
            "openai",
            "openai-responses",
            "anthropic",
            "ollama",
            "openai-compat",
            "replay",
        ] {
            let given = format!("{provider}:");
            let told = ModelSpec::parse(&given).unwrap_err().to_string();
            assert!(
                told.contains(&format!("nothing follows {provider}: (give {provider}:")),
                "{told}"
            );
            // Every provider the parser knows has its example, and only those do.
            let model = format!("{provider}:m");
            assert!(ModelSpec::parse(&model).is_ok(), "{model}");
        }
        assert_eq!(EXAMPLES.len(), 7);
        let told = ModelSpec::parse("llama3:").unwrap_err().to_string();
        assert!(told.contains("give ollama:llama3"), "{told}");
    }

    #[test]
    fn a_model_without_a_provider_gets_the_one_its_name_suggests() {
        let told = |text: &str| ModelSpec::parse(text).unwrap_err().to_string();
        for (given, meant) in [
            ("gpt-4o", "did you mean openai:gpt-4o?"),
            ("o3-mini", "did you mean openai:o3-mini?"),
            (
                "claude-sonnet-4-5",
                "did you mean anthropic:claude-sonnet-4-5?",
            ),
            ("Claude-Opus-4", "did you mean anthropic:Claude-Opus-4?"),
            ("run/script.json", "did you mean script:run/script.json?"),
            // Ollama's names hold a colon: taken for a provider, and pointed home.
            ("llama3.1:8b", "give ollama:llama3.1:8b;"),
            ("mistral", "openai-compat:mistral and its --base-url"),
            ("gpt-4o:", "did you mean openai:gpt-4o?"),
            (":", "for example openai:gpt-4o"),
        ] {
            let message = told(given);
            assert!(message.contains(meant), "{given}: {message}");
        }
        assert!(told("llama3.1:8b").contains("unknown provider \"llama3.1\""));
    }
}
