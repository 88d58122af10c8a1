//! The `--model PROVIDER:MODEL` argument.

use std::path::PathBuf;

/// Which model a run uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// `script:PATH`: the offline script model.
    Script(PathBuf),
}

/// A `--model` value this version cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// No `PROVIDER:` prefix, or nothing after it.
    #[error(
        "--model {0:?} is not of the form PROVIDER:MODEL (for example script:examples/hello/script.json)"
    )]
    Malformed(String),
    /// A provider the contract names that this version does not have yet.
    #[error("--model {0}: the {1} provider is not available in this version; use script:PATH")]
    NotAvailable(String, String),
    /// A provider nobody knows.
    #[error(
        "--model {0}: unknown provider {1:?}; known: script, openai, anthropic, openai-compat, replay"
    )]
    UnknownProvider(String, String),
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
            "openai" | "anthropic" | "openai-compat" | "replay" => Err(SpecError::NotAvailable(
                text.to_owned(),
                provider.to_owned(),
            )),
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
        assert!(matches!(
            ModelSpec::parse("openai:gpt-4o"),
            Err(SpecError::NotAvailable(..))
        ));
        assert!(matches!(
            ModelSpec::parse("foo:bar"),
            Err(SpecError::UnknownProvider(..))
        ));
    }
}
