//! How long a model thinks before it decides: Anthropic's thinking, and the effort every
//! provider that reasons takes as a hint.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Anthropic's thinking before each decision. Written in settings as a number of tokens
/// or as `"adaptive"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    /// Up to this many tokens a call (`{"type": "enabled", "budget_tokens": N}`): the way of
    /// the models up to Claude 4.5; deprecated on the 4.6 models, refused from Claude Opus
    /// 4.7 on.
    Budget(u32),
    /// The model decides whether and how long to think (`{"type": "adaptive"}`), guided by
    /// the [`Effort`]: the way of current models, with thinking between tool calls.
    Adaptive,
}

impl fmt::Display for Thinking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Thinking::Budget(tokens) => write!(f, "{tokens} tokens"),
            Thinking::Adaptive => f.write_str("adaptive"),
        }
    }
}

impl Serialize for Thinking {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Thinking::Budget(tokens) => serializer.serialize_u32(*tokens),
            Thinking::Adaptive => serializer.serialize_str("adaptive"),
        }
    }
}

impl<'de> Deserialize<'de> for Thinking {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Written;
        impl Visitor<'_> for Written {
            type Value = Thinking;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of tokens or \"adaptive\"")
            }
            fn visit_u64<E: de::Error>(self, tokens: u64) -> Result<Thinking, E> {
                u32::try_from(tokens).map(Thinking::Budget).map_err(|_| {
                    E::invalid_value(de::Unexpected::Unsigned(tokens), &"at most 4294967295")
                })
            }
            fn visit_i64<E: de::Error>(self, tokens: i64) -> Result<Thinking, E> {
                match u64::try_from(tokens) {
                    Ok(tokens) => self.visit_u64(tokens),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(tokens), &self)),
                }
            }
            fn visit_str<E: de::Error>(self, word: &str) -> Result<Thinking, E> {
                if word == "adaptive" {
                    Ok(Thinking::Adaptive)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(word), &self))
                }
            }
        }
        deserializer.deserialize_any(Written)
    }
}

/// How much a model should reason and write: Anthropic's `output_config.effort`, OpenAI's
/// `reasoning_effort` (the Responses API's `reasoning.effort`). A hint the provider takes
/// for the whole reply, tool calls included; lower costs less. Which levels a model
/// accepts is the provider's to say (OpenAI's go from `none` to `xhigh`, Anthropic's from
/// `low` to `max`): an unknown one is refused by the provider, with its words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    /// No reasoning (OpenAI's newer models).
    None,
    /// Almost none (OpenAI).
    Minimal,
    /// Little: fast and cheap.
    Low,
    /// Some.
    Medium,
    /// Much (the providers' default).
    High,
    /// More (OpenAI's and Anthropic's newest models).
    Xhigh,
    /// As much as the model will (Anthropic).
    Max,
}

impl Effort {
    /// The provider's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::None => "none",
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Xhigh => "xhigh",
            Effort::Max => "max",
        }
    }

    /// Whether it asks for more than the providers' default (`high`), and so may cost more.
    pub fn above_default(self) -> bool {
        matches!(self, Effort::Xhigh | Effort::Max)
    }
}

impl fmt::Display for Effort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_is_written_as_tokens_or_adaptive() {
        let read = |text: &str| serde_json::from_str::<Thinking>(text);
        assert_eq!(read("4096").unwrap(), Thinking::Budget(4096));
        assert_eq!(read("\"adaptive\"").unwrap(), Thinking::Adaptive);
        for bad in ["-5", "\"lots\"", "1.5", "99999999999", "true"] {
            let err = read(bad).unwrap_err().to_string();
            assert!(
                err.contains("a number of tokens or \"adaptive\"") || err.contains("at most"),
                "{bad}: {err}"
            );
        }
        for thinking in [Thinking::Budget(2048), Thinking::Adaptive] {
            let text = serde_json::to_string(&thinking).unwrap();
            assert_eq!(read(&text).unwrap(), thinking);
        }
        assert_eq!(serde_json::to_string(&Thinking::Budget(7)).unwrap(), "7");
    }

    #[test]
    fn an_effort_is_the_provider_s_word() {
        for word in ["none", "minimal", "low", "medium", "high", "xhigh", "max"] {
            let effort: Effort = serde_json::from_str(&format!("\"{word}\"")).unwrap();
            assert_eq!(effort.as_str(), word);
            assert_eq!(
                serde_json::to_string(&effort).unwrap(),
                format!("\"{word}\"")
            );
        }
        let err = serde_json::from_str::<Effort>("\"extreme\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("extreme") && err.contains("xhigh"), "{err}");
    }
}
