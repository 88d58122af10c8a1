//! Tool schemas as providers accept them.

use serde_json::Value;

/// `format` values every provider dialect accepts; others (schemars' `uint`, `int64`,
/// `double`, ...) are dropped.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uuid",
];

/// A copy of `schema` without what providers reject: `$schema`, `title` and non-standard
/// `format` values, at every depth. The meaning for validation is unchanged (these keywords
/// are annotations).
pub fn provider_schema(schema: &Value) -> Value {
    let mut out = schema.clone();
    clean(&mut out, true);
    out
}

fn clean(value: &mut Value, is_schema: bool) {
    match value {
        Value::Object(map) => {
            if is_schema {
                map.remove("$schema");
                if map.get("title").is_some_and(Value::is_string) {
                    map.remove("title");
                }
                if map
                    .get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| !STANDARD_FORMATS.contains(&f))
                {
                    map.remove("format");
                }
            }
            for (key, child) in map.iter_mut() {
                // Under `properties`, `$defs` and `definitions` the keys are names, whose
                // values are schemas; `enum`, `const`, `default` and `examples` hold data.
                let child_is_schema =
                    !matches!(key.as_str(), "enum" | "const" | "default" | "examples");
                if matches!(
                    key.as_str(),
                    "properties" | "$defs" | "definitions" | "patternProperties"
                ) {
                    if let Value::Object(named) = child {
                        named.values_mut().for_each(|s| clean(s, true));
                    }
                } else if child_is_schema {
                    clean(child, true);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| clean(i, is_schema)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strips_what_providers_reject_and_keeps_the_rest() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "ReadFileArgs",
            "type": "object",
            "properties": {
                "title": {"type": "string", "title": "Title"},
                "limit": {"type": ["integer", "null"], "format": "uint", "minimum": 1},
                "when": {"type": "string", "format": "date-time"},
                "mode": {"enum": [{"title": "kept, it is data"}]}
            },
            "$defs": {"Inner": {"title": "Inner", "type": "object"}},
            "required": ["title"]
        });
        assert_eq!(
            provider_schema(&schema),
            json!({
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "limit": {"type": ["integer", "null"], "minimum": 1},
                    "when": {"type": "string", "format": "date-time"},
                    "mode": {"enum": [{"title": "kept, it is data"}]}
                },
                "$defs": {"Inner": {"type": "object"}},
                "required": ["title"]
            })
        );
    }
}
