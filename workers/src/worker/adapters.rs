//! The `adapters` endpoint (1.10): an operator lists, loads and unloads the LoRA
//! adapters of the worker's model at run time. The heartbeat that follows a change
//! tells coordinators, so requests for an unloaded adapter stop arriving.

use super::context::ServeContext;
use switchyard_messages::{
    decode, encode, AdapterOp, AdapterReply, AdapterRequest, ErrorCode, WireError, PROTOCOL_VERSION,
};

/// Answers one request; `true` when the adapters changed.
pub(super) async fn handle(ctx: &ServeContext, payload: &[u8]) -> (Vec<u8>, bool) {
    let outcome = match decode::<AdapterRequest>(payload) {
        Err(e) => Err(WireError::new(ErrorCode::BadRequest, e.to_string())),
        Ok(r) => run(ctx, r).await,
    };
    let changed = matches!(outcome, Ok(true));
    let reply = AdapterReply {
        v: PROTOCOL_VERSION,
        worker_id: ctx.worker_id.clone(),
        adapters: ctx.model.adapters(),
        error: outcome.err(),
    };
    (encode(&reply), changed)
}

async fn run(ctx: &ServeContext, r: AdapterRequest) -> Result<bool, WireError> {
    switchyard_messages::check_version(r.v)?;
    match r.op {
        AdapterOp::List => Ok(false),
        AdapterOp::Load => {
            switchyard_messages::check_adapter_name(&r.name)?;
            if r.path.is_empty() {
                return Err(WireError::new(ErrorCode::BadRequest, "load needs the adapter's path"));
            }
            let loaded = ctx.model.load_adapter(r.name.clone(), r.path.clone(), r.scale).await;
            loaded.map_err(|e| e.to_wire())?;
            tracing::info!(worker = %ctx.worker_id, adapter = %r.name, path = %r.path, "LoRA adapter loaded at run time");
            Ok(true)
        }
        AdapterOp::Unload => {
            ctx.model
                .unload_adapter(r.name.clone())
                .await
                .map_err(|e| e.to_wire())?;
            tracing::info!(worker = %ctx.worker_id, adapter = %r.name, "LoRA adapter unloaded at run time");
            Ok(true)
        }
    }
}
