//! MessagePack encoding with named fields (maps, not arrays), so any language's
//! MessagePack library reads switchyard's payloads by field name and unknown fields
//! are ignored.

use serde::{de::DeserializeOwned, Serialize};

/// A payload that could not be decoded, with the decoder's reason (e.g. which field
/// was missing or had the wrong type).
#[derive(Debug, thiserror::Error)]
#[error("invalid MessagePack payload for {what}: {source}")]
pub struct DecodeError {
    /// The type being decoded.
    pub what: &'static str,
    /// The decoder's own error.
    #[source]
    pub source: rmp_serde::decode::Error,
}

/// Encodes `value` as MessagePack with named fields.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising plain data structs into a Vec cannot fail: no I/O, no maps with
    // non-string keys in this crate.
    rmp_serde::to_vec_named(value).expect("MessagePack encoding of a contract type")
}

/// How deep a payload may nest: the contract's own types nest a handful of levels;
/// deeper input (e.g. 600 nested maps in an unknown field, 1.5 KB) is refused before
/// it can exhaust a thread's stack.
pub const MAX_DEPTH: usize = 32;

/// Decodes a MessagePack payload into `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MAX_DEPTH);
    T::deserialize(&mut de).map_err(|source| DecodeError {
        what: short_type_name::<T>(),
        source,
    })
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}
