//! Model names in the store: they become object names and cache directories, so
//! they may not climb out of either.

use anyhow::bail;

/// The longest name.
pub const MAX_LEN: usize = 128;

/// Refuses a name that is empty, too long, has `/`, `\`, `..`, starts with `.`,
/// or holds anything but letters, digits and `. _ - :` — with the rule it breaks.
pub fn validate(name: &str) -> anyhow::Result<()> {
    if name.is_empty() {
        bail!("a model name may not be empty");
    }
    if name.len() > MAX_LEN {
        bail!("model name {name:?} is {} bytes; the limit is {MAX_LEN}", name.len());
    }
    if name.contains('/') || name.contains('\\') {
        bail!("model name {name:?} may not contain '/' or '\\' (it names one directory in the cache)");
    }
    if name.contains("..") || name.starts_with('.') {
        bail!("model name {name:?} may not start with '.' or contain '..'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')))
    {
        bail!("model name {name:?} may only hold letters, digits and '.', '_', '-', ':' (found {c:?})");
    }
    Ok(())
}

/// Whether `s` could be a store name (for telling a name from a path).
pub fn is_name(s: &str) -> bool {
    validate(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_climb_out_are_refused() {
        for bad in [
            "",
            "../x",
            "a/b",
            "..",
            "a..b",
            ".hidden",
            "a\\b",
            "a b",
            "é",
            &"x".repeat(129),
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
        for good in ["SmolLM2-135M-Instruct.Q4_1", "qwen2.5:0.5b", "a", "m_1"] {
            validate(good).unwrap();
        }
    }
}
