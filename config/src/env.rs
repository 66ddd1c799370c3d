//! Overlaying TOML tables and `SWITCHYARD_{SECTION}_{FIELD}` environment variables.

use crate::ConfigError;

/// Fields that were renamed, as (section, old name, new name): a file or a variable
/// that uses the old name sets the new field.
const RENAMED: &[(&str, &str, &str)] = &[("worker", "rocm_allow_cpu", "gpu_allow_cpu")];

/// The current name of `section.field`.
fn current_name<'a>(section: &str, field: &'a str) -> &'a str {
    RENAMED
        .iter()
        .find(|(s, old, _)| *s == section && *old == field)
        .map_or(field, |(_, _, new)| new)
}

/// Renames the old field names in a file's table to the current ones.
pub(crate) fn rename_old_fields(table: &mut toml::Table) {
    for (section, old, new) in RENAMED {
        if let Some(toml::Value::Table(fields)) = table.get_mut(*section) {
            if let Some(v) = fields.remove(*old) {
                fields.insert(new.to_string(), v);
            }
        }
    }
}

/// Recursively overlays `over` onto `base`.
pub(crate) fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Applies every `SWITCHYARD_{SECTION}_{FIELD}` variable that names a known field,
/// parsed as that field's type. Other `SWITCHYARD_*` variables (e.g. the setup
/// script's paths) are left alone.
pub(crate) fn apply(
    table: &mut toml::Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (var, raw) in vars {
        let Some(rest) = var.strip_prefix("SWITCHYARD_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        for (section, fields) in table.iter_mut() {
            let Some(field) = rest.strip_prefix(&format!("{section}_")) else {
                continue;
            };
            let field = current_name(section, field);
            let toml::Value::Table(fields) = fields else {
                continue;
            };
            let Some(current) = fields.get(field) else {
                continue;
            };
            let parsed = parse_like(current, &raw).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            fields.insert(field.to_string(), parsed);
        }
    }
    Ok(())
}

fn parse_like(current: &toml::Value, raw: &str) -> Result<toml::Value, String> {
    Ok(match current {
        toml::Value::String(_) => toml::Value::String(raw.to_string()),
        toml::Value::Integer(_) => {
            toml::Value::Integer(raw.trim().parse().map_err(|_| format!("{raw:?} is not an integer"))?)
        }
        toml::Value::Float(_) => {
            toml::Value::Float(raw.trim().parse().map_err(|_| format!("{raw:?} is not a number"))?)
        }
        toml::Value::Boolean(_) => toml::Value::Boolean(match raw.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => return Err(format!("{raw:?} is not a boolean")),
        }),
        other => {
            return Err(format!(
                "fields of type {} cannot be set from the environment",
                other.type_str()
            ))
        }
    })
}
