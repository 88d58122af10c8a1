//! The prompt as a person reads it: the text `agent context` prints, also the format of
//! readable snapshot tests.

use std::fmt;

use agent_core::{Part, Prompt, Role};

/// A prompt written as text: the system text, each message numbered with its role, each
/// part in order (tool uses and results with their call ids), then the tool names.
///
/// ```
/// use agent_context::PromptText;
/// use agent_core::{Message, Prompt};
///
/// let prompt = Prompt { system: "sys".into(), messages: vec![Message::user_text("hi")], tools: vec![], answer_schema: None };
/// assert_eq!(PromptText(&prompt).to_string(), "=== system\nsys\n=== 1 user\nhi\n=== tools\n\n");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PromptText<'a>(pub &'a Prompt);

impl fmt::Display for PromptText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prompt = self.0;
        writeln!(f, "=== system\n{}", prompt.system)?;
        for (i, message) in prompt.messages.iter().enumerate() {
            let role = match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            writeln!(f, "=== {} {role}", i + 1)?;
            for part in &message.parts {
                match part {
                    Part::Text { text } => writeln!(f, "{text}")?,
                    Part::ToolUse {
                        call_id,
                        name,
                        arguments,
                    } => writeln!(f, "[tool use {call_id}] {name} {arguments}")?,
                    Part::ToolResult {
                        call_id,
                        ok,
                        content,
                        ..
                    } => {
                        let status = if *ok { "ok" } else { "error" };
                        writeln!(f, "[tool result {call_id}, {status}]\n{content}")?;
                    }
                    Part::Reasoning { reasoning } => match reasoning.readable() {
                        Some(text) => writeln!(f, "[reasoning]\n{text}")?,
                        None => writeln!(f, "[reasoning, encrypted]")?,
                    },
                }
            }
        }
        let names: Vec<&str> = prompt.tools.iter().map(|t| t.name.as_str()).collect();
        writeln!(f, "=== tools\n{}", names.join(", "))
    }
}
