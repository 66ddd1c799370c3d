//! LoRA adapters on a llama.cpp server. llama-server loads adapter files only at
//! start (`--lora FILE`, repeatable; a supervised `rocm`/`cuda` child gets
//! `worker.adapters` that way, at scale 0 with `--lora-init-without-apply`) and lists
//! them on `GET /lora-adapters`; each `/completion` then says which to apply
//! (`"lora": [{"id", "scale"}]`, the unnamed ones at 0). A worker serves an adapter
//! under a name once the server holds its file: loading names one of the server's,
//! unloading forgets the name.
//!
//! llama-server clears a slot's KV when a request's adapters differ from what the
//! slot last ran, and batches together only requests with the same adapters.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use switchyard_backend::BackendError;
use switchyard_messages::ServedAdapter;

/// The server's adapters and the names the worker serves them under.
#[derive(Default)]
pub struct ServerAdapters {
    /// `GET /lora-adapters`: (id, file) of each adapter the server loaded.
    server: Vec<(u64, String)>,
    /// Served name → (the server's id, what heartbeats announce).
    named: Mutex<BTreeMap<String, (u64, ServedAdapter)>>,
}

impl ServerAdapters {
    /// From the server's `GET /lora-adapters` answer (`Null` when it has none or
    /// does not say).
    pub fn new(listed: &Value) -> Self {
        let server = listed
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| Some((e["id"].as_u64()?, e["path"].as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            server,
            named: Mutex::default(),
        }
    }

    /// Serves the server's adapter loaded from `path` as `name` at `scale`.
    pub fn load(&self, name: &str, path: &str, scale: f32, url: &str) -> Result<ServedAdapter, BackendError> {
        switchyard_messages::check_adapter_name(name).map_err(|e| BackendError::Invalid(e.message))?;
        let invalid = |why: String| BackendError::Invalid(format!("LoRA adapter {name:?} ({path}): {why}"));
        if !scale.is_finite() {
            return Err(invalid(format!("scale {scale} is not a finite number")));
        }
        let same = |a: &str| {
            a == path
                || match (Path::new(a).canonicalize(), Path::new(path).canonicalize()) {
                    (Ok(x), Ok(y)) => x == y,
                    _ => false,
                }
        };
        let Some(&(id, _)) = self.server.iter().find(|(_, p)| same(p)) else {
            let held: Vec<&str> = self.server.iter().map(|(_, p)| p.as_str()).collect();
            return Err(invalid(format!(
                "the llama.cpp server at {url} has not loaded it (llama-server loads adapters at start, \
                 with --lora FILE; a GGUF LoRA, not a PEFT directory); it holds: {}",
                if held.is_empty() {
                    "none".into()
                } else {
                    held.join(", ")
                }
            )));
        };
        let served = ServedAdapter {
            name: name.to_string(),
            path: path.to_string(),
            scale,
            exclusive: false,
        };
        self.lock().insert(name.to_string(), (id, served.clone()));
        Ok(served)
    }

    /// Stops serving `name`.
    pub fn unload(&self, name: &str) -> Result<(), BackendError> {
        match self.lock().remove(name) {
            Some(_) => Ok(()),
            None => Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded"))),
        }
    }

    /// What is served, by name.
    pub fn list(&self) -> Vec<ServedAdapter> {
        self.lock().values().map(|(_, s)| s.clone()).collect()
    }

    /// The `/completion` `lora` parameter for `adapter` (none: the base model, every
    /// adapter at 0); `None` when the server has no adapters.
    pub fn param(&self, adapter: Option<&str>) -> Result<Option<Value>, BackendError> {
        if self.server.is_empty() {
            return match adapter {
                Some(a) => Err(BackendError::Invalid(format!("no LoRA adapter {a:?} is loaded"))),
                None => Ok(None),
            };
        }
        let chosen = match adapter {
            None => None,
            Some(a) => match self.lock().get(a) {
                Some((id, s)) => Some((*id, s.scale)),
                None => return Err(BackendError::Invalid(format!("no LoRA adapter {a:?} is loaded"))),
            },
        };
        let list: Vec<Value> = self
            .server
            .iter()
            .map(|&(id, _)| {
                let scale = chosen.filter(|c| c.0 == id).map_or(0.0, |c| c.1);
                json!({"id": id, "scale": scale})
            })
            .collect();
        Ok(Some(Value::Array(list)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, ServedAdapter)>> {
        self.named.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_one_of_the_servers_adapters_and_the_rest_stay_off() {
        let listed =
            json!([{"id": 0, "path": "/a/one.gguf", "scale": 0.0}, {"id": 1, "path": "/a/two.gguf", "scale": 0.0}]);
        let a = ServerAdapters::new(&listed);
        assert_eq!(
            a.param(None).unwrap().unwrap(),
            json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}])
        );
        assert!(a.param(Some("two")).is_err(), "not served under a name yet");
        a.load("two", "/a/two.gguf", 0.5, "http://s").unwrap();
        assert_eq!(
            a.param(Some("two")).unwrap().unwrap(),
            json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}])
        );
        let e = a
            .load("three", "/a/three.gguf", 1.0, "http://s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"three\"") && e.contains("/a/one.gguf, /a/two.gguf"), "{e}");
        assert_eq!(a.list().len(), 1);
        a.unload("two").unwrap();
        assert!(a.unload("two").is_err());
        let none = ServerAdapters::new(&Value::Null);
        assert_eq!(none.param(None).unwrap(), None);
        assert!(none.param(Some("x")).is_err());
    }
}
